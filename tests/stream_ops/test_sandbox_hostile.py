"""Hostile solutions against the code_tests sandbox, as a policy searching for reward would write
them: one per attack of issue 28 plus the ones the first sandbox already held against.

Each is a wrong `add` (WRONG: passes 1 of 3 tests) with the attack appended, or a probe whose
finding comes back as the value a test call returned. "Contained" means, for each:
- the wrong solution scores no more than without the attack (WRONG_SCORE);
- no secret of the host appears in anything the code can output (the result and its reasons);
- nothing of the run outlives it (processes, cgroups, mounts, IPC objects: `leftovers`);
- the call returns within its wall limit plus a margin, and raises no SandboxUnavailable (only a
  missing handshake may: whatever the code does after it counts against the code);
- where the attack is on shared resources, an honest run alongside scores what it scores alone.
"""
from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from streamrft.stream_ops.sandbox import SandboxResult, run_tests
from tests.stream_ops.sandbox_helpers import COLD, HONEST, TESTS, WRONG, WRONG_SCORE, gave, leftovers

MARGIN_S = 15.0


def contained(code: str, tests=TESTS, limits=COLD, *, secret: str | None = None, honest_alongside=False) -> SandboxResult:
    """Run `code` and check every part of "contained" that applies; return its result."""
    before = leftovers()
    honest: list[SandboxResult] = []
    side = threading.Thread(target=lambda: honest.append(run_tests(HONEST, TESTS, limits)))
    if honest_alongside:
        side.start()
    t0 = time.monotonic()
    result = run_tests(code, tests, limits)
    elapsed = time.monotonic() - t0
    if honest_alongside:
        side.join()
        assert honest[0].fraction == 1.0, f"an honest run alongside the attack: {honest[0]}"
    assert elapsed < limits.wall_s * (1 if limits.isolate == "solution" else len(tests)) + MARGIN_S
    if secret is not None:
        assert secret not in repr(result)
    assert leftovers() == before, "something of the run outlived it"
    return result


def attack(code: str) -> str:
    return WRONG + "\n" + code


# ---- verdicts: a wrong solution must not score more by tampering with the grader ----------

@pytest.mark.parametrize("name, code", [
    ("replace exec, eval and compile", "import builtins\n_c = builtins.compile\n"
     "builtins.exec = lambda *a, **k: None\nbuiltins.eval = lambda *a, **k: True\n"
     "builtins.compile = lambda *a, **k: _c('True', 'x', 'eval')"),
    ("patch json.dumps", "import json\njson.dumps = lambda *a, **k: '{\"i\": 0, \"ok\": true}'"),
    ("patch the runner's writer to claim every test", "import __main__\n_js = __main__.js\n"
     "__main__.js = lambda o: _js({'i': o['i'], 'v': ['b', True]}) if isinstance(o, dict) and 'i' in o else _js(o)"),
    ("patch repr", "import builtins\nbuiltins.repr = lambda o: '3'"),
    ("patch marshal to read another job", "import marshal\nmarshal.loads = lambda *a: {'code': '', 'cases': []}"),
    ("patch json.dumps to claim every test", "import json\n_d = json.dumps\n"
     "json.dumps = lambda o, *a, **k: _d({'i': o.get('i'), 'v': ['b', True]}) if isinstance(o, dict) and 'i' in o else _d(o)"),
    ("call the runner's own emit, then exit", "import __main__, os\n"
     "for i in range(-1, 3):\n    __main__.emit({'i': i, 'v': ['b', True], 'ok': True})\nos._exit(0)"),
    ("repeat the handshake and claim", "import __main__, os\n__main__.emit({'ready': __main__.job['nonce']})\n"
     "__main__.emit({'i': 0, 'ok': True})\nos._exit(0)"),
    ("fake lines on every descriptor", "import os\nfor fd in range(0, 64):\n    try:\n"
     "        os.write(fd, b'{\"i\": 0, \"v\": [\"b\", true]}\\n{\"i\": 0, \"ok\": true}\\n')\n    except OSError:\n        pass"),
    ("read the expected values from frames and objects", "import gc, sys\n"
     "def add(a, b):\n    for o in gc.get_objects():\n        if isinstance(o, dict) and ('expected' in o or 'stdout' in o):\n"
     "            return o.get('expected')\n    f = sys._getframe()\n    while f:\n"
     "        for c in f.f_code.co_consts:\n            if c in (3, 15):\n                return c\n        f = f.f_back\n    return 0"),
    ("a value that equals everything", "class Any(int):\n    def __eq__(self, o): return True\n    __hash__ = int.__hash__\n"
     "def add(a, b):\n    return Any(0)"),
    ("a subclass of list equal to everything", "class L(list):\n    def __eq__(self, o): return True\ndef add(a, b):\n    return L()"),
    ("flood every descriptor with an unparseable line", "import os\nfor fd in range(1, 64):\n    try:\n"
     "        os.write(fd, b'[' * (8 << 20))\n    except OSError:\n        pass"),
    ("a value nested 10,000 deep", "def add(a, b):\n    x = []\n    for _ in range(10000):\n        x = [x]\n    return x"),
    ("sys.exit", "import sys\nsys.exit(0)"),
    ("exit with the old 'setup failed' status", "import os\nos._exit(70)"),
    ("claim the sandbox failed", "import sys\nsys.stderr.write('unshare failed: Operation not permitted\\n')\nsys.exit(1)"),
    ("kill the grader and everything it can", "import os, signal\nfor pid in (os.getppid(), 1, -1):\n    try:\n"
     "        os.kill(pid, signal.SIGKILL)\n    except OSError:\n        pass"),
    ("exit from inside the first test call", "import os\ndef add(a, b):\n    os._exit(0)"),
])
def test_tampering_with_the_verdict_gains_nothing(name, code):
    result = contained(attack(code))
    assert result.total == 3
    assert result.fraction <= WRONG_SCORE + 1e-9, f"{name}: {result}"
    # and it is the solution's failure, not the sandbox's: the same attack on a correct add loses points, never raises
    assert contained(HONEST + "\n" + code).total == 3


