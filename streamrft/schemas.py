"""Every message on every topic, one pydantic model each, and the one msgpack codec.

Wire format: msgpack of the model's dict (`model_dump()`; bytes stay msgpack bin), tagged with `kind` and a
`schema` version; nothing is pickled. `streamrft schema NAME` prints the JSON Schema of a model so
producers in any language can follow it. Decoding failures raise `DecodeError` naming the field.
"""
from __future__ import annotations

import math
import re
import time
import uuid
from typing import Any, Literal

import msgpack
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

SCHEMA_VERSION = 1


def _now() -> float:
    return time.time()


def new_id() -> str:
    return uuid.uuid4().hex


class Message(BaseModel):
    """Base of every wire message: a `kind` tag, a schema version, a creation time (epoch s)."""

    model_config = ConfigDict(extra="forbid", frozen=False)

    schema_version: int = Field(SCHEMA_VERSION, alias="schema", description="wire schema version")
    created_at: float = Field(default_factory=_now, description="epoch seconds when created")

    @field_validator("schema_version")
    @classmethod
    def _known_schema(cls, v: int) -> int:
        if v < 1 or v > SCHEMA_VERSION:
            raise ValueError(f"unsupported schema version {v}; this reader knows 1..{SCHEMA_VERSION}")
        return v


class Task(Message):
    """One prompt to explore, with what a verifier needs to score it."""

    kind: Literal["task"] = "task"
    task_id: str = Field(default_factory=new_id)
    prompt: str = Field(description="the prompt text (or a chat rendered by the workflow)")
    answer: str | None = Field(None, description="ground truth for verifiers, if any")
    prompt_ids: list[int] | None = Field(None, description="pre-tokenised prompt, optional")
    metadata: dict[str, Any] = Field(default_factory=dict)


class Trajectory(Message):
    """One sampled response to a task, with the behaviour log-prob of every generated token.

    For multi-turn runs `response_ids` holds every token after the prompt (model turns and
    environment/tool turns interleaved); `loss_mask` is 1 on model tokens, 0 on the others, and
    `logprobs` is 0.0 where the mask is 0.
    """

    kind: Literal["trajectory"] = "trajectory"
    traj_id: str = Field(default_factory=new_id, description="globally unique; the trainer dedups on it")
    group_id: str
    task_id: str
    team: str = "default"
    model_version: int = Field(ge=0, description="weight version that generated it")
    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float] = Field(description="behaviour log-prob of each response token")
    loss_mask: list[int] | None = Field(None, description="1 = train on this token; default all 1")
    response_text: str = ""
    env_reward: float | None = Field(None, description="reward given by the environment, if any")
    finish_reason: str = "stop"
    info: dict[str, Any] = Field(default_factory=dict)

    @field_validator("prompt_ids", "response_ids")
    @classmethod
    def _token_ids(cls, v: list[int]) -> list[int]:
        if any(t < 0 for t in v):
            raise ValueError("token ids must be >= 0")
        return v

    @field_validator("logprobs")
    @classmethod
    def _logprobs(cls, v: list[float], info: ValidationInfo) -> list[float]:
        for lp in v:
            if not math.isfinite(lp) or lp > 1e-4:
                raise ValueError(f"log-probs must be finite and <= 0, got {lp}")
        n = len(info.data.get("response_ids", v))
        if len(v) != n:
            raise ValueError(f"logprobs has {len(v)} entries for {n} response tokens")
        return v

    @field_validator("loss_mask")
    @classmethod
    def _loss_mask(cls, v: list[int] | None, info: ValidationInfo) -> list[int] | None:
        if v is None:
            return v
        n = len(info.data.get("response_ids", v))
        if len(v) != n:
            raise ValueError(f"loss_mask has {len(v)} entries for {n} response tokens")
        if any(m not in (0, 1) for m in v):
            raise ValueError("loss_mask entries must be 0 or 1")
        return v

    @field_validator("prompt_ids")
    @classmethod
    def _prompt(cls, v: list[int]) -> list[int]:
        if not v:
            raise ValueError("prompt_ids is empty")
        return v

    def mask(self) -> list[int]:
        return self.loss_mask if self.loss_mask is not None else [1] * len(self.response_ids)


class RolloutGroup(Message):
    """The n trajectories of one task, published together once all n are done."""

    kind: Literal["rollout_group"] = "rollout_group"
    group_id: str = Field(default_factory=new_id)
    team: str = "default"
    task: Task
    trajectories: list[Trajectory] = Field(min_length=1)
    producer_id: str = ""

    @field_validator("trajectories")
    @classmethod
    def _consistent(cls, v: list[Trajectory], info: ValidationInfo) -> list[Trajectory]:
        group_id, task = info.data.get("group_id"), info.data.get("task")
        for t in v:
            if group_id is not None and t.group_id != group_id:
                raise ValueError(f"trajectory {t.traj_id} has group_id {t.group_id}, group is {group_id}")
            if task is not None and t.task_id != task.task_id:
                raise ValueError(f"trajectory {t.traj_id} has task_id {t.task_id}, task is {task.task_id}")
        ids = [t.traj_id for t in v]
        if len(set(ids)) != len(ids):
            raise ValueError("duplicate traj_id inside the group")
        return v


