"""Progress bars where a person waits (prepare/convert, SFT stages, offline training, export, replay,
benchmarks): `with bar(total, "sft stage 0") as b: ... b.update(1)`.

tqdm on stderr, shown only on a terminal and never when `CI` is set, so CI logs and the roles'
log files stay free of carriage-return noise; a hidden bar costs nothing and accepts the same calls.
"""
from __future__ import annotations

import os
import sys


def shown() -> bool:
    """Whether bars draw: stderr is a terminal and `CI` is unset (or empty)."""
    return sys.stderr.isatty() and not os.environ.get("CI")


def bar(total: int | None, desc: str, unit: str = "step", hide: bool = False, **kwargs):
    """A tqdm bar (a context manager) of `total` `unit`s, drawn only where `shown()` and not `hide`
    (e.g. on ranks other than 0)."""
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, disable=hide or not shown(), dynamic_ncols=True, leave=False,
                file=sys.stderr, **kwargs)
