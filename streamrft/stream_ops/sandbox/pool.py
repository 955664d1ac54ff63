"""Warm jails: started ahead, each used for exactly one run and then destroyed.

Starting bubblewrap and an interpreter costs about as much as the bare interpreter itself, so a
pool keeps `warm` jails per `JailSpec` whose runners already wait for a job on stdin. A run takes
one (or starts one if none is ready) and, once the run is over, a long-lived refill thread starts
its replacement in the background. Nothing is reused: a jail that ran a solution is killed with its cgroup and tmpfs, so
no run can leave anything for the next. The refill thread lives as long as the process, so the
jails' `--die-with-parent` (tied to the thread that forked them) fires only when the process dies.
"""
from __future__ import annotations

import atexit
import logging
import queue
import threading
import time
from collections import deque

from streamrft.stream_ops.sandbox.jail import Jail, JailSpec, SandboxUnavailable, spawn

log = logging.getLogger(__name__)


class Pool:
    def __init__(self, spec: JailSpec, warm: int):
        self.spec, self.warm = spec, warm
        self._ready: deque[Jail] = deque()
        self._cond = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None

    def take(self) -> Jail:
        """A live jail waiting for its job: a warm one if ready, else one started now."""
        with self._cond:
            if self.warm > 0 and self._thread is None:
                self._thread = threading.Thread(target=self._refill, name="sandbox-pool", daemon=True)
                self._thread.start()
            jail = None
            while self._ready:
                jail = self._ready.popleft()
                if jail.proc.poll() is None:
                    break
                jail.destroy()  # died while waiting (should not happen): never hand it out
                jail = None
        if jail is None:
            jail = spawn(self.spec)
        return jail

    def replenish(self) -> None:
        """Start the replacements of the jails taken: called once a run is over, so that starting
        them does not compete with the run for the CPU and the kernel's namespace locks."""
        with self._cond:
            self._cond.notify_all()

    def _refill(self) -> None:
        while True:
            with self._cond:
                while not self._closed and len(self._ready) >= self.warm:
                    self._cond.wait()
                if self._closed:
                    return
            try:
                jail = spawn(self.spec)
            except SandboxUnavailable as e:  # take() spawns on demand and raises it to the caller
                log.warning("sandbox pool: cannot start a warm jail: %s", e)
                time.sleep(1.0)
                continue
            with self._cond:
                if self._closed:
                    jail.destroy()
                    return
                self._ready.append(jail)

    def close(self) -> None:
        """Destroy the warm jails, and wait for a jail being started meanwhile to be destroyed too."""
        with self._cond:
            self._closed = True
            jails = list(self._ready)
            self._ready.clear()
            self._cond.notify_all()
        for jail in jails:
            jail.destroy()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=30)


_pools: dict[tuple[JailSpec, int], Pool] = {}
_lock = threading.Lock()
_retired: "queue.Queue[Jail]" = queue.Queue()
_reaper: threading.Thread | None = None


def retire(jail: Jail) -> None:
    """A jail whose run is over: killed now; waited for and freed (cgroup, memfds, mount point) by a
    background thread, off the caller's path. `close_pools` waits for that to finish."""
    global _reaper
    jail.kill()
    with _lock:
        if _reaper is None:
            _reaper = threading.Thread(target=_reap, name="sandbox-reaper", daemon=True)
            _reaper.start()
    _retired.put(jail)


def _reap() -> None:
    while True:
        jail = _retired.get()
        try:
            jail.release()
        except Exception:  # noqa: BLE001 - the reaper must go on; the next sweep removes what is left
            log.exception("sandbox: releasing a jail failed")
        finally:
            _retired.task_done()


def pool_for(spec: JailSpec, warm: int) -> Pool:
    with _lock:
        pool = _pools.get((spec, warm))
        if pool is None:
            pool = _pools[(spec, warm)] = Pool(spec, warm)
        return pool


@atexit.register
def close_pools() -> None:
    """Destroy every warm jail and wait for retired ones to be freed (at exit, and in tests that
    count what is left)."""
    with _lock:
        pools = list(_pools.values())
        _pools.clear()
    for pool in pools:
        pool.close()
    _retired.join()
