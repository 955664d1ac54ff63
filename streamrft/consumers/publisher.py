"""The trainer's background publisher: version N goes to S3 (then its checkpoint is finalised and
it is announced) while the trainer's step loop computes step N+1.

One job at a time, one thread, in submission order, so versions are uploaded and announced in
order. `submit` first waits for the job before (back-pressure: at most one version in flight, so
at most one CPU copy of the weights besides the live model) and raises what it failed with; so
does `wait`. A failed job is never skipped: the job retries what is worth retrying itself, and
what still fails is raised in the step loop at its next hand-off (or its end: `on_error` lets the
trainer stop waiting for data), so the role fails and restarts from its last checkpoint.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable

log = logging.getLogger(__name__)


class PublishError(RuntimeError):
    """A version could not be published (uploaded, checkpointed or announced)."""


class Publisher:
    def __init__(self, on_error: Callable[[BaseException], None] = lambda e: None, name: str = "publisher"):
        self._on_error = on_error
        self._name = name
        self._thread: threading.Thread | None = None
        self._what = ""
        self._error: BaseException | None = None
        self.waited_s = 0.0  # time the caller spent blocked in submit/wait, over the life of this

    def _work(self, job: Callable[[], None]) -> None:
        try:
            job()
        except BaseException as e:  # reported to the step loop, never lost
            log.error("publishing %s failed: %s: %s", self._what, type(e).__name__, e)
            self._error = e
            self._on_error(e)

    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def wait(self) -> None:
        """Until the job in flight is done; raises `PublishError` if it (or an earlier one) failed."""
        if self._thread is not None:
            t0 = time.monotonic()
            self._thread.join()
            self.waited_s += time.monotonic() - t0
            self._thread = None
        if self._error is not None:
            raise PublishError(f"publishing {self._what} failed: {type(self._error).__name__}: "
                               f"{self._error}") from self._error

    def submit(self, what: str, job: Callable[[], None]) -> None:
        self.wait()
        self._what = what
        self._thread = threading.Thread(target=self._work, args=(job,), name=f"{self._name}-{what}", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Wait for the job in flight without raising (the process is ending anyway)."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None


def retried(fn: Callable[[], object], what: str, attempts: int = 4, delay: float = 1.0):
    """`fn()`, tried `attempts` times, the delay doubling; the last failure is raised."""
    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except Exception as e:
            if attempt == attempts:
                raise
            log.warning("%s failed (attempt %d/%d), retrying in %.1f s: %s: %s", what, attempt, attempts, delay,
                        type(e).__name__, e)
            time.sleep(delay)
            delay *= 2


def cpu_copy(state_dict: dict, into: dict | None = None) -> dict:
    """A CPU copy of `state_dict` that the next optimiser step cannot change; tied tensors (one
    storage under two names) stay tied, so `save_shards` still stores them once. `into`: tensors
    nobody uses any more (`DeltaPublisher.take_spare`), copied into where a name's tensor has the
    same shape and dtype (contiguous): no fresh host memory for those (written 3-4x slower than
    memory written before)."""
    copies: dict[tuple, object] = {}
    out = {}
    for name, t in state_dict.items():
        key = (t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype)
        if key not in copies:
            spare = into.get(name) if into else None
            if (spare is not None and spare.shape == t.shape and spare.dtype == t.dtype and spare.is_contiguous()
                    and spare.device.type == "cpu"):
                copies[key] = spare.copy_(t.detach())
            else:
                copies[key] = t.detach().to("cpu", copy=True)
        out[name] = copies[key]
    return out
