"""Every message on every topic, one pydantic model each, and the one msgpack codec.

Wire format: msgpack of the model's dict (`model_dump()`), tagged with `kind` and a `schema` version;
nothing is pickled. `streamrft schema NAME` prints a model's JSON Schema: it is the whole wire
contract. `decode` enforces exactly it, with no type coercion, plus the rules across fields that a
JSON Schema cannot state (the models' descriptions spell those out). Models built in Python keep
pydantic's usual conversions but every bound, so what a role builds is what `decode` accepts.
"""
from __future__ import annotations

import math
import re
import time
import uuid
from typing import Annotated, Any, Literal

import msgpack
from pydantic import (AfterValidator, BaseModel, ConfigDict, Field, ValidationError, ValidationInfo,
                      field_validator, model_validator)
from pydantic_core import PydanticCustomError
from pydantic_core import core_schema as cs

SCHEMA_VERSION = 3
"""1: the first wire format. 2: `Trajectory.turn_versions` (an episode whose turns different weight
versions sampled). 3: `Task.images` and `Trajectory.images` (references to images in S3). A version 1 record still decodes:
its tokens are all its `model_version`'s; a version 1 or 2 task has no images."""
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
LOGPROB_MAX = 1e-4  # engines' float rounding can leave a sampled token's log-prob a hair above 0
MAX_JSON_DEPTH = 10  # arrays/objects nested in a free-form field, the field's own object included

WIRE_RULES = (
    "A message is a msgpack map (the JSON object below). Types are exact: integers are msgpack "
    "integers (a float such as 3.0 is not an integer here, although JSON Schema's 'integer' admits it), "
    "a string is never a number, a boolean never a number. Numbers are finite. No field outside the schema. "
    "Rules across fields are stated in the descriptions and are enforced by the decoder."
)


def _now() -> float:
    return time.time()


def new_id() -> str:
    return uuid.uuid4().hex


# ---- field types --------------------------------------------------------------------------------
# Every integer is bounded within signed 64 bits, so every decoded message encodes again (msgpack
# stops at 64 bits; a decimal string of 10**23 once got through and crashed the encoder).
Count = Annotated[int, Field(ge=0, le=INT64_MAX)]  # token ids, versions, steps
Bit = Annotated[int, Field(ge=0, le=1)]
Partition = Annotated[int, Field(ge=-1, le=2**31 - 1, description="Kafka partition; -1 = unknown")]
Offset = Annotated[int, Field(ge=-1, le=INT64_MAX, description="Kafka offset; -1 = unknown")]
LogProb = Annotated[float, Field(le=LOGPROB_MAX)]
Id = Annotated[str, Field(min_length=1, max_length=256)]
Name = Annotated[str, Field(max_length=256)]
TopicName = Annotated[str, Field(max_length=249)]  # Kafka's limit
# a team names its rollouts topic `<ns>.rollouts.<team>`, so only topic-name characters
Team = Annotated[str, Field(pattern=r"^[A-Za-z0-9._-]+$", max_length=200,
                            description="team name: letters, digits, '.', '_', '-'")]


class _NotJson(Exception):
    """Raised by `_check_json`; `path` is filled in on the way out."""

    def __init__(self, problem: str):
        self.path: list[str] = []
        self.problem = problem


def _check_json(value: Any, levels: int) -> None:
    """Raise `_NotJson` unless `value` is a JSON value with at most `levels` nested arrays/objects."""
    if isinstance(value, (str, bool)) or value is None:
        return
    if isinstance(value, (int, float)):
        if not INT64_MIN <= value <= INT64_MAX:  # NaN fails this too
            raise _NotJson(f"{value!r} is not a finite number" if isinstance(value, float) and not math.isfinite(value)
                           else f"{value!r} is outside [-2^63, 2^63-1]")
        return
    if not isinstance(value, (dict, list)):
        raise _NotJson(f"a {type(value).__name__} is not a JSON value")
    if levels <= 0:
        raise _NotJson(f"arrays/objects nested deeper than {MAX_JSON_DEPTH} levels")
    if isinstance(value, dict):
        for key in value:
            if not isinstance(key, str):
                raise _NotJson(f"object key {key!r} is not a string")
    for key, item in (value.items() if isinstance(value, dict) else enumerate(value)):
        try:
            _check_json(item, levels - 1)
        except _NotJson as e:
            e.path.insert(0, str(key))
            raise


