"""How often `streamrft run` restarts a role that fails: a budget per time window, with backoff.

A role that exits non-zero (a delivery it could not complete while the broker was away, a fault it
could not ride out) is started again and redoes its work from its durable state. A long run meets a
few such faults an hour, so a count per run would end it sooner or later; a role that fails again
and again within minutes is broken, and restarting it for ever would hide that. So a role may be
restarted at most `max_restarts` times within any `window_s` seconds (`restarts:` in the config,
`config/stack.py`), and each restart within the window waits twice as long as the one before (from
`backoff_s`, at most `max_backoff_s`): a broker that is away for a minute is not hammered, and a
role that failed once is back at once.
"""
from __future__ import annotations

from collections import deque

from streamrft.config.stack import RestartConfig


class RestartBudget:
    """One role's restarts: `delay(now)` says how long to wait before the next one (None: the budget
    is spent), `restarted(now)` records one. Times are `time.monotonic()` seconds."""

    def __init__(self, cfg: RestartConfig):
        self.cfg = cfg
        self.times: deque[float] = deque()

    def recent(self, now: float) -> int:
        """Restarts within the last `window_s` seconds."""
        while self.times and self.times[0] <= now - self.cfg.window_s:
            self.times.popleft()
        return len(self.times)

    def delay(self, now: float) -> float | None:
        n = self.recent(now)
        if n >= self.cfg.max_restarts:
            return None
        return 0.0 if n == 0 else min(self.cfg.backoff_s * 2 ** (n - 1), self.cfg.max_backoff_s)

    def restarted(self, now: float) -> None:
        self.times.append(now)
