"""Held-out evaluation: greedy decoding on the eval tasks, scored with the run's reward terms."""
from __future__ import annotations

from streamrft.config import RewardTerm
from streamrft.engine.rollout.base import RolloutEngine, SamplingParams
from streamrft.producers.workflows import encode_prompt
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
