"""Each role's Prometheus `/metrics` (prometheus-client), with `monitor.prometheus.enabled`.

A role hands every Metric it puts on the metrics topic to its `RoleMetrics` (`observe`); a scrape
shows the latest values of each, named `streamrft_<role>_<name>` with a `role_id` label (a
gateway's team counters carry `team` too). Cumulative counts and busy seconds are counters
(`_total`), the rest gauges (`COUNTERS`). The explorer, stream ops and trainer serve it on
`host:port_base + SLOTS[role]` (explorer i: + i; the evaluator too), or a free port when port_base is 0 or that one
is taken, and log the port; the gateway adds the route to its own FastAPI app (`route`).
"""
from __future__ import annotations

import logging
import re
import threading

from streamrft.config import PrometheusConfig
from streamrft.schemas import Metric

log = logging.getLogger(__name__)

SLOTS = {"trainer": 0, "stream_ops": 1, "evaluator": 2, "explorer": 3}
"""Port offsets from `monitor.prometheus.port_base`; explorer i takes `3 + i`. (The evaluator's Metrics
are of role `eval`.)"""

COUNTERS = {
    "trainer": lambda k: k.startswith("count_"),
    "explorer": lambda k: k in {"groups", "trajectories", "swaps", "admission_waits", "slot_waits", "wall_s", "fetch_s",
                                "generate_s", "publish_s", "reserve_s", "admission_wait_s", "slot_wait_s",
                                "task_wait_s", "load_s", "eval_s", "env_s", "reserve_busy_s", "publish_busy_s",
                                "env_errors", "env_timeouts", "groups_dropped_env", "generate_calls"},
    "stream_ops": lambda k: k in {"scored", "filtered", "dead_lettered", "score_s"},
    "eval": lambda k: k in {"evals", "load_s", "eval_s", "fetch_s"},  # the evaluator's; explorers' evals lack them
    "gateway": lambda k: k not in {"open_groups", "open_episodes", "version"},
}
"""Which of a role's values only grow (counts since the role started, busy seconds)."""


def metric_name(role: str, key: str) -> str:
    return "streamrft_" + re.sub(r"[^a-zA-Z0-9_]", "_", f"{role}_{key}")


class RoleMetrics:
    """The latest Metric of each (role, role_id) this process reported, as a prometheus-client collector."""

    def __init__(self):
        self._latest: dict[tuple[str, str], Metric] = {}
        self._lock = threading.Lock()
        self.server = None
        self.port: int | None = None

    def observe(self, m: Metric) -> None:
        with self._lock:
            self._latest[(m.role, m.role_id)] = m

    def describe(self) -> list:
        return []  # no families known before the first Metric: registering must not call collect()

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        with self._lock:
            latest = list(self._latest.values())
        families: dict[str, object] = {}
        for m in latest:
            role_id, _, team = m.role_id.partition(":")  # a gateway's team counters: "<gateway id>:<team>"
            labels = {"role_id": role_id, **({"team": team} if m.role == "gateway" else {})}
            for key, value in m.values.items():
                name = metric_name(m.role, key)
                fam = families.get(name)
                if fam is None:
                    counter = COUNTERS.get(m.role, lambda k: False)(key)
                    kind = CounterMetricFamily if counter else GaugeMetricFamily
                    fam = families[name] = kind(name, f"{m.role} {key} (docs/monitoring.md)", labels=list(labels))
                fam.add_metric(list(labels.values()), value)
        yield from families.values()

    def registry(self):
        from prometheus_client import CollectorRegistry

        registry = CollectorRegistry(auto_describe=False)
        registry.register(self)
        return registry

    def serve(self, cfg: PrometheusConfig, port: int) -> int:
        """Serve `/metrics` on `cfg.host:port` (0, or a port in use: a free one); returns the port."""
        from prometheus_client import start_http_server

        try:
            self.server, _ = start_http_server(port, cfg.host, registry=self.registry())
        except OSError as e:
            if port == 0:
                raise
            log.warning("prometheus port %d is taken (%s): serving /metrics on a free port instead", port, e)
            self.server, _ = start_http_server(0, cfg.host, registry=self.registry())
        self.port = self.server.server_port
        return self.port

    def route(self, app) -> None:
        """`GET /metrics` on a FastAPI app (the gateway's)."""
        from fastapi import Response
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        registry = self.registry()
        app.add_api_route("/metrics", lambda: Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST),
                          methods=["GET"], include_in_schema=False)

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None


def role_metrics(cfg: PrometheusConfig, role: str, index: int = 0) -> RoleMetrics:
    """A role's `RoleMetrics`, serving `/metrics` if `cfg.enabled` (the port is printed to its log)."""
    metrics = RoleMetrics()
    if cfg.enabled:
        port = metrics.serve(cfg, cfg.port_base + SLOTS[role] + index if cfg.port_base else 0)
        print(f"prometheus: {role} metrics on http://{cfg.host}:{port}/metrics", flush=True)
    return metrics
