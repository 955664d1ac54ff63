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
    ExplorerLedger,
    Feedback,
    GroupDropped,
    Metric,
    ParkedGroup,
    RolloutGroup,
    Task,
    TaskOutcome,
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
    "explorer_ledger": ExplorerLedger(explorer_id="explorer-0-41-ab12cd34", produced=12, in_flight=4,
                                      in_flight_version=7),
    "group_dropped": GroupDropped(group_id="group-1", reason="filtered", role="stream_ops"),
    "task_outcome": TaskOutcome(group_id="group-1", task_id="task-1", team="red", rewards=[1.0, 0.25],
                                model_version=7),
    "feedback": Feedback(feedback_id="fb-1", target="trajectory", target_id="traj-1", reward=0.5, source="human",
                         rater="ann", rated_at=1.0e9, comment="close, but the second line is wrong"),
    "parked_group": ParkedGroup(group=_group(), parked_at=1.0e9, source_topic="ns.rollouts.red", source_partition=1,
                                source_offset=42),
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
    ("negative token id", _pack(_traj_raw(response_ids=[8, -9, 10])), Trajectory, "response_ids.1"),
    ("NaN log-prob", _pack(_traj_raw(logprobs=[-0.5, math.nan, -1.0])), Trajectory, "logprobs.1"),
    ("infinite log-prob", _pack(_traj_raw(logprobs=[-0.5, -math.inf, -1.0])), Trajectory, "logprobs.1"),
    ("positive log-prob", _pack(_traj_raw(logprobs=[-0.5, 0.5, -1.0])), Trajectory, "logprobs.1"),
    ("logprobs length != response length", _pack(_traj_raw(logprobs=[-0.5, -1.0])), Trajectory, "logprobs"),
    ("loss_mask length mismatch", _pack(_traj_raw(loss_mask=[1, 1])), Trajectory, "loss_mask"),
    ("loss_mask value 2", _pack(_traj_raw(loss_mask=[1, 2, 1])), Trajectory, "loss_mask.1"),
    ("empty prompt", _pack(_traj_raw(prompt_ids=[])), Trajectory, "prompt_ids"),
    ("schema version 99", _pack(_raw(_task(), schema=99)), None, "schema"),
    ("schema version 0", _pack(_raw(_task(), schema=0)), None, "schema"),
    ("extra unknown field", _pack(_raw(_task(), priority_boost=3)), None, "priority_boost"),
    ("bad trajectory inside a group", _pack(_group_raw([{}, {"logprobs": [-1.0, 2.0, -1.0]}])),
     RolloutGroup, "trajectories.1.logprobs.1"),
    ("trajectory group_id != group's", _pack(_group_raw([{}, {"group_id": "group-2"}])), RolloutGroup,
     "trajectories.1.group_id"),
    ("trajectory task_id != task's", _pack(_group_raw([{"task_id": "task-2"}])), RolloutGroup,
     "trajectories.0.task_id"),
    ("duplicate traj_id", _pack(_group_raw([{}, {"traj_id": "traj-0"}])), RolloutGroup, "trajectories.1.traj_id"),
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
    assert err.field == field, f"{err.field!r}: {err.problem}"  # the exact path, list indices included
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
        "ns.tasks", "ns.rollouts.default", "ns.experiences", "ns.weights", "ns.metrics", "ns.dlq", "ns.admission",
        "ns.task-stats", "ns.feedback.default", "ns.parked"}
    assert topic_name("run1", "feedback", "red") == "run1.feedback.red"
    with pytest.raises(ValueError, match="rollout"):
        topic_name("run1", "rollout")


def test_a_dropped_record_is_named_by_its_key_or_else_by_its_place():
    def name(key):
        return GroupDropped.of_record(key, "ns.rollouts.red", 2, 17, "dead_letter", "trainer").group_id

    assert name(b"group-1") == "group-1"  # rollouts and experiences records are keyed by group_id
    assert name(None) == name(b"") == name(b"\xff\xfe") == name(b"k" * 257) == "ns.rollouts.red:2:17"


