"""Every script under benchmarks/ imports (its module level runs, `main` does not): a benchmark is
run by hand, so a name it imports that moved would otherwise show only when someone next runs it."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCHMARKS = sorted((Path(__file__).resolve().parents[1] / "benchmarks").glob("*.py"))


@pytest.mark.parametrize("path", BENCHMARKS, ids=[p.stem for p in BENCHMARKS])
def test_the_benchmark_imports(path, monkeypatch):
    monkeypatch.syspath_prepend(str(path.parent))  # as `python benchmarks/<name>.py` runs it
    spec = importlib.util.spec_from_file_location(f"benchmark_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    assert callable(getattr(module, "main", None)), f"{path.name} has no main()"
