"""Run untrusted Python (a response's code) against tests, with verdicts the code cannot reach.

`run_tests(code, tests, limits)` -> `SandboxResult(passed, total, reason)`.

- Each test is split when it is loaded (`cases.py`) into an input the sandbox runs (a call
  expression, or a program's stdin) and an expected value the parent keeps; a test that cannot be
  split raises `TestFormatError`. The runner in the sandbox (`runner.py`) sends back what the call
  returned (plain values only) or what the program printed, and the parent compares. The
  expected values never enter the sandbox.
- A nonce-tagged handshake, written after the runner has its job and its limits and before the
  solution runs, marks the sandbox as set up: only a missing handshake raises `SandboxUnavailable`;
  whatever the solution does after it (exit codes, crashes, messages) counts against it.
- The sandbox (`jail.py`): bubblewrap namespaces, a read-only root of the interpreter and its
  stdlib, a new /proc, a size- and inode-capped tmpfs, a cgroup per run for memory and processes.
  Warm jails (`pool.py`) hide its start-up; every jail runs one solution (or one test, with
  `isolate="test"`) and is destroyed.
"""
from __future__ import annotations

import marshal
import os
import secrets
import select
import time
from dataclasses import dataclass, fields

from streamrft.stream_ops.sandbox.cases import Case, TestFormatError, judge, parse_case, parse_cases
from streamrft.stream_ops.sandbox.jail import JailSpec, SandboxUnavailable
from streamrft.stream_ops.sandbox.pool import close_pools, pool_for, retire
from streamrft.stream_ops.sandbox.runner import ValueFormatError, decode_value, read_lines

__all__ = ["Case", "Limits", "SandboxResult", "SandboxUnavailable", "TestFormatError", "close_pools",
           "parse_case", "parse_cases", "run_cases", "run_tests"]

_RANGES = {"cpu_s": (1, 600), "memory_mb": (32, 65536), "file_mb": (1, 1024), "processes": (2, 4096),
           "open_files": (16, 65536), "wall_s": (0.5, 3600), "tmpfs_mb": (1, 4096), "inodes": (64, 1 << 20),
           "warm": (0, 64), "cpus": (0.05, 256)}


@dataclass(frozen=True)
class Limits:
    cpu_s: int = 5
    """RLIMIT_CPU: CPU seconds of each process."""
    memory_mb: int = 512
    """Memory of the whole run (its cgroup: every process, its tmpfs and pipes), and RLIMIT_AS of each process."""
    file_mb: int = 4
    """RLIMIT_FSIZE: the largest file a process may write (its stdout, stderr and results included)."""
    processes: int = 32
    """Processes of the whole run (its cgroup's pids.max, and RLIMIT_NPROC in its own user namespace)."""
    open_files: int = 64
    wall_s: float = 10.0
    """Wall-clock limit of one jail's run (the solution and its tests); past it the jail is killed."""
    tmpfs_mb: int = 16
    """Size of the run's /tmp (its working directory)."""
    inodes: int = 4096
    """Files and directories the run's /tmp may hold (tmpfs nr_inodes)."""
    cpus: float = 1.0
    """Cores the whole run may use at once (its cgroup's CPU quota, where the cpu controller is there)."""
    isolate: str = "solution"
    """"solution": one jail runs the solution and all its tests; "test": a fresh jail per test."""
    warm: int = 4
    """Jails kept started ahead (per distinct memory/processes/tmpfs/inodes/cpus), hiding start-up."""

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "isolate":
                if value not in ("solution", "test"):
                    raise ValueError(f"code_tests: isolate={value!r} must be one of ['solution', 'test']")
                continue
            lo, hi = _RANGES[f.name]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not lo <= value <= hi:
                raise ValueError(f"code_tests: {f.name}={value!r} must be a number in [{lo}, {hi}]")

    @property
    def spec(self) -> JailSpec:
        return JailSpec(self.memory_mb, self.processes, self.tmpfs_mb, self.inodes, self.cpus)


@dataclass(frozen=True)
class SandboxResult:
    passed: int
    total: int
    reason: str = ""
    """Empty when every test passed; else why not (each failing test's error, a timeout, ...)."""

    @property
    def fraction(self) -> float:
        return self.passed / self.total if self.total else 0.0