def test_rollouts_pattern():
    pattern = rollouts_pattern("a.b")
    assert pattern.startswith("^")  # librdkafka treats only ^-prefixed names as regex subscriptions
    rx = re.compile(pattern)
    assert rx.match(topic_name("a.b", "rollouts", "red"))
    assert rx.match(topic_name("a.b", "rollouts", "team-2"))
    for other in ("aXb.rollouts.red", "a.b.rollouts.", "a.b.experiences", "x.a.b.rollouts.red", "a.bc.rollouts.red"):
        assert not rx.match(other), other


# ---- strict decoding: no coercion, bounded integers, finite floats -----------------------------
INT64_MAX = 2**63 - 1


def _decodes(obj: dict, cls: type) -> object:
    """`obj` is accepted, and what it decodes to encodes and decodes back equal."""
    msg = decode(_pack(obj), cls)
    assert decode(encode(msg), cls) == msg
    return msg


def _rejected_at(obj: dict, cls: type) -> str:
    with pytest.raises(DecodeError) as info:
        decode(_pack(obj), cls)
    return info.value.field


@pytest.mark.parametrize("field,value", [
    ("model_version", "3"), ("model_version", "99999999999999999999999"), ("model_version", True),
    ("model_version", 3.0), ("model_version", 3.5), ("model_version", 2**63), ("model_version", 2**64 - 1),
    ("model_version", -1), ("response_ids", [8, "9", 10]), ("response_ids", [8, "99999999999999999999999", 10]),
    ("response_ids", [8, True, 10]), ("response_ids", [8, 9.0, 10]), ("response_ids", [8, 2**63, 10]),
    ("prompt_ids", [-1]), ("loss_mask", [1, True, 0]), ("loss_mask", [1, -1, 0]),
    ("logprobs", [-0.5, "nan", -1.0]), ("logprobs", [-0.5, "-1.0", -1.0]), ("logprobs", [-0.5, False, -1.0]),
    ("logprobs", [-0.5, 2e-4, -1.0]), ("env_reward", True), ("env_reward", "1.0"), ("env_reward", math.inf),
    ("env_reward", math.nan), ("created_at", math.nan), ("created_at", -math.inf), ("created_at", "1700000000"),
    ("traj_id", b"traj-0"), ("response_text", b"4"), ("finish_reason", 5), ("team", "red team"), ("team", ""),
    ("team", "t" * 201), ("traj_id", ""), ("group_id", "g" * 257), ("info", []), ("schema", True), ("schema", "1"),
    ("schema", 1.0),
])
def test_trajectory_types_are_exact_and_bounded(field, value):
    assert _rejected_at(_traj_raw(**{field: value}), Trajectory).split(".")[0] == field


@pytest.mark.parametrize("field,value", [
    ("model_version", INT64_MAX), ("model_version", 0), ("response_ids", [0, INT64_MAX, 1]), ("response_ids", []),
    ("logprobs", [-0.5, 0, -1]), ("logprobs", [-0.5, 1e-4, -1e300]), ("logprobs", [-0.0, 0.0, -1.0]),
    ("env_reward", 1), ("env_reward", None), ("env_reward", -1.7e308), ("created_at", 0), ("loss_mask", None),
    ("team", "Team_2.b-c"), ("traj_id", "é" * 256), ("schema", 1),
])
def test_trajectory_edge_values_accepted(field, value):
    if field == "response_ids":
        n = len(value)
        obj = _traj_raw(response_ids=value, logprobs=[-1.0] * n, loss_mask=[1] * n)
    else:
        obj = _traj_raw(**{field: value})
    msg = _decodes(obj, Trajectory)
    if isinstance(value, int) and not isinstance(value, bool) and field in ("env_reward", "created_at"):
        assert isinstance(getattr(msg, field), float)  # an int is a number; it is kept as a float


