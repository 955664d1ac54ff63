"""The `streamrft` command, run as a subprocess: light commands never import torch; up/status/down
manage exactly their own processes, twice in a row; schema prints JSON Schema; roundtrip passes."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import NewTopic

from streamrft.config import KafkaConfig
from streamrft.infra.kafka import ensure_topics, flush_or_raise, make_consumer, make_producer
from streamrft.infra.stack import EmbeddedStack, free_ports, pid_alive
from streamrft.schemas import MESSAGES

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "transformers", "deepspeed", "vllm")


def _cli(*args: str, timeout: float = 120) -> tuple[subprocess.CompletedProcess, set[str]]:
    """Run `streamrft ARGS`; returns the result and the top-level packages it imported."""
    r = subprocess.run([sys.executable, "-X", "importtime", "-m", "streamrft.cli", *args], cwd=ROOT,
                       capture_output=True, text=True, timeout=timeout)
    imported = {line.rsplit("|", 1)[1].strip().split(".")[0]
                for line in r.stderr.splitlines() if line.startswith("import time:") and "|" in line}
    r.stderr = "\n".join(line for line in r.stderr.splitlines() if not line.startswith("import time:"))
    return r, imported


def _stack_flags(data_dir: Path) -> tuple[list[str], dict[str, int]]:
    ports = free_ports()
    return ["--data-dir", str(data_dir), "--kafka-port", str(ports["kafka_port"]), "--s3-port",
            str(ports["s3_port"]), "--weed-port-base", str(ports["weed_port_base"])], ports


def _processes_of(data_dir: Path, ports: dict[str, int]) -> list[int]:
    """PIDs of any process that belongs to this stack: weed names the data dir, tansu its port."""
    marks = (str(data_dir), f"tcp://127.0.0.1:{ports['kafka_port']}")
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and pid_alive(int(proc.name)):
            try:
                cmdline = (proc / "cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if any(m in cmdline for m in marks) and "pytest" not in cmdline:
                found.append(int(proc.name))
    return found


@pytest.mark.parametrize("args", [["--help"], ["up", "--help"], ["dashboard", "--help"], ["schema", "task"]])
def test_light_commands_do_not_import_torch(args):
    r, imported = _cli(*args)
    assert r.returncode == 0, r.stderr
    assert "streamrft" in imported
    assert not imported & set(HEAVY), imported & set(HEAVY)


def test_schema_prints_json_schema():
    r, _ = _cli("schema", "rollout_group")
    assert r.returncode == 0, r.stderr
    schema = json.loads(r.stdout)
    assert schema["title"] == "RolloutGroup"
    assert {"kind", "schema", "group_id", "task", "trajectories"} <= set(schema["properties"])
    r, _ = _cli("schema")
    assert set(json.loads(r.stdout)) == set(MESSAGES)


def test_up_status_down_twice(tmp_path):
    data_dir = tmp_path / "stack"
    flags, ports = _stack_flags(data_dir)
    es = EmbeddedStack(data_dir)
    topic, group = "cli.records", "cli-group"
    try:
        r, imported = _cli("up", *flags)
        assert r.returncode == 0, r.stderr
        assert "stack up" in r.stdout and not imported & set(HEAVY)
        # a new data dir gets the default metadata store, and up names it
        assert "store sqlite (SeaweedFS metadata" in r.stdout and (data_dir / "s3" / "filer.db").exists()
        pids = {name: p.pid for name, p in es.load_state().procs.items()}
        assert set(pids) == {"weed", "tansu", "keeper"} and all(pid_alive(p) for p in pids.values())

        r, _ = _cli("up", *flags)
        assert r.returncode == 0 and "already running" in r.stdout, r.stdout + r.stderr
        assert {name: p.pid for name, p in es.load_state().procs.items()} == pids

        # something for status to show: a topic with 5 records and a group that committed 2
        kafka = KafkaConfig(bootstrap=f"127.0.0.1:{ports['kafka_port']}")
        ensure_topics(kafka, {topic: NewTopic(topic, num_partitions=1, replication_factor=1)})
        producer = make_producer(kafka)
        for i in range(5):
            producer.produce(topic, value=b"x%d" % i)
        flush_or_raise(producer)
        del producer
        consumer = make_consumer(kafka, group)
        consumer.commit(offsets=[TopicPartition(topic, 0, 2)], asynchronous=False)
        consumer.close()

        for cycle in (1, 2):
            if cycle == 2:  # up again on the same data dir: new processes, same data
                r, _ = _cli("up", *flags)
                assert r.returncode == 0 and "stack up" in r.stdout, r.stdout + r.stderr
                pids = {name: p.pid for name, p in es.load_state().procs.items()}

            r, imported = _cli("status", *flags)
            assert r.returncode == 0, r.stdout + r.stderr
            out = r.stdout
            assert "kafka: ok" in out and "s3: ok" in out and not imported & set(HEAVY)
            assert "tansu=up" in out and "weed=up" in out and "keeper=up" in out
            assert topic in out and "records=5" in out
            assert group in out and "lag=3" in out and "committed=p0:2" in out
            assert "weights" in out and "tansu " in out

            r, _ = _cli("down", *flags)
            assert r.returncode == 0, r.stderr
            assert "stopped: keeper, tansu, weed" in r.stdout
            assert not any(pid_alive(p) for p in pids.values())
            assert _processes_of(data_dir, ports) == []

        r, _ = _cli("down", *flags)
        assert r.returncode == 0 and "nothing running" in r.stdout
    finally:
        es.down()


def test_roundtrip(tmp_path):
    data_dir = tmp_path / "roundtrip"
    flags, ports = _stack_flags(data_dir)
    # a short session timeout: the embedded broker holds each JoinGroup reply for half of it
    config = tmp_path / "run.yaml"
    config.write_text("model: {path: unused}\nkafka: {session_timeout_ms: 2000, heartbeat_interval_ms: 500}\n")
    try:
        r, _ = _cli("roundtrip", *flags, "--config", str(config), timeout=240)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "roundtrip OK" in r.stdout
        assert "stack down: stopped keeper, tansu, weed" in r.stdout
        assert _processes_of(data_dir, ports) == []
    finally:
        EmbeddedStack(data_dir).down()
