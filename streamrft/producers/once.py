"""Counting each id once, in bounded memory: what the explorers' folds use to count a group once
though its record may come twice (a producer's re-send, a stream-ops worker redoing records after
a crash).

`OnceWindow(window)` remembers the newest `window` ids it counted; an id seen again within them is
not counted again. An id older than that is forgotten, so a copy arriving after `window` newer ids
counts a second time: at the CPU demo's 10 groups a second, 50,000 ids are more than an hour,
while a copy comes within seconds or minutes. What it keeps depends only on the ids and their
order, so every explorer folding the same records holds the same window, and a snapshot of it
(`state`) restores exactly what a fold from offset 0 reaches.
"""
from __future__ import annotations

from collections import OrderedDict

WINDOW = 50_000


class OnceWindow:
    def __init__(self, window: int = WINDOW):
        if window < 1:
            raise ValueError(f"window={window}: must be >= 1")
        self.window = window
        self.count = 0  # ids counted, the forgotten ones included
        self._recent: OrderedDict[str, None] = OrderedDict()

    def add(self, key: str) -> bool:
        """Count `key` unless it is among the newest `window` counted; True when it was counted."""
        if key in self._recent:
            return False
        self._recent[key] = None
        if len(self._recent) > self.window:
            self._recent.popitem(last=False)
        self.count += 1
        return True

    def __contains__(self, key: str) -> bool:
        return key in self._recent

    def state(self) -> dict:
        return {"count": self.count, "recent": list(self._recent)}

    @classmethod
    def from_state(cls, state: "dict | list", window: int = WINDOW) -> "OnceWindow":
        """From `state()`; a list is the older snapshot format (every id, sorted)."""
        out = cls(window)
        ids = state if isinstance(state, list) else state["recent"]
        for key in ids[-window:]:
            out._recent[key] = None
        out.count = len(ids) if isinstance(state, list) else int(state["count"])
        return out