def test_huge_integers_as_strings_never_reach_the_encoder():
    # the reported crash: accepted as 10**23, then OverflowError in encode
    obj = _group_raw([{"model_version": "99999999999999999999999"}])
    assert _rejected_at(obj, RolloutGroup) == "trajectories.0.model_version"
    obj = _group_raw([{}, {"response_ids": [8, 9, "99999999999999999999999"]}])
    assert _rejected_at(obj, RolloutGroup) == "trajectories.1.response_ids.2"


@pytest.mark.parametrize("changes,field", [
    ({"created_at": math.nan}, "created_at"), ({"created_at": math.inf}, "created_at"),
    ({"prompt_ids": [5, -6]}, "prompt_ids.1"), ({"prompt_ids": [5, True]}, "prompt_ids.1"),
    ({"prompt": b"bytes"}, "prompt"), ({"answer": 4}, "answer"), ({"task_id": ""}, "task_id"),
    ({"metadata": {"a": [{"b": math.nan}]}}, "metadata.a.0.b"), ({"metadata": {"a": math.inf}}, "metadata.a"),
    ({"metadata": {"a": 2**63}}, "metadata.a"), ({"metadata": {"a": [-(2**63), 2**64 - 1]}}, "metadata.a.1"),
    ({"metadata": {"a": 1e19}}, "metadata.a"), ({"metadata": {"a": b"raw"}}, "metadata.a"),
    ({"metadata": {"a": {b"k": 1}}}, "metadata.a"), ({"metadata": []}, "metadata"),
])
def test_task_rules(changes, field):
    assert _rejected_at(_raw(_task(), **changes), Task) == field


def test_task_metadata_accepts_json_values():
    meta = {"n": None, "b": True, "i": -(2**63), "j": INT64_MAX, "f": 9.2e18, "g": -0.5, "s": "é",
            "l": [1, "a", [2.5, {"k": []}]], "d": {}}
    assert _decodes(_raw(_task(), metadata=meta), Task).metadata == meta


def _nested(levels: int) -> object:
    """A value with `levels` nested lists: 0 -> a scalar."""
    value: object = 1
    for _ in range(levels):
        value = [value]
    return value


def test_free_form_depth_bound():
    from streamrft.schemas import MAX_JSON_DEPTH

    # the field's own object is one level
    _decodes(_raw(_task(), metadata={"deep": _nested(MAX_JSON_DEPTH - 1)}), Task)
    assert _rejected_at(_raw(_task(), metadata={"deep": _nested(MAX_JSON_DEPTH)}), Task).startswith("metadata.deep")
    assert _rejected_at(_traj_raw(info={"deep": _nested(MAX_JSON_DEPTH)}), Trajectory).startswith("info.deep")


def test_python_construction_keeps_the_bounds_but_converts_types():
    assert Trajectory(group_id="g", task_id="t", model_version="3", prompt_ids=[1], response_ids=[],
                      logprobs=[]).model_version == 3  # as before: strictness is for the wire
    for bad in ({"x": math.nan}, {"x": (1, 2)}, {"x": object()}, {"x": 2**64}, {"x": {1: 2}}):
        with pytest.raises(ValueError):
            Task(prompt="p", metadata=bad)
    with pytest.raises(ValueError):
        Trajectory(group_id="g", task_id="t", model_version=2**63, prompt_ids=[1], response_ids=[], logprobs=[])
    with pytest.raises(ValueError):
        Task(prompt="p", created_at=math.inf)


