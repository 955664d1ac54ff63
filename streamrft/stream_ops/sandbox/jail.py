"""One sandbox process: bubblewrap namespaces, a minimal read-only root, a cgroup per run.

`spawn(spec)` starts `bwrap ... python -I -S -c RUNNER` and returns a `Jail` whose runner waits
for its job on stdin (so a pool can keep jails warm). What each one gets:

- new user, pid, net, ipc, uts, cgroup and mount namespaces (`--unshare-all`), no further user
  namespaces (`--disable-userns`), uid/gid 65534 inside, no capabilities, a new session, a cleared
  environment, killed with its parent (`--die-with-parent`), a seccomp filter (`seccomp.py`);
- a root holding only the interpreter, the shared libraries it and its stdlib's extension modules
  load (found with `ldd`), and the stdlib with `site-packages` hidden, all read-only; a new `/proc`
  (its own processes only); a minimal `/dev`, read-only;
- `/tmp` (the cwd): a tmpfs with both `size` and `nr_inodes`, mounted by the parent (private,
  mode 0700) and unmounted after the run, or, where the parent cannot mount (not root), bwrap's
  own size-capped tmpfs;
- a cgroup of its own (v2, else the v1 `memory`, `pids` and, where mounted, `cpu` hierarchies)
  holding every process of the run: `memory` (swap included) and `pids` bound the run as a whole,
  and a CPU quota (`cpus`) keeps one run from taking the machine's cores from the others. Where no cgroup can be
  made, the fallback is RLIMIT_NPROC counted in the jail's own user namespace (so per run) times
  RLIMIT_AS per process: the total is still bounded, by `processes x memory_mb`.
"""
from __future__ import annotations

import atexit
import ctypes
import ctypes.util
import errno
import functools
import glob
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from streamrft.stream_ops.sandbox.seccomp import program as seccomp_program
from streamrft.stream_ops.sandbox.runner import RUNNER

log = logging.getLogger(__name__)

SANDBOX_UID = 65534
CGROUP_DIR = "streamrft-sandbox"
CPU_PERIOD_US = 100_000
MS_NOSUID, MS_NODEV, MS_PRIVATE = 2, 4, 1 << 18


class SandboxUnavailable(RuntimeError):
    """The machine cannot make the sandbox (no bubblewrap, or the kernel refuses): never run unconfined."""


@dataclass(frozen=True)
class JailSpec:
    """What is fixed when a jail starts (the pool's key); rlimits come with each job."""
    memory_mb: int
    processes: int
    tmpfs_mb: int
    inodes: int
    cpus: float = 1.0


@dataclass
class Jail:
    proc: subprocess.Popen
    out_fd: int
    """memfds on the parent's side: the solution's stdout, stderr, and the runner's results."""
    err_fd: int
    res_fd: int
    done_fd: int
    """A pipe's read end: readable once the runner says it is done, or once every process of the
    jail has let go of its write end (they all exited)."""
    cgroup: "Cgroup | None"
    scratch: str | None

    def read(self, fd: int, cap: int) -> bytes:
        return os.pread(fd, cap, 0)

    def destroy(self) -> None:
        """Kill every process of the jail and free what it held; nothing of the run is left."""
        self.kill()
        self.release()

    def kill(self) -> None:
        """SIGKILL bwrap (its child, the namespace's init, dies with it, and with the init the kernel
        kills the rest of the PID namespace) and, for good measure, everything in the run's cgroup."""
        if self.proc.poll() is None:
            try:
                self.proc.kill()
            except ProcessLookupError:
                pass
        if self.cgroup is not None:
            self.cgroup.kill(passes=1)

    def release(self) -> None:
        """Wait until no process of the jail is left, then free its cgroup, memfds and mount point."""
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            log.warning("sandbox: bwrap pid %d did not exit in 10 s after SIGKILL", self.proc.pid)
        if self.cgroup is not None:
            self.cgroup.kill()
        for fd in (self.out_fd, self.err_fd, self.res_fd, self.done_fd):
            try:
                os.close(fd)
            except OSError:
                pass
        if self.proc.stdin is not None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
        if self.cgroup is not None:
            self.cgroup.remove()
        if self.scratch is not None:
            unmount_scratch(self.scratch)


# ---- cgroups --------------------------------------------------------------------------------

