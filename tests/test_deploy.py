"""docker-compose.yml and the Dockerfile, checked without Docker: the services exist, every role's
command parses with the real CLI and points at a config that loads with its overrides."""
from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from streamrft.cli import build_parser
from streamrft.config import load_config

ROOT = Path(__file__).resolve().parents[1]
ROLES = {"explorer": "explore", "stream-ops": "score", "trainer": "train"}


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def _host_path(service: dict, container_path: str) -> Path:
    """Map a path inside the container to the repo through the service's bind mounts."""
    for volume in service.get("volumes", []):
        src, _, rest = volume.partition(":")
        dst = rest.split(":")[0]
        if src.startswith(".") and (container_path == dst or container_path.startswith(dst + "/")):
            return ROOT / src / container_path[len(dst):].lstrip("/")
    raise AssertionError(f"{container_path} is not on a bind mount of the repo")


def test_services(compose):
    services = compose["services"]
    assert {"kafka", "minio", "minio-init", "explorer", "stream-ops", "trainer"} <= set(services)
    assert services["kafka"]["image"].startswith("apache/kafka:")
    assert services["kafka"]["environment"]["KAFKA_PROCESS_ROLES"] == "broker,controller"  # KRaft, no ZooKeeper
    assert "PLAINTEXT://kafka:9092" in services["kafka"]["environment"]["KAFKA_ADVERTISED_LISTENERS"]
    assert services["minio"]["image"].startswith("minio/minio")
    assert services["minio-init"]["image"].startswith("minio/mc")
    assert "local/weights" in " ".join(services["minio-init"]["command"])
    for name, service in services.items():
        for dep in service.get("depends_on", {}):
            assert dep in services, f"{name} depends on unknown service {dep}"
        for cfg in service.get("configs", []):
            assert cfg["source"] in compose.get("configs", {})
        for volume in service.get("volumes", []):
            src = volume.split(":")[0]
            assert src.startswith(".") or src in compose.get("volumes", {}), f"{name}: volume {src} not declared"


@pytest.mark.parametrize("role,command", sorted(ROLES.items()))
def test_role_command_runs_a_config_that_loads(compose, role, command):
    service = compose["services"][role]
    assert service["build"] == "."
    cmd = service["command"]
    assert cmd[:2] == ["streamrft", command]
    args = build_parser().parse_args(cmd[1:])  # the real CLI accepts it as written
    assert args.command == command
    cfg = load_config(_host_path(service, args.config), args.overrides)
    # only configuration differs from the embedded default: external broker and object store
    assert cfg.stack.embedded is False
    assert cfg.kafka.bootstrap == "kafka:9092"
    assert cfg.s3.endpoint == "minio:9000" and cfg.s3.bucket == "weights"
    minio_env = compose["services"]["minio"]["environment"]
    assert (cfg.s3.access_key, cfg.s3.secret_key) == (minio_env["MINIO_ROOT_USER"], minio_env["MINIO_ROOT_PASSWORD"])


def test_deploy_config_loads_alone():
    cfg = load_config(ROOT / "deploy" / "run.yaml")
    assert cfg.stack.embedded is False and cfg.kafka.bootstrap == "kafka:9092"


def test_dockerfile():
    lines = [line.strip() for line in (ROOT / "Dockerfile").read_text().splitlines()
             if line.strip() and not line.lstrip().startswith("#")]
    assert lines[0] == "FROM python:3.11-slim"
    runs = " ".join(line for line in lines if line.startswith("RUN"))
    assert "torch==2.13.0" in runs and "pip install ." in runs
    assert runs.index("torch==2.13.0") < runs.index("pip install .")  # CPU torch before the package
    copied = [shlex.split(line)[1:-1] for line in lines if line.startswith("COPY")]
    for sources in copied:
        for src in sources:
            assert (ROOT / src).exists(), f"COPY {src}: missing from the repo"


@pytest.mark.skipif(shutil.which("docker") is None, reason="no docker CLI")
def test_docker_compose_config():
    probe = subprocess.run(["docker", "compose", "version"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip("docker CLI has no compose plugin")
    r = subprocess.run(["docker", "compose", "config", "-q"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