@pytest.mark.parametrize("name,changes,field", [
    ("experience_group", {"rewards": [1.0, math.nan]}, "rewards.1"),
    ("experience_group", {"priority": math.inf}, "priority"),
    ("experience_group", {"reward_components": {"exact": [1.0, math.inf]}}, "reward_components.exact.1"),
    ("experience_group", {"source_partition": -2}, "source_partition"),
    ("experience_group", {"source_partition": 2**31}, "source_partition"),
    ("experience_group", {"source_offset": -2}, "source_offset"),
    ("experience_group", {"source_offset": "41"}, "source_offset"),
    ("weight_version", {"version": -1}, "version"), ("weight_version", {"version": 7.0}, "version"),
    ("weight_version", {"manifest_sha256": "AB" * 32}, "manifest_sha256"),
    ("weight_version", {"manifest_sha256": "ab"}, "manifest_sha256"),
    ("weight_version", {"adapter_only": 1}, "adapter_only"),
    ("metric", {"values": {"loss": math.nan}}, "values.loss"), ("metric", {"values": {"loss": "0.25"}}, "values.loss"),
    ("metric", {"step": -1}, "step"), ("dead_letter", {"value": "text"}, "value"),
    ("dead_letter", {"source_offset": 2**63}, "source_offset"),
    # feedback: exactly one rating; a reward or label names its item, a preference two others
    ("feedback", {"label": "good"}, "label"), ("feedback", {"reward": None}, "reward"),
    ("feedback", {"target_id": None}, "target_id"), ("feedback", {"reward": math.inf}, "reward"),
    ("feedback", {"reward": "1"}, "reward"), ("feedback", {"source": "admin"}, "source"),
    ("feedback", {"target": "group"}, "target"), ("feedback", {"rater": ""}, "rater"),
    ("feedback", {"comment": "x" * 4097}, "comment"), ("feedback", {"team": "red"}, "team"),
    ("feedback", {"reward": None, "preference": {"chosen": "a", "rejected": "b"}}, "target_id"),
    ("feedback", {"reward": None, "target_id": None, "preference": {"chosen": "a", "rejected": "a"}}, "preference"),
    ("feedback", {"reward": None, "target_id": None, "preference": {"chosen": "a"}}, "preference.rejected"),
])
def test_other_messages_rules(name, changes, field):
    assert _rejected_at(_raw(SAMPLES[name], **changes), type(SAMPLES[name])) == field


def test_partition_and_offset_minus_one_means_unknown():
    msg = _decodes(_raw(SAMPLES["experience_group"], source_partition=-1, source_offset=-1), ExperienceGroup)
    assert (msg.source_partition, msg.source_offset) == (-1, -1)


def test_kind_is_required_everywhere_on_the_wire():
    with pytest.raises(DecodeError) as info:
        decode(_pack(_raw(_task(), kind=_DROP)))
    assert info.value.field == "kind" and "missing" in info.value.problem
    group = _group_raw()
    del group["task"]["kind"]
    assert _rejected_at(group, RolloutGroup) == "task.kind"
    group = _group_raw()
    del group["trajectories"][1]["kind"]
    assert _rejected_at(group, RolloutGroup) == "trajectories.1.kind"
    assert _rejected_at(_group_raw(task=_raw(_task(), kind="trajectory")), RolloutGroup) == "task.kind"
    assert Task(prompt="no kind given in Python").kind == "task"  # Python code may leave it out


def test_group_team_must_match_its_trajectories():
    assert _rejected_at(_group_raw([{}, {"team": "blue"}]), RolloutGroup) == "trajectories.1.team"
    with pytest.raises(ValueError, match="team"):
        RolloutGroup(group_id="group-1", team="blue", task=_task(), trajectories=[_traj(0)])


# ---- JSON Schema ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(MESSAGES))
def test_json_schema(name):
    schema = json_schema(name)
    json.dumps(schema)  # exportable as-is
    props = schema["properties"]
    assert props["kind"]["const"] == name and "default" not in props["kind"]
    assert schema["required"][0] == "kind"
    for sub in schema.get("$defs", {}).values():  # nested messages too
        if "kind" in sub.get("properties", {}):
            assert "kind" in sub["required"] and "const" in sub["properties"]["kind"]
    assert props["schema"]["enum"] == list(range(1, SCHEMA_VERSION + 1))  # the wire name, not the Python one
    wire = msgpack.unpackb(encode(SAMPLES[name]), raw=False)
    assert set(wire) <= set(props)
    assert set(schema["required"]) <= set(wire)
    assert schema["$schema"].endswith("2020-12/schema") and "msgpack" in schema["$comment"]