def _json_object(value: dict[str, Any]) -> dict[str, Any]:
    try:
        _check_json(value, MAX_JSON_DEPTH)
    except _NotJson as e:
        raise PydanticCustomError("json_value", "{problem}", {"at": ".".join(e.path), "problem": e.problem}) from None
    return value


class _JsonValueSchema:
    """JSON Schema of `JsonObject`: one definition per nesting level, as the depth bound needs."""

    @staticmethod
    def _level(k: int) -> cs.CoreSchema:
        def render(_core: Any, handler: Any) -> dict[str, Any]:
            out: dict[str, Any] = {
                "description": f"a JSON value with at most {k} nested arrays/objects; numbers in [-2^63, 2^63-1]",
                "type": ["null", "boolean", "number", "string"] + (["array", "object"] if k else []),
                "minimum": INT64_MIN, "maximum": INT64_MAX}
            if k:
                inner = handler(cs.definition_reference_schema(f"JsonValueDepth{k - 1}"))
                out["items"] = out["additionalProperties"] = inner
            return out
        return cs.any_schema(ref=f"JsonValueDepth{k}", metadata={"pydantic_js_functions": [render]})

    def __get_pydantic_json_schema__(self, _core: Any, handler: Any) -> dict[str, Any]:
        top = cs.dict_schema(cs.str_schema(), cs.definition_reference_schema(f"JsonValueDepth{MAX_JSON_DEPTH - 1}"))
        return handler(cs.definitions_schema(top, [self._level(k) for k in range(MAX_JSON_DEPTH)]))


# free-form data (Task.metadata, Trajectory.info): JSON values only, so every language can read them
JsonObject = Annotated[dict[str, Any], AfterValidator(_json_object), _JsonValueSchema()]
FREE_FORM = f"free-form JSON object: arrays/objects nested at most {MAX_JSON_DEPTH} deep, this one included"


def _error_at(at: str, problem: str) -> PydanticCustomError:
    """A validation error whose `at` extends the failing field's path (see `decode`): "trajectories" + "1.team"."""
    return PydanticCustomError("cross_field", "{problem}", {"at": at, "problem": problem})


def _wire_json_schema(schema: dict[str, Any]) -> None:
    # `kind` is required on the wire; Python code may leave it out, the model knows its own kind
    schema["properties"]["kind"].pop("default", None)
    schema["required"] = ["kind", *(r for r in schema.get("required", []) if r != "kind")]


_WIRE: dict[str, bool] = {"wire": True}  # validation context of `decode`


class Message(BaseModel):
    """Base of every wire message: a `kind` tag, a schema version, a creation time (epoch s)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, json_schema_extra=_wire_json_schema)

    schema_version: int = Field(SCHEMA_VERSION, alias="schema", ge=1, le=SCHEMA_VERSION,
                                json_schema_extra={"enum": list(range(1, SCHEMA_VERSION + 1))},
                                description="wire schema version")
    created_at: float = Field(default_factory=_now, description="epoch seconds when created (finite)")

    @model_validator(mode="before")
    @classmethod
    def _kind_on_the_wire(cls, data: Any, info: ValidationInfo) -> Any:
        # Python code may leave `kind` out (the model knows its own); a wire message may not
        if info.context is _WIRE and isinstance(data, dict) and "kind" not in data:
            raise _error_at("kind", "Field required: every message, nested ones too, names its kind")
        return data


MAX_IMAGE_SIDE = 16384  # pixels: a reference naming a larger side is refused on the wire
MAX_IMAGES = 16  # images one task may carry
IMAGE_MIMES = ("image/png", "image/jpeg", "image/webp", "image/gif")


class ImageRef(BaseModel):
    """An image stored once in S3 by content hash (`s3://<bucket>/<ns>/media/<sha256>.<ext>`): records
    carry this reference, never the pixels. Readers fetch it by `uri` and check its bytes against
    `sha256`, and the decoded image against `width`, `height` and `mime` (`infra/media.py`)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="the image file's sha256, lowercase hex")
    uri: str = Field(pattern=r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]/\S+$", max_length=1024,
                     description="s3://<bucket>/<key> of the image file")
    width: int = Field(ge=1, le=MAX_IMAGE_SIDE, description="pixels")
    height: int = Field(ge=1, le=MAX_IMAGE_SIDE, description="pixels")
    mime: Literal[IMAGE_MIMES] = Field(description="the file's format")


