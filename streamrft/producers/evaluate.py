"""Held-out evaluation: greedy decoding on the eval tasks, scored with the run's reward terms.

`evaluate_run` is what explorers and `streamrft run` call: single-turn completions (`evaluate`), or
for a multi-turn workflow greedy episodes (`evaluate_episodes`) scored as stream ops score them,
the environment's `env` term included.
"""
from __future__ import annotations

from streamrft.config import RewardTerm, RunConfig
from streamrft.engine.rollout.base import RolloutEngine, SamplingParams
from streamrft.producers.workflows import Workflow, encode_prompt, make_workflow
from streamrft.schemas import Task
from streamrft.stream_ops.rewards import resolve_reward


def evaluate(engine: RolloutEngine, tasks: list[Task], terms: list[RewardTerm], max_new_tokens: int,
             chat: bool = False) -> float:
    """Mean reward of greedy completions over `tasks`."""
    if not tasks:
        raise ValueError("no eval tasks")
    prompts = [encode_prompt(engine.tokenizer, t, chat) for t in tasks]
    outs = engine.generate(prompts, SamplingParams(n=1, max_new_tokens=max_new_tokens, temperature=0.0))
    rewards = [(t.weight, resolve_reward(t.name, t.import_path), t.params) for t in terms]  # look up once

    def score(response: str, answer: str | None) -> float:
        return sum(w * fn(response, answer, **params) for w, fn, params in rewards)

    return sum(score(o[0].text, t.answer) for t, o in zip(tasks, outs)) / len(tasks)


def evaluate_episodes(workflow: Workflow, engine: RolloutEngine, tasks: list[Task], cfg: RunConfig) -> float:
    """Mean reward over the trajectories of one greedy episode per task (step-wise: per step),
    each scored with `stream_ops.rewards` exactly as stream ops score it."""
    from streamrft.stream_ops.scoring import resolve_rewards, score_group

    if not tasks:
        raise ValueError("no eval tasks")
    ex = cfg.explorer
    params = SamplingParams(n=1, max_new_tokens=ex.sampling.max_new_tokens, temperature=0.0)
    groups = workflow(engine, tasks, params, version=engine.version, team=ex.team, chat=ex.chat_template)
    terms = resolve_rewards(cfg)
    rewards = [r for g in groups for r in score_group(g, terms, None, {}, False, "fifo").rewards]
    return sum(rewards) / len(rewards)


def evaluate_run(engine: RolloutEngine, tasks: list[Task], cfg: RunConfig) -> float:
    """The run's held-out eval reward, as its workflow plays the tasks."""
    ex = cfg.explorer
    if ex.workflow_import_path is None and ex.workflow == "single_turn":
        return evaluate(engine, tasks, cfg.stream_ops.rewards, ex.sampling.max_new_tokens, ex.chat_template)
    return evaluate_episodes(make_workflow(ex), engine, tasks, cfg)
