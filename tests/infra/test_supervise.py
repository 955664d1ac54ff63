"""`replace_on_outage`: a worker that ends with OUTAGE_EXIT is replaced by a fresh forked one; any
other exit is returned; a stop is passed on and ends the loop; the worker dies with its role."""
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from streamrft.infra.supervise import OUTAGE_EXIT, replace_on_outage

ROOT = Path(__file__).resolve().parents[2]


def _counting_work(counter: Path, codes: list[int]):
    """A worker whose k-th run (counted in a file: each runs in a fresh child) returns codes[k]."""
    def work() -> int:
        k = int(counter.read_text()) if counter.exists() else 0
        counter.write_text(str(k + 1))
        return codes[k]
    return work


def test_a_worker_is_replaced_while_it_reports_an_outage(tmp_path):
    counter, seen = tmp_path / "runs", []
    code = replace_on_outage(_counting_work(counter, [OUTAGE_EXIT, OUTAGE_EXIT, 0]), "w", max_backoff_s=0.2,
                             on_outage=lambda k, s: seen.append(k))
    assert code == 0 and counter.read_text() == "3" and seen == [1, 2]


def test_any_other_failure_is_the_roles_own(tmp_path):
    counter = tmp_path / "runs"
    assert replace_on_outage(_counting_work(counter, [3, 0]), "w") == 3 and counter.read_text() == "1"


def test_an_exception_in_the_worker_is_exit_1_and_not_replaced(tmp_path):
    def work() -> int:
        raise RuntimeError("a bug")
    assert replace_on_outage(work, "w") == 1


def _role(tmp_path: Path, body: str) -> subprocess.Popen:
    """A role process running replace_on_outage over `body` (a worker function's source)."""
    script = tmp_path / "role.py"
    script.write_text(textwrap.dedent(f"""
        import os, sys, time
        from pathlib import Path
        from streamrft.infra.supervise import OUTAGE_EXIT, replace_on_outage
        out = Path({str(tmp_path)!r})
        {textwrap.indent(textwrap.dedent(body), '        ').strip()}
        sys.exit(replace_on_outage(work, "w", max_backoff_s=60))
    """))
    return subprocess.Popen([sys.executable, str(script)], cwd=ROOT)


def _wait_for(path: Path, timeout: float = 30.0) -> str:
    deadline = time.monotonic() + timeout
    while not (path.exists() and path.read_text()):
        assert time.monotonic() < deadline, f"{path} never written"
        time.sleep(0.05)
    return path.read_text()


def _gone(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def test_sigterm_reaches_the_worker_and_its_code_is_the_roles(tmp_path):
    role = _role(tmp_path, """
        import signal
        def work():
            signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
            (out / "child").write_text(str(os.getpid()))
            time.sleep(60)
            return 5
    """)
    try:
        _wait_for(tmp_path / "child")
        role.send_signal(signal.SIGTERM)
        assert role.wait(10) == 0
    finally:
        role.kill()


def test_a_stop_during_the_backoff_ends_the_role_at_once(tmp_path):
    role = _role(tmp_path, """
        def work():
            (out / "child").write_text(str(os.getpid()))
            return OUTAGE_EXIT
    """)
    try:
        _wait_for(tmp_path / "child")
        time.sleep(0.5)  # the child has ended; the role waits (1 s, then 2 s...) to replace it
        t0 = time.monotonic()
        role.send_signal(signal.SIGTERM)
        assert role.wait(10) == 0 and time.monotonic() - t0 < 3
    finally:
        role.kill()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_the_worker_dies_with_a_role_killed_with_minus_9(tmp_path):
    role = _role(tmp_path, """
        def work():
            (out / "child").write_text(str(os.getpid()))
            time.sleep(120)
            return 0
    """)
    try:
        child = int(_wait_for(tmp_path / "child"))
        role.kill()
        role.wait(10)
        assert _gone(child), "the worker outlived its role"
    finally:
        role.kill()

