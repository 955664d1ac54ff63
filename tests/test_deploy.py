"""docker-compose.yml and the Dockerfile, checked without Docker: the services exist, every role's
command parses with the real CLI and points at a config that loads with its overrides; roles that
finish stay finished, there is one explorer service per configured explorer, and the run's topics
exist before any role starts (`streamrft topics`, tested here on the real embedded broker)."""
from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from streamrft.cli import build_parser
from streamrft.config import load_config
from streamrft.infra.kafka import make_admin

ROOT = Path(__file__).resolve().parents[1]
ROLE_COMMANDS = ("explore", "score", "train")
ONE_SHOTS = ("kafka-users", "minio-init", "prepare", "topics")


def _read_compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


@pytest.fixture(scope="module")
def compose() -> dict:
    return _read_compose()


def _roles(compose: dict) -> dict[str, str]:
    """service name -> its streamrft role command, for every long-running role service."""
    return {name: svc["command"][1] for name, svc in compose["services"].items()
            if svc.get("command", [None])[0] == "streamrft" and svc["command"][1] in ROLE_COMMANDS}


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
    assert {"kafka", "minio", "minio-init", "prepare", "topics", "explorer-0", "stream-ops", "trainer"} <= set(services)
    assert sorted(set(_roles(compose).values())) == sorted(ROLE_COMMANDS)
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


def _service_config(service: dict):
    """The parsed CLI arguments of a streamrft service and the config they load."""
    args = build_parser().parse_args(service["command"][1:])  # the real CLI accepts it as written
    return args, load_config(_host_path(service, args.config), args.overrides)


@pytest.mark.parametrize("role", [*sorted(_roles(_read_compose())), "topics"])
def test_role_command_runs_a_config_that_loads(compose, role):
    service = compose["services"][role]
    assert service["build"] == "."
    command = _roles(compose).get(role, "topics")
    assert service["command"][:2] == ["streamrft", command]
    args, cfg = _service_config(service)
    assert args.command == command
    # only configuration differs from the embedded default: external broker and object store
    assert cfg.stack.embedded is False
    assert cfg.kafka.bootstrap == "kafka:9092"
    assert cfg.s3.endpoint == "minio:9000" and cfg.s3.bucket == "weights"
    minio_env = compose["services"]["minio"]["environment"]
    assert (cfg.s3.access_key, cfg.s3.secret_key) == (minio_env["MINIO_ROOT_USER"], minio_env["MINIO_ROOT_PASSWORD"])


def test_roles_that_finish_stay_finished(compose):
    """`unless-stopped` restarted the trainer forever after max_steps: a role that exits 0 stays down,
    one that fails comes back; a one-shot runs once."""
    services = compose["services"]
    for name in _roles(compose):
        assert services[name]["restart"] == "on-failure", name
    for name in ONE_SHOTS:
        assert services[name].get("restart", "no") == "no", name


def test_one_explorer_service_per_configured_explorer(compose):
    """Compose once ran one explorer while the config said two: it took half of the tasks and quota."""
    services = compose["services"]
    explorers = [name for name, command in _roles(compose).items() if command == "explore"]
    indexes = []
    for name in explorers:
        args, cfg = _service_config(services[name])
        assert name == f"explorer-{args.index}", "name each explorer service by its index"
        assert cfg.explorer.num_explorers == len(explorers), (
            f"{name}: explorer.num_explorers={cfg.explorer.num_explorers} but compose runs {len(explorers)}")
        indexes.append(args.index)
    assert sorted(indexes) == list(range(len(explorers)))
    assert load_config(ROOT / "deploy" / "run.yaml").explorer.num_explorers == len(explorers)


def test_topics_exist_before_any_role_starts(compose):
    """Auto-creation is off: a one-shot `streamrft topics` creates them once kafka is healthy, with
    the same config (namespace, team, partitions) the roles use, and every role waits for it."""
    services = compose["services"]
    assert services["kafka"]["environment"]["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"
    topics = services["topics"]
    assert topics["depends_on"]["kafka"] == {"condition": "service_healthy"}
    _, topics_cfg = _service_config(topics)
    for name in _roles(compose):
        assert services[name]["depends_on"]["topics"] == {"condition": "service_completed_successfully"}, name
        assert services[name]["depends_on"]["prepare"] == {"condition": "service_completed_successfully"}, name
        _, cfg = _service_config(services[name])
        assert (cfg.namespace, cfg.explorer.team, cfg.kafka) == (topics_cfg.namespace, topics_cfg.explorer.team,
                                                                 topics_cfg.kafka), name


def test_streamrft_topics_creates_the_run_topics_idempotently(stack, namespace, tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({
        "namespace": namespace, "model": {"path": "unused"}, "stack": {"embedded": False},
        "kafka": {"bootstrap": stack.kafka.bootstrap, "partitions": 3}, "explorer": {"team": "blue"}}))
    expected = {f"{namespace}.{t}": p for t, p in [("tasks", 3), ("experiences", 3), ("weights", 1),
                                                     ("metrics", 1), ("dlq", 1), ("admission", 1),
                                                     ("rollouts.blue", 3)]}
    code = ("import sys; from streamrft.cli import main; rc = main(sys.argv[1:]); "
            "assert 'torch' not in sys.modules, 'streamrft topics imported torch'; sys.exit(rc)")
    outputs = []
    for _ in range(2):  # the second run finds them all and changes nothing
        r = subprocess.run([sys.executable, "-c", code, "topics", str(config), "kafka.partitions=3"], cwd=ROOT,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        outputs.append({line.split()[1]: line.split()[0] for line in r.stdout.splitlines()})
    assert outputs[0] == {name: "created" for name in expected}
    assert outputs[1] == {name: "exists" for name in expected}
    listed = make_admin(stack.kafka).list_topics(timeout=30).topics
    assert {name: len(listed[name].partitions) for name in expected if name in listed} == expected


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
