"""`reward_model`: a model's score of a response, no text parsed.

A factory (built once per worker from the term's params, see `rewards.__init__`):
- `kind: classifier` (local only): a sequence-classification model (`local_model.LocalClassifier`)
  scores `template` (default: prompt, a newline, the response); the logit of a one-label head, else
  the probability of `label`.
- `kind: causal`: a causal LM asked `template` (default `YES_NO_TEMPLATE`); the reward is
  P(yes) / (P(yes) + P(no)) of its first answer token: locally from the logits, over HTTP from the
  endpoint's `top_logprobs` (`http_model.yes_probability`).
Local models batch across the records scoring at once (a blocking reward); HTTP is an async one.
"""
from __future__ import annotations

from streamrft.stream_ops.rewards.rubric import render

KINDS = ("classifier", "causal")
CLASSIFIER_TEMPLATE = "{prompt}\n{response}"
YES_NO_TEMPLATE = ("Task: {prompt}\nReference answer: {answer}\nResponse: {response}\n"
                   "Is the response correct? Answer Yes or No.")


def make_reward_model(*, model: str, kind: str = "classifier", backend: str = "local", template: str | None = None,
                      label: int = -1, yes: str = "Yes", no: str = "No", system: str | None = None,
                      batch_size: int = 8, batch_wait_s: float = 0.01, device: str = "cpu", dtype: str = "float32",
                      chat_template: bool = True,
                      base_url: str | None = None, api_key_env: str | None = None, max_concurrency: int = 16):
    """The reward model's reward function for these params (loads the model or makes the client now)."""
    if kind not in KINDS:
        raise ValueError(f"reward_model: kind={kind!r} is not one of {list(KINDS)}")
    if backend not in ("local", "http"):
        raise ValueError(f"reward_model: backend={backend!r} is not one of ['local', 'http']")
    if backend == "http" and kind != "causal":
        raise ValueError("reward_model: backend http supports kind causal only (OpenAI-compatible endpoints "
                         "have no standard classification API)")
    template = template or (CLASSIFIER_TEMPLATE if kind == "classifier" else YES_NO_TEMPLATE)
    if "{response}" not in template:
        raise ValueError("reward_model: the template must contain {response}")

    def text_of(response: str, answer: str | None, task) -> str:
        return render(template, prompt=task.prompt, response=response, answer=answer)

    if backend == "http":
        from streamrft.stream_ops.rewards.http_model import ChatClient, yes_probability

        client = ChatClient(base_url or "", model, api_key_env=api_key_env, max_concurrency=max_concurrency,
                            system=system)

        async def reward_model_http(response: str, answer: str | None, *, task) -> float:
            reply = await client.chat(text_of(response, answer, task), max_tokens=1, logprobs=True, top_logprobs=20)
            return yes_probability(reply, yes, no)

        reward_model_http.client = client
        return reward_model_http

    from streamrft.stream_ops.rewards.local_model import Batcher, LocalClassifier, LocalLM

    if kind == "classifier":
        clf = LocalClassifier(model, device=device, dtype=dtype, label=label)
        run = clf.scores
    else:
        lm = LocalLM(model, device=device, dtype=dtype, chat=chat_template, system=system)
        lm.token_id(yes), lm.token_id(no)  # fail at start, not on every record, if a word has no token

        def run(prompts: list[str]) -> list[float]:
            return lm.yes_probability(prompts, yes, no)

    batcher = Batcher(run, batch_size, batch_wait_s, name="reward-model-batcher")

    def reward_model_local(response: str, answer: str | None, *, task) -> float:
        return batcher.submit(text_of(response, answer, task))

    reward_model_local.blocking = True
    reward_model_local.batcher = batcher
    return reward_model_local


make_reward_model.factory = True
