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
    """Each role's `/metrics` endpoint (prometheus-client)."""

    enabled: bool = False
    host: str = "127.0.0.1"
    port_base: int = Field(9400, ge=0, le=65535 - 64)
    """Roles take ports from here up, in the order they start (the port is logged and on the metrics
    topic); 0: each role a free port."""


class MonitorConfig(Section):
    backends: list[Literal["tensorboard", "wandb", "mlflow"]] = Field(default_factory=lambda: ["tensorboard"])
    """Where every run mode (online, replay, offline, stages) logs its metrics, under the same names."""
    project: str = "streamrft"
    """The W&B project / MLflow experiment."""
    mlflow_tracking_uri: str | None = None
    """None: `<output_dir>/mlflow` (a file store)."""
    dashboard: DashboardConfig = Field(default_factory=DashboardConfig)
    prometheus: PrometheusConfig = Field(default_factory=PrometheusConfig)
