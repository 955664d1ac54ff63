"""Episodes scheduled one by one (`workflows/scheduler.py`): none waits for another, the engine
batches whatever is ready, environments fail without wedging anything, and an episode's tokens,
masks and log-probs are exactly what the lockstep loop gives.

A scripted engine stands in where the model's tokens must be forced (its answers depend only on
the episode's text, so both schedulings see the same episodes); the real transformers engine on a
tiny char model plays episodes end to end with a slow async environment."""
from __future__ import annotations

import asyncio
import dataclasses
import re
import threading
import time

import pytest

torch = pytest.importorskip("torch")

from streamrft.engine.models import build_char_tokenizer, build_tiny_model  # noqa: E402
from streamrft.engine.rollout.base import Completion, SamplingParams  # noqa: E402
from streamrft.engine.rollout.hf import TransformersEngine  # noqa: E402
from streamrft.producers.envs import StepResult, guess_number  # noqa: E402
from streamrft.producers.envs.guess_number import GuessNumber  # noqa: E402
from streamrft.producers.envs.latency import AsyncSlowEnv, Latency, SlowEnv, with_latency  # noqa: E402
from streamrft.producers.workflows import multi_turn, step_wise  # noqa: E402
from streamrft.producers.workflows.episodes import TurnLimits, run_episodes  # noqa: E402
from streamrft.producers.workflows.scheduler import EpisodeScheduler, play_all  # noqa: E402
from streamrft.schemas import RolloutGroup, Task, decode, encode  # noqa: E402

LP = -0.25


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer(guess_number.ALPHABET)


class ScriptedEngine:
    """Binary search over 1-8 from the transcript; records each call's prompts."""

    def __init__(self, tokenizer, version=0):
        self.tokenizer, self.version, self.calls = tokenizer, version, []

    def generate(self, prompt_ids, params):
        self.calls.append(len(prompt_ids))
        out = []
        for p in prompt_ids:
            text = self.tokenizer.decode(p, skip_special_tokens=False)
            lo, hi = 1, 8
            for guess, word in re.findall(r"(\d)<eos>(higher|lower)", text):
                lo, hi = (int(guess) + 1, hi) if word == "higher" else (lo, int(guess) - 1)
            ids = self.tokenizer(f"{(lo + hi) // 2}", add_special_tokens=False).input_ids + [self.tokenizer.eos_token_id]
            out.append([Completion(ids, [LP] * len(ids), self.tokenizer.decode(ids, skip_special_tokens=True), "stop")])
        return out


def _tasks(*secrets):
    return [Task(task_id=f"t{s}", prompt="guess 1-8:", answer=str(s)) for s in secrets]


def _play(scheduler_kw, tasks, n, engine, env, limits=TurnLimits()):
    """Each task's episodes in the order their groups ended, with the scheduler."""

    async def go():
        s = EpisodeScheduler(engine, SamplingParams(max_new_tokens=4), env=env, limits=limits, **scheduler_kw)
        s.start()
        done = []

        async def one(task):
            episodes = await s.play(task, n)
            done.append((task.task_id, episodes))

        try:
            await asyncio.gather(*(one(t) for t in tasks))
        finally:
            await s.close()
        return done, s

    return asyncio.run(go())


def test_episodes_match_lockstep_token_for_token(tok):
    tasks = _tasks(1, 5, 8)
    lock = run_episodes(ScriptedEngine(tok), tasks, SamplingParams(n=3, max_new_tokens=4), env=GuessNumber,
                        limits=TurnLimits())
    done, _ = _play({}, tasks, 3, ScriptedEngine(tok), GuessNumber)
    by_task = dict(done)
    for task, row in zip(tasks, lock):
        for a, b in zip(row, by_task[task.task_id]):
            assert (a.prompt_ids, a.response_ids, a.logprobs, a.loss_mask, a.finish_reason, a.env_reward) == \
                   (b.prompt_ids, b.response_ids, b.logprobs, b.loss_mask, b.finish_reason, b.env_reward)