def _every_integer_is_bounded(node) -> None:
    if isinstance(node, dict):
        if node.get("type") == "integer" or "integer" in (node.get("type") or []):
            assert "minimum" in node and "maximum" in node, node
        for value in node.values():
            _every_integer_is_bounded(value)
    elif isinstance(node, list):
        for value in node:
            _every_integer_is_bounded(value)


@pytest.mark.parametrize("name", sorted(MESSAGES))
def test_json_schema_bounds_every_integer(name):
    _every_integer_is_bounded(json_schema(name))


def test_json_schema_states_the_rules():
    defs = json_schema("rollout_group")["$defs"]
    traj, task = defs["Trajectory"]["properties"], defs["Task"]["properties"]
    ids = {"type": "integer", "minimum": 0, "maximum": INT64_MAX}
    assert traj["model_version"]["minimum"] == 0 and traj["model_version"]["maximum"] == INT64_MAX
    assert traj["prompt_ids"]["items"] == ids and traj["prompt_ids"]["minItems"] == 1
    assert traj["response_ids"]["items"] == ids
    assert task["prompt_ids"]["anyOf"][0]["items"] == ids
    assert traj["logprobs"]["items"] == {"type": "number", "maximum": 1e-4}
    assert traj["loss_mask"]["anyOf"][0]["items"] == {"type": "integer", "minimum": 0, "maximum": 1}
    assert traj["team"]["pattern"] and traj["traj_id"]["minLength"] == 1 and traj["traj_id"]["maxLength"]
    assert json_schema("rollout_group")["properties"]["trajectories"]["minItems"] == 1
    # the rules JSON Schema cannot state are written where `streamrft schema` shows them
    assert "one per response_ids entry" in traj["logprobs"]["description"]
    assert "one per response_ids entry" in traj["loss_mask"]["description"]
    group = json_schema("rollout_group")["description"]
    assert all(word in group for word in ("group_id", "task_id", "team", "traj_id", "topic"))
    assert "one entry per trajectory" in json_schema("experience_group")["description"]
    dead = json_schema("dead_letter")["properties"]
    assert "msgpack bin" in dead["value"]["description"] and "msgpack bin" in dead["key"]["description"]
    eg = json_schema("experience_group")["properties"]
    assert eg["source_partition"]["minimum"] == -1 and eg["source_offset"]["minimum"] == -1


def test_json_schema_unknown_name():
    with pytest.raises(ValueError, match="rollout_group"):
        json_schema("rollout")


def test_metric_of_finite_drops_and_counts_non_finite_values():
    m = Metric.of_finite("trainer", "t-1", 3, {"loss": float("nan"), "grad_norm": float("inf"), "reward": 0.5})
    assert m.values == {"reward": 0.5, "nonfinite_values": 2.0}
    assert decode(encode(m), Metric) == m
    assert Metric.of_finite("trainer", "t-1", 3, {"reward": 0.5}).values == {"reward": 0.5}


def test_feedback_rates_one_item_or_prefers_one_of_two():
    pref = Feedback(target="completion", preference={"chosen": "c-1", "rejected": "c-2"}, source="user", rater="u-7")
    assert decode(encode(pref), Feedback) == pref and pref.rated() == ["c-1", "c-2"]
    label = Feedback(target="episode", target_id="e-1", label="helpful", source="verifier", rater="ci")
    assert decode(encode(label)).rated() == ["e-1"]
    assert SAMPLES["feedback"].rated() == ["traj-1"]
