"""A role's /metrics: the latest Metric of each of its instances, counters as `_total`, over real HTTP
on a free port, read with prometheus_client's own text parser. (A running stream-ops worker is
scraped in tests/stream_ops/test_stream_ops_integration.py.)"""
from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from streamrft.config import PrometheusConfig
from streamrft.monitor.prometheus import role_metrics
from streamrft.schemas import Metric


def scrape(url: str) -> dict[str, tuple[str, dict[tuple, float]]]:
    """name -> (type, {sorted labels: value}) of every sample at `url`."""
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    return {f.name: (f.type, {tuple(sorted(s.labels.items())): s.value for s in f.samples})
            for f in text_string_to_metric_families(text)}


def test_the_latest_values_of_each_instance_are_served_with_their_kind():
    prom = role_metrics(PrometheusConfig(enabled=True, port_base=0), "explorer")
    try:
        prom.observe(Metric(role="explorer", role_id="explorer-0-1", step=1, values={"groups": 3, "traj_per_s": 2.5}))
        prom.observe(Metric(role="explorer", role_id="explorer-0-1", step=2, values={"groups": 5, "traj_per_s": 1.5}))
        prom.observe(Metric(role="eval", role_id="explorer-0-1", step=2, values={"eval_reward": 0.75}))
        prom.observe(Metric(role="gateway", role_id="gw-1:agents", values={"episodes_finished": 4, "open_episodes": 2}))
        got = scrape(f"http://127.0.0.1:{prom.port}/metrics")
    finally:
        prom.close()
    me = (("role_id", "explorer-0-1"),)
    assert got["streamrft_explorer_groups"] == ("counter", {me: 5.0})  # the text names its sample ..._total
    assert got["streamrft_explorer_traj_per_s"] == ("gauge", {me: 1.5})
    assert got["streamrft_eval_eval_reward"] == ("gauge", {me: 0.75})
    team = (("role_id", "gw-1"), ("team", "agents"))
    assert got["streamrft_gateway_episodes_finished"] == ("counter", {team: 4.0})
    assert got["streamrft_gateway_open_episodes"] == ("gauge", {team: 2.0})