class Slow(GuessNumber):
    """Guess-the-number whose steps take `delay` seconds (sync: a thread waits), for secrets in `slow`."""

    delay, slow = 0.0, set()

    def step(self, action):
        if self.secret in self.slow:
            time.sleep(self.delay)
        return super().step(action)


def test_a_slow_environment_holds_up_no_other_episode_and_the_fast_groups_end_first(tok):
    Slow.delay, Slow.slow = 0.4, {1}
    eng = ScriptedEngine(tok)
    done, s = _play({}, _tasks(1, 5, 8, 6), 4, eng, Slow)  # secret 1: 3 guesses (4, 2, 1), 0.4 s each
    order = [task_id for task_id, _ in done]
    assert order[-1] == "t1" and set(order) == {"t1", "t5", "t8", "t6"}  # every group once, the slow one last
    # the fast episodes never waited for the slow ones: they were played in the calls of the slow
    # group's first waits, and the slow group's later turns had calls of their own (its 4 episodes,
    # together or, on a loaded machine where their tools answer apart, in several calls)
    assert eng.calls[0] == 16 and 1 <= eng.calls[-1] <= 4
    assert s.stats["env_s"] > 0.8 and s.stats["episodes"] == 16


def test_slow_steps_wait_together_not_in_turn(tok):
    """16 episodes, each step 0.2 s: lockstep waits 16 x 0.2 s a turn; one by one, ~0.2 s a turn."""
    Slow.delay, Slow.slow = 0.2, set(range(1, 9))
    t0 = time.monotonic()
    done, s = _play({"env_threads": 16}, _tasks(5, 5, 5, 5), 4, ScriptedEngine(tok), Slow)  # 4, 6, 5: 3 steps
    one_by_one = time.monotonic() - t0
    assert one_by_one < 16 * 0.2  # less than one lockstep turn of waits; 3 turns of 0.2 s in all
    assert all(e.finish_reason == "env_done" for _, row in done for e in row)


class Broken(GuessNumber):
    mode = {}
    made = []
    closed = []

    def __init__(self):
        super().__init__()
        self.k = len(Broken.made)
        Broken.made.append(self)

    def reset(self, task):
        if Broken.mode.get(self.k) == "reset":
            raise RuntimeError("no such task")
        return super().reset(task)

    def step(self, action):
        m = Broken.mode.get(self.k)
        if m == "raise":
            raise ConnectionError("tool down")
        if m == "hang":
            time.sleep(3)
        if m == "garbage":
            return "garbage"
        if m == "nan":
            return StepResult("", float("nan"), True, {})
        return super().step(action)

    def close(self):
        Broken.closed.append(self.k)


def test_environments_that_raise_hang_or_answer_garbage_end_their_own_episodes_only(tok):
    Broken.mode = {0: "reset", 1: "raise", 2: "hang", 3: "garbage", 4: "nan"}
    Broken.made, Broken.closed = [], []
    t0 = time.monotonic()
    done, s = _play({"step_timeout_s": 0.5}, _tasks(5, 6), 4, ScriptedEngine(tok), Broken)
    assert time.monotonic() - t0 < 3  # the hung step was given up at its timeout
    episodes = sorted((e for _, row in done for e in row), key=lambda e: id(e))
    reasons = sorted(e.finish_reason for e in episodes)
    assert reasons == ["env_done"] * 3 + ["env_error"] * 4 + ["env_timeout"]
    assert all(e.failed == (e.finish_reason != "env_done") for e in episodes)
    assert sorted(Broken.closed) == list(range(8))  # close() on every environment, whatever happened
    assert "took longer than 0.5 s" in next(e.error for e in episodes if e.finish_reason == "env_timeout")
    # the workflow leaves them out of the group, or drops it, and counts them
    stats = {}
    Broken.made, Broken.closed = [], []
    groups = multi_turn(ScriptedEngine(tok), _tasks(5, 6), SamplingParams(n=4, max_new_tokens=4), version=0,
                        team="default", env=Broken, limits=TurnLimits(), stats=stats,
                        play=lambda *a, **kw: play_all(*a, **kw, step_timeout_s=0.5))
    assert [len(g.trajectories) for g in groups] == [3]  # task t6: 3 of 4 ended normally; t5: none
    assert stats.pop("env_s") > 0.4  # the hung step's wait (0.5 s, less the calls around it)
    assert stats == {"env_errors": 4, "env_timeouts": 1, "groups_dropped_env": 1}


