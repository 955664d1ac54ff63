"""The demo loop as separate role processes, supervised, and the checks of what it left, from
durable records only: shared by the chaos test (kill -9) and the network-fault test."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

from streamrft.launch.roles import Role, spawn
from streamrft.schemas import DeadLetter, ExperienceGroup, RolloutGroup, WeightVersion, decode, topic_name
from tests_helpers import read_all


class Roles:
    """The role processes, restarted when they die (as `restart: on-failure`)."""

    def __init__(self, config: Path, logs: Path):
        self.config, self.logs = config, logs
        self.args = {"trainer": ["train"], "stream-ops": ["score"],
                     "explorer-0": ["explore", "--index", "0"], "explorer-1": ["explore", "--index", "1"]}
        self.procs: dict[str, Role] = {}
        self.pids: list[int] = []
        self.starts: Counter = Counter()
        self.exits: list[tuple[str, int]] = []
        self.trainer_done = False
        logs.mkdir(parents=True, exist_ok=True)

    def start(self, name: str) -> None:
        cmd, *rest = self.args[name]
        log = self.logs / f"{name}.log"
        with open(log, "ab") as fh:
            fh.write(f"\n==== start {self.starts[name] + 1} at {time.time():.1f}\n".encode())
        # forked from the fork server, as `streamrft run` starts the CPU demo's roles (`fork_roles`)
        p = spawn([cmd, str(self.config), *rest], log, fork=True)
        self.procs[name] = p
        self.pids.append(p.pid)
        self.starts[name] += 1

    def supervise(self) -> None:
        for name, p in list(self.procs.items()):
            if p.poll() is None:
                continue
            if name == "trainer" and p.returncode == 0:
                self.trainer_done = True
                continue
            self.exits.append((name, p.returncode))
            self.start(name)

    def kill(self, name: str) -> None:
        os.kill(self.procs[name].pid, signal.SIGKILL)
        self.procs[name].wait()

    def stop(self, names: list[str], timeout: float = 60.0) -> None:
        for name in names:
            p = self.procs.pop(name, None)
            if p is None or p.poll() is not None:
                continue
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                raise AssertionError(f"{name} did not stop within {timeout}s of SIGTERM") from None

    def kill_all(self) -> None:
        """SIGKILL every role process still running (a test's `finally`)."""
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()

    def tail(self, name: str, n: int = 3000) -> str:
        path = self.logs / f"{name}.log"
        return f"--- {name} ---\n" + (path.read_text(errors="replace")[-n:] if path.exists() else "(no log)")

    def wait_for_a_version(self, ckpt: Path, after: int, within: float, what: str, not_before: float = 0.0) -> int:
        """Supervise until the trainer has a checkpoint newer than `after` (and the clock has passed
        `not_before`); returns its version. Fails on a stall or a trainer that finished already."""
        from tests_helpers import trainer_version

        deadline = time.monotonic() + within
        while time.monotonic() < not_before or trainer_version(ckpt) <= after:
            self.supervise()
            assert not self.trainer_done, f"the trainer finished too soon: raise its max_steps ({what})"
            assert time.monotonic() < deadline, (
                f"stall: no trainer version after v{after} within {within:.0f}s; {what}\n"
                + "\n".join(self.tail(n) for n in self.args))
            time.sleep(0.2)
        return trainer_version(ckpt)

    def wind_down(self, kafka, ns: str, team: str) -> None:
        """The trainer finishes its steps, the explorers stop, stream ops catches up with everything
        they produced (its committed offsets at the rollouts' ends), then stops."""
        from streamrft.infra.kafka import committed_offsets, partition_ends

        deadline = time.monotonic() + 600
        while not self.trainer_done:
            self.supervise()
            assert time.monotonic() < deadline, "trainer did not finish\n" + self.tail("trainer")
            time.sleep(0.2)
        self.stop(["explorer-0", "explorer-1"])

        # stream ops catches up with everything the explorers produced, then stops
        rollouts = topic_name(ns, "rollouts", team)
        ends = {e.partition: e.end for e in partition_ends(kafka, rollouts)}
        deadline = time.monotonic() + 180
        while True:
            self.supervise()
            done = committed_offsets(kafka, f"{ns}.stream-ops", rollouts, list(ends))
            if all(done[p] >= end for p, end in ends.items() if end > 0):
                break
            assert time.monotonic() < deadline, f"stream ops stuck at {done}, ends {ends}\n" + self.tail("stream-ops")
            time.sleep(1.0)
        self.stop(["stream-ops"])


def check_loop_accounting(cfg, kafka, ckpt: Path, max_steps: int, logs: Path, what: str) -> None:
    """After a run that finished `max_steps`: every version in S3 and announced in order; every
    rollout group an experience, a zero-variance group or a dead letter; nothing trained twice.
    `what` (the faults or kills) goes into the failure messages."""
    from streamrft.infra.objectstore import WeightStore
    from streamrft.stream_ops.scoring import build_scorer

    ns = cfg.namespace
    rollouts = topic_name(ns, "rollouts", cfg.explorer.team)
    # versions: all in S3, all announced, announcements never go backwards
    final = json.loads((ckpt / f"v{max_steps}" / "state.json").read_text())
    assert final["version"] == max_steps and final["step"] == max_steps
    assert WeightStore(cfg.s3).list_versions(cfg.weights_key) == list(range(max_steps + 1))
    announced = [decode(m.value(), WeightVersion).version for m in read_all(kafka, topic_name(ns, "weights"))]
    assert set(announced) >= set(range(max_steps + 1)), f"never announced: {sorted(set(range(max_steps + 1)) - set(announced))}"
    assert announced == sorted(announced), f"announcements went backwards: {announced}"

    # every rollout group: an experience, a zero-variance group, or a dead letter
    groups, where = {}, {}
    for m in read_all(kafka, rollouts):
        g = decode(m.value(), RolloutGroup)
        groups.setdefault(g.group_id, g)
        where.setdefault(g.group_id, (m.partition(), m.offset(), g.producer_id, g.trajectories[0].model_version))
    experiences = [decode(m.value(), ExperienceGroup) for m in read_all(kafka, topic_name(ns, "experiences"))]
    dead = [decode(m.value(), DeadLetter) for m in read_all(kafka, topic_name(ns, "dlq"))]
    assert not dead, f"valid groups were dead-lettered: {[d.reason for d in dead][:5]}"
    scored = {e.group_id for e in experiences}
    scorer = build_scorer(cfg)
    unaccounted = [gid for gid, g in groups.items() if gid not in scored and scorer(g) is not None]
    assert not unaccounted, (f"{len(unaccounted)} of {len(groups)} rollout groups became nothing: "
                             f"(partition, offset, producer, model version) {[where[g] for g in unaccounted]}; "
                             f"{what}\n" + (logs / "stream-ops.log").read_text()[-3000:])
    print(f"rollout groups {len(groups)}, experiences {len(experiences)} ({len(scored)} distinct), "
          f"filtered {len(groups) - len(scored)}")

    # the audit trail: nothing trained twice, only real experiences, matching the trainer's count
    audit = Counter(i for f in (ckpt / "audit").glob("v*.json") for i in json.loads(f.read_text()))
    twice = [i for i, n in audit.items() if n > 1]
    assert not twice, f"{len(twice)} trajectories trained twice"
    assert set(audit) <= {t.traj_id for e in experiences for t in e.trajectories}
    assert sum(audit.values()) == final["counts"]["trained"] > 0
    print(f"trained {final['counts']}")
