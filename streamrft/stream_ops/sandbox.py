"""Run untrusted Python (a response's code) against tests in a throwaway sandbox process.

`run_tests(code, tests, limits)` -> `SandboxResult(passed, total, reason)`. Each run is one
`unshare --net --pid --mount --fork --kill-child` process (util-linux, on every Debian): no network
(a new, empty network namespace), its own PID namespace (when its first process ends, the kernel
kills every process left in it: nothing survives a run), and a private mount namespace in which
`/tmp`, `/var/tmp`, `/dev/shm` and `/run/lock` are fresh size-capped tmpfs; the scratch directory
is `/tmp/work` there, so it vanishes with the namespace. Started as root, the runner drops to
`nobody` (uid/gid 65534) before touching the code, so RLIMIT_NPROC holds (root ignores it) and
nothing outside the private tmpfs is writable. Not root: a user namespace maps the caller to root
inside; the code then keeps the caller's file permissions (see docs/rewards.md).
Limits (setrlimit in the sandbox): CPU seconds, address space, file size, processes, open files;
a wall timeout kills the whole process group. Env is cleared; the interpreter runs with `-I -S`.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

SETUP_FAILED = 70
"""The runner's exit status when it cannot make its mounts (EX_SOFTWARE)."""


@dataclass(frozen=True)
class Limits:
    cpu_s: int = 5
    """RLIMIT_CPU: CPU seconds of each process."""
    memory_mb: int = 512
    """RLIMIT_AS: address space of each process."""
    file_mb: int = 4
    """RLIMIT_FSIZE: the largest file a process may write (stdout/stderr included)."""
    processes: int = 32
    """RLIMIT_NPROC: processes of the sandbox user (root is exempt, hence the drop to nobody)."""
    open_files: int = 64
    wall_s: float = 10.0
    """Wall-clock limit of the whole run; past it the process group is SIGKILLed."""
    tmpfs_mb: int = 16


@dataclass(frozen=True)
class SandboxResult:
    passed: int
    total: int
    reason: str = ""
    """Empty when every test passed; else why not (the first failing test's error, a timeout, ...)."""

    @property
    def fraction(self) -> float:
        return self.passed / self.total if self.total else 0.0


class SandboxUnavailable(RuntimeError):
    """The machine cannot make the namespaces (no `unshare`, or the kernel refuses): never run unconfined."""


# The runner: set up the mounts (still root inside the namespaces), drop privileges, set limits,
# then exec the solution and each test in one namespace, printing one nonce-tagged line per test.
RUNNER = r"""
import ctypes, json, os, resource, signal, sys
job = json.loads(sys.stdin.read()); sys.stdin.close()
libc = ctypes.CDLL(None, use_errno=True)
for d in ("/tmp", "/var/tmp", "/dev/shm", "/run/lock"):
    if os.path.isdir(d) and libc.mount(b"tmpfs", d.encode(), b"tmpfs", 0,
                                       ("size=%dm,mode=1777" % job["tmpfs_mb"]).encode()) != 0:
        sys.stderr.write("mount tmpfs on %s failed: errno %d\n" % (d, ctypes.get_errno())); sys.exit(70)
# the interpreter's stdlib may sit under a directory nobody cannot enter (/root/.pyenv): bind it
# where nobody can read it and import from there
prefix = sys.base_prefix
os.mkdir("/tmp/.python", 0o755)
if libc.mount(prefix.encode(), b"/tmp/.python", None, 4096 | 16384, None) != 0:  # MS_BIND | MS_REC
    sys.stderr.write("bind mount of %s failed: errno %d\n" % (prefix, ctypes.get_errno())); sys.exit(70)
sys.path[:] = ["/tmp/.python" + p[len(prefix):] if p.startswith(prefix) else p for p in sys.path]
for m in list(sys.modules.values()):  # packages already loaded (encodings) import submodules later
    if isinstance(getattr(m, "__path__", None), list):
        m.__path__[:] = ["/tmp/.python" + p[len(prefix):] if p.startswith(prefix) else p for p in m.__path__]
sys.path_importer_cache.clear()
os.mkdir("/tmp/work", 0o700)
if job["drop"]:
    os.chown("/tmp/work", 65534, 65534); os.setgroups([]); os.setgid(65534); os.setuid(65534)
os.chdir("/tmp/work")
for name, soft in job["rlimits"].items():  # CPU: SIGXCPU at the soft limit, SIGKILL a second later
    resource.setrlimit(getattr(resource, name), (soft, soft + 1 if name == "RLIMIT_CPU" else soft))
nonce, out, current = job["nonce"], sys.__stdout__, [-1]
def report(i, ok, error=""):
    out.write(nonce + json.dumps({"i": i, "ok": ok, "error": error[-500:]}) + "\n"); out.flush()
def out_of_cpu(signum, frame):
    report(current[0], False, "CPU time limit of %d s exceeded" % job["rlimits"]["RLIMIT_CPU"]); os._exit(0)
signal.signal(signal.SIGXCPU, out_of_cpu)
g = {"__name__": "__main__"}
try:
    exec(compile(job["code"], "solution.py", "exec"), g)
except BaseException as e:
    report(-1, False, "the solution raised %s: %s" % (type(e).__name__, e)); sys.exit(0)
for i, test in enumerate(job["tests"]):
    current[0] = i
    try:
        exec(compile(test, "test_%d.py" % i, "exec"), g)
        report(i, True)
    except BaseException as e:
        report(i, False, "%s: %s" % (type(e).__name__, str(e) or test.strip().splitlines()[-1]))
"""