def run_tests(code: str, tests: list, limits: Limits = Limits()) -> SandboxResult:
    """Run `code` against `tests` (strings `assert ...` or dicts; see cases.py): the fraction passed."""
    return run_cases(code, parse_cases(tests), limits)


def run_cases(code: str, cases: list[Case], limits: Limits = Limits()) -> SandboxResult:
    if not cases:
        return SandboxResult(0, 0, "no tests")
    groups = [(0, cases)] if limits.isolate == "solution" else [(i, [c]) for i, c in enumerate(cases)]
    outcomes: dict[int, tuple[bool, str]] = {}
    for first, group in groups:
        outcomes.update(_run_jail(code, group, first, limits))
    passed = sum(1 for ok, _ in outcomes.values() if ok)
    failures = [f"test {i}: {err}" for i, (ok, err) in sorted(outcomes.items()) if not ok]
    return SandboxResult(passed, len(cases), "; ".join(failures))


def _send(pipe, data: bytes, deadline: float) -> None:
    """Write the job to the runner's stdin and close it, giving up at the deadline (a jail that
    never reads its job never answers: the missing handshake says so)."""
    fd = pipe.fileno()
    os.set_blocking(fd, False)
    view = memoryview(data)
    try:
        while view:
            if not select.select([], [fd], [], max(0.0, deadline - time.monotonic()))[1]:
                return
            view = view[os.write(fd, view[:1 << 16]):]
    except OSError:  # BrokenPipeError: the runner is gone before reading its job
        pass
    finally:
        pipe.close()


def _run_jail(code: str, cases: list[Case], first: int, limits: Limits) -> dict[int, tuple[bool, str]]:
    """Run the solution against `cases` (numbered from `first`) in one fresh jail."""
    mb = 1 << 20
    nonce = secrets.token_hex(16)
    job = marshal.dumps({
        "code": code, "cases": [c.wire() for c in cases], "first": first, "nonce": nonce,
        "output_cap": limits.file_mb * mb, "rlimits": {
            "RLIMIT_CPU": limits.cpu_s, "RLIMIT_AS": limits.memory_mb * mb, "RLIMIT_FSIZE": limits.file_mb * mb,
            "RLIMIT_NPROC": limits.processes, "RLIMIT_NOFILE": limits.open_files, "RLIMIT_CORE": 0}})
    pool = pool_for(limits.spec, limits.warm)
    jail = pool.take()
    timed_out = False
    try:
        deadline = time.monotonic() + limits.wall_s
        _send(jail.proc.stdin, job, deadline)
        # done: the runner wrote to its pipe, or every process of the jail is gone (EOF)
        timed_out = not select.select([jail.done_fd], [], [], max(0.0, deadline - time.monotonic()))[0]
        returncode = jail.proc.poll()
        results = jail.read(jail.res_fd, limits.file_mb * mb + (1 << 16))
        stderr = jail.read(jail.err_fd, 4096).decode("utf-8", "replace")
    finally:
        retire(jail)
        pool.replenish()
    ready, lines = read_lines(results, nonce, len(cases), first)
    if not ready:
        raise SandboxUnavailable(f"the sandbox was not set up (no handshake; exit {returncode}"
                                 f"{', wall timeout' if timed_out else ''}): {stderr.strip()[-300:]}")
    if -1 in lines:  # the solution itself raised: every test fails with that
        error = str(lines[-1].get("error"))[:500]
        return {first + k: (False, error) for k in range(len(cases))}
    out: dict[int, tuple[bool, str]] = {}
    for k, case in enumerate(cases):
        i = first + k
        line = lines.get(i)
        if line is None:
            if timed_out:
                why = f"wall timeout after {limits.wall_s} s"
            elif returncode is not None and returncode < 0:
                why = f"not run: the sandbox was killed by signal {-returncode}"
            else:
                why = f"not run: the sandbox ended (exit {returncode})"
            out[i] = (False, why)
        elif "v" in line:
            try:
                out[i] = judge(case, decode_value(line["v"]))
            except (ValueFormatError, ValueError) as e:
                out[i] = (False, f"the returned value is not readable: {e}")
        else:
            out[i] = (False, str(line.get("error"))[:500])
    return out
