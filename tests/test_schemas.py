"""The wire schema: every message survives encode/decode, malformed bytes are rejected with a
`DecodeError` that names the bad field, topic names and the JSON Schema export."""
from __future__ import annotations

import json
import math
import random
import re

import msgpack
import pytest

from streamrft.schemas import (
    MESSAGES,
    SCHEMA_VERSION,
    TOPICS,
    DeadLetter,
    DecodeError,
    ExperienceGroup,
    Metric,
    RolloutGroup,
    Task,
    Trajectory,
    WeightVersion,
    decode,
    encode,
    json_schema,
    rollouts_pattern,
    topic_name,
)


def _task() -> Task:
    return Task(task_id="task-1", prompt="What is 2+2?", answer="4", prompt_ids=[5, 6, 7],
                metadata={"source": "gsm8k", "level": 3, "tags": ["math"]})


def _traj(i: int = 0, group_id: str = "group-1", task_id: str = "task-1") -> Trajectory:
    return Trajectory(traj_id=f"traj-{i}", group_id=group_id, task_id=task_id, team="red", model_version=3,
                      prompt_ids=[5, 6, 7], response_ids=[8, 9, 10], logprobs=[-0.5, 0.0, -1.25],
                      loss_mask=[1, 0, 1], response_text="4", env_reward=1.0, finish_reason="length",
                      info={"turns": 2})


def _group() -> RolloutGroup:
    return RolloutGroup(group_id="group-1", team="red", task=_task(), trajectories=[_traj(0), _traj(1)],
                        producer_id="explorer-0")


SAMPLES = {
    "task": _task(),
    "trajectory": _traj(),
    "rollout_group": _group(),
    "experience_group": ExperienceGroup(group_id="group-1", team="red", task=_task(),
                                        trajectories=[_traj(0), _traj(1)], rewards=[1.0, 0.0],
                                        advantages=[0.7071, -0.7071], reward_components={"exact": [1.0, 0.0]},
                                        priority=0.5, source_topic="ns.rollouts.red", source_partition=2,
                                        source_offset=41),
    "weight_version": WeightVersion(model="policy", version=7, bucket="weights", prefix="policy/v7/",
                                    manifest_sha256="ab" * 32, step=7, adapter_only=True),
    "metric": Metric(role="trainer", role_id="trainer-0", step=3, values={"loss": 0.25, "reward": 0.5}),
    "dead_letter": DeadLetter(reason="bad logprobs", error_type="DecodeError", source_topic="ns.rollouts.red",
                              source_partition=1, source_offset=9, role="stream-ops", key=b"group-1",
                              value=b"\x00\xffnot msgpack"),
}


def test_samples_cover_every_message_type():
    assert set(SAMPLES) == set(MESSAGES)


@pytest.mark.parametrize("kind", sorted(SAMPLES))
def test_round_trip(kind):
    msg = SAMPLES[kind]
    data = encode(msg)
    assert isinstance(data, bytes)
    assert decode(data) == msg
    assert decode(data, type(msg)) == msg
    wire = msgpack.unpackb(data, raw=False)
    assert wire["kind"] == kind and wire["schema"] == SCHEMA_VERSION


def test_defaults_are_evaluated_per_message():
    a, b = Task(prompt="x"), Task(prompt="x")
    assert a.task_id != b.task_id
    assert _traj().mask() == [1, 0, 1]
    assert Trajectory(group_id="g", task_id="t", model_version=0, prompt_ids=[1], response_ids=[2, 3],
                      logprobs=[-1.0, -2.0]).mask() == [1, 1]


# ---- malformed input ---------------------------------------------------------------------------
def _raw(msg, **changes) -> dict:
    d = msg.model_dump(by_alias=True)
    for key, value in changes.items():
        if value is _DROP:
            del d[key]
        else:
            d[key] = value
    return d


_DROP = object()


def _traj_raw(**changes) -> dict:
    return _raw(_traj(), **changes)


def _group_raw(traj_changes: list[dict] | None = None, **changes) -> dict:
    d = _raw(_group(), **changes)
    for t, ch in zip(d["trajectories"], traj_changes or []):
        t.update(ch)
    return d


def _pack(obj) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


