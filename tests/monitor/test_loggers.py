"""MetricLogger: one naming rule for every Metric, and what each backend logged, read back from
its own store: TensorBoard's event files, W&B's offline run file, MLflow's sqlite store."""
from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import pytest

from streamrft.config import ConfigError, MonitorConfig
from streamrft.monitor.loggers import MetricLogger, series
from streamrft.schemas import Metric
from tests_helpers import read_tensorboard


def test_each_role_and_instance_has_its_own_series():
    assert series(Metric(role="trainer", role_id="trainer-77", step=3, values={"loss": 0.5})) == {"trainer/loss": 0.5}
    assert series(Metric(role="explorer", role_id="explorer-2-4411", values={"groups": 8})) == {"explorer/2/groups": 8.0}
    assert series(Metric(role="gateway", role_id="gateway-9-ab12cd34:agents", values={"episodes_finished": 3})) \
        == {"gateway/agents/episodes_finished": 3.0}
    assert series(Metric(role="gateway", role_id="gateway-9-ab12cd34", values={"unauthorized": 1})) \
        == {"gateway/unauthorized": 1.0}
    assert series(Metric(role="stage", role_id="0", values={"loss": 2.0})) == {"stage/0/loss": 2.0}
    assert series(Metric(role="stream_ops", role_id="host-12", values={"scored": 6})) == {"stream_ops/scored": 6.0}


def wandb_history(run_file: Path) -> list[dict]:
    """The history rows of a W&B run file (`run-<id>.wandb`: a LevelDB-style log of protobuf records,
    32 KiB blocks, each chunk framed by crc32, length and type: full, first, middle, last)."""
    from wandb.proto import wandb_internal_pb2

    data = run_file.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, buf, rows = 7, 32768, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _crc, n, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk, pos = data[pos + 7:pos + 7 + n], pos + 7 + n
        buf = chunk if kind in (1, 2) else buf + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(buf)
            if record.WhichOneof("record_type") == "history":
                rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item})
    return rows


def test_every_backend_logs_the_same_series(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("WANDB_MODE", "offline")
    logger = MetricLogger(MonitorConfig(backends=["tensorboard", "wandb", "mlflow"], project="monitor-test"),
                          tmp_path, "run-a", {"lr": 0.003})
    # the trainer counts steps, explorers weight versions: both start again at their own 0/1
    # each point at the time its role made it (created_at), not when the launcher read it
    for step in (1, 2, 3):
        logger.log(Metric(role="trainer", role_id="trainer-1", step=step, values={"loss": 1.0 / step},
                          created_at=1.7e9 + step / 4))
        logger.log(Metric(role="explorer", role_id="explorer-0-99", step=step - 1, values={"groups": 4.0 * step}))
    logger.close()
    want = {"trainer/loss": [(1, 1.0), (2, 0.5), (3, pytest.approx(1 / 3))],
            "explorer/0/groups": [(0, 4.0), (1, 8.0), (2, 12.0)]}

    tb = read_tensorboard(tmp_path / "tensorboard")
    assert {k: tb[k] for k in want} == want

    run_file = next((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    rows = wandb_history(run_file)
    got = {name: [(int(r[f"{name.rsplit('/', 1)[0]}/step"]), r[name]) for r in rows if name in r] for name in want}
    assert got == want

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.get_experiment_by_name("monitor-test")
    (run,) = client.search_runs([exp.experiment_id])
    assert run.info.run_name == "run-a" and run.data.params == {"lr": "0.003"} and run.info.status == "FINISHED"
    for name, points in want.items():
        history = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, name))
        assert history == points
    assert sorted(m.timestamp for m in client.get_metric_history(run.info.run_id, "trainer/loss")) == [
        1_700_000_000_250, 1_700_000_000_500, 1_700_000_000_750]

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    assert [e.wall_time for e in acc.Scalars("trainer/loss")] == [1.7e9 + 0.25, 1.7e9 + 0.5, 1.7e9 + 0.75]


def test_a_backend_that_is_not_installed_is_a_config_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` now raises ImportError
    with pytest.raises(ConfigError, match=r"monitor.backends names 'wandb' but wandb is not installed.*"
                                          r"pip install 'streamrft\[wandb\]'"):
        MetricLogger(MonitorConfig(backends=["tensorboard", "wandb"]), tmp_path, "run-b")
