"""`judge`: an LLM asked with a rubric template; the reward is the score parsed from its answer, in [0, 1].

A factory (built once per worker from the term's params, see `rewards.__init__`):

    stream_ops:
      rewards:
      - name: judge
        params: {backend: local, model: out/models/judge}   # or backend: http, base_url: http://h:8000/v1, model: name
        timeout_s: 30
        retries: 2
        fallback: 0.0                                        # unset: the group is dead-lettered

`backend: local` loads a causal LM (`local_model.LocalLM`) and batches the judge prompts of every
record scoring at once (a blocking reward); `backend: http` posts to an OpenAI-compatible endpoint
(`http_model.ChatClient`; an async reward). The prompt is `template` (`rubric.DEFAULT_TEMPLATE`)
filled with the task's prompt, the response and the reference answer; the answer's score is read by
`rubric.parse_score` and mapped from `score_range` to [0, 1]. A malformed answer fails the attempt.
"""
from __future__ import annotations

from streamrft.stream_ops.rewards.rubric import DEFAULT_TEMPLATE, parse_score, render

BACKENDS = ("local", "http")


def make_judge(*, model: str, backend: str = "local", template: str = DEFAULT_TEMPLATE,
               score_range: tuple[float, float] | list[float] = (0.0, 10.0), score_pattern: str | None = None,
               max_new_tokens: int = 16, system: str | None = None,
               batch_size: int = 8, batch_wait_s: float = 0.01, device: str = "cpu", dtype: str = "float32",
               chat_template: bool = True,
               base_url: str | None = None, api_key_env: str | None = None, max_concurrency: int = 16):
    """The judge's reward function for these params (loads the model or makes the client now)."""
    if backend not in BACKENDS:
        raise ValueError(f"judge: backend={backend!r} is not one of {list(BACKENDS)}")
    if "{response}" not in template:
        raise ValueError("judge: the template must contain {response}")
    low, high = (float(x) for x in score_range)
    if high <= low:
        raise ValueError(f"judge: score_range {list(score_range)} must be [low, high] with low < high")

    def prompt_of(response: str, answer: str | None, task) -> str:
        return render(template, prompt=task.prompt, response=response, answer=answer)

    if backend == "http":
        from streamrft.stream_ops.rewards.http_model import ChatClient, answer_text

        client = ChatClient(base_url or "", model, api_key_env=api_key_env, max_concurrency=max_concurrency,
                            system=system)

        async def judge_http(response: str, answer: str | None, *, task) -> float:
            reply = await client.chat(prompt_of(response, answer, task), max_tokens=max_new_tokens)
            return parse_score(answer_text(reply), low, high, score_pattern)

        judge_http.client = client
        return judge_http

    from streamrft.stream_ops.rewards.local_model import Batcher, LocalLM

    lm = LocalLM(model, device=device, dtype=dtype, chat=chat_template, system=system)
    batcher = Batcher(lambda prompts: lm.generate(prompts, max_new_tokens), batch_size, batch_wait_s,
                      name="judge-batcher")

    def judge_local(response: str, answer: str | None, *, task) -> float:
        return parse_score(batcher.submit(prompt_of(response, answer, task)), low, high, score_pattern)

    judge_local.blocking = True
    judge_local.batcher = batcher
    return judge_local


make_judge.factory = True