# ---- isolation ---------------------------------------------------------------------------

PROBE_PROC = """
import os
def leak(word):
    found = []
    for pid in os.listdir('/proc'):
        if not pid.isdigit():
            continue
        for name in ('cmdline', 'environ'):
            try:
                data = open('/proc/%s/%s' % (pid, name), 'rb').read().decode('latin-1')
            except OSError:
                continue
            if word in data:
                found.append(data[data.index(word):][:60])
        for name in ('cwd', 'root/tmp', 'root/etc'):
            try:
                found += [n for n in os.listdir('/proc/%s/%s' % (pid, name)) if 'streamrft' in n or 'secret' in n]
            except OSError:
                pass
    return ';'.join(found) or 'nothing'
def pids():
    return sorted(int(p) for p in os.listdir('/proc') if p.isdigit())
"""


def test_proc_shows_only_the_run_and_no_command_line_secret():
    secret = secrets.token_hex(12)
    canary = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", f"s3.secret_key={secret}"],
                              env={**os.environ, "STREAMRFT_SECRET": secret})
    try:
        result = contained(PROBE_PROC, ["assert leak('secret') == 'x'", "assert pids() == 'x'"], secret=secret)
    finally:
        canary.kill()
        canary.wait()
    assert gave(result.reason, 0) == "'nothing'", result
    assert gave(result.reason, 1) == "[1, 2]", result  # bwrap's init and the runner: nothing else exists


def test_host_files_sockets_and_the_repo_are_out_of_reach(tmp_path):
    secret = secrets.token_hex(12)
    shared = Path("/tmp") / f"streamrft-secret-{secret[:8]}"
    shared.mkdir(mode=0o755)
    (shared / "run.yaml").write_text(f"s3:\n  secret_key: {secret}\n")
    os.chmod(shared / "run.yaml", 0o644)
    repo_file = Path(__file__).resolve()
    run_dir = Path("/run") / f"streamrft-test-{secret[:8]}.sock"
    servers, accepted = [], []
    for path in (str(shared / "s.sock"), str(run_dir)):
        s = socket.socket(socket.AF_UNIX)
        s.bind(path)
        s.listen(1)
        s.settimeout(2)
        servers.append(s)
        threading.Thread(target=lambda s=s: accepted.extend(_accept(s)), daemon=True).start()
    code = "\n".join([
        "import os, socket",
        "def read(path):",
        "    try:",
        "        return open(path).read()[:80]",
        "    except OSError as e:",
        "        return type(e).__name__",
        "def connect(path):",
        "    try:",
        "        socket.socket(socket.AF_UNIX).connect(path)",
        "        return 'connected'",
        "    except OSError as e:",
        "        return type(e).__name__",
        "def listing(path):",
        "    try:",
        "        return sorted(os.listdir(path))",
        "    except OSError as e:",
        "        return type(e).__name__",
    ])
    tests = [f"assert read({str(shared / 'run.yaml')!r}) == 'x'", f"assert read({str(repo_file)!r}) == 'x'",
             "assert read('/etc/passwd') == 'x'", f"assert connect({str(shared / 's.sock')!r}) == 'x'",
             f"assert connect({str(run_dir)!r}) == 'x'", "assert listing('/') == 'x'", "assert listing('/usr/lib') == 'x'"]
    try:
        result = contained(code, tests, secret=secret)
    finally:
        for s in servers:
            s.close()
        run_dir.unlink()
        (shared / "s.sock").unlink()
        (shared / "run.yaml").unlink()
        shared.rmdir()
    for i in range(5):
        assert gave(result.reason, i) in ("'FileNotFoundError'", "'ConnectionRefusedError'"), result
    assert accepted == []
    assert gave(result.reason, 5) == "['dev', 'lib', 'lib64', 'proc', 'root', 'tmp', 'usr']", result
    assert gave(result.reason, 6) == "['x86_64-linux-gnu']", result  # the libraries it links, no more


