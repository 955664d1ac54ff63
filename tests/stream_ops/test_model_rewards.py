"""`judge` and `reward_model` on their real back ends: an OpenAI-compatible HTTP server (FastAPI under
uvicorn, `tests/judge_server.py`) and local transformers models (tiny ones built here, SmolLM2 when
installed: tests/real_model/test_judge.py), built from config as a worker builds them, scored through `Scorer` and `route_record_async`.
"""
from __future__ import annotations

import asyncio

import pytest

from judge_server import judge_server
from streamrft.config import RunConfig
from streamrft.schemas import RolloutGroup, Task, Trajectory, decode, encode
from streamrft.stream_ops.app import route_record_async
from streamrft.stream_ops.scoring import build_scorer

ALPHABET = "abcdefghij|"


def make_group(responses: list[str], answer: str = "4", gid: str = "g1") -> RolloutGroup:
    task = Task(task_id=f"t-{gid}", prompt="2+2=", answer=answer)
    trajs = [Trajectory(traj_id=f"{gid}-{i}", group_id=gid, task_id=task.task_id, model_version=0, prompt_ids=[1],
                        response_ids=[2], logprobs=[-0.1], response_text=r) for i, r in enumerate(responses)]
    return RolloutGroup(group_id=gid, task=task, trajectories=trajs)


def scorer_for(*terms: dict, **stream_ops):
    return build_scorer(RunConfig.model_validate({
        "model": {"path": "unused"}, "algorithm": {"type": "grpo"},
        "stream_ops": {"rewards": list(terms), "drop_zero_variance": False, **stream_ops}}))


def route(scorer, group: RolloutGroup, offset: int = 0):
    return asyncio.run(route_record_async(scorer.ascore, "ns", encode(group), group.group_id.encode(),
                                          "ns.rollouts.default", 0, offset))


def http_judge(url: str, **term) -> dict:
    return {"name": "judge", "params": {"backend": "http", "base_url": url, "model": "judge",
                                        **term.pop("params", {})}, "backoff_s": 0.01, **term}


def test_http_judge_scores_and_keeps_to_its_concurrency_limit():
    with judge_server(latency_s=0.05) as (url, state):
        scorer = scorer_for(http_judge(url, params={"max_concurrency": 3}))
        group = make_group(["4", "5", " 4", "x"] * 3)
        exp = decode(route(scorer, group).value)
        assert exp.reward_components == {"judge": [1.0, 0.0, 1.0, 0.0] * 3}
        assert state["requests"] == 12 and 1 <= state["max_active"] <= 3


def test_http_judge_failures_retry_then_dead_letter_or_fall_back():
    with judge_server(slow_s=30) as (url, state):
        scorer = scorer_for(http_judge(url, retries=2))
        exp = decode(route(scorer, make_group(["4", "FLAKY"])).value)  # 500, 500, then an answer
        assert exp.kind == "experience_group" and exp.reward_components["judge"] == [1.0, 0.0]
        assert state["flaky"] == {"FLAKY": 3}

        out = route(scorer, make_group(["4", "DOWN"]), offset=5)
        dead = decode(out.value)
        assert out.kind == "dead_letter" and dead.error_type == "HTTPStatusError" and dead.source_offset == 5
        assert "reward term 'judge' failed on trajectory g1-1 after 3 attempts" in dead.reason and "500" in dead.reason

        dead = decode(route(scorer_for(http_judge(url, retries=0)), make_group(["GARBLED"])).value)
        assert dead.error_type == "MalformedAnswer" and "I will not grade this." in dead.reason

        dead = decode(route(scorer_for(http_judge(url, retries=0, timeout_s=0.3)), make_group(["4", "SLOW"])).value)
        assert dead.error_type == "RewardTimeout" and "timed out after 0.3 s" in dead.reason

        scorer = scorer_for(http_judge(url, retries=1, fallback=0.25))
        exp = decode(route(scorer, make_group(["4", "DOWN"])).value)
        assert exp.reward_components["judge"] == [1.0, 0.25] and scorer.stats["fallbacks"] == 1