class Cgroup:
    """One run's cgroup: a directory per hierarchy (one on v2; memory and pids on v1)."""

    def __init__(self, dirs: list[str], version: int):
        self.dirs, self.version = dirs, version

    @property
    def procs_files(self) -> list[str]:
        return [os.path.join(d, "cgroup.procs") for d in self.dirs]

    def adopt(self, pid: int) -> None:
        """Move `pid` and every process below it into this cgroup. A process moved before it forks
        passes the cgroup on; one forked before its parent moved shows among the children read
        after that move. Called before the jail gets its job, while its processes only wait."""
        moved: set[int] = set()
        todo = [pid]
        while todo:
            p = todo.pop()
            if p in moved:
                continue
            for f in self.procs_files:
                try:
                    with open(f, "w") as fh:
                        fh.write(str(p))
                except ProcessLookupError:
                    break
            moved.add(p)
            for task in glob.glob(f"/proc/{p}/task/*/children"):
                try:
                    todo += [int(c) for c in Path(task).read_text().split()]
                except OSError:
                    pass

    def pids(self) -> list[int]:
        out: set[int] = set()
        for f in self.procs_files:
            try:
                out.update(int(p) for p in Path(f).read_text().split())
            except OSError:
                pass
        return sorted(out)

    def kill(self, passes: int = 100) -> None:
        """SIGKILL every process in the cgroup, pass after pass until it is empty (at most `passes`)."""
        if self.version == 2 and _write(os.path.join(self.dirs[0], "cgroup.kill"), "1") and passes == 1:
            return
        for _ in range(passes):  # v1: no cgroup.kill; a process forked meanwhile shows on the next pass
            pids = self.pids()
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.002)

    def remove(self) -> None:
        for d in self.dirs:
            for attempt in range(200):  # the killed processes leave the cgroup as they are reaped
                try:
                    os.rmdir(d)
                    break
                except FileNotFoundError:
                    break
                except OSError as e:
                    if e.errno != errno.EBUSY:
                        log.warning("sandbox: cannot remove cgroup %s: %s", d, e)
                        break
                    time.sleep(0.005)
            else:
                log.warning("sandbox: cgroup %s still busy after its run", d)


def _write(path: str, text: str) -> bool:
    try:
        with open(path, "w") as fh:
            fh.write(text)
        return True
    except OSError:
        return False


_setup_lock = threading.Lock()
"""Serialises the once-per-process set-up (cgroup bases, the root tree): the pool's refill thread
and a caller may both get there first, and two probes of one name would fail each other."""


def cgroup_bases() -> tuple[int, tuple[str, ...]] | None:
    """(version, the directories new run cgroups go under), or None where none can be made here."""
    with _setup_lock:
        return _cgroup_bases()


@functools.lru_cache(maxsize=1)
def _cgroup_bases() -> tuple[int, tuple[str, ...]] | None:
    own = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for c in controllers.split(",") if controllers else [""]:
            own[c] = path
    mounts = {}
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        pre, _, post = line.partition(" - ")
        fields, fstype = pre.split(), post.split()
        if not fstype:
            continue
        root, point = fields[3], fields[4]
        if fstype[0] == "cgroup2":
            mounts.setdefault("", (root, point))
        elif fstype[0] == "cgroup":
            for opt in fstype[2].split(","):
                if opt in ("memory", "pids", "cpu"):
                    mounts[opt] = (root, point)
    if "memory" in mounts and "pids" in mounts:  # v1 (or hybrid, as on this project's machines)
        bases = []
        for c in ("memory", "pids", "cpu") if "cpu" in mounts else ("memory", "pids"):
            root, point = mounts[c]
            rel = os.path.relpath(own.get(c, "/"), root) if own.get(c, "/").startswith(root) else "."
            bases.append(os.path.normpath(os.path.join(point, rel, CGROUP_DIR)))
        if all(_make_base(b, 1) for b in bases):
            return 1, tuple(bases)
    if "" in mounts and os.path.exists(os.path.join(mounts[""][1], "cgroup.controllers")):
        root, point = mounts[""]
        mine = os.path.normpath(os.path.join(point, os.path.relpath(own.get("", "/"), root)))
        for parent in (mine, os.path.dirname(mine), point):  # a parent that may enable memory and pids below it
            base = os.path.join(parent, CGROUP_DIR)
            if _make_base(base, 2):
                return 2, (base,)
    return None


