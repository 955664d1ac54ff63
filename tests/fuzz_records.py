"""Malformed rollouts records for the stream-ops fuzz test, one generator per kind, and valid groups.

`malformed_kinds()` maps a kind name to `fn(rng) -> (key, value)`; every record it makes must become a
dead letter under the strict wire contract (no type coercion: "3" is not an int, true is not an int,
bytes are not text; integers bounded; NaN/inf nowhere, nested metadata included; a root `kind`).
`valid_group(rng)` makes a group that must be scored, with rewards that vary (never filtered).
`picky_reward` is a user reward (config `import_path: fuzz_records:picky_reward`) that misbehaves
when a response is one of the `CUE_*` strings, so user-code failures are fuzzed too.
(Not a test module: `tests/` is on pytest's `pythonpath`.)
"""
from __future__ import annotations

import math
import random
from copy import deepcopy
from typing import Any, Callable

import msgpack

from streamrft.schemas import SCHEMA_VERSION, ExperienceGroup, Metric, RolloutGroup, Task, Trajectory

TEAM = "fuzz"
ANSWER = "4"
U64_MAX = 2**64 - 1  # the largest integer msgpack can carry
I64_MIN = -(2**63)
HUGE_INT_TEXT = "99999999999999999999999"  # the string that once crashed the agent (OverflowError on encode)
MIB = 1 << 20

CUE_RAISE, CUE_NAN, CUE_NOT_NUMBER, CUE_OVERFLOW, CUE_UNPRINTABLE = (
    "<raise>", "<nan>", "<not-a-number>", "<overflow>", "<unprintable>")

Record = tuple[bytes | None, bytes | None]  # (key, value)


class UnprintableError(Exception):
    def __str__(self) -> str:
        raise RuntimeError("this exception cannot be printed")


def picky_reward(response: str, answer: str | None, **params) -> float:
    """0.0, except on cue: raises, NaN, a non-number, a value that overflows once weighted, an unprintable error."""
    if response == CUE_RAISE:
        raise KeyError("picky reward refuses this response")
    if response == CUE_NAN:
        return float("nan")
    if response == CUE_NOT_NUMBER:
        return "not a number"  # type: ignore[return-value]  # float() of it raises
    if response == CUE_OVERFLOW:
        return 1.7e308  # finite, but x2 (the term's weight in the fuzz config) is inf
    if response == CUE_UNPRINTABLE:
        raise UnprintableError()
    return 0.0


def pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def valid_group(rng: random.Random, n: int | None = None, response_tokens: int | None = None,
                responses: list[str] | None = None) -> dict:
    """The wire dict of a valid group: 2-6 trajectories, at least one right and one wrong answer."""
    gid = f"g-{rng.getrandbits(64):016x}"
    task = Task(task_id=f"t-{gid}", prompt="2+2=", answer=ANSWER,
                prompt_ids=rng.choice([None, [rng.randrange(50_000) for _ in range(rng.randint(1, 8))]]),
                metadata={"source": "fuzz", "level": rng.randint(0, 5), "weight": rng.random(),
                          "tags": ["a", {"nested": [1, 2.5, "x", None, True]}]})
    if responses is None:
        n = n or rng.randint(2, 6)
        responses = ["4", "5"] + [rng.choice(["4", "5", " 4 ", "x", "", "44", "four"]) for _ in range(n - 2)]
        rng.shuffle(responses)
    trajs = []
    for i, text in enumerate(responses):
        length = response_tokens if response_tokens is not None else rng.randint(0, 12)
        mask = rng.choice([None, [rng.randint(0, 1) for _ in range(length)]])
        trajs.append(Trajectory(
            traj_id=f"{gid}-{i}", group_id=gid, task_id=task.task_id, team=TEAM, model_version=rng.randint(0, 10**6),
            prompt_ids=[rng.randrange(50_000) for _ in range(rng.randint(1, 10))],
            response_ids=[rng.randrange(50_000) for _ in range(length)],
            logprobs=[-rng.random() * 8 for _ in range(length)], loss_mask=mask, response_text=text,
            env_reward=rng.choice([None, rng.uniform(-1, 1)]), finish_reason=rng.choice(["stop", "length"]),
            info={"turns": rng.randint(1, 3), "tool": rng.choice(["calc", None])}))
    return RolloutGroup(group_id=gid, team=TEAM, task=task, trajectories=trajs,
                        producer_id="fuzzer").model_dump(by_alias=True)