def test_http_reward_model_reads_yes_from_top_logprobs():
    with judge_server() as (url, _):
        scorer = scorer_for({"name": "reward_model", "params": {"backend": "http", "kind": "causal", "base_url": url,
                                                                "model": "rm"}})
        assert scorer(make_group(["4", "5"])).reward_components["reward_model"] == pytest.approx([0.9, 0.2])


def test_bad_params_fail_when_the_worker_builds_its_scorer():
    with pytest.raises(ValueError, match="backend='grpc' is not one of"):
        scorer_for({"name": "judge", "params": {"backend": "grpc", "model": "m"}})
    with pytest.raises(ValueError, match="base_url"):
        scorer_for({"name": "judge", "params": {"backend": "http", "model": "m"}})
    with pytest.raises(ValueError, match="kind causal only"):
        scorer_for({"name": "reward_model", "params": {"backend": "http", "base_url": "http://x/v1", "model": "m"}})


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    """A tiny causal LM and a tiny one-label classifier (random Qwen2s) on a char tokenizer."""
    import torch
    from transformers import Qwen2Config, Qwen2ForSequenceClassification

    from streamrft.engine.models import build_char_tokenizer, build_tiny_model

    root = tmp_path_factory.mktemp("tiny-rewards")
    tok = build_char_tokenizer(ALPHABET)
    build_tiny_model(root / "lm", tok, hidden_size=32, layers=1, heads=2)
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2, num_labels=1, pad_token_id=tok.pad_token_id)
    Qwen2ForSequenceClassification(cfg).save_pretrained(root / "clf")
    tok.save_pretrained(root / "clf")
    return root


@pytest.mark.parametrize("kind", ["causal", "classifier"])
def test_local_reward_model_batches_across_records_and_padding_changes_nothing(tiny_models, kind):
    term = {"name": "reward_model", "params": {"model": str(tiny_models / ("lm" if kind == "causal" else "clf")),
                                               "kind": kind, "template": "{answer}|{response}", "yes": "a",
                                               "no": "b", "batch_size": 16, "batch_wait_s": 0.2}}
    scorer = scorer_for(term)
    groups = [make_group(["abc", "b", "hgfedcba"], answer="ab", gid="g1"),
              make_group(["ab", "jjjjjjjjjj", "c"], answer="ab", gid="g2")]

    async def both():
        return await asyncio.gather(*(scorer.ascore(g) for g in groups))

    together = [e.reward_components["reward_model"] for e in asyncio.run(both())]
    batcher = scorer.rewards[0].fn.batcher
    assert batcher.items == 6 and batcher.batches < 6  # the six trajectories of both records shared batches
    alone = scorer_for({**term, "params": {**term["params"], "batch_size": 1, "batch_wait_s": 0.0}})
    one_by_one = [alone(g).reward_components["reward_model"] for g in groups]
    assert sum(together, []) == pytest.approx(sum(one_by_one, []), abs=1e-5)  # left padding changes no score
    if kind == "causal":
        assert all(0.0 < v < 1.0 for v in together[0] + together[1])
    scorer.close()



def test_a_local_judge_reads_every_character_of_its_prompt(tmp_path):
    # AutoTokenizer loads a char tokenizer as the model type's own class, which drops spaces and
    # newlines: a judge would then read "Expected:dcbaGot:dcba"; the judge loads it as the policy does
    from streamrft.engine.models import build_char_tokenizer, build_tiny_model
    from streamrft.stream_ops.rewards.local_model import LocalLM

    tok = build_char_tokenizer("abcd:\n ")
    build_tiny_model(tmp_path / "lm", tok, hidden_size=32, layers=1, heads=2)
    lm = LocalLM(str(tmp_path / "lm"), chat=False)
    prompt = "a: dc\nb: ab\n"
    ids = lm._encode([prompt])["input_ids"][0].tolist()
    assert ids == [tok.bos_token_id] + tok(prompt, add_special_tokens=False).input_ids and len(ids) == 1 + len(prompt)
    assert tok.unk_token_id not in ids
