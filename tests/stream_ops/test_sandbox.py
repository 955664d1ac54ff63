"""The code sandbox and the `code_tests` reward: each hostile response is scored 0 (or partial
credit) and leaves the test process, the machine and the files outside its scratch dir untouched."""
from __future__ import annotations

import os
import socket
import threading
from pathlib import Path

import pytest

from streamrft.schemas import Task
from streamrft.stream_ops.rewards.code_tests import code_tests, extract_code, parse_tests
from streamrft.stream_ops.sandbox import Limits, run_tests

TESTS = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(10, 5) == 15"]
FAST = Limits(cpu_s=1, wall_s=15, memory_mb=256, processes=16)  # wall >> CPU: the machine may be busy
SLEEPY = Limits(cpu_s=1, wall_s=2, memory_mb=256, processes=16)


def sandbox_processes() -> list[tuple]:
    """Live processes of the sandbox user, and the test process's own children (pid, name, uid)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            status = Path(f"/proc/{entry}/status").read_text()
        except OSError:  # gone meanwhile
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if fields["Uid"].split()[0] == "65534" or int(fields["PPid"]) == os.getpid():
            pids.append((int(entry), fields["Name"].strip(), fields["Uid"].split()[0]))
    return pids


def fenced(code: str) -> str:
    return f"Here is my solution:\n```python\n{code}\n```\nDone."


def test_parse_tests_and_extract_code():
    assert parse_tests('["assert f(1) == 1", "assert f(2) == 2"]') == ["assert f(1) == 1", "assert f(2) == 2"]
    assert parse_tests("assert f(1) == 1\n\n  assert f(2) == 2\n") == ["assert f(1) == 1", "  assert f(2) == 2"]
    assert parse_tests("ignored", {"tests": ["assert True"]}) == ["assert True"]
    assert parse_tests(None) == [] and parse_tests("  ") == []
    assert extract_code("```py\nx = 1\n```\ntext\n```python\ny = 2\n```") == "y = 2\n"
    assert extract_code("def f(): pass") == "def f(): pass"


@pytest.mark.parametrize("name, code, expected, reason", [
    ("correct", "def add(a, b):\n    return a + b", 1.0, ""),
    ("wrong", "def add(a, b):\n    return a - b", 0.0, "test 0: AssertionError"),
    ("partial", "def add(a, b):\n    return a + b if a < 5 else 0", 2 / 3, "test 2: AssertionError"),
    ("infinite loop", "while True:\n    pass", 0.0, "CPU time limit of 1 s exceeded"),
    ("sleeps", "import time\ntime.sleep(60)", 0.0, "wall timeout after 2 s (3 tests not run)"),
    ("fork bomb", "import os\nwhile True:\n    os.fork()", 0.0, "BlockingIOError"),
    ("memory hog", "x = bytearray(4 << 30)", 0.0, "MemoryError"),
    ("raises", "raise SystemExit(3)", 0.0, "the solution raised SystemExit"),
])
def test_code_tests_scores_every_kind_of_response(name, code, expected, reason):
    before = sandbox_processes()
    result = run_tests(extract_code(fenced(code)), TESTS, SLEEPY if name == "sleeps" else FAST)
    assert result.fraction == pytest.approx(expected), result
    assert result.total == 3
    assert reason in result.reason, result
    assert sandbox_processes() == before, f"{name}: stray processes"  # the stack's servers may be children
    assert not [p for p in before if p[2] == "65534"]


def test_no_network_and_no_writes_outside(tmp_path):
    before = sandbox_processes()
    # a server on the host's loopback: a sandboxed connect must not reach it
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(3)
    port = server.getsockname()[1]
    accepted = []
    waiter = threading.Thread(target=lambda: accepted.extend(_accept(server)))
    waiter.start()
    outside = tmp_path / "outside.txt"
    shared_tmp = Path("/tmp") / f"streamrft-escape-{os.getpid()}"
    in_repo = Path(__file__).resolve().parent / f".escape-{os.getpid()}"  # a real, root-owned dir
    code = "\n".join([
        "import socket, os",
        "def connects():",
        f"    socket.create_connection(('127.0.0.1', {port}), timeout=1).close()",
        "    return True",
        "def writes(path):",
        "    with open(path, 'w') as fh:",
        "        fh.write('escaped')",
        "    return True",
    ])
    tests = ["assert connects()", f"assert writes({str(outside)!r})", f"assert writes({str(shared_tmp)!r})",
             f"assert writes({str(in_repo)!r})",
             "assert writes('inside.txt') and os.getcwd() == '/tmp/work'"]
    result = run_tests(code, tests, FAST)
    waiter.join()
    server.close()
    assert (result.passed, result.total) == (2, 5), result  # its own private /tmp and scratch dir: yes
    # the host's /tmp is hidden behind the sandbox's own tmpfs; elsewhere it is nobody, without rights
    assert "test 0: OSError: [Errno 101]" in result.reason and "test 1: FileNotFoundError" in result.reason
    # the repo, as `nobody`: no permission; a checkout under /tmp is not even there (the sandbox's /tmp is its own)
    assert "test 3: PermissionError" in result.reason or (
        str(in_repo).startswith("/tmp/") and "test 3: FileNotFoundError" in result.reason)
    assert accepted == [] and not outside.exists() and not shared_tmp.exists() and not in_repo.exists()
    assert sandbox_processes() == before


def _accept(server: socket.socket) -> list:
    try:
        return [server.accept()]
    except OSError:  # timed out: nobody connected
        return []


def test_code_tests_reward_reads_tests_from_the_task():
    task = Task(prompt="write add", answer=None, metadata={"tests": TESTS[:2]})
    assert code_tests(fenced("def add(a, b):\n    return a + b"), None, task=task, wall_s=4) == 1.0
    assert code_tests("def add(a, b):\n    return 0", "\n".join(TESTS)) == pytest.approx(1 / 3)  # add(-1, 1) == 0
    assert code_tests.blocking is True
    with pytest.raises(ValueError, match="no tests"):
        code_tests("x = 1", "")


def test_no_namespaces_means_no_run(monkeypatch):
    """Where the sandbox cannot be made, the code never runs unconfined: the reward raises."""
    from streamrft.stream_ops import sandbox

    monkeypatch.setenv("PATH", "/nonexistent")  # no `unshare` to be found
    with pytest.raises(sandbox.SandboxUnavailable, match="unshare"):
        run_tests("open('ran', 'w')", ["assert True"], FAST)
    assert not Path("ran").exists()