def test_an_engine_failure_fails_every_waiting_episode_instead_of_wedging(tok):
    class Failing(ScriptedEngine):
        def generate(self, prompt_ids, params):
            raise RuntimeError("CUDA error")

    with pytest.raises(RuntimeError, match="engine failed"):
        _play({}, _tasks(5), 2, Failing(tok), GuessNumber)


def test_turns_record_the_version_that_sampled_them(tok):
    """Weights swap between turns: the episode's trajectory says so, and its staleness counts from its
    oldest turn (model_version); step-wise, each step carries its own turn's version."""
    eng = ScriptedEngine(tok, version=3)

    def swap():
        eng.version += 1  # a new version before every engine call
        return 0.0

    async def go():
        s = EpisodeScheduler(eng, SamplingParams(max_new_tokens=4), env=GuessNumber, limits=TurnLimits(),
                             before_generate=swap)
        s.start()
        try:
            return await s.play(_tasks(1)[0], 2)
        finally:
            await s.close()

    episodes = asyncio.run(go())
    assert [[t.version for t in e.turns] for e in episodes] == [[4, 5, 6]] * 2  # 4, 2, 1
    from streamrft.producers.workflows.multi_turn import episode_group
    from streamrft.producers.workflows.step_wise import steps_group

    g = episode_group(tok, _tasks(1)[0], episodes, version=3, team="default")
    assert [(t.model_version, t.turn_versions) for t in g.trajectories] == [(4, [4, 5, 6])] * 2
    assert decode(encode(g), RolloutGroup) == g
    g = steps_group(tok, _tasks(1)[0], episodes, version=3, team="default")
    assert [t.model_version for t in g.trajectories] == [4, 5, 6] * 2


def test_latency_wrapper_draws_its_median_and_p99_and_repeats_with_its_seed():
    import random

    lat = Latency(0.5, 5.0, random.Random(0))
    draws = sorted(lat.draw() for _ in range(20000))
    assert draws[10000] == pytest.approx(0.5, rel=0.05) and draws[19800] == pytest.approx(5.0, rel=0.15)
    a = with_latency(GuessNumber, 0.5, 5.0, seed=7)
    b = with_latency(GuessNumber, 0.5, 5.0, seed=7)
    assert [a().latency.draw() for _ in range(3)] == [b().latency.draw() for _ in range(3)]
    assert isinstance(a(), SlowEnv) and isinstance(with_latency(GuessNumber, 0.5, 5.0, asynchronous=True)(),
                                                   AsyncSlowEnv)


def test_real_engine_episodes_with_an_async_slow_tool_wait_together(tok, tmp_path):
    """The transformers engine on a tiny char model, 32 episodes, every step an async tool of ~0.3 s:
    they wait together (well under lockstep's 32 x 0.3 s a turn), and the trajectories pass the wire."""
    build_tiny_model(tmp_path / "m", tok, hidden_size=32, layers=1, heads=2, seed=0)
    torch.set_num_threads(1)
    eng = TransformersEngine(str(tmp_path / "m"), max_batch=32)
    env = with_latency(GuessNumber, 0.3, 0.31, seed=1, asynchronous=True)
    t0 = time.monotonic()
    groups = step_wise(eng, _tasks(1, 2, 3, 4), SamplingParams(n=8, max_new_tokens=3, temperature=1.0), version=0,
                       team="default", env=env, limits=TurnLimits(max_turns=3),
                       play=play_all)
    assert time.monotonic() - t0 < 32 * 0.3
    for g in groups:
        assert decode(encode(g), RolloutGroup) == g