def _make_base(base: str, version: int) -> bool:
    try:
        os.makedirs(base, exist_ok=True)
    except OSError:
        return False
    if version == 2:
        parent = os.path.dirname(base)
        available = Path(parent, "cgroup.controllers").read_text().split() if os.path.exists(
            os.path.join(parent, "cgroup.controllers")) else []
        if not {"memory", "pids"} <= set(available):
            return False
        _write(os.path.join(parent, "cgroup.subtree_control"), "+memory +pids")
        if not _write(os.path.join(base, "cgroup.subtree_control"), "+memory +pids"):
            return False
        if "cpu" in available:  # optional: a run's CPU share (Limits.cpus)
            _write(os.path.join(parent, "cgroup.subtree_control"), "+cpu")
            _write(os.path.join(base, "cgroup.subtree_control"), "+cpu")
    _sweep(base)
    probe = os.path.join(base, f"probe-{os.getpid()}-{threading.get_ident()}")
    try:
        os.mkdir(probe)
        os.rmdir(probe)
    except OSError:
        return False
    return True


def _sweep(base: str) -> None:
    """Remove run cgroups left by workers that died (their names carry the worker's pid)."""
    for d in glob.glob(os.path.join(base, "w*-*")):
        m = re.fullmatch(r"w(\d+)-\d+", os.path.basename(d))
        if m and not os.path.exists(f"/proc/{m.group(1)}"):
            try:
                os.rmdir(d)
            except OSError:
                pass


_counter = iter(range(1, 1 << 62))


@functools.lru_cache(maxsize=1)
def _warn_no_cgroup() -> None:
    log.warning("sandbox: no cgroup can be made here (not root, or no delegated cgroup v2 subtree): a run's "
                "memory is bounded only by processes x memory_mb (RLIMIT_NPROC in its user namespace x RLIMIT_AS)")


def make_cgroup(spec: JailSpec) -> Cgroup | None:
    found = cgroup_bases()
    if found is None:
        _warn_no_cgroup()
        return None
    version, bases = found
    name = f"w{os.getpid()}-{next(_counter)}"
    dirs = [os.path.join(b, name) for b in bases]
    memory = str(spec.memory_mb << 20)
    quota = max(1000, int(spec.cpus * CPU_PERIOD_US))
    try:
        for d in dirs:
            os.mkdir(d)
        if version == 2:
            d = dirs[0]
            ok = _write(os.path.join(d, "memory.max"), memory) and _write(os.path.join(d, "pids.max"), str(spec.processes))
            if os.path.exists(os.path.join(d, "memory.swap.max")):
                ok = ok and _write(os.path.join(d, "memory.swap.max"), "0")
            if os.path.exists(os.path.join(d, "cpu.max")):
                ok = ok and _write(os.path.join(d, "cpu.max"), f"{quota} {CPU_PERIOD_US}")
        else:
            mem, pids = dirs[:2]
            ok = _write(os.path.join(mem, "memory.limit_in_bytes"), memory) \
                and _write(os.path.join(pids, "pids.max"), str(spec.processes))
            if os.path.exists(os.path.join(mem, "memory.memsw.limit_in_bytes")):
                ok = ok and _write(os.path.join(mem, "memory.memsw.limit_in_bytes"), memory)
            if len(dirs) == 3:
                ok = ok and _write(os.path.join(dirs[2], "cpu.cfs_period_us"), str(CPU_PERIOD_US)) \
                    and _write(os.path.join(dirs[2], "cpu.cfs_quota_us"), str(quota))
        if not ok:
            raise OSError("cannot set the run cgroup's limits")
    except OSError as e:
        Cgroup(dirs, version).remove()
        raise SandboxUnavailable(f"cannot make the run's cgroup under {bases}: {e}") from e
    return Cgroup(dirs, version)


# ---- the root filesystem ------------------------------------------------------------------

@functools.lru_cache(maxsize=1)
def interpreter() -> tuple[str, str]:
    """(the real interpreter binary, its stdlib directory)."""
    exe = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)
    stdlib = os.path.realpath(os.path.dirname(os.__file__))
    return exe, stdlib


def root_binds() -> tuple[str, ...]:
    with _setup_lock:
        return _root_binds()


