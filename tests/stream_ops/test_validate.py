"""Validation of raw rollouts records: good groups pass, every kind of bad one names its reason."""
from __future__ import annotations

import msgpack
import pytest

from streamrft.schemas import RolloutGroup, Task, Trajectory, encode
from streamrft.stream_ops.validate import InvalidRollout, team_of_topic, validate


def make_group(team: str = "default", responses: tuple[str, ...] = ("4", "5")) -> RolloutGroup:
    task = Task(task_id="t1", prompt="2+2=", answer="4")
    trajs = [Trajectory(traj_id=f"x{i}", group_id="g1", task_id="t1", team=team, model_version=3,
                        prompt_ids=[1, 2], response_ids=[5, 6], logprobs=[-0.5, -1.0], response_text=r)
             for i, r in enumerate(responses)]
    return RolloutGroup(group_id="g1", team=team, task=task, trajectories=trajs)


def tampered(**edits) -> bytes:
    """A good group's wire dict with some fields replaced (`trajectories.1.task_id=...`)."""
    raw = make_group().model_dump(by_alias=True)
    for path, value in edits.items():
        node = raw
        *parents, last = path.split("__")
        for p in parents:
            node = node[int(p)] if p.isdigit() else node[p]
        node[last] = value
    return msgpack.packb(raw, use_bin_type=True)


def reason(raw, **kw) -> InvalidRollout:
    with pytest.raises(InvalidRollout) as info:
        validate(raw, **kw)
    return info.value


def test_good_group_round_trips():
    group = make_group(team="red")
    assert validate(encode(group), expected_team="red") == group


def test_empty_responses_everywhere_are_fine():
    group = make_group(responses=("", ""))
    assert validate(encode(group)).trajectories[0].response_text == ""


def test_not_msgpack_and_tombstone_and_wrong_kind():
    assert reason(b"\xc1garbage").field == "<bytes>"
    assert "tombstone" in reason(None).reason
    assert reason(b"").reason == "empty payload"
    e = reason(encode(Task(prompt="p")))
    assert e.field == "kind" and "expected 'rollout_group'" in e.reason


def test_trajectory_of_another_task():
    e = reason(tampered(trajectories__1__task_id="other"))
    assert "task_id" in str(e) and "other" in str(e)


def test_schema_errors_name_the_field():
    assert reason(tampered(trajectories__0__model_version=-1)).field == "trajectories.0.model_version"
    assert reason(tampered(trajectories__0__logprobs=[0.5, -1.0])).field == "trajectories.0.logprobs.0"
    assert "logprobs has 1 entries" in reason(tampered(trajectories__1__logprobs=[-1.0])).reason
    assert reason(tampered(trajectories=[])).field == "trajectories"


def test_team_checks():
    e = reason(encode(make_group(team="red")), expected_team="blue")
    assert e.field == "team" and "'red'" in e.reason and "'blue'" in e.reason
    e = reason(tampered(trajectories__1__team="blue"))
    assert e.field == "trajectories.1.team"


def test_non_finite_env_reward():
    assert reason(tampered(trajectories__0__env_reward=float("nan"))).field == "trajectories.0.env_reward"


def test_team_of_topic():
    assert team_of_topic("ns.rollouts.red", "ns") == "red"
    assert team_of_topic("ns.rollouts.", "ns") is None
    assert team_of_topic("other.rollouts.red", "ns") is None


def test_non_finite_created_at_and_out_of_range_numbers():
    assert reason(tampered(created_at=float("inf"))).field == "created_at"
    assert reason(tampered(trajectories__1__created_at=float("nan"))).field == "trajectories.1.created_at"
    assert reason(tampered(trajectories__0__model_version="99999999999999999999999")).field == \
        "trajectories.0.model_version"
    assert reason(tampered(task__prompt_ids=[1, -2])).field == "task.prompt_ids.1"
    assert reason(tampered(task__metadata={"a": [float("nan")]})).field == "task.metadata.a.0"


def test_missing_kind_is_rejected_like_the_schema_says():
    raw = make_group().model_dump(by_alias=True)
    del raw["kind"]
    assert reason(msgpack.packb(raw, use_bin_type=True)).field == "kind"


def test_only_invalid_rollout_escapes(monkeypatch):
    import random

    rng = random.Random(7)
    good = encode(make_group())
    for _ in range(300):  # random damage to a good record: always InvalidRollout or a group
        data = bytearray(good)
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        try:
            validate(bytes(data))
        except InvalidRollout:
            pass

    def broken_decoder(*args, **kwargs):
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr("streamrft.stream_ops.validate.decode", broken_decoder)
    e = reason(good)
    assert e.field == "<bytes>" and "RecursionError" in e.reason