class ExperienceGroup(Message):
    """A scored group: rewards and advantages per trajectory, and a replay priority."""

    kind: Literal["experience_group"] = "experience_group"
    group_id: str
    team: str = "default"
    task: Task
    trajectories: list[Trajectory] = Field(min_length=1)
    rewards: list[float]
    advantages: list[float]
    reward_components: dict[str, list[float]] = Field(default_factory=dict)
    priority: float = 0.0
    source_topic: str = ""
    source_partition: int = -1
    source_offset: int = -1

    @field_validator("rewards", "advantages")
    @classmethod
    def _lengths(cls, v: list[float], info: ValidationInfo) -> list[float]:
        n = len(info.data.get("trajectories", v))
        if len(v) != n:
            raise ValueError(f"{n} trajectories but {len(v)} {info.field_name}")
        return v


class WeightVersion(Message):
    """Announces a published weight version; the manifest in S3 is the source of truth."""

    kind: Literal["weight_version"] = "weight_version"
    model: str
    version: int = Field(ge=0)
    bucket: str
    prefix: str = Field(description="object prefix, e.g. 'policy/v3/'")
    manifest_sha256: str = ""
    step: int = 0
    adapter_only: bool = False


class Metric(Message):
    """A batch of scalar metrics from one role at one step."""

    kind: Literal["metric"] = "metric"
    role: str
    role_id: str
    step: int = 0
    values: dict[str, float]


class DeadLetter(Message):
    """A record that could not be processed: the original bytes plus why and where from."""

    kind: Literal["dead_letter"] = "dead_letter"
    reason: str
    error_type: str = ""
    source_topic: str
    source_partition: int = -1
    source_offset: int = -1
    role: str = ""
    key: bytes | None = None
    value: bytes


MESSAGES: dict[str, type[Message]] = {
    m.model_fields["kind"].default: m
    for m in (Task, Trajectory, RolloutGroup, ExperienceGroup, WeightVersion, Metric, DeadLetter)
}

# topic role -> message type; the full name is f"{namespace}.{role}" (rollouts: ".<team>")
TOPICS: dict[str, type[Message]] = {
    "tasks": Task,
    "rollouts": RolloutGroup,
    "experiences": ExperienceGroup,
    "weights": WeightVersion,
    "metrics": Metric,
    "dlq": DeadLetter,
}


def topic_name(namespace: str, role: str, team: str | None = None) -> str:
    if role not in TOPICS:
        raise ValueError(f"unknown topic role {role!r}; allowed: {sorted(TOPICS)}")
    if role == "rollouts":
        return f"{namespace}.rollouts.{team or 'default'}"
    return f"{namespace}.{role}"


def rollouts_pattern(namespace: str) -> str:
    """Regex that matches every team's rollouts topic (for pattern subscriptions)."""
    return "^" + re.escape(namespace) + r"\.rollouts\..+"


class DecodeError(ValueError):
    """Bytes that are not a valid message. `field` is the dotted path of the first bad field."""

    def __init__(self, field: str, problem: str):
        self.field = field
        self.problem = problem
        super().__init__(f"{field}: {problem}")


def encode(msg: Message) -> bytes:
    return msgpack.packb(msg.model_dump(by_alias=True), use_bin_type=True)


def decode(data: bytes, expected: type[Message] | None = None) -> Message:
    """Decode bytes into the message type named by their `kind` (checked against `expected`)."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise DecodeError("<bytes>", f"expected bytes, got {type(data).__name__}")
    if not data:
        raise DecodeError("<bytes>", "empty payload")
    try:
        obj = msgpack.unpackb(bytes(data), raw=False, strict_map_key=True)
    except Exception as e:  # msgpack raises several unrelated types for bad input
        raise DecodeError("<bytes>", f"not valid msgpack ({type(e).__name__}: {e})") from None
    if not isinstance(obj, dict):
        raise DecodeError("<root>", f"expected a map, got {type(obj).__name__}")
    kind = obj.get("kind")
    cls = MESSAGES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise DecodeError("kind", f"unknown message kind {kind!r}; allowed: {sorted(MESSAGES)}")
    if expected is not None and cls is not expected:
        raise DecodeError("kind", f"expected {expected.model_fields['kind'].default!r}, got {kind!r}")
    try:
        return cls.model_validate(obj)
    except ValidationError as e:
        err = e.errors()[0]
        field = ".".join(str(p) for p in err["loc"]) or "<root>"
        raise DecodeError(field, err["msg"]) from None


def json_schema(name: str) -> dict:
    if name not in MESSAGES:
        raise ValueError(f"unknown message {name!r}; allowed: {sorted(MESSAGES)}")
    return MESSAGES[name].model_json_schema(by_alias=True)