@functools.lru_cache(maxsize=1)
def _root_binds() -> tuple[str, ...]:
    """bwrap arguments for a read-only root holding the interpreter, the shared libraries it and its
    stdlib's extension modules load (found with `ldd`), and its stdlib with `site-packages` hidden.

    The interpreter and libraries are gathered once per process into a private directory tree of
    hard links (copies where links are refused), with every symlink on their way recreated, and
    bound as the jail's `/` in one mount: a bind per library costs more to set up and tear down
    than the interpreter takes to start."""
    exe, stdlib = interpreter()
    objects = [exe, *glob.glob(os.path.join(stdlib, "lib-dynload", "*.so"))]
    libs: set[str] = set()
    ldd = shutil.which("ldd")
    if ldd is None:
        raise SandboxUnavailable("`ldd` is not on PATH: cannot find the interpreter's shared libraries")
    for chunk in range(0, len(objects), 64):
        out = subprocess.run([ldd, *objects[chunk:chunk + 64]], capture_output=True, text=True).stdout
        for line in out.splitlines():
            m = re.search(r"(?:=>\s*)?(/\S+)\s+\(0x", line)
            if m:
                libs.add(m.group(1))
    links: dict[str, str] = {}
    files: set[str] = set()
    for path in sorted(libs | {exe}):
        _walk(path, links, files)
    _sweep_roots()
    _sweep_scratch()
    tree = tempfile.mkdtemp(prefix=f"{ROOT_PREFIX}{os.getpid()}-")
    atexit.register(shutil.rmtree, tree, True)
    for f in sorted(files):
        dest = tree + f
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        try:
            os.link(f, dest)
        except OSError:  # another filesystem, or protected_hardlinks for a user who does not own it
            shutil.copy2(f, dest)
    for link, target in sorted(links.items()):
        dest = tree + link
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        if not os.path.lexists(dest):
            os.symlink(target, dest)
    for d in ("proc", "dev", "tmp", stdlib.lstrip("/")):  # mount points of the jail's own mounts
        os.makedirs(os.path.join(tree, d), exist_ok=True)
    for dirpath, dirnames, _ in os.walk(tree):
        for d in dirnames:
            os.chmod(os.path.join(dirpath, d), 0o755)
    os.chmod(tree, 0o755)
    args = ["--ro-bind", tree, "/", "--ro-bind", stdlib, stdlib]
    site = os.path.join(stdlib, "site-packages")
    if os.path.isdir(site):
        args += ["--tmpfs", site, "--remount-ro", site]
    return tuple(args)


ROOT_PREFIX = "streamrft-sandbox-root-"


def _sweep_roots() -> None:
    """Remove jail root trees of processes that died without their atexit."""
    for d in glob.glob(os.path.join(tempfile.gettempdir(), ROOT_PREFIX + "*")):
        m = re.match(re.escape(ROOT_PREFIX) + r"(\d+)-", os.path.basename(d))
        if m and not os.path.exists(f"/proc/{m.group(1)}"):
            shutil.rmtree(d, ignore_errors=True)


def _walk(path: str, links: dict[str, str], files: set[str], depth: int = 0) -> None:
    """Every symlink on the way to `path` (recreated in the jail) and the file it ends at (bound)."""
    if depth > 16:
        return
    parts = Path(path).parts
    cur = "/"
    for i, part in enumerate(parts[1:], start=1):
        cur = os.path.join(cur, part)
        if os.path.islink(cur):
            target = os.readlink(cur)
            links[cur] = target
            resolved = os.path.normpath(os.path.join(os.path.dirname(cur), target))
            _walk(os.path.join(resolved, *parts[i + 1:]), links, files, depth + 1)
            return
    if os.path.isfile(cur):
        files.add(cur)


# ---- spawning ------------------------------------------------------------------------------

@functools.lru_cache(maxsize=1)
def _libc():
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
    return libc


SCRATCH_PREFIX = "streamrft-jail-"
MNT_DETACH = 2


def mount_scratch(spec: JailSpec) -> str | None:
    """The run's /tmp: a tmpfs with `size` and `nr_inodes` on a fresh directory, mounted here (only
    root may), private (no propagation), mode 0700 (only the jail's uid, root outside, enters).
    None where this process cannot mount: bwrap then makes a tmpfs capped in bytes only."""
    if os.geteuid() != 0:
        return None
    path = tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-")
    libc = _libc()
    options = f"size={spec.tmpfs_mb << 20},nr_inodes={spec.inodes},mode=0700".encode()
    if libc.mount(b"tmpfs", path.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, options) != 0:
        err = ctypes.get_errno()
        os.rmdir(path)
        raise SandboxUnavailable(f"cannot mount the run's tmpfs on {path}: {os.strerror(err)}")
    libc.mount(None, path.encode(), None, MS_PRIVATE, None)
    return path


