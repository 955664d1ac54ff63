"""Seeing a run: metric loggers, the live dashboard, Prometheus endpoints (`streamrft.monitor`)."""
from __future__ import annotations

from typing import Literal

from pydantic import Field

from streamrft.config.base import Section

LOGGER_BACKENDS = ("tensorboard", "wandb", "mlflow")


class DashboardConfig(Section):
    """`streamrft dashboard`: one live page of a run, read from its topics (docs/dashboard.md)."""

    enabled: bool = True
    """`streamrft run` serves the dashboard too and prints its URL."""
    host: str = "127.0.0.1"
    """Where the page is served; 127.0.0.1 keeps it on this machine (it shows prompts and answers)."""
    port: int = Field(8050, ge=0, le=65535)
    """0 = a free port, taken at start (the printed URL names it): for tests and runs side by side."""


class PrometheusConfig(Section):
    """Each role's `/metrics` endpoint (prometheus-client; monitor/prometheus.py, docs/monitoring.md)."""

    enabled: bool = False
    host: str = "127.0.0.1"
    """Where the explorer, evaluator, stream ops and trainer serve `/metrics` (0.0.0.0 in containers); the gateway
    serves it on its own host and port."""
    port_base: int = Field(9400, ge=0, le=65535 - 64)
    """Trainer `port_base`, stream ops + 1, evaluator + 2, explorer i + 3 + i; 0: each takes a free port.
    A port in use falls back to a free one. Every role prints its port to its log."""


class MonitorConfig(Section):
    backends: list[Literal["tensorboard", "wandb", "mlflow"]] = Field(default_factory=lambda: ["tensorboard"])
    """Where every run mode (online, replay, offline, stages) logs its metrics, under the same names
    (docs/monitoring.md); wandb and mlflow need their extras (`pip install 'streamrft[wandb,mlflow]'`)."""
    project: str = "streamrft"
    """The W&B project / MLflow experiment."""
    mlflow_tracking_uri: str | None = None
    """None: `sqlite:///<output_dir>/mlflow.db` (MLflow 3 keeps its file store in maintenance mode)."""
    dashboard: DashboardConfig = Field(default_factory=DashboardConfig)
    prometheus: PrometheusConfig = Field(default_factory=PrometheusConfig)
