"""Name -> function look-up for the algorithm tables, with an `import_path` escape hatch.

The tables themselves are literal dicts (see `streamrft.engine.algorithms`); a user's own
function is named as `"pkg.module:function"` and imported as-is, never registered.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Mapping


def resolve(
    table: Mapping[str, Callable[..., Any]], name: str | None, import_path: str | None = None
) -> Callable[..., Any]:
    """Return the function a config names.

    `import_path` ("pkg.module:function") wins over `name` when both are given, so a config
    may keep its default `type` and still plug in its own function. Otherwise `name` must be
    a key of `table`; an unknown or missing name raises ValueError naming the bad value and
    listing the allowed ones.
    """
    if import_path:
        module_name, sep, attr = import_path.partition(":")
        if not sep or not module_name or not attr:
            raise ValueError(f"import_path {import_path!r} must look like 'pkg.module:function'")
        fn = getattr(importlib.import_module(module_name), attr, None)
        if not callable(fn):
            raise ValueError(f"import_path {import_path!r} does not name a callable")
        return fn
    if name not in table:
        allowed = ", ".join(sorted(table))
        raise ValueError(f"unknown name {name!r}; allowed: {allowed}")
    return table[name]