def _accept(server) -> list:
    try:
        return [server.accept()]
    except OSError:
        return []


IPC = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def shm(mb):
    libc.shmat.restype = ctypes.c_void_p
    sid = libc.shmget(0, mb << 20, 0o1666)  # IPC_PRIVATE, IPC_CREAT | 0666
    if sid < 0:
        return 'shmget errno %d' % ctypes.get_errno()
    addr = libc.shmat(sid, None, 0)
    if addr in (None, ctypes.c_void_p(-1).value):
        return 'shmat errno %d' % ctypes.get_errno()
    ctypes.memset(addr, 1, mb << 20)
    return 'pinned'
def segments():
    return len(open('/proc/sysvipc/shm').read().splitlines()) - 1
def add_key(payload):
    r = libc.syscall(248, b'user', b'streamrft-probe', payload, len(payload), -4)  # add_key to the user keyring
    return 'added' if r >= 0 else 'errno %d' % ctypes.get_errno()
def find_key():
    r = libc.syscall(250, 10, -4, b'user', b'streamrft-probe', 0)  # keyctl(KEYCTL_SEARCH, user keyring)
    return 'found' if r >= 0 else 'errno %d' % ctypes.get_errno()
"""


def test_ipc_objects_and_keys_do_not_outlive_a_run():
    first = contained(IPC, ["assert shm(64) == 'x'", "assert segments() == 'x'", "assert add_key(b'from-run-1') == 'x'",
                            "assert find_key() == 'x'"])
    assert gave(first.reason, 0) == "'pinned'" and gave(first.reason, 1) == "1", first  # it could, in its own namespace
    assert gave(first.reason, 2) == "'errno 1'", first  # keyrings: EPERM from the seccomp filter
    second = contained(IPC, ["assert segments() == 'x'", "assert find_key() == 'x'"])
    assert gave(second.reason, 0) == "0", second  # the first run's segment is gone with its IPC namespace
    assert gave(second.reason, 1) == "'errno 1'", second


SYSCALLS = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def call(nr, *args):
    r = libc.syscall(nr, *[ctypes.c_long(a) for a in args])
    return 'ok' if r >= 0 else 'errno %d' % ctypes.get_errno()
"""


@pytest.mark.parametrize("name, nr, args", [
    ("ptrace PTRACE_TRACEME", 101, (0, 0, 0, 0)), ("bpf", 321, (0, 0, 0)), ("perf_event_open", 298, (0, 0, -1, -1, 0)),
    ("userfaultfd", 323, (0,)), ("io_uring_setup", 425, (1, 0)), ("keyctl", 250, (0, -4, 0)),
    ("open_by_handle_at", 304, (0, 0, 0)), ("setns", 308, (0, 0)), ("x32 ABI getpid", 0x40000000 + 39, ()),
])
def test_kernel_surface_a_solution_has_no_use_for_is_refused(name, nr, args):
    if os.uname().machine != "x86_64":
        pytest.skip("the seccomp filter covers x86_64 only")
    result = contained(SYSCALLS, [f"assert call({nr}, {', '.join(map(str, args))}) == 'x'", "assert call(39) == 'x'"])
    assert gave(result.reason, 0) == "'errno 1'", (name, result)  # EPERM from the filter
    assert gave(result.reason, 1) == "'ok'", result  # getpid: ordinary calls pass


