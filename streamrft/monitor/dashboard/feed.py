"""What one open page has been sent, and what to send it next (the live stream of `app.py`).

The first message carries every line downsampled (`state.downsample`) and the tables; each later
one only what changed: the points appended to a line since the last message, and each table that
differs from what the page has. A line whose page copy has taken more than `points`
new points since it was last sent whole is sent whole again, downsampled (`reset`), so a page left
open for a day holds at most about twice `points` a line. Nothing changed, nothing is sent.

With several runs (`streamrft dashboard A.yaml B.yaml`), the first is the one shown in full; the
others add their reward and eval lines to the reward charts, labelled by namespace.
"""
from __future__ import annotations

import json
from contextlib import ExitStack

from streamrft.monitor.dashboard.state import CHARTS, LINE_POINTS, Line, RunState, downsample

COMPARED = ("reward_time", "reward_version")  # the charts other runs are overlaid on


def line_key(run: int, key: str) -> str:
    return f"{run}:{key}"


def lines_of(states: list[RunState]):
    """(page key, line, label) of every line the page shows. Callers hold each state's lock."""
    compare = len(states) > 1
    for k, s in enumerate(states):
        for key, ln in s.lines.items():
            if k and ln.chart not in COMPARED:
                continue
            label = f"{s.namespace}: {ln.label}" if compare and ln.chart in COMPARED else ln.label
            yield line_key(k, key), ln, label


def find_line(states: list[RunState], key: str) -> tuple[RunState, Line] | None:
    """The run and the line a page key names, or None."""
    run, _, name = key.partition(":")
    if not run.isdigit() or int(run) >= len(states) or name not in states[int(run)].lines:
        return None
    return states[int(run)], states[int(run)].lines[name]


class Feed:
    def __init__(self, states: list[RunState], points: int = LINE_POINTS):
        self.states, self.points = states, points
        self.sent: dict[str, int] = {}  # page key -> raw points the page has (appended or within a whole send)
        self.since: dict[str, int] = {}  # page key -> raw points appended since it was sent whole
        self.tables: dict[str, str] = {}  # table -> its JSON as last sent
        self.revision: tuple[int, ...] | None = None  # the states' revisions when last looked at

    def next(self) -> dict | None:
        """The next message for the page, or None when nothing changed since the last one."""
        revision = tuple(s.revision for s in self.states)
        if revision == self.revision:
            return None
        lines: dict[str, dict] = {}
        with ExitStack() as held:  # every state's lock, always in the same order
            for s in self.states:
                held.enter_context(s.lock)
            for key, ln, label in lines_of(self.states):
                self._line(lines, key, ln, label)
            tables = {**self.states[0].tables(), "runs": [s.namespace for s in self.states]}
        msg: dict = {}
        if lines:
            msg["lines"] = lines
        changed = {}
        for name, value in tables.items():  # each table alone: a new record offset resends only `records`
            encoded = json.dumps(value, sort_keys=True, default=str)
            if self.tables.get(name) != encoded:
                self.tables[name] = encoded
                changed[name] = value
        if changed:
            msg["tables"] = changed
        self.revision = revision
        return msg or None

    def _line(self, out: dict, key: str, ln: Line, label: str) -> None:
        n, have = len(ln), self.sent.get(key)
        if have is None or self.since[key] + n - have > self.points:
            out[key] = {"chart": ln.chart, "x": CHARTS[ln.chart], "label": label, "reset": True,
                        "points": downsample(ln.xs, ln.ys, self.points)}
            self.since[key] = 0
        elif n > have:
            out[key] = {"append": ln.points(have, n)}
            self.since[key] += n - have
        self.sent[key] = n
