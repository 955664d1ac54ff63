"""The code sandbox and the `code_tests` reward on ordinary responses: correct, wrong and partial
solutions, programs on stdin/stdout, each test in its own jail, warm jails that leave nothing, and
a machine without bubblewrap (the code never runs). Hostile solutions: test_sandbox_hostile.py."""
from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest

from streamrft.schemas import Task
from streamrft.stream_ops.rewards.code_tests import code_tests, extract_code, parse_tests
from streamrft.stream_ops.sandbox import Limits, SandboxUnavailable, close_pools, run_tests
from tests.stream_ops.sandbox_helpers import COLD, HONEST, TESTS, leftovers

FAST = Limits(cpu_s=1, wall_s=15, memory_mb=256, processes=16)  # wall >> CPU: the machine may be busy
SLEEPY = Limits(cpu_s=1, wall_s=2, memory_mb=256, processes=16)


def fenced(code: str) -> str:
    return f"Here is my solution:\n```python\n{code}\n```\nDone."


def test_parse_tests_and_extract_code():
    assert parse_tests('["assert f(1) == 1", "assert f(2) == 2"]') == ["assert f(1) == 1", "assert f(2) == 2"]
    assert parse_tests("assert f(1) == 1\n\n  assert f(2) == 2\n") == ["assert f(1) == 1", "  assert f(2) == 2"]
    assert parse_tests("ignored", {"tests": ["assert True", {"call": "f()", "expected": 1}]}) == [
        "assert True", {"call": "f()", "expected": 1}]
    assert parse_tests(None) == [] and parse_tests("  ") == []
    assert extract_code("```py\nx = 1\n```\ntext\n```python\ny = 2\n```") == "y = 2\n"
    assert extract_code("def f(): pass") == "def f(): pass"


@pytest.mark.parametrize("name, code, expected, reason", [
    ("correct", HONEST, 1.0, ""),
    ("wrong", "def add(a, b):\n    return a - b", 0.0, "test 0: AssertionError: add(1, 2) gave -1"),
    ("partial", "def add(a, b):\n    return a + b if a < 5 else 0", 2 / 3, "test 2: AssertionError: add(10, 5) gave 0"),
    ("not a plain value", "class N(int):\n    def __eq__(self, o): return True\ndef add(a, b):\n    return N(0)", 0.0,
     "test 0: TypeError: the call returned a N, not a plain value"),
    ("infinite loop", "while True:\n    pass", 0.0, "CPU time limit of 1 s exceeded"),
    ("sleeps", "import time\ntime.sleep(60)", 0.0, "test 2: wall timeout after 2 s"),
    ("fork bomb", "import os\nwhile True:\n    os.fork()", 0.0, "BlockingIOError"),
    ("memory hog", "x = bytearray(4 << 30)", 0.0, "MemoryError"),
    ("raises", "raise SystemExit(3)", 0.0, "the solution raised SystemExit"),
])
def test_code_tests_scores_every_kind_of_response(name, code, expected, reason):
    before = leftovers()
    result = run_tests(extract_code(fenced(code)), TESTS, replace(SLEEPY if name == "sleeps" else FAST, warm=0))
    assert result.fraction == pytest.approx(expected), result
    assert result.total == 3
    assert reason in result.reason, result
    assert leftovers() == before, f"{name}: something of the run is left"


def test_programs_read_stdin_and_are_judged_on_stdout():
    tests = [{"stdin": "1 2\n", "stdout": "3\n"}, {"stdin": "5 5", "stdout": "10"}, {"stdin": "2 2\n", "stdout": "5\n"}]
    program = "import sys\na, b = map(int, sys.stdin.read().split())\nprint(a + b)"
    result = run_tests(program, tests, FAST)
    assert (result.passed, result.total) == (2, 3) and "test 2: AssertionError: the program gave '4\\n'" in result.reason
    # input(), exit(0) and fd-level writes are a program's ordinary means
    other = "import os, sys\na, b = map(int, input().split())\nos.write(1, str(a + b).encode())\nsys.exit(0)"
    assert run_tests(other, tests[:2], FAST).fraction == 1.0
    crashes = run_tests("raise SystemExit(2)", tests[:1], FAST)
    assert crashes.fraction == 0 and "the program exited with status 2" in crashes.reason


def test_each_test_in_a_fresh_jail():
    """isolate="test": what one test does to the interpreter cannot reach the next."""
    code = "import builtins\ncalls = []\ndef add(a, b):\n    calls.append(1)\n    return a + b + len(calls) - 1"
    shared = run_tests(code, TESTS, FAST)
    assert shared.passed == 1  # the second and third calls see the first's state
    fresh = run_tests(code, TESTS, replace(FAST, isolate="test"))
    assert fresh.passed == 3, fresh


