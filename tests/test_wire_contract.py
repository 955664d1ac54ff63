"""The exported JSON Schema is the whole wire contract: a differential test of `decode` against a
JSON Schema validator on a few thousand generated records, valid ones and mutations of them.

Both must give the same verdict on every record, except for the mutations listed in
DECODER_ONLY (rules across fields, and the int/float distinction, that a JSON Schema cannot state;
the schema's descriptions spell them out). A record JSON cannot carry (NaN, bytes, a non-string
key) is outside the contract, so the JSON side rejects it. Every record `decode` accepts must
encode, decode back equal, and meet the schema again. Dead letters are left out: their key and
value are msgpack bin, not JSON (tests/test_schemas.py covers them).
"""
from __future__ import annotations

import copy
import json
import math
import random
import string
from collections import Counter

import jsonschema
import msgpack

from streamrft.schemas import (MAX_JSON_DEPTH, MESSAGES, DecodeError, ExperienceGroup, ExplorerLedger, Feedback,
                               GroupDropped, ImageRef, ParkedGroup,
                               Metric, RolloutGroup, Task, TaskOutcome, Trajectory, WeightVersion, decode, encode,
                               json_schema)

# rules only the decoder can check; each maps to why a JSON Schema cannot state it
DECODER_ONLY = {
    "length_mismatch": "logprobs and loss_mask have one entry per response token, rewards and advantages "
                       "one per trajectory: JSON Schema cannot compare the lengths of two arrays",
    "group_mismatch": "a group's trajectories carry its group_id, task_id and team: no cross-property equality",
    "duplicate_traj_id": "traj_ids are distinct in a group: uniqueItems compares whole items, not one property",
    "int_as_float": "an integer is a msgpack int: JSON Schema's data model does not tell 3.0 from 3",
    "feedback_rating": "a rating holds exactly one of reward, preference, label, names its item in target_id "
                       "unless it is a preference, and prefers one item over another: rules across fields",
}
# (a group's team must also be its topic's team: that is stream ops' check, see stream_ops/test_validate.py)

KINDS = sorted(k for k in MESSAGES if k != "dead_letter")
VALIDATORS = {k: jsonschema.Draft202012Validator(json_schema(k)) for k in KINDS}
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
ID_CHARS = string.ascii_letters + string.digits + "-_.:@/ é日"
TEAM_CHARS = string.ascii_letters + string.digits + "._-"


# ---- valid records ---------------------------------------------------------------------------------
def _id(rng: random.Random) -> str:
    return "".join(rng.choice(ID_CHARS) for _ in range(rng.choice([1, 8, 32, 256])))


def _team(rng: random.Random) -> str:
    return rng.choice(["default", "red", "t.2_b-c", "x" * 200])


def _number(rng: random.Random) -> int | float:
    return rng.choice([0, 1, -7, INT64_MIN, INT64_MAX, 0.5, -0.0, 1e-300, 9.2e18, -9.2e18, rng.uniform(-1e6, 1e6)])


def _json(rng: random.Random, levels: int) -> object:
    """A random JSON value with at most `levels` nested arrays/objects."""
    pick = rng.randrange(8 if levels > 0 else 5)
    if pick == 0:
        return None
    if pick == 1:
        return rng.random() < 0.5
    if pick in (2, 3):
        return _number(rng)
    if pick == 4:
        return rng.choice(["", "text", "é日\n", "x" * 300])
    if pick in (5, 6):
        return {_id(rng)[:12]: _json(rng, levels - 1) for _ in range(rng.randrange(4))}
    return [_json(rng, levels - 1) for _ in range(rng.randrange(4))]


def _json_object(rng: random.Random) -> dict:
    return {_id(rng)[:12]: _json(rng, rng.choice([0, 1, 2, MAX_JSON_DEPTH - 1])) for _ in range(rng.randrange(4))}


def _float(rng: random.Random) -> float | int:
    return rng.choice([0.0, -1.5, 1e300, -1.7e308, 3, rng.uniform(-10, 10)])


def _task(rng: random.Random) -> Task:
    return Task(task_id=_id(rng), prompt=rng.choice(["", "2+2=", "é" * 50]),
                answer=rng.choice([None, "4"]), prompt_ids=rng.choice([None, [], [0, 5, INT64_MAX]]),
                images=[_image(rng) for _ in range(rng.choice([0, 0, 1, 2]))],
                metadata=_json_object(rng), created_at=_float(rng))


