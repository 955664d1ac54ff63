"""Progress bars draw on a terminal only, and never under CI."""
from __future__ import annotations

import io
import sys

from streamrft.monitor.bars import bar, shown


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_bars_draw_on_a_terminal_unless_ci_is_set(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert not shown()  # a log file or a pipe
    term = Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    assert shown()
    with bar(4, "steps") as b:
        b.update(4)
    assert "steps:" in term.getvalue() and "/4 [" in term.getvalue()
    monkeypatch.setenv("CI", "true")
    assert not shown()
    before = term.getvalue()
    with bar(4, "quiet") as b:
        b.update(4)
    assert term.getvalue() == before