def test_warm_jails_are_used_once_and_leave_nothing_after_close():
    before = leftovers()
    limits = replace(FAST, warm=2)
    scores = [run_tests(HONEST, TESTS, limits).fraction for _ in range(5)]
    assert scores == [1.0] * 5
    # a jail never serves two runs: a file the first run leaves in its /tmp is gone for the next
    marker = "def add(a, b):\n    import os\n    seen = os.path.exists('/tmp/mark')\n    open('/tmp/mark', 'w').close()\n    return a + b + seen"
    assert [run_tests(marker, TESTS[:1], limits).fraction for _ in range(4)] == [1.0] * 4
    close_pools()
    assert leftovers() == before


def test_no_network_and_no_writes_outside(tmp_path):
    import socket
    import threading

    before = leftovers()
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(3)
    port = server.getsockname()[1]
    accepted = []
    waiter = threading.Thread(target=lambda: accepted.extend(_accept(server)))
    waiter.start()
    outside = tmp_path / "outside.txt"
    in_repo = Path(__file__).resolve().parent / f".escape-{os.getpid()}"
    code = "\n".join([
        "import socket, os",
        "def connects():",
        f"    socket.create_connection(('127.0.0.1', {port}), timeout=1).close()",
        "    return True",
        "def writes(path):",
        "    with open(path, 'w') as fh:",
        "        fh.write('escaped')",
        "    return True",
        "def cwd():",
        "    return os.getcwd()",
    ])
    tests = ["assert connects()", f"assert writes({str(outside)!r})", f"assert writes({str(in_repo)!r})",
             "assert writes('inside.txt')", "assert cwd() == '/tmp'", "assert writes('/usr/lib/x')"]
    result = run_tests(code, tests, COLD)
    waiter.join()
    server.close()
    assert (result.passed, result.total) == (2, 6), result
    # its own network namespace: only its own loopback, where nothing listens
    assert "test 0: ConnectionRefusedError" in result.reason or "test 0: OSError: [Errno 101]" in result.reason
    for i in (1, 2):  # not there at all (the jail's root holds the interpreter only), or read-only
        assert f"test {i}: FileNotFoundError" in result.reason or f"test {i}: OSError: [Errno 30]" in result.reason, result
    assert "test 5: OSError: [Errno 30] Read-only file system" in result.reason or "test 5: FileNotFoundError" in result.reason
    assert accepted == [] and not outside.exists() and not in_repo.exists()
    assert leftovers() == before


def _accept(server) -> list:
    try:
        return [server.accept()]
    except OSError:
        return []


def test_code_tests_reward_reads_tests_from_the_task():
    task = Task(prompt="write add", answer=None, metadata={"tests": TESTS[:2]})
    assert code_tests(fenced(HONEST), None, task=task, wall_s=10) == 1.0
    assert code_tests("def add(a, b):\n    return 0", "\n".join(TESTS)) == pytest.approx(1 / 3)  # add(-1, 1) == 0
    assert code_tests.blocking is True
    with pytest.raises(ValueError, match="no tests"):
        code_tests("x = 1", "")
    with pytest.raises(ValueError, match="cannot be split"):  # refused, never run with the answer inside
        code_tests(HONEST, "assert add(1, 2) == 3 or True")


def test_no_bubblewrap_means_no_run(monkeypatch, tmp_path):
    """Where the sandbox cannot be made, the code never runs unconfined: the reward raises."""
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr("streamrft.stream_ops.sandbox.jail.os.path.exists", lambda p: False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SandboxUnavailable, match="bubblewrap"):
        run_tests("open('ran', 'w')\ndef f(): return 1", ["assert f() == 1"], replace(COLD, memory_mb=300))
    assert not (tmp_path / "ran").exists()


def test_only_a_missing_handshake_means_the_sandbox_is_unavailable(monkeypatch):
    """A jail that never starts its runner (here a broken bwrap) raises, so the group is retried or
    dead-lettered; a solution exiting however it likes after the handshake is scored (hostile tests)."""
    monkeypatch.setattr("streamrft.stream_ops.sandbox.jail.bwrap_path", lambda: "/bin/false")
    before = leftovers()
    with pytest.raises(SandboxUnavailable, match="no handshake"):
        run_tests(HONEST, TESTS, COLD)
    assert leftovers() == before


def test_leftovers_count_only_this_process_s_run_tmpfs(tmp_path):
    """A run tmpfs a dead process left (swept by the next spawn anywhere) or a live process's
    elsewhere is not this test's; one named after this process is."""
    import subprocess
    import tempfile

    from streamrft.stream_ops.sandbox.jail import SCRATCH_PREFIX
    dead = subprocess.Popen(["true"])
    dead.wait()
    others = [tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{dead.pid}-"), tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}1-")]
    try:
        assert not set(others) & set(leftovers()["scratch"])
        mine = tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-")
        try:
            assert mine in leftovers()["scratch"]
        finally:
            os.rmdir(mine)
    finally:
        for d in others:
            os.rmdir(d)