def _image(rng: random.Random) -> ImageRef:
    sha = "".join(rng.choice("0123456789abcdef") for _ in range(64))
    return ImageRef(sha256=sha, uri=f"s3://{rng.choice(['weights', 'my.bucket-1'])}/ns/media/{sha}.png",
                    width=rng.choice([1, 32, 16384]), height=rng.choice([1, 7, 640]),
                    mime=rng.choice(["image/png", "image/jpeg", "image/webp", "image/gif"]))


def _traj(rng: random.Random, group_id: str, task_id: str, team: str) -> Trajectory:
    n = rng.choice([0, 1, 3, 6])
    return Trajectory(group_id=group_id, task_id=task_id, team=team, model_version=rng.choice([0, 3, INT64_MAX]),
                      prompt_ids=[rng.choice([0, 1, 50000, INT64_MAX]) for _ in range(rng.randint(1, 4))],
                      response_ids=[rng.randrange(100) for _ in range(n)],
                      logprobs=[rng.choice([0.0, -0.0, -1e-9, -3.25, 1e-4, -1e300, -2]) for _ in range(n)],
                      loss_mask=rng.choice([None, [rng.randint(0, 1) for _ in range(n)]]),
                      response_text=rng.choice(["", "4", "é"]), env_reward=rng.choice([None, 1, -0.5, 1e300]),
                      finish_reason=rng.choice(["stop", "length", ""]), info=_json_object(rng))


def _group_parts(rng: random.Random) -> tuple[str, str, Task, list[Trajectory]]:
    gid, team, task = _id(rng), _team(rng), _task(rng)
    return gid, team, task, [_traj(rng, gid, task.task_id, team) for _ in range(rng.randint(1, 4))]


def valid_record(rng: random.Random, kind: str) -> dict:
    if kind == "task":
        msg = _task(rng)
    elif kind == "trajectory":
        msg = _traj(rng, _id(rng), _id(rng), _team(rng))
    elif kind == "rollout_group":
        gid, team, task, trajs = _group_parts(rng)
        msg = RolloutGroup(group_id=gid, team=team, task=task, trajectories=trajs, producer_id=rng.choice(["", "x"]))
    elif kind == "experience_group":
        gid, team, task, trajs = _group_parts(rng)
        n = len(trajs)
        msg = ExperienceGroup(group_id=gid, team=team, task=task, trajectories=trajs,
                              rewards=[_float(rng) for _ in range(n)], advantages=[_float(rng) for _ in range(n)],
                              reward_components={"exact": [_float(rng) for _ in range(n)]}, priority=_float(rng),
                              source_topic=rng.choice(["", "ns.rollouts.red"]),
                              source_partition=rng.choice([-1, 0, 2**31 - 1]),
                              source_offset=rng.choice([-1, 0, INT64_MAX]))
    elif kind == "weight_version":
        msg = WeightVersion(model=_id(rng), version=rng.choice([0, 7, INT64_MAX]), bucket="weights", prefix="p/v7/",
                            manifest_sha256=rng.choice(["", "0123456789abcdef" * 4]), step=rng.choice([0, 7]),
                            adapter_only=rng.random() < 0.5)
    elif kind == "explorer_ledger":
        msg = ExplorerLedger(explorer_id=_id(rng), produced=rng.choice([0, 7, INT64_MAX]),
                             in_flight=rng.choice([0, 4, INT64_MAX]), in_flight_version=rng.choice([0, 7, INT64_MAX]))
    elif kind == "group_dropped":
        msg = GroupDropped(group_id=_id(rng), reason=rng.choice(["filtered", "dead_letter", "stale", "feedback_timeout"]),
                           role=rng.choice(["", "trainer", "stream_ops"]))
    elif kind == "task_outcome":
        msg = TaskOutcome(group_id=_id(rng), task_id=_id(rng), team=_team(rng),
                          rewards=[_float(rng) for _ in range(rng.randint(1, 4))], model_version=rng.choice([0, INT64_MAX]))
    elif kind == "feedback":
        chosen = _id(rng)
        rejected = chosen[:-1] + ("x" if chosen[-1] != "x" else "y")  # another id of the same length
        rating = rng.choice([{"reward": rng.choice([0.0, -1.5, 1.0, 3, rng.uniform(-10, 10)])}, {"label": _id(rng)},
                             {"preference": {"chosen": chosen, "rejected": rejected}}])
        target = {} if "preference" in rating else {"target_id": _id(rng)}
        msg = Feedback(target=rng.choice(["trajectory", "episode", "completion"]), **target, **rating,
                       source=rng.choice(["human", "user", "verifier", "model"]), rater=_id(rng),
                       rated_at=rng.choice([0.0, 1.7e9]), comment=rng.choice(["", "close"]))
    elif kind == "parked_group":
        gid, team, task, trajs = _group_parts(rng)
        msg = ParkedGroup(group=RolloutGroup(group_id=gid, team=team, task=task, trajectories=trajs),
                          parked_at=rng.choice([0.0, 1.7e9]), source_topic=rng.choice(["ns.rollouts.red", ""]),
                          source_partition=rng.choice([-1, 0, 2**31 - 1]), source_offset=rng.choice([-1, 0, INT64_MAX]))
    else:
        msg = Metric(role="trainer", role_id=_id(rng), step=rng.choice([0, INT64_MAX]),
                     values={_id(rng)[:8]: _float(rng) for _ in range(rng.randrange(4))})
    record = msg.model_dump(by_alias=True)
    for key in ("schema", "created_at", "producer_id", "answer", "metadata", "info"):  # defaults may be left out
        if key in record and rng.random() < 0.2:
            del record[key]
    return record