class Task(Message):
    """One prompt to explore, with what a verifier needs to score it."""

    kind: Literal["task"] = "task"
    task_id: Id = Field(default_factory=new_id)
    prompt: str = Field(description="the prompt text (or a chat rendered by the workflow)")
    answer: str | None = Field(None, description="ground truth for verifiers, if any")
    prompt_ids: list[Count] | None = Field(None, description="pre-tokenised prompt, optional")
    images: list[ImageRef] = Field(default_factory=list, max_length=MAX_IMAGES,
                                   description="images the prompt shows the model, in order (schema >= 3)")
    metadata: JsonObject = Field(default_factory=dict, description=FREE_FORM)


class Trajectory(Message):
    """One sampled response to a task, with the behaviour log-prob of every generated token.

    For multi-turn runs `response_ids` holds every token after the prompt (model turns and
    environment/tool turns interleaved); `loss_mask` is 1 on model tokens, 0 on the others, and
    `logprobs` is 0.0 where the mask is 0. Across fields: `logprobs`, and `loss_mask` when present,
    have exactly one entry per `response_ids` entry.
    """

    kind: Literal["trajectory"] = "trajectory"
    traj_id: Id = Field(default_factory=new_id, description="globally unique; the trainer dedups on it")
    group_id: Id = Field(description="in a group: equal to the group's group_id")
    task_id: Id = Field(description="in a group: equal to the group's task.task_id")
    team: Team = Field("default", description="in a group: equal to the group's team")
    model_version: Count = Field(description="weight version that generated it (the oldest, with turn_versions)")
    turn_versions: list[Count] | None = Field(
        None, min_length=2,
        description="multi-turn, schema >= 2: the weight version of each model turn in order, where an episode's "
                    "turns were sampled by more than one version (weights swapped between turns); "
                    "model_version is their minimum. None: every token is model_version's")
    prompt_ids: list[Count] = Field(min_length=1, description="the prompt's token ids")
    response_ids: list[Count] = Field(description="every token after the prompt, as sampled")
    logprobs: list[LogProb] = Field(
        description=f"behaviour log-prob of each response token: one per response_ids entry, <= 0 "
                    f"(up to {LOGPROB_MAX} is tolerated as rounding)")
    loss_mask: list[Bit] | None = Field(
        None, description="1 = train on this token, one per response_ids entry; default all 1")
    images: list[ImageRef] = Field(default_factory=list, max_length=MAX_IMAGES,
                                   description="the images whose placeholder tokens prompt_ids holds, in order (schema >= 3): "
                                               "the trainer feeds the same pixels when it recomputes log-probs")
    response_text: str = ""
    env_reward: float | None = Field(None, description="reward given by the environment, if any")
    finish_reason: Name = "stop"
    info: JsonObject = Field(default_factory=dict, description=FREE_FORM)

    @field_validator("logprobs", "loss_mask")
    @classmethod
    def _one_per_token(cls, v: list | None, info: ValidationInfo) -> list | None:
        n = len(info.data.get("response_ids", v or ()))
        if v is not None and len(v) != n:
            raise ValueError(f"{info.field_name} has {len(v)} entries for {n} response tokens")
        return v

    @model_validator(mode="after")
    def _turn_versions(self) -> "Trajectory":
        if self.turn_versions is not None:
            if self.schema_version < 2:
                raise ValueError("turn_versions needs schema >= 2")
            if min(self.turn_versions) != self.model_version:
                raise ValueError(f"model_version {self.model_version} is not the oldest of turn_versions "
                                 f"{self.turn_versions}")
        return self

    def mask(self) -> list[int]:
        return self.loss_mask if self.loss_mask is not None else [1] * len(self.response_ids)


