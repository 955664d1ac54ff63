"""Slow reward terms under their policy: retries, timeouts, fallback or dead letter, threads for blocking calls.

Plain async and blocking Python functions stand in for a model here; the model back ends themselves
are tested against a real HTTP server and real transformers models in test_model_rewards.py.
"""
from __future__ import annotations

import asyncio
import threading

import pytest

from streamrft.schemas import DeadLetter, RolloutGroup, Task, Trajectory, decode, encode
from streamrft.stream_ops.app import route_record_async
from streamrft.stream_ops.rewards import REWARDS, reward_kind
from streamrft.stream_ops.scoring import ResolvedReward, Scorer, ScoringError
from streamrft.stream_ops.slow_terms import backoff_delays, call_with_policy, slow_components

EXACT = ResolvedReward("exact_match", REWARDS["exact_match"])


def make_group(responses: list[str]) -> RolloutGroup:
    task = Task(task_id="t1", prompt="2+2=", answer="4")
    trajs = [Trajectory(traj_id=f"x{i}", group_id="g1", task_id="t1", model_version=0, prompt_ids=[1, 2],
                        response_ids=[3], logprobs=[-0.1], response_text=r) for i, r in enumerate(responses)]
    return RolloutGroup(group_id="g1", task=task, trajectories=trajs)


def test_reward_kinds():
    async def coro(response, answer):
        return 1.0

    def blocking(response, answer):
        return 1.0

    blocking.blocking = True
    assert (reward_kind(coro), reward_kind(blocking), reward_kind(REWARDS["exact_match"])) == ("async", "blocking",
                                                                                                 "inline")
    assert ResolvedReward("c", coro).slow and ResolvedReward("b", blocking).slow and not EXACT.slow


def test_backoff_doubles():
    assert backoff_delays(0, 1.0) == [] and backoff_delays(4, 0.25) == [0.25, 0.5, 1.0, 2.0]


def flaky(failures: int, value: float = 0.5):
    calls = []

    async def reward(response, answer):
        calls.append(response)
        if len(calls) <= failures:
            raise ConnectionError(f"attempt {len(calls)} refused")
        return value

    return reward, calls


def test_failures_then_success_is_retried():
    fn, calls = flaky(2)
    term = ResolvedReward("judge", fn, retries=2, backoff_s=0.001)
    assert asyncio.run(call_with_policy(term, make_group(["4"]), 0)) == 0.5 and len(calls) == 3


def test_always_failing_is_a_scoring_error_or_the_fallback():
    fn, calls = flaky(100)
    term = ResolvedReward("judge", fn, retries=1, backoff_s=0.001)
    with pytest.raises(ScoringError) as info:
        asyncio.run(call_with_policy(term, make_group(["4"]), 0))
    assert len(calls) == 2 and info.value.error_type == "ConnectionError"
    assert info.value.reason == ("reward term 'judge' failed on trajectory x0 after 2 attempts: "
                                 "ConnectionError: attempt 2 refused")
    stats = {"fallbacks": 0}
    term = ResolvedReward("judge", fn, retries=0, fallback=0.25)
    assert asyncio.run(call_with_policy(term, make_group(["4"]), 0, stats=stats)) == 0.25 and stats["fallbacks"] == 1


def test_a_hung_call_times_out():
    async def hang(response, answer):
        await asyncio.sleep(3600)

    term = ResolvedReward("judge", hang, timeout_s=0.05, retries=1, backoff_s=0.0)
    with pytest.raises(ScoringError) as info:
        asyncio.run(call_with_policy(term, make_group(["4"]), 0))
    assert info.value.error_type == "RewardTimeout" and "after 2 attempts: timed out after 0.05 s" in info.value.reason


def test_a_non_finite_value_is_a_failed_attempt():
    async def nan(response, answer):
        return float("nan")

    with pytest.raises(ScoringError, match="returned nan"):
        asyncio.run(call_with_policy(ResolvedReward("judge", nan, retries=0), make_group(["4"]), 0))


def test_blocking_terms_run_in_the_pool_while_the_loop_goes_on():
    threads, release = set(), threading.Event()

    def model(response, answer):
        threads.add(threading.current_thread().name)
        release.wait(5)  # held until the event loop has shown it still runs
        return float(len(response))

    model.blocking = True
    scorer = Scorer([EXACT, ResolvedReward("model", model)], None, {}, False, "fifo", threads=4)

    async def main():
        scoring = asyncio.ensure_future(scorer.ascore(make_group(["4", "55", "666"])))
        for _ in range(3):
            await asyncio.sleep(0.01)  # the loop is free while all three calls block their threads
        assert not scoring.done()
        release.set()
        return await scoring

    exp = asyncio.run(main())
    scorer.close()
    assert exp.reward_components == {"exact_match": [1.0, 0.0, 0.0], "model": [1.0, 2.0, 3.0]}
    assert exp.rewards == [2.0, 2.0, 3.0]
    assert threads and all(name.startswith("reward") for name in threads)


def test_the_sync_scorer_and_score_group_run_slow_terms_too():
    async def judge(response, answer):
        return 0.5 if response == answer else 0.0

    scorer = Scorer([ResolvedReward("judge", judge)], None, {}, False, "fifo")
    assert scorer(make_group(["4", "5"])).rewards == [0.5, 0.0]


def test_one_failing_trajectory_cancels_the_group_and_dead_letters_it():
    cancelled = []

    async def judge(response, answer):
        if response == "bad":
            raise ValueError("malformed judge answer")
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.append(response)
            raise

    terms = [ResolvedReward("judge", judge, retries=0)]
    with pytest.raises(ScoringError):
        asyncio.run(slow_components(make_group(["4", "bad", "5"]), terms))
    assert sorted(cancelled) == ["4", "5"]

    scorer = Scorer(terms, None, {}, False, "fifo")
    raw = encode(make_group(["bad", "4"]))
    out = asyncio.run(route_record_async(scorer.ascore, "ns", raw, b"g1", "ns.rollouts.default", 1, 7))
    dead = decode(out.value)
    assert out.kind == "dead_letter" and isinstance(dead, DeadLetter) and dead.error_type == "ValueError"
    assert dead.reason == "reward term 'judge' failed on trajectory x0 after 1 attempt: ValueError: malformed judge answer"
    assert (dead.source_topic, dead.source_partition, dead.source_offset, dead.value) == ("ns.rollouts.default", 1, 7, raw)