# ---- mutations -------------------------------------------------------------------------------------
def _nodes(record: dict) -> list[tuple[list, object]]:
    """(path, value) of every node below the root."""
    out: list[tuple[list, object]] = []

    def walk(node, path):
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for key, value in items:
            out.append((path + [key], value))
            walk(value, path + [key])
    walk(record, [])
    return out


def _set(record: dict, path: list, value) -> None:
    node = record
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _messages(record: dict) -> list[dict]:
    """The message-level maps of a record: the root, its task, its trajectories."""
    out = [record]
    if isinstance(record.get("task"), dict):
        out.append(record["task"])
    if isinstance(record.get("trajectories"), list):
        out += [t for t in record["trajectories"] if isinstance(t, dict)]
    return out


def _free_form(record: dict) -> list[dict]:
    return [m[k] for m in _messages(record) for k in ("metadata", "info") if isinstance(m.get(k), dict)]


def _number_node(path: list, value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


LENGTH_COUPLED = {"response_ids", "logprobs", "loss_mask", "rewards", "advantages"}  # must have equal lengths
GROUP_KEYS = {"group_id", "task_id", "team"}

# mutations that replace one node: name -> (which nodes, the new value)
REPLACE = {
    "str_for_int": (lambda p, v: _is_int(v), lambda rng, v: rng.choice([str(v), "99999999999999999999999"])),
    "bool_for_number": (_number_node, lambda rng, v: rng.random() < 0.5),
    "int_as_float": (lambda p, v: _is_int(v) and abs(v) < 2**53, lambda rng, v: float(v)),
    "fraction_for_int": (lambda p, v: _is_int(v) and abs(v) < 2**52, lambda rng, v: v + 0.5),
    "huge_int": (_number_node, lambda rng, v: rng.choice([2**63, 2**64 - 1, INT64_MIN, INT64_MAX, 1e19])),
    "negative": (lambda p, v: _is_int(v) and v < 2**62, lambda rng, v: rng.choice([-1, -2, -v - 1])),
    "nonfinite": (lambda p, v: not isinstance(v, (dict, list)),
                  lambda rng, v: rng.choice([math.nan, math.inf, -math.inf])),
    "null": (lambda p, v: True, lambda rng, v: None),
    "bytes_for_str": (lambda p, v: isinstance(v, str), lambda rng, v: v.encode()),
    "str_for_float": (lambda p, v: isinstance(v, float), lambda rng, v: rng.choice(["nan", "inf", repr(v)])),
    "wrong_container": (lambda p, v: True, lambda rng, v: {"0": v} if isinstance(v, list)
                        else list(v.values()) if isinstance(v, dict) else [v]),
    "empty_list": (lambda p, v: isinstance(v, list) and v, lambda rng, v: []),
    "positive_logprob": (lambda p, v: len(p) >= 2 and p[-2] == "logprobs",
                         lambda rng, v: rng.choice([0.5, 2e-4, 1e-4, 5e-5, 1.0000000000000002e-4])),
    "long_string": (lambda p, v: isinstance(v, str),
                    lambda rng, v: "y" * rng.choice([0, 200, 201, 249, 250, 256, 257, 1025])),
    # (no value ending in a newline: Python's `re` lets `$` match before one, ECMA-262 and the decoder do not)
    "bad_team": (lambda p, v: p[-1] == "team", lambda rng, v: rng.choice(["red team", "", "a/b", "é", "red\t"])),
    "length_mismatch": (lambda p, v: isinstance(v, list) and p[-1] in LENGTH_COUPLED - {"response_ids"},
                        lambda rng, v: v[:-1] if v and rng.random() < 0.5 else v + [0]),
}


def _replace(rng: random.Random, record: dict, op: str, kind: str) -> str | None:
    which, new_value = REPLACE[op]
    found = [(p, v) for p, v in _nodes(record) if which(p, v)]
    if not found:
        return None
    path, value = rng.choice(found)
    _set(record, path, new_value(rng, value))
    return _label(op, path, kind)


def _label(op: str, path: list, kind: str) -> str:
    """The mutation's name, or the decoder-only rule it may break besides (checked by name below)."""
    if kind == "parked_group" and path[0] == "group" and len(path) > 1:  # the group it carries: its rules
        return _label(op, path[1:], "rollout_group")
    field = path[-1] if len(path) == 1 or (path[0], len(path)) in (("task", 2), ("trajectories", 3)) else None
    if op == "empty_list" and field in LENGTH_COUPLED:
        return "length_mismatch"  # one of the arrays that must have equal lengths
    if kind == "rollout_group" and field in GROUP_KEYS:
        return "group_mismatch"  # a still valid id or team, no longer the group's (or a default taking its place)
    if kind == "rollout_group" and field == "traj_id":
        return "duplicate_traj_id"
    if kind == "feedback" and path[0] in ("reward", "label", "preference", "target_id"):
        return "feedback_rating"  # e.g. a rating left with none, or two, or a target_id beside a preference
    return op


def _drop_field(rng: random.Random, record: dict, kind: str) -> str | None:
    found = [p for p, _ in _nodes(record) if not isinstance(p[-1], int)]
    if not found:
        return None
    path = rng.choice(found)
    parent = record
    for key in path[:-1]:
        parent = parent[key]
    del parent[path[-1]]
    return _label("drop_field", path, kind)


def _nested_value(rng: random.Random, levels: int) -> object:
    value: object = rng.choice([1, math.nan, "s", 2**63, -0.5])
    for _ in range(levels):
        value = [value] if rng.random() < 0.5 else {"k": value}
    return value


def mutate(rng: random.Random, record: dict, kind: str) -> str | None:
    """Apply one random mutation in place; its name, or None when it does not apply to this record."""
    op = rng.choice(OPS)
    if op in REPLACE:
        return _replace(rng, record, op, kind)
    if op == "drop_field":
        return _drop_field(rng, record, kind)
    if op == "drop_kind":
        rng.choice(_messages(record)).pop("kind", None)
    elif op == "wrong_kind":
        rng.choice(_messages(record))["kind"] = rng.choice([*MESSAGES, "tusk", "", 5, None])
    elif op == "extra_field":
        dicts = [v for _, v in _nodes(record) if isinstance(v, dict)] + [record]
        rng.choice(dicts)[rng.choice(["priority_boost", "x", "kind2"])] = 1
    elif op == "schema_version":
        rng.choice(_messages(record))["schema"] = rng.choice([0, 1, 2, 99, -1, "1", True, None])
    elif op == "bad_sha":
        if kind != "weight_version":
            return None
        record["manifest_sha256"] = rng.choice(["AB" * 32, "ab", "g" * 64, "0" * 65, "0" * 64])
    elif op in ("deep_json", "json_oddity"):
        targets = _free_form(record)
        if not targets:
            return None
        if op == "deep_json":  # at the bound or one past it (the field's own object is one level)
            rng.choice(targets)["deep"] = _nested_value(rng, MAX_JSON_DEPTH - 1 + rng.randint(0, 1))
        else:  # inside metadata/info: nested NaN, huge numbers, bytes, non-string keys
            bad = rng.choice([math.nan, math.inf, 2**63, 2**64 - 1, 1e19, 9.2e18, INT64_MIN, b"raw", 3.0])
            rng.choice(targets)["odd"] = rng.choice([bad, [1, bad], {"a": [bad]}, {rng.choice([1, b"k"]): 1}])
    elif op == "group_mismatch":
        if kind != "rollout_group" or not isinstance(record.get("trajectories"), list) or not record["trajectories"]:
            return None
        traj, key = rng.choice(record["trajectories"]), rng.choice(sorted(GROUP_KEYS))
        if not isinstance(traj, dict) or not isinstance(traj.get(key), str):
            return None  # an earlier mutation already broke this node
        traj[key] = "other" if key == "team" and len(traj[key]) >= 200 else traj[key] + "x"
    elif op == "duplicate_traj_id":
        if kind != "rollout_group" or len(record["trajectories"]) < 2:
            return None
        record["trajectories"][1]["traj_id"] = record["trajectories"][0]["traj_id"]
    elif op == "feedback_rating":
        if kind != "feedback":
            return None
        preference = record.get("preference")
        how = rng.choice(["two", "none", "target", "same"])
        if how == "two":  # a second rating beside the first
            record["label" if record.get("reward") is not None else "reward"] = 1.0 if record.get("label") else "good"
        elif how == "none":
            for key in ("reward", "label", "preference"):
                record.pop(key, None)
        elif how == "target" or not isinstance(preference, dict):  # a target_id beside a preference, or none
            if isinstance(preference, dict):
                record["target_id"] = "t"
            else:
                record.pop("target_id", None)
        else:
            preference["rejected"] = preference.get("chosen")
    else:
        raise AssertionError(op)
    return op


OPS = [*REPLACE, "drop_field", "drop_kind", "wrong_kind", "extra_field", "schema_version", "bad_sha", "deep_json",
       "json_oddity", "group_mismatch", "duplicate_traj_id", "feedback_rating"]


# ---- the two verdicts ------------------------------------------------------------------------------
def _is_json(value) -> bool:
    """What JSON can carry: no NaN or infinity, no bytes, string keys only."""
    if value is None or isinstance(value, (str, bool, int)):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        return all(_is_json(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _is_json(v) for k, v in value.items())
    return False


def schema_accepts(kind: str, record: dict) -> bool:
    return _is_json(record) and VALIDATORS[kind].is_valid(json.loads(json.dumps(record)))


def decoder_accepts(kind: str, record: dict):
    try:
        return decode(msgpack.packb(record, use_bin_type=True), MESSAGES[kind])
    except DecodeError:
        return None


# ---- the tests -------------------------------------------------------------------------------------
def test_the_exported_schemas_are_valid_json_schemas():
    for kind in MESSAGES:
        jsonschema.Draft202012Validator.check_schema(json_schema(kind))


def test_decoder_and_json_schema_agree():
    rng = random.Random(20240607)
    applied: Counter = Counter()
    diverged: Counter = Counter()
    verdicts: Counter = Counter()
    disagreements = []
    for i in range(6000):
        kind = KINDS[i % len(KINDS)]
        record = valid_record(rng, kind)
        ops: list[str] = []
        if i % 6:  # five in six records are mutated, some twice (6, not 5: ten kinds, each mutated)
            for _ in range(1 if rng.random() < 0.8 else 2):
                before = copy.deepcopy(record)
                op = mutate(rng, record, kind)
                if op is None:
                    record = before
                else:
                    ops.append(op)
        applied.update(ops)
        by_schema, msg = schema_accepts(kind, record), decoder_accepts(kind, record)
        verdicts[(by_schema, msg is not None)] += 1
        if not ops:
            assert by_schema and msg is not None, f"a valid {kind} was rejected: {record}"
        if by_schema != (msg is not None):
            if by_schema and msg is None and any(op in DECODER_ONLY for op in ops):
                diverged.update(op for op in ops if op in DECODER_ONLY)
            else:
                disagreements.append((kind, ops, by_schema, record))
        if msg is not None:  # whatever decode accepts encodes, decodes back equal and meets the schema
            assert decode(encode(msg), type(msg)) == msg
            assert schema_accepts(kind, msg.model_dump(by_alias=True))
    assert not disagreements, "\n".join(f"{k} {ops} schema={s}: {r}" for k, ops, s, r in disagreements[:5])
    assert set(applied) == set(OPS) and min(applied.values()) >= 15, applied
    assert set(diverged) == set(DECODER_ONLY), diverged  # every listed rule is needed, and seen
    assert verdicts[(True, True)] >= 1000 and verdicts[(False, False)] >= 1500, verdicts
