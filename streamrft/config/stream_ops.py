"""Stream ops: reward terms, filtering, priority."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from streamrft.config.base import _FINITE, CLEANING_OP_TYPES, REWARD_NAMES, Section, _choice


class FeedbackParams(Section):
    """The `feedback` term's params: rewards that arrive later on `<ns>.feedback.<team>`
    (docs/feedback.md). A group with this term is parked until each of its trajectories has
    `min_rated` ratings, then scored with every term, this one the ratings' aggregate."""

    min_rated: int = Field(1, ge=1, le=1000)
    """Ratings each trajectory needs (with `bradley_terry`: preferences it appears in)."""
    aggregate: Literal["mean", "majority", "bradley_terry"] = "mean"
    """`mean` of scalar rewards and labels' values; the `majority` label's value; `bradley_terry`:
    centred log-strengths fitted to the preferences among the group's trajectories."""
    wait_s: float = Field(600.0, gt=0, le=7 * 86400, **_FINITE)
    """How long a parked group waits for its ratings, and a rating for its group."""
    labels: dict[str, float] = Field(default_factory=dict)
    """Allowed labels and their reward values, in tie-breaking order (e.g. {good: 1, bad: 0})."""
    on_timeout: Literal["drop", "dead_letter", "fallback"] = "drop"
    """A group still short of ratings after `wait_s`: `drop` (counted, never trained),
    `dead_letter` (to the DLQ with its rollouts record's place), `fallback` (scored with
    `fallback_term`'s values in this term's place)."""
    fallback_term: str | None = None
    """With `on_timeout: fallback`: the label of another configured term (its name, or
    `import_path`), e.g. a judge given weight 0 so that it counts only then."""
    teams: list[str] | None = None
    """Teams whose feedback topics may rate this run's groups; None: a group's own team only."""

    @model_validator(mode="after")
    def _consistent(self) -> "FeedbackParams":
        if self.aggregate == "majority" and not self.labels:
            raise ValueError("aggregate='majority' needs labels (e.g. {good: 1.0, bad: 0.0})")
        if (self.on_timeout == "fallback") != (self.fallback_term is not None):
            raise ValueError(f"on_timeout={self.on_timeout!r} and fallback_term={self.fallback_term!r}: "
                             "fallback_term is set exactly when on_timeout is 'fallback'")
        return self


FEEDBACK = "feedback"


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

    @field_validator("params")
    @classmethod
    def _feedback_params(cls, v: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        if info.data.get("name") == FEEDBACK and not info.data.get("import_path"):
            return FeedbackParams.model_validate(v).model_dump()
        return v

    def feedback(self) -> FeedbackParams | None:
        """This term's feedback params, if it is the `feedback` term."""
        return FeedbackParams(**self.params) if self.name == FEEDBACK and not self.import_path else None


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

    @model_validator(mode="after")
    def _one_feedback_term(self) -> "StreamOpsConfig":
        terms = [t for t in self.rewards if t.feedback() is not None]
        if len(terms) > 1:
            raise ValueError(f"stream_ops.rewards has {len(terms)} feedback terms; at most one")
        if terms and terms[0].feedback().fallback_term is not None:
            fallback = terms[0].feedback().fallback_term
            labels = [t.import_path or t.name for t in self.rewards if t.feedback() is None]
            if fallback not in labels:
                raise ValueError(f"stream_ops.rewards: the feedback term's fallback_term={fallback!r} is not one of "
                                 f"the other terms {labels}")
        return self

    def feedback(self) -> "RewardTerm | None":
        """The `feedback` reward term, if configured: its groups are parked for the feedback join."""
        return next((t for t in self.rewards if t.feedback() is not None), None)

    drop_zero_variance: bool = True
    """Filter groups whose rewards are all equal (no learning signal under group baselines)."""
    priority: Literal["fifo", "reward_std", "abs_advantage"] = "reward_std"
    workers: int = Field(1, ge=1)
    threads: int = Field(32, ge=1, le=1024)
    """Threads per worker for blocking rewards (local models, sandboxes): how many calls run at
    once; a local model batches the calls waiting together."""
    ops: list[CleaningOp] = Field(default_factory=list)
    """Data cleaning ops, applied in order to each group before scoring (docs/cleaning.md)."""