class RolloutGroup(Message):
    """The n trajectories of one task, published together once all n are done.

    Across fields: every trajectory's `group_id`, `task_id` and `team` equal the group's
    `group_id`, `task.task_id` and `team`, and no two trajectories share a `traj_id`. On a
    rollouts topic the group's `team` is the topic's (`<ns>.rollouts.<team>`); stream ops check it.
    """

    kind: Literal["rollout_group"] = "rollout_group"
    group_id: Id = Field(default_factory=new_id)
    team: Team = Field("default", description="the team whose rollouts topic carries the group")
    task: Task
    trajectories: list[Trajectory] = Field(
        min_length=1, description="same group_id, task_id and team as the group; distinct traj_ids")
    producer_id: Name = ""

    @field_validator("trajectories")
    @classmethod
    def _consistent(cls, v: list[Trajectory], info: ValidationInfo) -> list[Trajectory]:
        group_id, team, task = info.data.get("group_id"), info.data.get("team"), info.data.get("task")
        seen: set[str] = set()
        for i, t in enumerate(v):
            if group_id is not None and t.group_id != group_id:
                raise _error_at(f"{i}.group_id",
                                f"trajectory {t.traj_id} has group_id {t.group_id}, group is {group_id}")
            if task is not None and t.task_id != task.task_id:
                raise _error_at(f"{i}.task_id",
                                f"trajectory {t.traj_id} has task_id {t.task_id}, task is {task.task_id}")
            if team is not None and t.team != team:
                raise _error_at(f"{i}.team", f"trajectory {t.traj_id} has team {t.team!r}, group is {team!r}")
            if t.traj_id in seen:
                raise _error_at(f"{i}.traj_id", f"duplicate traj_id {t.traj_id} inside the group")
            seen.add(t.traj_id)
        return v


class ExperienceGroup(Message):
    """A scored group: rewards and advantages per trajectory, and a replay priority.

    Across fields: `rewards` and `advantages` have exactly one entry per trajectory.
    """

    kind: Literal["experience_group"] = "experience_group"
    group_id: Id
    team: Team = "default"
    task: Task
    trajectories: list[Trajectory] = Field(min_length=1)
    rewards: list[float] = Field(description="one per trajectory")
    advantages: list[float] = Field(description="one per trajectory")
    reward_components: dict[str, list[float]] = Field(default_factory=dict)
    dropped: dict[str, str] = Field(default_factory=dict, description="trajectories the cleaning ops removed "
                                    "from the group: traj_id -> 'op: reason' (docs/cleaning.md)")
    priority: float = 0.0
    source_topic: TopicName = ""
    source_partition: Partition = -1
    source_offset: Offset = -1

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
    model: Id
    version: Count
    bucket: Id
    prefix: str = Field(max_length=1024, description="object prefix, e.g. 'policy/v3/'")
    manifest_sha256: str = Field("", pattern=r"^([0-9a-f]{64})?$", description="lowercase hex, or empty")
    step: Count = 0
    adapter_only: bool = False


class ExplorerLedger(Message):
    """One explorer process's running count of the groups it generated (admission control).

    Published on `<ns>.admission`, keyed by `explorer_id`, whenever it changes and every few
    seconds while `in_flight` is not 0: explorers add up every process's ledger to bound what all
    of them together generated (`streamrft.producers.admission`).
    """

    kind: Literal["explorer_ledger"] = "explorer_ledger"
    explorer_id: Id = Field(description="the explorer process, unique per start")
    produced: Count = Field(description="groups it published and the broker acknowledged, since it started")
    in_flight: Count = Field(0, description="groups it is generating now (started, not published yet)")
    in_flight_version: Count = Field(0, description="the weight version generating them")


class GroupDropped(Message):
    """A generated group that will never be trained: filtered (zero variance), dead-lettered, or
    stale. Published on `<ns>.admission` by stream ops and the trainer, keyed by `group_id`;
    explorers count each `group_id` once (redeliveries publish it again)."""

    kind: Literal["group_dropped"] = "group_dropped"
    group_id: Id = Field(description="the group's id (its record key); for a record unreadable as a group, "
                                     "<topic>:<partition>:<offset>")
    reason: Literal["filtered", "dead_letter", "stale", "feedback_timeout"]
    role: Name = ""

    @classmethod
    def of_record(cls, key: bytes | None, topic: str, partition: int, offset: int, reason: str,
                  role: str) -> "GroupDropped":
        """The drop of a record whose content may be unreadable: rollouts and experiences records
        are keyed by their group_id; a record without a usable key is named by its place."""
        try:
            group_id = key.decode("utf-8") if key else ""
        except UnicodeDecodeError:
            group_id = ""
        if not 0 < len(group_id) <= 256:
            group_id = f"{topic}:{partition}:{offset}"[-256:]
        return cls(group_id=group_id, reason=reason, role=role)


