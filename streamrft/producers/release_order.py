"""Which finished groups an explorer publishes now (`explorer.publish_order`).

Episodes scheduled one by one end in the order their tools answer, so a group goes out when its
slowest episode ends, and tasks that take fewer (or faster) tool steps finish first. Published as
they finish, fast tasks fill the trainer's early batches and the slow ones, often those that argue
against the current policy, arrive stalest (issue 53, cause 1; Magistral and tinker-cookbook train
in generation order for the same reason). `admitted` publishes them in the order they were
admitted instead: a finished group waits for the groups this explorer admitted before it, at most
`wait_s` after it finished, so one tool's tail never holds the rest for longer than that.
`finished` publishes each at once.

Pure and unit-tested; `episode_loop.py` calls it with the clock.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class ReleaseOrder:
    wait_s: float | None
    """How long a finished group waits for older open ones; None: no waiting (`finished`)."""
    _next: int = 0
    _open: set[int] = field(default_factory=set)  # admitted, not finished nor cancelled
    _done: dict[int, tuple[float, Any]] = field(default_factory=dict)  # seq -> (finished at, item)
    overtook: int = 0
    """Groups published while one admitted before them was still open (in either order)."""
    waited_out: int = 0
    """Of those, `admitted` groups published because their wait ran out."""

    def admit(self) -> int:
        """A new group's place in the order."""
        seq, self._next = self._next, self._next + 1
        self._open.add(seq)
        return seq

    def cancel(self, seq: int) -> None:
        """The group will never be published (dropped, failed, abandoned): nothing waits for it."""
        self._open.discard(seq)

    def finish(self, seq: int, item: Any, now: float) -> None:
        self._open.discard(seq)
        self._done[seq] = (now, item)

    def held(self) -> int:
        return len(self._done)

    def due(self, now: float, *, everything: bool = False) -> list[Any]:
        """The finished items to publish now, in admission order: each whose older groups are all
        published or cancelled, or that has waited `wait_s` (`everything`: all, e.g. on stop)."""
        out, oldest_open = [], min(self._open, default=None)
        for seq in sorted(self._done):
            at, item = self._done[seq]
            older_open = oldest_open is not None and oldest_open < seq
            expired = self.wait_s is None or now - at >= self.wait_s
            if not older_open or expired or everything:
                if older_open:
                    self.overtook += 1
                    self.waited_out += self.wait_s is not None and not everything
                del self._done[seq]
                out.append(item)
        return out
