"""What every config section shares: the base class, the error, YAML 1.2 floats, and the names of
registered parts (plain tuples, so validating a config never imports torch; tests check they match
the registries in `streamrft.engine.algorithms`, `streamrft.stream_ops.rewards`,
`streamrft.producers.workflows`, `streamrft.producers.envs` and `streamrft.producers.task_selection`)."""
from __future__ import annotations

import re

import yaml
from pydantic import BaseModel, ConfigDict

ALGORITHM_TYPES = ("grpo", "dr_grpo", "ppo", "rloo", "reinforce_pp", "gspo", "cispo", "opd", "sft", "dpo", "kto")
ADVANTAGE_TYPES = ("grpo", "dr_grpo", "rloo", "reinforce_pp", "gae", "opmd", "opd")
POLICY_LOSS_TYPES = ("ppo", "pg", "gspo", "cispo", "decoupled_ppo", "sft")
KL_ESTIMATOR_TYPES = ("k1", "k2", "k3", "low_var_kl")
AGGREGATION_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
OFFLINE_TYPES = ("sft", "dpo", "kto")
# `streamrft.stream_ops.rewards.REWARDS` plus `env` (scoring.ENV_TERM: the trajectory's env_reward)
# and `feedback` (scoring.FEEDBACK_TERM: ratings that arrive later, joined by the feedback join)
REWARD_NAMES = ("exact_match", "math_verify", "format", "reverse", "weighted_mix", "judge", "reward_model", "code_tests",
                "env", "feedback")
CLEANING_OP_TYPES = ("length", "repetition", "charset", "dedup", "prompt_copy")  # streamrft.stream_ops.ops.OPS
WORKFLOW_TYPES = ("single_turn", "multi_turn", "step_wise")  # streamrft.producers.workflows.WORKFLOWS
ENV_TYPES = ("guess_number", "calculator")  # streamrft.producers.envs.ENVIRONMENTS
TASK_SELECTOR_TYPES = ("sequential", "random", "difficulty")  # streamrft.producers.task_selection.SELECTORS

_PORT = {"ge": 1, "le": 65535}
_FINITE = {"allow_inf_nan": False}


class _Loader(yaml.SafeLoader):
    """YAML 1.2 floats: PyYAML (YAML 1.1) reads `1e-6` as a string, wrong wherever the type is Any."""


_Loader.add_implicit_resolver("tag:yaml.org,2002:float", re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+$"),
                              list("-+0123456789."))


class ConfigError(ValueError):
    """A config value is wrong; the message names the field and what is allowed."""


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


def _choice(value: str | None, allowed: tuple[str, ...], field: str) -> str | None:
    if value is not None and value not in allowed:
        raise ValueError(f"{field}={value!r} is not one of {list(allowed)}")
    return value