def _key(group: dict) -> bytes:
    gid = group.get("group_id")
    return gid.encode() if isinstance(gid, str) else b"fuzz"


def _mutated(mutate: Callable[[random.Random, dict], Any]) -> Callable[[random.Random], Record]:
    """A kind that takes a valid group, changes it in place with `mutate`, and packs it."""
    def make(rng: random.Random) -> Record:
        group = valid_group(rng)
        key = _key(group)
        mutate(rng, group)
        return key, pack(group)
    return make


def _some_traj(rng: random.Random, group: dict) -> dict:
    return rng.choice(group["trajectories"])


def _set(path: tuple, values: list) -> Callable[[random.Random, dict], None]:
    """Set `path` (a "*" step: one random trajectory) to one of `values`."""
    def mutate(rng: random.Random, group: dict) -> None:
        node = group
        for step in path[:-1]:
            node = _some_traj(rng, group) if step == "*" else node[step]
        node[path[-1]] = deepcopy(rng.choice(values))
    return mutate


def _delete(path: tuple) -> Callable[[random.Random, dict], None]:
    def mutate(rng: random.Random, group: dict) -> None:
        node = group
        for step in path[:-1]:
            node = _some_traj(rng, group) if step == "*" else node[step]
        del node[path[-1]]
    return mutate


def _name(path: tuple) -> str:
    return ".".join("traj" if s == "*" else str(s) for s in path)


# Values of the wrong type for each field; each one is refused by a decoder that does not coerce.
WRONG_TYPES: dict[tuple, list] = {
    ("group_id",): [5, None, b"gid", ["g"], True, 1.5],
    ("team",): [5, None, TEAM.encode(), True, [TEAM]],
    ("producer_id",): [5, b"fuzzer", ["p"], None],
    ("created_at",): ["1.0", None, b"1", [1.0], True, {"t": 1.0}],
    ("schema",): ["1", True, 1.0, None, b"\x01", [1]],
    ("kind",): [7, None, b"rollout_group", ["rollout_group"], True],
    ("task",): ["2+2=", 5, None, [1], b"task"],
    ("task", "task_id"): [5, b"t", None, 1.5],
    ("task", "prompt"): [5, None, b"2+2=", ["2+2="], 2.5],
    ("task", "answer"): [4, b"4", ["4"], True, 4.0],
    ("task", "prompt_ids"): ["12", [1.0], ["1"], [True], b"\x01\x02", 5, [[1]]],
    ("task", "metadata"): ["m", [1], 5, b"m", True],
    ("trajectories",): [{"0": 1}, "x", 5, None, b"t"],
    ("*", "model_version"): ["3", True, 1.0, 1.5, None, b"3", [3], "0x10"],
    ("*", "prompt_ids"): ["12", [1.0], ["1"], [True], b"\x01\x02", None, [[1]]],
    ("*", "response_ids"): ["3", ["3"], [3.0], [True], b"\x03", None],
    ("*", "logprobs"): [["-0.1"], ["x"], "-0.1", [None], [True], b"\x00", None],
    ("*", "loss_mask"): [[True], ["1"], [1.0], "1", b"\x01", 1],
    ("*", "response_text"): [b"4", 4, None, ["4"], 4.0],
    ("*", "env_reward"): ["1.0", True, b"1", [1.0], {"r": 1.0}],
    ("*", "finish_reason"): [5, b"stop", None, ["stop"]],
    ("*", "info"): ["i", [1], 5, b"i", None],
    ("*", "traj_id"): [5, b"x", None, ["x"]],
    ("*", "group_id"): [5, b"g", None],
    ("*", "task_id"): [5, b"t", None],
    ("*", "team"): [5, TEAM.encode(), None],
    ("*", "created_at"): ["1.0", True, None, b"1"],
    ("*", "schema"): ["1", True, 1.0, None],
    ("*", "kind"): ["task", 5, None, b"trajectory", "rollout_group"],
}