class TaskOutcome(Message):
    """How one scored group of a task went: its episode rewards, for the explorers' task selection.

    Published on `<ns>.task-stats` (compacted) by stream ops for every group they score, those
    dropped for zero variance included, keyed by `group_id`: explorers fold the whole topic into
    per-task pass rates (`streamrft.producers.task_selection`) and count each `group_id` once
    (a redelivered group publishes it again).
    """

    kind: Literal["task_outcome"] = "task_outcome"
    group_id: Id = Field(description="the scored group (the record's key)")
    task_id: Id = Field(description="the group's task")
    team: Team = "default"
    rewards: list[float] = Field(min_length=1, max_length=65536,
                                 description="one total reward per episode (per trajectory in single-turn groups), finite")
    model_version: Count = Field(0, description="the newest weight version among the group's trajectories")


class Metric(Message):
    """A batch of scalar metrics from one role at one step."""

    kind: Literal["metric"] = "metric"
    role: Name
    role_id: Name
    step: Count = 0
    values: dict[str, float] = Field(description="metric name -> finite value")

    @classmethod
    def of_finite(cls, role: str, role_id: str, step: int, values: dict[str, float]) -> "Metric":
        """A Metric of the finite values only (JSON carries no NaN): a role whose loss turned NaN
        reports it as `nonfinite_values` (how many were dropped) instead of crashing."""
        kept = {k: float(v) for k, v in values.items() if math.isfinite(v)}
        if len(kept) < len(values):
            kept["nonfinite_values"] = float(len(values) - len(kept))
        return cls(role=role, role_id=role_id, step=step, values=kept)


class DeadLetter(Message):
    """A record that could not be processed: the original bytes plus why and where from.

    `key` and `value` are msgpack bin (raw bytes), outside the JSON contract: only streamrft's own
    roles write dead letters; other producers never do.
    """

    kind: Literal["dead_letter"] = "dead_letter"
    reason: str
    error_type: Name = ""
    source_topic: TopicName
    source_partition: Partition = -1
    source_offset: Offset = -1
    role: Name = ""
    key: bytes | None = Field(None, description="the original record's key: msgpack bin, not JSON")
    value: bytes = Field(description="the original record's value: msgpack bin, not JSON")


FEEDBACK_SOURCES = ("human", "user", "verifier", "model")
FEEDBACK_TARGETS = ("trajectory", "episode", "completion")
MAX_COMMENT = 4096


class Preference(BaseModel):
    """Two rated items of the same kind (`Feedback.target`): the rater preferred `chosen`."""

    model_config = ConfigDict(extra="forbid")

    chosen: Id
    rejected: Id


class Feedback(Message):
    """A rating that arrives later and from elsewhere: a person on the labelling page, a user of the
    deployed model, a slow verifier, another team's grader.

    Published on `<ns>.feedback.<team>` (keyed by the rated id); the team is the topic's (the
    gateway's key, or the Kafka user allowed to write it), never a field a producer chooses.
    Exactly one of `reward`, `preference`, `label`: `reward` and `label` rate `target_id`; a
    `preference` names two ids of the `target` kind and no `target_id`. `feedback_id` is unique per
    rating: a copy with the same id is the same rating, applied once.
    """

    kind: Literal["feedback"] = "feedback"
    feedback_id: Id = Field(default_factory=new_id, description="one rating's id: copies of it count once")
    target: Literal[FEEDBACK_TARGETS] = Field(description="what is rated: a trajectory, an episode (its "
                                                          "trajectories), or a gateway completion")
    target_id: Id | None = Field(None, description="the rated item's id (with `reward` or `label`)")
    reward: float | None = Field(None, ge=-1e6, le=1e6, description="a scalar reward, finite")
    preference: Preference | None = Field(None, description="two items of the `target` kind, chosen over rejected")
    label: Name | None = Field(None, min_length=1, description="a label from the run's configured set")
    source: Literal[FEEDBACK_SOURCES] = Field(description="who rated: a person, a user of the deployed model, "
                                                          "a verifier, a model")
    rater: Name = Field(min_length=1, description="the rater's id (a person's login, a verifier's name)")
    rated_at: float = Field(default_factory=_now, ge=0, description="epoch seconds when it was rated")
    comment: str = Field("", max_length=MAX_COMMENT)

    @model_validator(mode="after")
    def _one_rating(self) -> "Feedback":
        given = [name for name in ("reward", "preference", "label") if getattr(self, name) is not None]
        if len(given) != 1:
            raise _error_at(given[1] if len(given) > 1 else "reward",
                            f"exactly one of reward, preference, label (got {', '.join(given) or 'none'})")
        if self.preference is None and self.target_id is None:
            raise _error_at("target_id", f"a {given[0]} rates one item: name it")
        if self.preference is not None:
            if self.target_id is not None:
                raise _error_at("target_id", "a preference names its two items in `preference`, not here")
            if self.preference.chosen == self.preference.rejected:
                raise _error_at("preference", "chosen and rejected are the same item")
        return self

    def rated(self) -> list[str]:
        """The ids this rating is about."""
        return [self.target_id] if self.preference is None else [self.preference.chosen, self.preference.rejected]


