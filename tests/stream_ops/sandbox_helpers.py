"""What a sandbox run may leave behind, seen from the host: processes descending from this test
process, run cgroups, scratch mount points, SysV IPC objects."""
from __future__ import annotations

import glob
import os
import re
from pathlib import Path

from streamrft.stream_ops.sandbox import Limits, close_pools
from streamrft.stream_ops.sandbox.jail import SCRATCH_PREFIX, cgroup_bases

TESTS = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(10, 5) == 15"]
HONEST = "def add(a, b):\n    return a + b"
WRONG = "def add(a, b):\n    return 0"
"""Passes only add(-1, 1) == 0: 1/3. An attack appended to it must not score more."""
WRONG_SCORE = 1 / 3
COLD = Limits(cpu_s=2, wall_s=20, memory_mb=256, processes=16, warm=0)
"""No warm jails: each run starts and destroys its own, so what it leaves shows at once."""


def descendants() -> list[tuple[int, str]]:
    """Live processes below this one (pid, name)."""
    parent: dict[int, int] = {}
    names: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            status = Path(f"/proc/{entry}/status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        parent[int(entry)] = int(fields["PPid"])
        names[int(entry)] = fields["Name"].strip()
    me, out = os.getpid(), []
    for pid in parent:
        p = parent[pid]
        while p and p != me and p in parent:
            p = parent[p]
        if p == me:
            out.append((pid, names[pid]))
    return sorted(out)


def _ours(scratch: str, mine: set[int]) -> bool:
    """A run tmpfs made by this process or a live one below it. A jail's tmpfs is mounted by the
    process that spawns the jail, so one named after any other pid is not this test's: another
    pytest-xdist worker's (its runs come and go meanwhile), or one a dead process left, which the
    next spawn anywhere sweeps away (CI 2026-12-05 and 2026-12-06: four of a dead pid's, seen
    before a test and swept during it, were counted as a difference)."""
    m = re.match(re.escape(SCRATCH_PREFIX) + r"(\d+)-", os.path.basename(scratch))
    return m is None or int(m[1]) in mine


def leftovers() -> dict:
    """Everything of this process's sandbox runs that exists now, once the warm jails are destroyed."""
    close_pools()
    below = descendants()
    mine = {os.getpid(), *(pid for pid, _ in below)}
    found = cgroup_bases()
    cgroups = sorted(d for base in (found[1] if found else ()) for d in glob.glob(os.path.join(base, f"w{os.getpid()}-*")))
    ipc = {kind: len(Path(f"/proc/sysvipc/{kind}").read_text().splitlines()) for kind in ("shm", "msg", "sem")}
    scratch = sorted(d for d in glob.glob(f"/tmp/{SCRATCH_PREFIX}*") if _ours(d, mine))
    return {"processes": [p for p in below if p[1] in ("bwrap", "python3.11", "python3", "python")],
            "cgroups": cgroups, "scratch": scratch, "ipc": ipc}


def gave(reason: str, test: int) -> str:
    """What test `test`'s call returned, as the failure reason shows it."""
    m = re.search(rf"test {test}: AssertionError: .*? gave (.*?)(?:; test \d+: |$)", reason)
    return m.group(1) if m else ""
