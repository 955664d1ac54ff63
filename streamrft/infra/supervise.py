"""A role that rides out a broker outage: its worker is replaced, the role's process lives on.

Some workers cannot recover in place once the broker has gone away under them (faust's consumer and
producer, after a failed delivery, keep failing on the broker that came back), and what they had not
committed must be redone anyway. Kafka Streams answers the same problem by replacing the stream
thread (`StreamsUncaughtExceptionHandler.REPLACE_THREAD`); `replace_on_outage` does it with a
process: it runs the worker in a forked child, and while the child ends with `OUTAGE_EXIT` (the
broker did not answer: a delivery never acknowledged, a connection lost) it forks a fresh one, after
a backoff (1 s doubling to `max_backoff_s`) that a stop interrupts. The fresh worker resumes from the
committed offsets. Any other exit is the role's own: returned as it is, for its supervisor
(`streamrft run`'s restart budget, compose, Kubernetes) to judge.

SIGTERM and SIGINT are passed to the child and end the loop; the child dies with this process even
when this one is killed with -9 (Linux's parent-death signal), so nothing is left running.
"""
from __future__ import annotations

import ctypes
import logging
import os
import signal
import time
from typing import Callable

log = logging.getLogger(__name__)

OUTAGE_EXIT = 75
"""A worker's exit code for "the broker did not answer" (EX_TEMPFAIL): replace me, I am not broken."""

STEADY_S = 60.0
"""A worker that ran this long before its outage starts the backoff afresh."""

_PR_SET_PDEATHSIG = 1


def _die_with_parent(parent: int) -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the parent's -9 leaves the child to its own stop
        pass
    if os.getppid() != parent:  # the parent died before the signal was armed
        os._exit(1)


def _exit_code(status: int) -> int:
    return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


def replace_on_outage(work: Callable[[], int], what: str, max_backoff_s: float = 30.0,
                      on_outage: Callable[[int, float], None] | None = None) -> int:
    """Run `work()` (it returns an exit code) in forked children until one ends other than with
    `OUTAGE_EXIT`, or a stop arrives; returns that child's exit code (a signal N: 128 + N).
    `on_outage(k, outage_s)` is called at each replacement (k-th in a row, seconds since the first)."""
    stopping: list[int] = []
    child = {"pid": 0}

    def forward(signum, _frame):
        stopping.append(signum)
        if child["pid"]:
            try:
                os.kill(child["pid"], signum)
            except ProcessLookupError:
                pass

    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    parent = os.getpid()
    outages, first = 0, 0.0
    try:
        while True:
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    for s, handler in previous.items():
                        signal.signal(s, handler)
                    _die_with_parent(parent)
                    code = work()
                except SystemExit as e:
                    code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
                except BaseException:
                    log.exception("%s failed", what)
                finally:
                    os._exit(code)
            child["pid"], started = pid, time.monotonic()
            if stopping:  # a stop arrived while forking: the child may have missed it
                os.kill(pid, stopping[0])
            while True:
                try:
                    _, status = os.waitpid(pid, 0)
                    break
                except ChildProcessError:
                    return 0
                except InterruptedError:
                    continue
            child["pid"] = 0
            code = _exit_code(status)
            if code != OUTAGE_EXIT or stopping:
                return 0 if stopping and code == OUTAGE_EXIT else code
            if time.monotonic() - started > STEADY_S:  # it worked for a while: a new outage
                outages, first = 0, 0.0
            outages += 1
            first = first or time.monotonic()
            delay = min(2.0 ** (outages - 1), max_backoff_s)
            log.warning("%s: the broker did not answer; a fresh worker in %.0f s (replacement %d, outage %.0f s so far)",
                        what, delay, outages, time.monotonic() - first)
            if on_outage is not None:
                on_outage(outages, time.monotonic() - first)
            deadline = time.monotonic() + delay
            while not stopping and time.monotonic() < deadline:
                time.sleep(0.1)
            if stopping:
                return 0
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