def test_concurrent_runs_neither_see_nor_starve_each_other():
    """12 honest runs at once with 4 processes each: the process limit is the run's, not a shared uid's."""
    limits = replace(COLD, processes=4)
    before = leftovers()
    results: list[SandboxResult] = []
    threads = [threading.Thread(target=lambda: results.append(run_tests(HONEST, TESTS, limits))) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [r.fraction for r in results] == [1.0] * 12, [r.reason for r in results if r.fraction < 1]
    assert leftovers() == before


def test_a_fork_bomb_does_not_starve_a_run_alongside():
    bomb = attack("import os\ntry:\n    while True:\n        os.fork()\nexcept OSError:\n    pass")
    result = contained(bomb, limits=replace(COLD, processes=8, wall_s=8), honest_alongside=True)
    assert result.fraction <= WRONG_SCORE + 1e-9


MEMORY = """
import os, time
def hold(children, mb):
    r, w = os.pipe()
    pids = []
    for _ in range(children):
        pid = os.fork()
        if pid == 0:
            try:
                block = bytearray(mb << 20)
                for i in range(0, len(block), 4096):
                    block[i] = 1
                os.write(w, b'1')
                time.sleep(30)
            finally:
                os._exit(0)
        pids.append(pid)
    os.close(w)
    time.sleep(3)
    os.set_blocking(r, False)
    try:
        done = len(os.read(r, 64))
    except BlockingIOError:
        done = 0
    return done * mb
"""


def test_memory_is_bounded_for_the_whole_run_not_per_process():
    """Four children of 200 MiB each against a 256 MiB run: at most one gets its memory."""
    result = contained(MEMORY, ["assert hold(4, 200) == 'x'"], replace(COLD, memory_mb=256, wall_s=15),
                       honest_alongside=True)
    held = gave(result.reason, 0)
    assert held in ("0", "200") or "not run" in result.reason or "killed" in result.reason, result
    small = contained(MEMORY, ["assert hold(4, 40) == 'x'"], replace(COLD, memory_mb=256, wall_s=15))
    assert gave(small.reason, 0) == "160", small  # the same children within the run's budget all get theirs


NAMESPACES = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
def unshare(flags):
    return 'ok' if libc.unshare(flags) == 0 else 'errno %d' % ctypes.get_errno()
def mount_tmpfs():
    if libc.unshare(0x10000000 | 0x00020000) != 0:  # CLONE_NEWUSER | CLONE_NEWNS
        return 'unshare errno %d' % ctypes.get_errno()
    return 'mount %d' % libc.mount(b'none', b'/tmp', b'tmpfs', 0, None)
"""


def test_no_user_namespace_and_no_mount_of_its_own():
    result = contained(NAMESPACES, ["assert unshare(0x10000000) == 'x'", "assert mount_tmpfs() == 'x'",
                                    "assert unshare(0x00020000) == 'x'"])
    assert gave(result.reason, 0) in ("'errno 28'", "'errno 1'"), result  # EPERM (seccomp), else ENOSPC (--disable-userns)
    assert gave(result.reason, 1).startswith("'unshare errno"), result
    assert gave(result.reason, 2) == "'errno 1'", result  # no CAP_SYS_ADMIN for a mount namespace either


FILES = """
import os
def files(n):
    made = 0
    try:
        for i in range(n):
            open('f%d' % i, 'w').close()
            made += 1
    except OSError as e:
        return made, e.errno
    return made, 0
def fill(mb):
    written = 0
    try:
        with open('big', 'wb') as fh:
            for _ in range(mb):
                fh.write(b'x' * (1 << 20))
                written += 1
    except OSError as e:
        return written, e.errno
    return written, 0
"""


def test_scratch_space_caps_bytes_and_inodes():
    limits = replace(COLD, tmpfs_mb=8, inodes=1000, file_mb=64)
    result = contained(FILES, ["assert files(300000) == 'x'", "assert fill(100) == 'x'"], limits)
    made, errno = eval(gave(result.reason, 0))
    assert made < 1000 and errno == 28, result  # ENOSPC at the inode cap
    written, errno = eval(gave(result.reason, 1))
    assert written <= 8 and errno == 28, result


def test_a_sleeping_or_spinning_solution_is_stopped_at_the_wall_limit():
    contained(attack("import time\ntime.sleep(600)"), limits=replace(COLD, wall_s=2))
    contained(attack("import os\nif os.fork() == 0:\n    while True:\n        pass"), limits=replace(COLD, wall_s=3, cpu_s=1))


SPIN = """
import os, time
def spin(children, seconds):
    r, w = os.pipe()
    for _ in range(children):
        if os.fork() == 0:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                pass
            t = os.times()
            os.write(w, ('%.3f\\n' % (t.user + t.system)).encode())
            os._exit(0)
    os.close(w)
    data = b''
    while True:
        chunk = os.read(r, 1024)
        if not chunk:
            break
        data += chunk
    return round(sum(float(x) for x in data.split()), 1)
"""


def test_a_run_gets_its_cpu_quota_not_the_machine():
    """Four spinning children for 3 s against `cpus: 0.5`: together they get about 1.5 CPU seconds,
    not the 6 (or the cores' worth) they would take unbounded."""
    from streamrft.stream_ops.sandbox.jail import cgroup_bases

    found = cgroup_bases()
    if found is None or (found[0] == 1 and len(found[1]) < 3):
        pytest.skip("no cpu cgroup controller here")
    result = contained(SPIN, ["assert spin(4, 3) == 'x'"], replace(COLD, cpus=0.5, cpu_s=10, wall_s=20))
    used = float(gave(result.reason, 0))
    assert 0.5 < used < 2.2, result  # 3 s x 0.5 cores = 1.5 s, with the scheduler's slack
