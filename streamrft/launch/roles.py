"""How `streamrft run` starts its role processes: a fresh interpreter each, or forked from a server
that imported torch and transformers once (`fork_roles: true`; the CPU demo's).

Each role (`streamrft train|score|explore|evaluate|serve`) spends seconds of CPU importing torch
and transformers before it does anything; five of them starting at once on two cores took about
12-15 s to the CPU demo's first version. With `fork_roles` the launcher starts multiprocessing's
fork server as it begins (its imports overlap the stack's start, the warm-up and the start eval),
and each role is forked from it, the imports already done: torch forked before any parallel
work, as its DataLoader workers are. A forked role is the same role command (`launch.commands`) in a
process of its own: its own session (as `start_new_session`), its log file as stdout and stderr,
the launcher's environment and working directory at the moment it is started (not the server's
older ones), and an exit code as a subprocess's (negative: the signal that ended it). `Role`
gives it the `subprocess.Popen` calls the launcher uses; `roles.json` holds its pid for `kill`.
"""
from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
from pathlib import Path

PRELOAD = ["torch", "transformers", "streamrft.engine.models", "streamrft.engine.rollout.hf",
           "streamrft.consumers.trainer", "streamrft.producers.explorer", "streamrft.producers.evaluator"]
"""Imported once in the fork server: what every role would import first (torch, transformers'
model classes) and the roles' own modules."""


def start_server() -> None:
    """Start the fork server now, in the background (its imports take seconds): call as early as
    the launcher can. Idempotent; the server lives as long as this process."""
    from multiprocessing import forkserver

    multiprocessing.set_forkserver_preload(PRELOAD)
    forkserver.ensure_running()


def _role_main(args: list[str], log: str, env: dict[str, str], cwd: str) -> None:  # in the forked child
    os.setsid()
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(null, 0)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    os.close(null)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    numpy = sys.modules.get("numpy")  # `random` reseeds itself in a forked child; numpy's global
    if numpy is not None:  # state would be the server's in every role (DataLoader's old pitfall)
        numpy.random.seed()
    from streamrft.launch.commands import main

    sys.exit(main(args))


class Role:
    """A role forked from the server, behind the `subprocess.Popen` calls the launcher makes."""

    def __init__(self, args: list[str], log: Path):
        ctx = multiprocessing.get_context("forkserver")
        self.args = args
        self._proc = ctx.Process(target=_role_main, args=(args, str(log), dict(os.environ), os.getcwd()),
                                 name=f"streamrft {args[0]}", daemon=False)
        self._proc.start()
        self.pid = self._proc.pid

    @property
    def returncode(self) -> int | None:
        return self._proc.exitcode

    def poll(self) -> int | None:
        return self._proc.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._proc.join(timeout)
        if self._proc.exitcode is None:
            raise subprocess.TimeoutExpired(["streamrft", *self.args], timeout)
        return self._proc.exitcode

    def send_signal(self, sig: int) -> None:
        if self._proc.exitcode is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def spawn(args: list[str], log: Path, fork: bool) -> "Role | subprocess.Popen":
    """Start `streamrft ARGS` with its output appended to `log`: forked from the server (`fork`),
    or as a fresh interpreter."""
    log.parent.mkdir(parents=True, exist_ok=True)
    if fork:
        return Role(args, log)
    with open(log, "ab") as fh:
        return subprocess.Popen([sys.executable, "-m", "streamrft.launch.commands", *args], stdout=fh, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