MISSING = [("kind",), ("task",), ("trajectories",), ("task", "prompt"), ("*", "group_id"), ("*", "task_id"),
           ("*", "model_version"), ("*", "prompt_ids"), ("*", "response_ids"), ("*", "logprobs")]

NON_FINITE = [math.nan, math.inf, -math.inf]


def _nested_non_finite(rng: random.Random) -> Any:
    bad = rng.choice(NON_FINITE)
    return rng.choice([bad, [1, bad], {"a": {"b": [0.5, bad]}}, [{"deep": [[bad]]}]])


def _set_non_finite_in(where: str) -> Callable[[random.Random, dict], None]:
    def mutate(rng: random.Random, group: dict) -> None:
        node = group["task"]["metadata"] if where == "metadata" else _some_traj(rng, group)["info"]
        node[rng.choice(["score", "extra", "level"])] = _nested_non_finite(rng)
    return mutate


def _mismatch(field: str) -> Callable[[random.Random, dict], None]:
    def mutate(rng: random.Random, group: dict) -> None:
        t = _some_traj(rng, group)
        n = len(t["response_ids"])
        t[field] = [0 if field == "loss_mask" else -0.5] * rng.choice([n + 1, n + 7] + ([n - 1] if n else []))
    return mutate


def _set_one_token(field: str, value: Any) -> Callable[[random.Random, dict], None]:
    """One response token whose `field` entry is `value` (the other lists kept consistent)."""
    def mutate(rng: random.Random, group: dict) -> None:
        t = _some_traj(rng, group)
        t["response_ids"], t["logprobs"], t["loss_mask"] = [7], [-0.25], [1]
        t[field] = [value]
    return mutate


def _duplicate_traj_ids(rng: random.Random, group: dict) -> None:
    group["trajectories"][1]["traj_id"] = group["trajectories"][0]["traj_id"]


def _wrong_team(rng: random.Random, group: dict) -> None:
    other = rng.choice(["other", "default", "fuzz2", ""])
    group["team"] = other
    for t in group["trajectories"]:
        t["team"] = other


def _cue(text: str) -> Callable[[random.Random, dict], None]:
    def mutate(rng: random.Random, group: dict) -> None:
        _some_traj(rng, group)["response_text"] = text
    return mutate


def _random_bytes(rng: random.Random) -> Record:
    return rng.randbytes(rng.randint(1, 8)), rng.randbytes(rng.randint(1, 300))


def _truncated(rng: random.Random) -> Record:
    group = valid_group(rng)
    raw = pack(group)
    return _key(group), raw[:rng.randint(1, len(raw) - 1)]


def _trailing_garbage(rng: random.Random) -> Record:
    group = valid_group(rng)
    return _key(group), pack(group) + rng.choice([b"\x00", b"\xc0", pack({"kind": "rollout_group"})])


def _scalar(rng: random.Random) -> Record:
    value = rng.choice([None, True, 0, -1, U64_MAX, I64_MIN, 1.5, math.nan, "rollout_group", b"\x81", [], [1, 2],
                        [valid_group(rng)]])
    return None, pack(value)


def _invalid_utf8(rng: random.Random) -> Record:
    bad = rng.choice([b"\xff\xfe", b"\xc3\x28", b"\xed\xa0\x80"])  # the last: an encoded lone surrogate
    return None, b"\x81" + pack("kind") + bytes([0xA0 | len(bad)]) + bad


