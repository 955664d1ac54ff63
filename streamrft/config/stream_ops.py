"""Stream ops: reward terms, filtering, priority."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from streamrft.config.base import _FINITE, CLEANING_OP_TYPES, REWARD_NAMES, Section, _choice


class RewardTerm(Section):
    import_path: str | None = None
    """`pkg.module:function` for your own reward; wins over `name`."""
    name: str | None = None
    """A reward in `streamrft.stream_ops.rewards.REWARDS`, or `env` (the environment's reward)."""
    weight: float = Field(1.0, **_FINITE)
    """Any finite number: a negative weight makes the term a penalty."""
    params: dict[str, Any] = Field(default_factory=dict)
    timeout_s: float = Field(30.0, gt=0, le=3600, **_FINITE)
    """Slow terms only (async or blocking rewards: judge, reward_model, code_tests): seconds one
    attempt on one trajectory may take before it counts as failed."""
    retries: int = Field(2, ge=0, le=10)
    """Slow terms only: attempts after the first when one fails or times out."""
    backoff_s: float = Field(0.5, ge=0, le=60, **_FINITE)
    """Slow terms only: wait before the first retry, doubled before each next one."""
    fallback: float | None = Field(None, **_FINITE)
    """Slow terms only: the value a trajectory scores when every attempt failed; unset (the
    default): the group is dead-lettered with the reason."""

    @field_validator("name")
    @classmethod
    def _known(cls, v: str | None, info: ValidationInfo) -> str | None:
        # declared after import_path so it is known here: a user's function skips the name check
        if info.data.get("import_path"):
            return v
        return _choice(v, REWARD_NAMES, "name")

    @model_validator(mode="after")
    def _named(self) -> "RewardTerm":
        if not self.name and not self.import_path:
            raise ValueError("a reward term needs `name` or `import_path`")
        return self


class CleaningOp(Section):
    """One data cleaning op (docs/cleaning.md): a `type` from `streamrft.stream_ops.ops.OPS`, or your own."""

    import_path: str | None = None
    """`pkg.module:make` for your own op factory; wins over `type`."""
    type: str | None = None
    """One of length, repetition, charset, dedup, prompt_copy."""
    params: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments of the op's `make` (checked when the worker builds it)."""

    @field_validator("type")
    @classmethod
    def _known(cls, v: str | None, info: ValidationInfo) -> str | None:
        if info.data.get("import_path"):
            return v
        return _choice(v, CLEANING_OP_TYPES, "type")

    @model_validator(mode="after")
    def _named(self) -> "CleaningOp":
        if not self.type and not self.import_path:
            raise ValueError(f"a cleaning op needs `type` (one of {list(CLEANING_OP_TYPES)}) or `import_path`")
        return self


class StreamOpsConfig(Section):
    rewards: list[RewardTerm] = Field(default_factory=lambda: [RewardTerm(name="exact_match")], min_length=1)
    drop_zero_variance: bool = True
    """Filter groups whose rewards are all equal (no learning signal under group baselines)."""
    priority: Literal["fifo", "reward_std", "abs_advantage"] = "reward_std"
    workers: int = Field(1, ge=1)
    threads: int = Field(32, ge=1, le=1024)
    """Threads per worker for blocking rewards (local models, sandboxes): how many calls run at
    once; a local model batches the calls waiting together."""
    ops: list[CleaningOp] = Field(default_factory=list)
    """Data cleaning ops, applied in order to each group before scoring (docs/cleaning.md)."""
