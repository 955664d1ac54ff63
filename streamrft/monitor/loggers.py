"""`MetricLogger`: every run mode's metrics, fanned out to `monitor.backends` under the same names.

Each mode hands it `Metric` messages, so one naming rule (`series`) serves all of them: `streamrft
run` passes every role's Metric from the metrics topic (launch/progress.py), a trainer started
alone (`train`, `replay`) its own, offline training (consumers/offline.py) and SFT stages
(launch/prepare.py) theirs. docs/monitoring.md lists the names. A new backend is one class with
`write(prefix, values, step)` and `close()`, added to `BACKENDS`; heavy clients are imported late.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

from streamrft.config import ConfigError, MonitorConfig, RunConfig
from streamrft.schemas import Metric

log = logging.getLogger(__name__)

EXTRA = {"wandb": "wandb", "mlflow": "mlflow"}
"""The pyproject extra that installs each optional backend."""
HINTS = {"wandb": " (`wandb login`, or WANDB_MODE=offline to keep the run in <output_dir>/wandb)",
         "mlflow": " (check monitor.mlflow_tracking_uri)"}


def prefix(m: Metric) -> str:
    """The series a Metric belongs to: `<role>`, or `<role>/<instance>` for roles that run several
    instances whose counters must not interleave: `explorer/<index>` (its id is
    `explorer-<index>-<pid>`), `gateway/<team>` (a team's counters), `stage/<index>`."""
    if m.role == "explorer" and m.role_id.count("-") >= 2:
        return f"explorer/{m.role_id.split('-')[1]}"
    if m.role == "gateway" and ":" in m.role_id:
        return f"gateway/{m.role_id.rsplit(':', 1)[1]}"
    if m.role == "stage":
        return f"stage/{m.role_id}"
    return m.role


def series(m: Metric) -> dict[str, float]:
    """`{"<prefix>/<name>": value}`: the names every backend logs a Metric under."""
    p = prefix(m)
    return {f"{p}/{k}": float(v) for k, v in m.values.items()}


def _require(backend: str, module: str):
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ConfigError(f"monitor.backends names {backend!r} but {module} is not installed ({e}): "
                          f"pip install 'streamrft[{EXTRA[backend]}]', or drop it from monitor.backends "
                          f"(allowed: tensorboard, wandb, mlflow)") from e


class TensorBoard:
    def __init__(self, output_dir: Path, run_name: str, params: dict):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(output_dir / "tensorboard"))

    def write(self, prefix: str, values: dict[str, float], step: int, walltime: float) -> None:
        for k, v in values.items():  # at the role's time, not when the launcher read the record
            self.writer.add_scalar(k, v, step, walltime=walltime)

    def close(self) -> None:
        self.writer.close()


class WandB:
    """A W&B run in `<output_dir>/wandb` (`WANDB_MODE=offline` keeps it there for `wandb sync`).
    W&B wants one growing step per run, while each role counts its own (the trainer its steps,
    explorers their weight version): each prefix gets its own step metric, `<prefix>/step`."""

    def __init__(self, output_dir: Path, run_name: str, params: dict, project: str):
        os.environ.setdefault("WANDB_SILENT", "true")  # no banner and sync hints in the roles' logs
        wandb = _require("wandb", "wandb")
        output_dir.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(project=project, name=run_name, dir=str(output_dir), config=params, reinit="create_new")
        self.defined: set[str] = set()

    def write(self, prefix: str, values: dict[str, float], step: int, walltime: float) -> None:
        if prefix not in self.defined:
            self.defined.add(prefix)
            self.run.define_metric(f"{prefix}/step", hidden=True)
            self.run.define_metric(f"{prefix}/*", step_metric=f"{prefix}/step")
        self.run.log({**values, f"{prefix}/step": step})

    def close(self) -> None:
        self.run.finish()


class MLflow:
    """An MLflow run in experiment `monitor.project`, at `monitor.mlflow_tracking_uri` (default a
    sqlite store, `<output_dir>/mlflow.db`: MLflow 3 keeps its file store in maintenance mode)."""

    def __init__(self, output_dir: Path, run_name: str, params: dict, project: str, uri: str | None):
        _require("mlflow", "mlflow")
        if uri is None:
            _require("mlflow", "sqlalchemy")  # mlflow-skinny's sqlite store needs it (and alembic)
            _require("mlflow", "alembic")
        from mlflow.tracking import MlflowClient

        output_dir.mkdir(parents=True, exist_ok=True)
        self.uri = uri or f"sqlite:///{output_dir / 'mlflow.db'}"
        self.client = MlflowClient(self.uri)
        exp = self.client.get_experiment_by_name(project)
        exp_id = exp.experiment_id if exp is not None else self.client.create_experiment(project)
        self.run_id = self.client.create_run(exp_id, run_name=run_name).info.run_id
        if params:
            from mlflow.entities import Param

            self.client.log_batch(self.run_id, params=[Param(k, str(v)[:6000]) for k, v in params.items()])

    def write(self, prefix: str, values: dict[str, float], step: int, walltime: float) -> None:
        from mlflow.entities import Metric as MlflowMetric

        at = int(walltime * 1000)
        self.client.log_batch(self.run_id, metrics=[MlflowMetric(k, v, at, step) for k, v in values.items()])

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


class MetricLogger:
    """Fans Metrics out to `monitor.backends`; a backend that fails to write is logged and dropped
    (a logging service going away must not end a training run), one that fails to start raises."""

    def __init__(self, monitor: MonitorConfig, output_dir: str | Path, run_name: str, params: dict | None = None):
        out, params = Path(output_dir), params or {}
        makers = {"tensorboard": lambda: TensorBoard(out, run_name, params),
                  "wandb": lambda: WandB(out, run_name, params, monitor.project),
                  "mlflow": lambda: MLflow(out, run_name, params, monitor.project, monitor.mlflow_tracking_uri)}
        self.backends: dict[str, object] = {}
        try:
            for name in dict.fromkeys(monitor.backends):  # a name listed twice logs once
                try:
                    self.backends[name] = makers[name]()
                except ConfigError:
                    raise
                except Exception as e:  # e.g. W&B online with no API key, an MLflow server that is down
                    raise ConfigError(f"monitor.backends: {name} could not start a run: {type(e).__name__}: {e}"
                                      + HINTS.get(name, "")) from e
        except BaseException:
            self.close()
            raise
        if self.backends:
            log.info("logging metrics to %s under %s", ", ".join(self.backends), out)

    @classmethod
    def for_run(cls, cfg: RunConfig, run_name: str | None = None) -> "MetricLogger":
        """The logger of `cfg`'s run, in its output_dir, with a few settings as the run's params."""
        params = {"namespace": cfg.namespace, "model": cfg.model.name, "algorithm": cfg.algorithm.type,
                  "max_steps": cfg.trainer.max_steps, "lr": cfg.trainer.lr}
        return cls(cfg.monitor, cfg.output_dir, run_name or cfg.namespace, params)

    def log(self, m: Metric) -> None:
        if not self.backends:
            return
        p, values = prefix(m), series(m)
        for name, backend in list(self.backends.items()):
            try:
                backend.write(p, values, m.step, m.created_at)
            except Exception as e:  # noqa: BLE001 - any client's failure: stop using that backend
                log.warning("metric backend %s failed (%s): no more metrics to it", name, e)
                self.backends.pop(name)

    def close(self) -> None:
        for name, backend in list(self.backends.items()):
            try:
                backend.close()
            except Exception as e:  # noqa: BLE001 - closing the others matters more
                log.warning("closing metric backend %s failed: %s", name, e)
        self.backends = {}