def _invalid_utf8_nested(rng: random.Random) -> Record:
    group = valid_group(rng)
    group["task"]["prompt"] = "\x00PLACEHOLDER\x00"
    bad = b"\xa4\xff\xfeok"  # fixstr of 4 bytes, not UTF-8
    return _key(group), pack(group).replace(pack("\x00PLACEHOLDER\x00"), bad)


def _non_string_key(rng: random.Random) -> Record:
    group = valid_group(rng)
    group[rng.choice([1, -5, 2.5, b"k"])] = "x"
    return _key(group), pack(group)


def _ext_type(rng: random.Random) -> Record:
    group = valid_group(rng)
    ext = msgpack.ExtType(rng.randint(0, 127), rng.randbytes(4))
    target = rng.choice([("group_id",), ("task", "prompt"), ("*", "model_version"), ("*", "response_text")])
    _set(target, [ext])(rng, group)
    return _key(group), pack(group)


def _too_deep(rng: random.Random) -> Record:
    group = valid_group(rng)
    group["task"]["metadata"]["deep"] = "\x00PLACEHOLDER\x00"
    deep = b"\x91" * rng.randint(1100, 3000) + b"\x00"  # nested 1-element arrays, past msgpack's stack
    return _key(group), pack(group).replace(pack("\x00PLACEHOLDER\x00"), deep)


def _empty_value(rng: random.Random) -> Record:
    return b"empty", b""


def _tombstone(rng: random.Random) -> Record:
    return rng.choice([None, b"tombstone"]), None


def _other_message(rng: random.Random) -> Record:
    group = valid_group(rng)
    task = Task(**{k: v for k, v in group["task"].items() if k != "schema"})
    if rng.random() < 0.5:
        return b"task", pack(task.model_dump(by_alias=True))
    if rng.random() < 0.5:
        return b"metric", pack(Metric(role="x", role_id="y", values={"a": 1.0}).model_dump(by_alias=True))
    n = len(group["trajectories"])
    exp = ExperienceGroup(group_id=group["group_id"], team=TEAM, task=task,
                          trajectories=[Trajectory(**{k: v for k, v in t.items() if k != "schema"})
                                        for t in group["trajectories"]],
                          rewards=[0.0] * n, advantages=[0.0] * n)
    return b"exp", pack(exp.model_dump(by_alias=True))


def _huge_random(rng: random.Random) -> Record:
    return b"huge-random", rng.randbytes(3 * MIB)


def _huge_wrong_team(rng: random.Random) -> Record:
    group = valid_group(rng, responses=["4", "5"])
    group["task"]["prompt"] = "x" * (2 * MIB + 123)
    _wrong_team(rng, group)
    return _key(group), pack(group)


def _huge_key(rng: random.Random) -> Record:
    return rng.randbytes(2 * MIB), rng.randbytes(100)