def unmount_scratch(path: str) -> None:
    """Unmount a run's tmpfs (its pages go with it) and remove the directory."""
    _libc().umount2(path.encode(), MNT_DETACH)
    try:
        os.rmdir(path)
    except OSError as e:
        log.warning("sandbox: cannot remove %s: %s", path, e)


def _sweep_scratch() -> None:
    """Unmount run tmpfs left by workers that died."""
    for d in glob.glob(os.path.join(tempfile.gettempdir(), SCRATCH_PREFIX + "*")):
        m = re.match(re.escape(SCRATCH_PREFIX) + r"(\d+)-", os.path.basename(d))
        if m and not os.path.exists(f"/proc/{m.group(1)}"):
            unmount_scratch(d)


def _seccomp_fd() -> int | None:
    """A memfd holding the jail's seccomp filter, for bwrap to read (one per jail: bwrap reads it to its end)."""
    filt = seccomp_program()
    if filt is None:
        _warn_no_seccomp()
        return None
    fd = os.memfd_create("seccomp", 0)
    os.write(fd, filt)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


@functools.lru_cache(maxsize=1)
def _warn_no_seccomp() -> None:
    log.warning("sandbox: no seccomp filter for %s: jails run with the kernel's whole system-call surface",
                os.uname().machine)


def bwrap_path() -> str:
    path = shutil.which("bwrap") or next((p for p in ("/usr/bin/bwrap", "/bin/bwrap") if os.path.exists(p)), None)
    if path is None:
        raise SandboxUnavailable("bubblewrap (`bwrap`) is not installed: `apt-get install bubblewrap`; "
                                 "code is never run without isolation")
    return path


def spawn(spec: JailSpec) -> Jail:
    """A jail whose runner waits for its job on stdin."""
    bwrap = bwrap_path()
    exe, _ = interpreter()
    cgroup = make_cgroup(spec)
    fds = [os.memfd_create(name, 0) for name in ("stdout", "stderr", "results")]  # not inheritable
    done_r, done_w = os.pipe()
    filter_fd = _seccomp_fd()
    seccomp = ["--seccomp", str(filter_fd)] if filter_fd is not None else []
    try:
        scratch = mount_scratch(spec)
    except SandboxUnavailable:
        for fd in (*fds, done_r, done_w):
            os.close(fd)
        if cgroup is not None:
            cgroup.remove()
        raise
    tmp = ["--bind", scratch, "/tmp"] if scratch else ["--size", str(spec.tmpfs_mb << 20), "--tmpfs", "/tmp"]
    cmd = [bwrap, "--unshare-all", "--unshare-user", "--disable-userns", "--uid", str(SANDBOX_UID),
           "--gid", str(SANDBOX_UID), "--hostname", "sandbox", "--die-with-parent", "--new-session",
           "--clearenv", "--cap-drop", "ALL", *seccomp, *root_binds(), "--proc", "/proc", "--dev", "/dev",
           "--remount-ro", "/dev", *tmp, "--chdir", "/tmp", exe, "-I", "-S", "-c", RUNNER, str(fds[2]), str(done_w)]
    try:
        # no preexec_fn: Python then starts bwrap with vfork, where a fork would copy the worker's
        # page tables (15 ms a jail from a 300 MB process); the cgroup is joined just below instead
        proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=fds[0], stderr=fds[1], env={}, cwd="/",
            pass_fds=(fds[2], done_w) if filter_fd is None else (fds[2], done_w, filter_fd),
            start_new_session=True)
        if cgroup is not None:
            cgroup.adopt(proc.pid)
    except (OSError, subprocess.SubprocessError) as e:
        if "proc" in locals():
            proc.kill()
            proc.wait()
        for fd in (*fds, done_r):
            os.close(fd)
        if cgroup is not None:
            cgroup.remove()
        if scratch is not None:
            unmount_scratch(scratch)
        raise SandboxUnavailable(f"cannot start the sandbox: {e}") from e
    finally:
        os.close(done_w)
        if filter_fd is not None:
            os.close(filter_fd)
    return Jail(proc, fds[0], fds[1], fds[2], done_r, cgroup, scratch)
