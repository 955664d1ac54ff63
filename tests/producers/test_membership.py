"""Explorer membership on the real broker: members split the slots, and the slots of one that
leaves (closed, or killed with -9) move to the others within the session timeout and a join."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from streamrft.producers.membership import Membership

ROOT = Path(__file__).resolve().parents[2]

MEMBER = """
import sys, time
from streamrft.config import KafkaConfig
from streamrft.producers.membership import Membership
m = Membership(KafkaConfig(bootstrap=sys.argv[1]), sys.argv[2], "killed").start()
while True:
    print(len(m.slots), flush=True)
    time.sleep(0.5)
"""


def _until(cond, timeout: float, what: str) -> float:
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout, f"{what}: not within {timeout}s"
        time.sleep(0.1)
    return time.monotonic() - t0


def _split(*members: Membership) -> bool:
    """Every member holds slots, no slot twice, all slots held."""
    sets = [m.slots for m in members]
    return all(sets) and sum(map(len, sets)) == len(frozenset().union(*sets)) == members[0].num_slots


def test_members_split_the_slots_and_take_over_those_of_one_that_leaves(stack, namespace):
    a = Membership(stack.kafka, namespace, "a").start()
    b = Membership(stack.kafka, namespace, "b").start()
    others: list[Membership] = [b]
    killed = None
    try:
        assert a.num_slots == b.num_slots == 64
        _until(lambda: _split(a, b), 30, "two members split the slots")
        assert {len(a.slots), len(b.slots)} == {32}

        b.stop()  # leaves the group: no session timeout to wait for
        _until(lambda: len(a.slots) == 64, 15, "the closed member's slots move to the other one")

        killed = subprocess.Popen([sys.executable, "-c", MEMBER, stack.kafka.bootstrap, namespace], cwd=ROOT,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _until(lambda: 0 < len(a.slots) < 64, 30, "a member in another process takes a share")
        c = Membership(stack.kafka, namespace, "c").start()
        others.append(c)
        _until(lambda: c.slots and len(a.slots) + len(c.slots) < 64, 30, "a third member takes a share")
        assert sorted(map(len, (a.slots, c.slots))) in ([21, 21], [21, 22])  # 64 = 22 + 21 + 21

        os.kill(killed.pid, signal.SIGKILL)
        killed.wait()
        took = _until(lambda: _split(a, c), 20, "the killed member's slots move to the others")
        assert took < 15, took  # session timeout (6 s) + one join (3 s) + polling
        assert sorted(map(len, (a.slots, c.slots))) == [32, 32]
    finally:
        if killed is not None and killed.poll() is None:
            killed.kill()
            killed.wait()
        for m in (a, *others):
            m.stop()
    assert not a.slots  # a stopped member holds nothing


def test_no_slot_before_the_first_assignment(stack, namespace):
    m = Membership(stack.kafka, namespace, "early")
    assert m.slots == frozenset()
    m.start()
    try:
        _until(lambda: len(m.slots) == 64, 30, "a lone member gets every slot")
    finally:
        m.stop()


def test_more_members_than_slots_one_holds_none_and_gets_slots_when_another_leaves(stack, namespace):
    members = [Membership(stack.kafka, namespace, f"m{i}", num_slots=2).start() for i in range(3)]
    try:
        assert all(m.num_slots == 2 for m in members)
        _until(lambda: sorted(len(m.slots) for m in members) == [0, 1, 1], 30, "two of three hold a slot")
        idle = next(m for m in members if not m.slots)
        busy = next(m for m in members if m.slots)
        busy.stop()
        _until(lambda: len(idle.slots) == 1, 15, "the member without a slot takes the freed one")
    finally:
        for m in members:
            m.stop()