class ParkedGroup(Message):
    """A rollout group waiting for its ratings (a `feedback` reward term; docs/feedback.md).

    Stream ops publish it on `<ns>.parked` (compacted, keyed by `group_id`) once the group is valid,
    and ack its rollouts record; the feedback join scores it when its ratings are in or its wait is
    over, then writes a tombstone (an empty value) under the same key. `source_*` is the rollouts
    record it came from, as an experience's."""

    kind: Literal["parked_group"] = "parked_group"
    group: RolloutGroup
    parked_at: float = Field(ge=0, description="epoch seconds when stream ops parked it")
    source_topic: TopicName
    source_partition: Partition = -1
    source_offset: Offset = -1


MESSAGES: dict[str, type[Message]] = {
    m.model_fields["kind"].default: m
    for m in (Task, Trajectory, RolloutGroup, ExperienceGroup, WeightVersion, Metric, DeadLetter, ExplorerLedger,
              GroupDropped, TaskOutcome, Feedback, ParkedGroup)
}

# topic role -> message type(s); the full name is f"{namespace}.{role}" (rollouts, feedback: ".<team>")
TOPICS: dict[str, type[Message] | tuple[type[Message], ...]] = {
    "tasks": Task,
    "rollouts": RolloutGroup,
    "experiences": ExperienceGroup,
    "weights": WeightVersion,
    "metrics": Metric,
    "dlq": DeadLetter,
    "admission": (ExplorerLedger, GroupDropped),
    "task-stats": TaskOutcome,
    "feedback": Feedback,
    "parked": ParkedGroup,
}
PER_TEAM = ("rollouts", "feedback")  # topic roles with one topic a team: `<ns>.<role>.<team>`


def topic_name(namespace: str, role: str, team: str | None = None) -> str:
    if role not in TOPICS:
        raise ValueError(f"unknown topic role {role!r}; allowed: {sorted(TOPICS)}")
    if role in PER_TEAM:
        return f"{namespace}.{role}.{team or 'default'}"
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
        problem = "missing" if "kind" not in obj else f"unknown message kind {kind!r}"
        raise DecodeError("kind", f"{problem}; allowed: {sorted(MESSAGES)}")
    if expected is not None and cls is not expected:
        raise DecodeError("kind", f"expected {expected.model_fields['kind'].default!r}, got {kind!r}")
    try:
        return cls.model_validate(obj, strict=True, context=_WIRE)
    except ValidationError as e:
        raise DecodeError(*first_error(e)) from None


def first_error(e: ValidationError) -> tuple[str, str]:
    """(the dotted path of a validation error's first bad field, what is wrong with it); a rule
    across fields names the field it blames (`_error_at`)."""
    err = e.errors(include_url=False, include_input=False)[0]
    path = [str(p) for p in err["loc"]]
    at = (err.get("ctx") or {}).get("at")
    if at:
        path.append(at)
    return ".".join(path) or "<root>", err["msg"]


def json_schema(name: str) -> dict:
    """The JSON Schema (draft 2020-12) of one message: the wire contract for producers in any language."""
    if name not in MESSAGES:
        raise ValueError(f"unknown message {name!r}; allowed: {sorted(MESSAGES)}")
    schema = MESSAGES[name].model_json_schema(by_alias=True)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$comment": WIRE_RULES, **schema}