def test_seeded_episodes_are_the_same_one_by_one_as_in_lockstep(tok, tmp_path):
    """With a seed per group (`explorer.sampling.seed`), the real engine samples every turn from
    the episode's own stream: lockstep and one by one (where some tasks' steps are slow, so the
    engine's calls hold other episodes in another order) give the same tokens, masks and rewards,
    and log-probs equal to float rounding; other seeds give other episodes."""
    from streamrft.engine.sft import sft_on_sequences
    from streamrft.producers.workflows.demonstrations import mixture

    build_tiny_model(tmp_path / "m", tok, hidden_size=32, layers=1, heads=2, seed=0)
    torch.set_num_threads(1)
    eng = TransformersEngine(str(tmp_path / "m"), max_batch=64)
    # a few steps on scripted games, so that episodes last several turns
    demos = mixture(tok, [Task(task_id=f"d{i}", prompt="guess 1-8:", answer=str(1 + i % 8)) for i in range(64)],
                    GuessNumber, guess_number.PLAYERS, {"linear": 0.5, "bisect": 0.5})
    sft_on_sequences(eng.model, tok, [(d.ids, d.loss_mask) for d in demos], steps=30, batch_size=16, lr=3e-3)
    eng.model.eval()
    tasks, seeds = _tasks(1, 4, 6, 8), [101, 202, 303, 404]
    params = SamplingParams(n=4, max_new_tokens=3, temperature=1.0, seeds=seeds)
    lock = run_episodes(eng, tasks, params, env=GuessNumber, limits=TurnLimits(max_turns=4))

    class SlowSome(Slow):
        delay, slow = 0.05, {4, 8}

    async def go():
        s = EpisodeScheduler(eng, params, env=SlowSome, limits=TurnLimits(max_turns=4))
        s.start()
        try:
            return await asyncio.gather(*(s.play(t, 4, seed) for t, seed in zip(tasks, seeds))), s.stats
        finally:
            await s.close()

    one_by_one, stats = asyncio.run(go())
    assert stats["generate_calls"] > 4  # the slow tasks' turns came in calls of their own
    turns = 0
    for row, other in zip(lock, one_by_one):
        for a, b in zip(row, other):
            assert (a.prompt_ids, a.response_ids, a.loss_mask, a.finish_reason, a.env_reward) == \
                   (b.prompt_ids, b.response_ids, b.loss_mask, b.finish_reason, b.env_reward)
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
            turns += len(a.turns)
    assert turns > 16  # episodes of several turns
    reseeded = run_episodes(eng, tasks, dataclasses.replace(params, seeds=[1, 2, 3, 4]), env=GuessNumber,
                            limits=TurnLimits(max_turns=4))
    assert [[e.response_ids for e in row] for row in reseeded] != [[e.response_ids for e in row] for row in lock]


def test_the_feeder_never_runs_two_engine_calls_at_once(tok):
    active, most = [0], [0]
    lock = threading.Lock()

    class Watching(ScriptedEngine):
        def generate(self, prompt_ids, params):
            with lock:
                active[0] += 1
                most[0] = max(most[0], active[0])
            time.sleep(0.01)
            with lock:
                active[0] -= 1
            return super().generate(prompt_ids, params)

    Slow.delay, Slow.slow = 0.01, set(range(1, 9))
    _play({}, _tasks(1, 2, 3, 4, 5, 6, 7, 8), 4, Watching(tok), Slow)
    assert most[0] == 1


def test_the_eval_of_a_run_with_a_slow_tool_waits_for_it_together_in_lockstep_too(tok):
    """The held-out eval measures the policy, not the scheduling: with `env.latency` its episodes
    wait for the tool together even when the run is in lockstep (16 episodes x 3 turns of 0.2 s
    would take 9.6 s in turn), and its score is lockstep's."""
    from streamrft.config import load_config
    from streamrft.producers.evaluate import evaluate_run

    root = __import__("pathlib").Path(__file__).resolve().parents[2]
    slow = load_config(root / "examples" / "agent_cpu.yaml",
                       ["explorer.env={type: guess_number, params: {low: 1, high: 8, max_guesses: 4}, "
                        "latency: {median_s: 0.2, p99_s: 0.21, seed: 0}}", "explorer.scheduling=lockstep"])
    fast = load_config(root / "examples" / "agent_cpu.yaml", ["explorer.scheduling=lockstep"])
    tasks = _tasks(*[1 + k % 8 for k in range(16)])
    t0 = time.monotonic()
    score = evaluate_run(ScriptedEngine(tok), tasks, slow)
    assert time.monotonic() - t0 < 16 * 0.2
    assert score == pytest.approx(evaluate_run(ScriptedEngine(tok), tasks, fast)) and score > 0.8


