"""Membership at 30 explorers on the real broker: members join and leave in random order, some
closed, some killed with -9 (five at a time, a process of five), and the group settles each time
with every slot held by exactly one live member: no task (tasks follow slots) is taken twice once
the group has settled. Members run as threads here and in helper processes, without models: this
is the membership protocol's own load (every join and leave rebalances all members)."""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from streamrft.producers.membership import Membership

ROOT = Path(__file__).resolve().parents[2]

HOST = """
import json, sys, time
from streamrft.config import KafkaConfig
from streamrft.producers.membership import Membership
kafka = KafkaConfig(bootstrap=sys.argv[1])
members = [Membership(kafka, sys.argv[2], f"{sys.argv[3]}-{i}").start() for i in range(int(sys.argv[4]))]
while True:
    print(json.dumps({m.name: sorted(m.slots) for m in members}), flush=True)
    time.sleep(0.3)
"""

pytestmark = pytest.mark.slow


class Host:
    """A process of `n` members; `slots` is what its members last said they hold."""

    def __init__(self, kafka, namespace: str, name: str, n: int):
        self.proc = subprocess.Popen([sys.executable, "-c", HOST, kafka.bootstrap, namespace, name, str(n)],
                                     cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.slots: dict[str, frozenset[int]] = {}
        self.said = 0.0
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.slots = {k: frozenset(v) for k, v in json.loads(line).items()}
            self.said = time.monotonic()

    def kill(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self.slots = {}


def _held(members: list[Membership], hosts: list[Host]) -> dict[str, frozenset[int]]:
    held = {m.name: m.slots for m in members}
    for h in hosts:
        held.update(h.slots)
    return held


def _settled(held: dict[str, frozenset[int]], n_live: int, num_slots: int) -> bool:
    """Every live member holds slots, no slot twice, every slot held."""
    sets = list(held.values())
    return (len(sets) == n_live and all(sets) and sum(map(len, sets)) == num_slots
            and len(frozenset().union(*sets)) == num_slots)


def _wait_settled(members, hosts, n_live: int, timeout: float, what: str) -> float:
    t0 = time.monotonic()
    while True:
        fresh = all(time.monotonic() - h.said < 2 for h in hosts)
        if fresh and _settled(_held(members, hosts), n_live, 64):
            return time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            held = _held(members, hosts)
            raise AssertionError(f"{what}: not settled in {timeout}s: {len(held)} members of {n_live}, "
                                 f"{sum(map(len, held.values()))} slots held, "
                                 f"{sum(1 for s in held.values() if not s)} holding none")
        time.sleep(0.2)


def test_thirty_explorers_join_and_leave_in_random_order_and_every_slot_has_one_owner(stack, namespace):
    rng = random.Random(3)
    members: list[Membership] = []
    hosts: list[Host] = []
    gone: list[Membership] = []
    try:
        # 30 members join: 15 threads here, 3 processes of 5, in random order, 0-0.5 s apart
        joins = ["thread"] * 15 + ["host"] * 3
        rng.shuffle(joins)
        for i, kind in enumerate(joins):
            if kind == "thread":
                members.append(Membership(stack.kafka, namespace, f"m{i}").start())
            else:
                hosts.append(Host(stack.kafka, namespace, f"h{i}", 5))
            time.sleep(rng.uniform(0, 0.5))
        took = _wait_settled(members, hosts, 30, 120, "30 members joined")
        sizes = sorted(len(s) for s in _held(members, hosts).values())
        assert sizes[0] >= 2 and sizes[-1] <= 3, sizes  # 64 slots over 30: 2 or 3 each
        print(f"30 members joined: settled {took:.1f}s after the last join")

        # churn in random order: 5 leave (closed), 5 killed with -9 (a host), 4 join
        events = ["leave"] * 5 + ["kill"] + ["join"] * 4
        rng.shuffle(events)
        for e in events:
            if e == "leave":
                m = members.pop(rng.randrange(len(members)))
                m.stop()
                gone.append(m)
            elif e == "kill":
                hosts.pop(rng.randrange(len(hosts))).kill()
            else:
                members.append(Membership(stack.kafka, namespace, f"j{len(members) + len(gone)}").start())
            time.sleep(rng.uniform(0, 1.0))
        n_live = len(members) + 5 * len(hosts)
        assert n_live == 24
        took = _wait_settled(members, hosts, n_live, 120, "after the churn")
        assert not any(m.slots for m in gone), "a member that left still holds slots"
        print(f"5 left, 5 killed, 4 joined: settled {took:.1f}s after the last event")

        # another host killed and half the threads leave at once
        hosts.pop().kill()
        for m in members[: len(members) // 2]:
            m.stop()
        members = members[len(members) // 2:]
        n_live = len(members) + 5 * len(hosts)
        took = _wait_settled(members, hosts, n_live, 120, "after a mass leave")
        print(f"down to {n_live} members: settled in {took:.1f}s")
    finally:
        for h in hosts:
            h.kill()
        for m in members:
            m.stop()