def _command() -> tuple[list[str], bool]:
    """The unshare command line and whether the runner drops to nobody (only root can)."""
    unshare = shutil.which("unshare")
    if unshare is None:
        raise SandboxUnavailable("`unshare` (util-linux) is not on PATH: code cannot be run without isolation")
    ns = ["--net", "--pid", "--mount", "--fork", "--kill-child"]
    if os.geteuid() != 0:
        ns = ["--user", "--map-root-user", *ns]
    return [unshare, *ns, sys.executable, "-I", "-S", "-c", RUNNER], os.geteuid() == 0


def run_tests(code: str, tests: list[str], limits: Limits = Limits()) -> SandboxResult:
    """Run `code` then each test (Python statements, e.g. `assert f(2) == 4`) in one sandbox process."""
    if not tests:
        return SandboxResult(0, 0, "no tests")
    cmd, drop = _command()
    nonce = f"@@{secrets.token_hex(16)}@@"
    mb = 1 << 20
    job = {"code": code, "tests": tests, "nonce": nonce, "drop": drop, "tmpfs_mb": limits.tmpfs_mb, "rlimits": {
        "RLIMIT_CPU": limits.cpu_s, "RLIMIT_AS": limits.memory_mb * mb, "RLIMIT_FSIZE": limits.file_mb * mb,
        "RLIMIT_NPROC": limits.processes, "RLIMIT_NOFILE": limits.open_files, "RLIMIT_CORE": 0}}
    # outputs go to files on the host side (a pipe is unbounded; RLIMIT_FSIZE caps these files)
    with tempfile.TemporaryDirectory(prefix="streamrft-sandbox-") as host_dir:
        out_path, err_path = os.path.join(host_dir, "out"), os.path.join(host_dir, "err")
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=out, stderr=err, env={"PATH": "/usr/bin:/bin"},
                                    cwd="/", start_new_session=True, close_fds=True)
            timed_out = False
            try:
                proc.communicate(json.dumps(job).encode(), timeout=limits.wall_s)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                _kill_group(proc)
        with open(out_path, "rb") as fh:
            stdout = fh.read().decode("utf-8", "replace")
        with open(err_path, "rb") as fh:
            stderr = fh.read(4096).decode("utf-8", "replace")
    return _result(stdout, stderr, nonce, len(tests), proc.returncode, timed_out, limits)


def _kill_group(proc: subprocess.Popen) -> None:
    """Kill the namespace's init first, so that unshare reaps it: the kernel kills and reaps every
    other process of the PID namespace before its init can be reaped, so once unshare has exited
    nothing of the run is left. Then SIGKILL the process group (unshare itself, anything else)."""
    if proc.poll() is None:
        try:
            children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        except OSError:  # unshare is gone meanwhile
            children = []
        for pid in children:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _result(stdout: str, stderr: str, nonce: str, total: int, returncode: int, timed_out: bool, limits: Limits) -> SandboxResult:
    verdicts: dict[int, dict] = {}
    for line in stdout.splitlines():
        if not line.startswith(nonce):  # the code's own prints
            continue
        try:
            v = json.loads(line[len(nonce):])
        except ValueError:
            continue
        verdicts.setdefault(int(v["i"]), v)  # the first verdict of a test counts
    if not verdicts and ("unshare failed" in stderr or returncode == SETUP_FAILED):  # the code never ran: no score
        raise SandboxUnavailable(f"the sandbox could not be set up (exit {returncode}): {stderr.strip()[-300:]}")
    if -1 in verdicts:
        return SandboxResult(0, total, verdicts[-1]["error"])
    passed = sum(1 for i in range(total) if verdicts.get(i, {}).get("ok") is True)
    failures = [f"test {i}: {verdicts[i]['error']}" for i in range(total) if i in verdicts and not verdicts[i]["ok"]]
    if timed_out:
        failures.append(f"wall timeout after {limits.wall_s} s ({total - len(verdicts)} tests not run)")
    elif len(verdicts) < total:
        how = f"killed by signal {-returncode}" if returncode < 0 else f"exit {returncode}"
        failures.append(f"the sandbox ended ({how}) with {total - len(verdicts)} tests not run"
                        + (f"; stderr: {stderr.strip()[-300:]}" if stderr.strip() else ""))
    return SandboxResult(passed, total, "; ".join(failures))
