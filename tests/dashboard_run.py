"""A long run's records, written to a real broker for the dashboard's scale test and benchmark.

`write_long_run(kafka, ns)` produces, with the real schemas and the checked producer, what a run of
`steps` trainer steps leaves on its topics: a trainer metric a step (reward, timings, off-policy
figures), a weight announcement a version, two explorers' and two stream-ops workers' metrics
every 10 steps, the launcher's start and end evals and an evaluator's every 100 versions, `groups`
experience groups of 8 multi-turn trajectories (model and tool turns), and the launcher's final
record. Seeded: the same call writes the same values.
"""
from __future__ import annotations

import math
import random

from streamrft.infra.kafka import ensure_topics, flush_or_raise, make_producer, run_topics
from streamrft.schemas import ExperienceGroup, Metric, Task, Trajectory, WeightVersion, encode, topic_name

T0 = 1_800_000_000.0


def _metric(role: str, role_id: str, step: int, values: dict, t: float) -> Metric:
    return Metric(role=role, role_id=role_id, step=step, values=values, created_at=t)


def write_long_run(kafka, ns: str, steps: int = 6000, groups: int = 1500, seed: int = 0,
                   finished: bool = True) -> dict:
    """Returns what was written: {"steps", "groups", "trajectories", "t_end"}."""
    rng = random.Random(seed)
    ensure_topics(kafka, run_topics(kafka, ns, ["default", "lab"]))
    p = make_producer(kafka)
    metrics, weights, experiences = (topic_name(ns, r) for r in ("metrics", "weights", "experiences"))
    at = lambda step: T0 + 0.5 * step  # noqa: E731  two steps a second
    p.produce(metrics, key=b"launcher", value=encode(_metric("eval", "launcher", 0, {"eval_reward": 0.2, "version": 0},
                                                             T0 - 1)))
    for step in range(1, steps + 1):
        level = 1 / (1 + math.exp(-(step - steps / 3) / (steps / 12)))
        p.produce(metrics, key=b"trainer", value=encode(_metric("trainer", "trainer-100", step, {
            "reward_mean": min(max(level + rng.gauss(0, 0.15), 0.0), 1.0), "version": step,
            "wait_s": abs(rng.gauss(0.2, 0.05)), "step_s": abs(rng.gauss(0.3, 0.02)), "publish_s": 0.05,
            "loop_latency_s": abs(rng.gauss(1.0, 0.2)), "iw_mean": 1 + rng.gauss(0, 0.02),
            "iw_max": 1 + abs(rng.gauss(0, 1)), "iw_ess": 0.95, "clip_frac_pos": 0.02, "clip_frac_neg": 0.03,
            "staleness_mean": rng.choice((0.5, 1.0, 1.5)), "count_trained": step * 64.0}, at(step))))
        p.produce(weights, key=b"policy", value=encode(WeightVersion(model="policy", version=step, bucket="b",
                                                                     prefix=f"policy/v{step}/", created_at=at(step))))
        if step % 10 == 0:
            for i in range(2):
                p.produce(metrics, key=b"explorer", value=encode(_metric("explorer", f"explorer-{i}-{200 + i}", step, {
                    "version": step - i, "generate_s": step * 0.3, "env_s": step * 0.1, "wall_s": step * 0.5},
                    at(step))))
                p.produce(metrics, key=b"so", value=encode(_metric("stream_ops", f"vm-{300 + i}", step, {
                    "latency_p50_s": 0.07 + rng.random() * 0.001, "latency_max_s": 0.2}, at(step))))
        if step % 100 == 0:
            p.produce(metrics, key=b"evaluator", value=encode(_metric("eval", "evaluator-400", step, {
                "eval_reward": min(level + 0.05, 1.0), "version": step}, at(step) + 5)))
        if step % 500 == 0:
            p.poll(0)
    trajectories = 0
    for g in range(groups):
        step = 1 + g * steps // groups
        team = "lab" if g % 5 == 0 else "default"
        task = Task(task_id=f"task-{g % 400}", prompt=f"guess 1-8 (task {g % 400}):", answer=str(1 + g % 8))
        base = rng.random()
        trajs, rewards = [], []
        for k in range(8):
            model, tool = [rng.randrange(3, 40) for _ in range(3)], [rng.randrange(3, 40) for _ in range(4)]
            response = model + tool + model
            trajs.append(Trajectory(group_id=f"g{g}", task_id=task.task_id, team=team, model_version=max(step - k % 3, 0),
                                    prompt_ids=[1, 2, 3, 4], response_ids=response, logprobs=[-0.5] * len(response),
                                    loss_mask=[1] * 3 + [0] * 4 + [1] * 3,
                                    finish_reason="length" if k == 7 and g % 10 == 0 else "stop"))
            rewards.append(min(max(base + rng.gauss(0, 0.1), 0.0), 1.0))
        mean = sum(rewards) / len(rewards)
        eg = ExperienceGroup(group_id=f"g{g}", team=team, task=task, trajectories=trajs, rewards=rewards,
                             advantages=[r - mean for r in rewards], reward_components={"env": rewards},
                             created_at=at(step) + 0.2)
        p.produce(experiences, key=eg.group_id.encode(), value=encode(eg))
        trajectories += len(trajs)
        if g % 200 == 0:
            p.poll(0)
    t_end = at(steps) + 10
    p.produce(metrics, key=b"launcher", value=encode(_metric("eval", "launcher", steps, {
        "eval_reward": 0.9, "version": steps}, t_end)))
    if finished:
        p.produce(metrics, key=b"launcher", value=encode(_metric("run", "launcher", steps, {
            "eval_reward_start": 0.2, "eval_reward_end": 0.9, "versions": steps, "trajectories": trajectories,
            "trained": steps * 64, "stale": 0, "stale_pct": 0.0, "wall_s": t_end - T0}, t_end + 1)))
    flush_or_raise(p)
    return {"steps": steps, "groups": groups, "trajectories": trajectories, "t_end": t_end}