def malformed_kinds() -> dict[str, Callable[[random.Random], Record]]:
    kinds: dict[str, Callable[[random.Random], Record]] = {
        "random_bytes": _random_bytes,
        "truncated_msgpack": _truncated,
        "trailing_garbage": _trailing_garbage,
        "msgpack_not_a_map": _scalar,
        "invalid_utf8_root": _invalid_utf8,
        "invalid_utf8_nested": _invalid_utf8_nested,
        "non_string_map_key": _non_string_key,
        "msgpack_ext_type": _ext_type,
        "nested_past_msgpack_limit": _too_deep,
        "empty_value": _empty_value,
        "tombstone": _tombstone,
        "other_message_kind": _other_message,
        "unknown_kind": _mutated(_set(("kind",), ["banana", "rollout_groups", "ROLLOUT_GROUP", ""])),
        "unsupported_schema_version": _mutated(_set(("schema",), [0, SCHEMA_VERSION + 1, 999, -1])),
        "extra_field.root": _mutated(_set(("surprise",), [1, None, "x"])),
        "extra_field.task": _mutated(_set(("task", "surprise"), [1, None, "x"])),
        "extra_field.traj": _mutated(_set(("*", "surprise"), [1, None, "x"])),
        "wrong_team_for_topic": _mutated(_wrong_team),
        "traj_team_differs": _mutated(_set(("*", "team"), ["other", "default"])),
        "traj_group_id_mismatch": _mutated(_set(("*", "group_id"), ["another-group", ""])),
        "traj_task_id_mismatch": _mutated(_set(("*", "task_id"), ["another-task", ""])),
        "duplicate_traj_ids": _mutated(_duplicate_traj_ids),
        "empty_group": _mutated(_set(("trajectories",), [[]])),
        "empty_prompt_ids": _mutated(_set(("*", "prompt_ids"), [[]])),
        "negative_token_id": _mutated(_set_one_token("response_ids", -1)),
        "positive_logprob": _mutated(_set_one_token("logprobs", 0.5)),
        "loss_mask_not_binary": _mutated(_set_one_token("loss_mask", 2)),
        "length_mismatch.logprobs": _mutated(_mismatch("logprobs")),
        "length_mismatch.loss_mask": _mutated(_mismatch("loss_mask")),
        "huge_int.model_version": _mutated(_set(("*", "model_version"), [U64_MAX])),
        "huge_int.schema": _mutated(_set(("schema",), [U64_MAX])),
        "huge_int.prompt_ids": _mutated(_set(("*", "prompt_ids"), [[U64_MAX], [1, U64_MAX]])),
        "huge_int.response_ids": _mutated(_set_one_token("response_ids", U64_MAX)),
        "huge_int.loss_mask": _mutated(_set_one_token("loss_mask", U64_MAX)),
        "huge_int.task_prompt_ids": _mutated(_set(("task", "prompt_ids"), [[U64_MAX]])),
        "negative_int.model_version": _mutated(_set(("*", "model_version"), [I64_MIN, -1])),
        "negative_int.prompt_ids": _mutated(_set(("*", "prompt_ids"), [[I64_MIN]])),
        "huge_int_text.model_version": _mutated(_set(("*", "model_version"), [HUGE_INT_TEXT, "-" + HUGE_INT_TEXT])),
        "huge_int_text.schema": _mutated(_set(("schema",), [HUGE_INT_TEXT])),
        "huge_int_text.token_ids": _mutated(_set(("*", "prompt_ids"), [[HUGE_INT_TEXT], [1, HUGE_INT_TEXT]])),
        "non_finite.created_at": _mutated(_set(("created_at",), NON_FINITE)),
        "non_finite.task.created_at": _mutated(_set(("task", "created_at"), NON_FINITE)),
        "non_finite.traj.created_at": _mutated(_set(("*", "created_at"), NON_FINITE)),
        "non_finite.traj.env_reward": _mutated(_set(("*", "env_reward"), NON_FINITE)),
        "non_finite.traj.logprobs": _mutated(_set_one_token("logprobs", math.nan)),
        "non_finite.task.metadata": _mutated(_set_non_finite_in("metadata")),
        "non_finite.traj.info": _mutated(_set_non_finite_in("info")),
        "reward_raises": _mutated(_cue(CUE_RAISE)),
        "reward_returns_nan": _mutated(_cue(CUE_NAN)),
        "reward_returns_not_a_number": _mutated(_cue(CUE_NOT_NUMBER)),
        "reward_overflows_when_weighted": _mutated(_cue(CUE_OVERFLOW)),
        "reward_raises_unprintable": _mutated(_cue(CUE_UNPRINTABLE)),
    }
    for path, values in WRONG_TYPES.items():
        kinds[f"wrong_type.{_name(path)}"] = _mutated(_set(path, values))
    for path in MISSING:
        kinds[f"missing.{_name(path)}"] = _mutated(_delete(path))
    return kinds


HUGE_KINDS: dict[str, tuple[Callable[[random.Random], Record], int]] = {
    "huge_random_bytes": (_huge_random, 2),
    "huge_group_wrong_team": (_huge_wrong_team, 2),
    "huge_key": (_huge_key, 1),
}
"""Multi-MB records, a few of each (name -> (maker, count)): their dead letters are truncated."""
