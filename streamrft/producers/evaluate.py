"""Held-out evaluation: greedy decoding on the eval tasks, scored with the run's reward terms."""
from __future__ import annotations

from streamrft.config import RewardTerm
from streamrft.engine.rollout.base import RolloutEngine, SamplingParams
from streamrft.producers.workflows import encode_prompt
from streamrft.schemas import Task
from streamrft.stream_ops.rewards import resolve_reward


def weighted_reward(terms: list[RewardTerm], response: str, answer: str | None) -> float:
    return sum(t.weight * resolve_reward(t.name, t.import_path)(response, answer, **t.params) for t in terms)


def evaluate(engine: RolloutEngine, tasks: list[Task], terms: list[RewardTerm], max_new_tokens: int,
             chat: bool = False) -> float:
    """Mean reward of greedy completions over `tasks`."""
    if not tasks:
        raise ValueError("no eval tasks")
    prompts = [encode_prompt(engine.tokenizer, t, chat) for t in tasks]
    outs = engine.generate(prompts, SamplingParams(n=1, max_new_tokens=max_new_tokens, temperature=0.0))
    return sum(weighted_reward(terms, o[0].text, t.answer) for t, o in zip(tasks, outs)) / len(tasks)