def test_single_turn_groups_share_one_engine_call_and_match_the_lockstep_workflow(tok):
    """`sample` (the single-turn workflow scheduled one by one): the groups ready together go into
    one engine call of n samples each, and each group is what `single_turn` makes of the same
    completions, with the version that sampled them."""
    from streamrft.producers.workflows import single_turn
    from streamrft.producers.workflows.single_turn import completion_group

    class Counting:
        """n completions per prompt: the prompt's last character and a counter, all log-probs LP."""

        def __init__(self, tokenizer):
            self.tokenizer, self.version, self.calls = tokenizer, 7, []

        def generate(self, prompt_ids, params):
            self.calls.append((len(prompt_ids), params.n))
            out = []
            for p in prompt_ids:
                row = []
                for k in range(params.n):
                    ids = [p[-1], *self.tokenizer(str(k), add_special_tokens=False).input_ids,
                           self.tokenizer.eos_token_id]
                    row.append(Completion(ids, [LP] * len(ids), self.tokenizer.decode(ids, skip_special_tokens=True),
                                          "stop"))
                out.append(row)
            return out

    tasks = [Task(task_id=f"t{k}", prompt=f"guess {k}-8:", answer="1") for k in range(1, 5)]
    engine = Counting(tok)

    async def go():
        s = EpisodeScheduler(engine, SamplingParams(max_new_tokens=4), env=None, limits=TurnLimits())
        s.start()
        try:
            return await asyncio.gather(*(s.sample(t, 3) for t in tasks)), s.episodes_in_flight
        finally:
            await s.close()

    results, in_flight_after = asyncio.run(go())
    assert engine.calls == [(4, 3)] and in_flight_after == 0
    lockstep = single_turn(Counting(tok), tasks, SamplingParams(n=3, max_new_tokens=4), version=7, team="a")
    for task, (prompt, completions, version), want in zip(tasks, results, lockstep):
        got = completion_group(task, prompt, completions, version=version, team="a")
        assert version == 7 and len(got.trajectories) == 3
        assert [t.model_dump(exclude={"group_id", "traj_id", "created_at"}) for t in got.trajectories] == \
               [t.model_dump(exclude={"group_id", "traj_id", "created_at"}) for t in want.trajectories]


def test_the_engine_waits_as_reserve_while_groups_open_and_a_call_holds_at_most_max_rows(tok):
    """With nothing to generate, the engine's wait is `reserve_s` while the owner says groups are
    being admitted and `idle_s` otherwise; one call samples at most `max_rows` sequences, the rest
    go into the next."""
    engine = ScriptedEngine(tok)
    opening = [1]

    async def go():
        s = EpisodeScheduler(engine, SamplingParams(max_new_tokens=4), env=None, limits=TurnLimits(), max_rows=6,
                             opening=lambda: opening[0])
        s.start()
        try:
            await asyncio.sleep(0.3)  # groups opening: the wait is admission's
            opening[0] = 0
            await s.sample(_tasks(1)[0], 1)  # wakes the feeder: the next wait is counted anew
            await asyncio.sleep(0.3)  # nothing opening, nothing in flight: idle
            await asyncio.gather(*(s.sample(t, 2) for t in _tasks(1, 2, 3, 4, 5)))
            return dict(s.stats)
        finally:
            await s.close()

    stats = asyncio.run(go())
    assert stats["reserve_s"] >= 0.25 and stats["idle_s"] >= 0.25 and stats["env_s"] == 0
    # one call for the lone request, then 5 requests of 2 rows under max_rows 6: 3 rows of requests, then 2
    assert engine.calls == [1, 3, 2]