_rng = random.Random(0)
MALFORMED = [
    # (case, bytes, expected class (None = any), field that must be named)
    ("empty", b"", None, "<bytes>"),
    ("random bytes", b"\xc1" + bytes(_rng.randrange(256) for _ in range(64)), None, "<bytes>"),
    ("truncated msgpack", encode(_group())[:-17], None, "<bytes>"),
    ("trailing garbage", encode(_task()) + b"\x01", None, "<bytes>"),
    ("map with an int key", _pack({1: "task"}), None, "<bytes>"),
    ("msgpack list", _pack([1, 2, 3]), None, "<root>"),
    ("msgpack int", _pack(42), None, "<root>"),
    ("msgpack str", _pack("task"), None, "<root>"),
    ("unknown kind", _pack(_raw(_task(), kind="tusk")), None, "kind"),
    ("kind not a string", _pack(_raw(_task(), kind=5)), None, "kind"),
    ("kind of another type", encode(_task()), RolloutGroup, "kind"),
    ("missing required field", _pack(_traj_raw(group_id=_DROP)), Trajectory, "group_id"),
    ("missing nested required field", _pack(_group_raw(task={"kind": "task"})), RolloutGroup, "task.prompt"),
    ("wrong type", _pack(_traj_raw(model_version="three")), Trajectory, "model_version"),
    ("wrong container type", _pack(_traj_raw(response_ids={"a": 1})), Trajectory, "response_ids"),
    ("negative model version", _pack(_traj_raw(model_version=-1)), Trajectory, "model_version"),
    ("negative token id", _pack(_traj_raw(response_ids=[8, -9, 10])), Trajectory, "response_ids"),
    ("NaN log-prob", _pack(_traj_raw(logprobs=[-0.5, math.nan, -1.0])), Trajectory, "logprobs"),
    ("infinite log-prob", _pack(_traj_raw(logprobs=[-0.5, -math.inf, -1.0])), Trajectory, "logprobs"),
    ("positive log-prob", _pack(_traj_raw(logprobs=[-0.5, 0.5, -1.0])), Trajectory, "logprobs"),
    ("logprobs length != response length", _pack(_traj_raw(logprobs=[-0.5, -1.0])), Trajectory, "logprobs"),
    ("loss_mask length mismatch", _pack(_traj_raw(loss_mask=[1, 1])), Trajectory, "loss_mask"),
    ("loss_mask value 2", _pack(_traj_raw(loss_mask=[1, 2, 1])), Trajectory, "loss_mask"),
    ("empty prompt", _pack(_traj_raw(prompt_ids=[])), Trajectory, "prompt_ids"),
    ("schema version 99", _pack(_raw(_task(), schema=99)), None, "schema"),
    ("schema version 0", _pack(_raw(_task(), schema=0)), None, "schema"),
    ("extra unknown field", _pack(_raw(_task(), priority_boost=3)), None, "priority_boost"),
    ("bad trajectory inside a group", _pack(_group_raw([{}, {"logprobs": [-1.0, 2.0, -1.0]}])),
     RolloutGroup, "trajectories.1.logprobs"),
    ("trajectory group_id != group's", _pack(_group_raw([{}, {"group_id": "group-2"}])), RolloutGroup, "group_id"),
    ("trajectory task_id != task's", _pack(_group_raw([{"task_id": "task-2"}])), RolloutGroup, "task_id"),
    ("duplicate traj_id", _pack(_group_raw([{}, {"traj_id": "traj-0"}])), RolloutGroup, "traj_id"),
    ("empty trajectories list", _pack(_group_raw(trajectories=[])), RolloutGroup, "trajectories"),
    ("ExperienceGroup rewards length mismatch", _pack(_raw(SAMPLES["experience_group"], rewards=[1.0])),
     ExperienceGroup, "rewards"),
    ("ExperienceGroup advantages length mismatch", _pack(_raw(SAMPLES["experience_group"], advantages=[0.0] * 3)),
     ExperienceGroup, "advantages"),
    ("DeadLetter without the original bytes", _pack(_raw(SAMPLES["dead_letter"], value=_DROP)), DeadLetter, "value"),
]


@pytest.mark.parametrize("data,expected,field", [c[1:] for c in MALFORMED], ids=[c[0] for c in MALFORMED])
def test_malformed_bytes_are_rejected_naming_the_field(data, expected, field):
    with pytest.raises(DecodeError) as info:
        decode(data, expected)
    err = info.value
    # the field is `err.field` itself or, for checks across fields, named in the problem
    assert err.field == field or re.search(rf"(?<![\w.]){re.escape(field)}(?![\w.])", err.problem), \
        f"{err.field!r}: {err.problem}"
    assert isinstance(err, ValueError)


def test_distinct_malformed_cases():
    assert len(MALFORMED) >= 20
    assert len({c[1] for c in MALFORMED}) == len(MALFORMED)


def test_decode_rejects_non_bytes():
    with pytest.raises(DecodeError) as info:
        decode("a string")  # type: ignore[arg-type]
    assert info.value.field == "<bytes>"


# ---- topics ------------------------------------------------------------------------------------
def test_topic_name():
    assert topic_name("run1", "tasks") == "run1.tasks"
    assert topic_name("run1", "experiences") == "run1.experiences"
    assert topic_name("run1", "weights") == "run1.weights"
    assert topic_name("run1", "rollouts", "red") == "run1.rollouts.red"
    assert topic_name("run1", "rollouts") == "run1.rollouts.default"
    assert {topic_name("ns", role) for role in TOPICS} == {
        "ns.tasks", "ns.rollouts.default", "ns.experiences", "ns.weights", "ns.metrics", "ns.dlq"}
    with pytest.raises(ValueError, match="rollout"):
        topic_name("run1", "rollout")


def test_rollouts_pattern():
    pattern = rollouts_pattern("a.b")
    assert pattern.startswith("^")  # librdkafka treats only ^-prefixed names as regex subscriptions
    rx = re.compile(pattern)
    assert rx.match(topic_name("a.b", "rollouts", "red"))
    assert rx.match(topic_name("a.b", "rollouts", "team-2"))
    for other in ("aXb.rollouts.red", "a.b.rollouts.", "a.b.experiences", "x.a.b.rollouts.red", "a.bc.rollouts.red"):
        assert not rx.match(other), other


# ---- JSON Schema ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(MESSAGES))
def test_json_schema(name):
    schema = json_schema(name)
    json.dumps(schema)  # exportable as-is
    props = schema["properties"]
    assert props["kind"]["const"] == name or props["kind"].get("default") == name
    assert "schema" in props  # the wire name, not the Python attribute
    wire = msgpack.unpackb(encode(SAMPLES[name]), raw=False)
    assert set(wire) <= set(props)
    assert set(schema.get("required", [])) <= set(wire)


def test_json_schema_unknown_name():
    with pytest.raises(ValueError, match="rollout_group"):
        json_schema("rollout")
