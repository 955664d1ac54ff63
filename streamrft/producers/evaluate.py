"""Held-out evaluation on the eval tasks, scored with the run's reward terms.

`evaluate_run` is what explorers and `streamrft run` call: the run's workflow plays one greedy
completion or episode per task, or `eval.samples` of each at `eval.temperature` with the fixed
`eval.seed` (`evaluate_workflow`), scored as stream ops score it: the `env` term included, and a
reward that asks for `task` / `trajectory` gets them, single-turn or not.
"""
from __future__ import annotations

from streamrft.config import RunConfig
from streamrft.engine.rollout.base import RolloutEngine, SamplingParams
from streamrft.producers.workflows import Workflow, make_workflow
from streamrft.schemas import Task


def evaluate_workflow(workflow: Workflow, engine: RolloutEngine, tasks: list[Task], cfg: RunConfig,
                      failures: dict | None = None) -> float:
    """Mean reward over the trajectories of the eval's completions or episodes of each task (greedy: one;
    sampled: `eval.samples`; step-wise: per step), each scored with `eval.rewards` (default
    `stream_ops.rewards`) exactly as stream ops score it. `failures`: the workflow's count of episodes their environment ended
    (`env_errors`, `env_timeouts`), each of which scores 0."""
    from streamrft.stream_ops.scoring import resolve_rewards, score_group

    if not tasks:
        raise ValueError("no eval tasks")
    ex = cfg.explorer
    ev = cfg.eval
    params = SamplingParams(n=1, max_new_tokens=ex.sampling.max_new_tokens, temperature=0.0)
    if ev.temperature > 0:  # the explorers' top-p / top-k, at the eval's own temperature and seed
        params = SamplingParams(n=ev.samples, max_new_tokens=ex.sampling.max_new_tokens, temperature=ev.temperature,
                                top_p=ex.sampling.top_p, top_k=ex.sampling.top_k, seed=ev.seed)
    groups = workflow(engine, tasks, params, version=engine.version, team=ex.team, chat=ex.chat_template)
    terms = resolve_rewards(cfg, cfg.eval.rewards)
    rewards = [r for g in groups for r in score_group(g, terms, None, {}, False, "fifo").rewards]
    failed = sum((failures or {}).get(k, 0) for k in ("env_errors", "env_timeouts"))
    rewards += [0.0] * failed
    return sum(rewards) / len(rewards)


def evaluate_run(engine: RolloutEngine, tasks: list[Task], cfg: RunConfig) -> float:
    """The run's held-out eval reward, as its workflow plays the tasks: every episode that ended
    normally is scored, every one its environment ended scores 0. With a slow tool
    (`explorer.env.latency`) the eval's episodes are scheduled one by one whatever the run's
    scheduling, so that an eval takes the same time in every scheduling."""
    failures: dict = {}
    ex = cfg.explorer
    if ex.env is not None and ex.env.latency is not None and ex.scheduling == "lockstep":
        # a slow tool measures the scheduling, not the policy: the eval's episodes wait for it together
        ex = ex.model_copy(update={"scheduling": "per_episode"})
    return evaluate_workflow(make_workflow(ex, stats=failures, min_episodes=1), engine, tasks, cfg, failures)
