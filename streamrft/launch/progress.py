"""The live view of a run: reads the metrics topic, keeps the latest figures, hands every Metric to the
run's `MetricLogger` (monitor/loggers.py: TensorBoard, W&B, MLflow)."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from confluent_kafka import TopicPartition

from streamrft.config import KafkaConfig
from streamrft.engine.algorithms.offpolicy import LENGTH_BUCKETS
from streamrft.infra.kafka import make_consumer
from streamrft.schemas import DecodeError, Metric, decode, topic_name

log = logging.getLogger(__name__)


def stale_pct(trained: int, stale: int) -> float:
    """Of the trajectories the trainer took (duplicates aside), the percentage dropped as too stale:
    generated in vain."""
    return 100.0 * stale / (trained + stale) if trained + stale else 0.0


def off_policy_part(t: dict[str, float]) -> str:
    """The profile's off-policy figures from the trainer's last step (`engine/algorithms/offpolicy.py`):
    its staleness mix, the importance weight (mean, max, effective sample size), the clipped shares
    of positive- and negative-advantage tokens and of first turns, the groups dropped stale (run
    total; a group is dropped whole), and for multi-turn batches their episodes by length (model
    turns 1/2/3+) with each length's mean staleness; with `trainer.max_update_kl`, the step's KL as
    taken and the scale kept."""
    pct = lambda k: f"{100 * t[k]:.0f}%" if k in t else "-"  # noqa: E731
    return (f"off-policy stale 0/1/2+ {pct('staleness_0')}/{pct('staleness_1')}/{pct('staleness_2p')} "
            f"iw {t['iw_mean']:.2f} max {t.get('iw_max', float('nan')):.1f} ess {t.get('iw_ess', float('nan')):.2f} "
            f"clip +{pct('clip_frac_pos')} -{pct('clip_frac_neg')} turn0 {pct('clip_frac_turn0')} "
            f"neg>c {pct('neg_iw_over_c')} groups dropped stale {int(t.get('count_stale_groups', 0))}"
            + (f" turns 1/2/3+ {'/'.join(pct(k) for k in LENGTH_BUCKETS)} stale "
               + "/".join(f"{t[f'staleness_{k}']:.1f}" if f"staleness_{k}" in t else "-" for k in LENGTH_BUCKETS)
               if t.get("turns_1", 1.0) < 1.0 else "")
            + (f" step kl {t['update_kl']:.3f} x{t.get('update_scale', 1.0):.2f}" if "update_kl" in t else ""))


@dataclass
class RunView:
    t0: float = field(default_factory=time.time)  # wall clock; metrics are placed by their created_at
    trainer: dict[str, float] = field(default_factory=dict)
    explorers: dict[str, dict[str, float]] = field(default_factory=dict)
    stream_ops: dict[str, dict[str, float]] = field(default_factory=dict)
    evals: list[tuple[float, int, float]] = field(default_factory=list)  # (wall_s, version, reward)
    train_rewards: list[tuple[float, int, float]] = field(default_factory=list)
    lag: dict[str, int] = field(default_factory=dict)  # role -> records behind its committed offsets
    gateway: dict[str, dict[str, float]] = field(default_factory=dict)  # "<gateway id>:<team>" -> its counters
    feedback: dict[str, float] = field(default_factory=dict)  # the feedback join's last counters

    @property
    def trajectories(self) -> int:
        """Published by explorers and through the gateway."""
        return int(sum(e.get("trajectories", 0) for e in self.explorers.values())
                   + sum(g.get("trajectories", 0) for g in self.gateway.values()))

    def line(self) -> str:
        t = self.trainer
        rate = sum(e.get("traj_per_s", 0) for e in self.explorers.values())
        ev = f"{self.evals[-1][2]:.3f}@v{self.evals[-1][1]}" if self.evals else "-"
        gw = ""
        if self.gateway:
            total = lambda k: int(sum(g.get(k, 0) for g in self.gateway.values()))  # noqa: E731
            gw = (f"  gateway: episodes {total('episodes_finished')} open {total('open_episodes')} "
                  f"expired {total('episodes_expired')} 429 {total('rejected_admission') + total('rejected_stale')}")
        f = self.feedback
        if f:
            gw += (f"  feedback: parked {int(f.get('parked', 0))} (oldest {f.get('parked_age_max_s', 0):.0f}s) "
                   f"joined {int(f.get('joined', 0))} timed out {int(f.get('timed_out', 0))}")
        return (f"[{time.time() - self.t0:6.0f}s] step {int(t.get('step', 0)):4d}  version {int(t.get('version', 0)):4d}  "
                f"eval {ev:>11}  train_reward {t.get('reward_mean', float('nan')):.3f}  "
                f"staleness {t.get('staleness_mean', float('nan')):.2f} (stale {self._stale_pct():.0f}%)  lag {self._lag()}  "
                f"trajectories {self.trajectories} ({rate:.1f}/s){gw}")

    def profile(self) -> str:
        """Where the roles' time goes: the explorers' stages as shares of their wall time (summed over
        explorers), stream ops' record latency in -> out, the trainer's wait and step per version."""
        parts = []
        wall = sum(e.get("wall_s", 0.0) for e in self.explorers.values())
        if wall > 0:
            from streamrft.producers.explorer import STAGES

            shares = {k.removesuffix("_s"): sum(e.get(k, 0.0) for e in self.explorers.values()) / wall
                      for k in (*STAGES, "fetch_s")}
            parts.append("explorers " + " ".join(f"{k} {100 * v:.0f}%" for k, v in shares.items() if v >= 0.005))
        lat = [w["latency_p50_s"] for w in self.stream_ops.values() if "latency_p50_s" in w]
        if lat:
            parts.append(f"stream ops in->out p50 {max(lat):.2f}s")
        t = self.trainer
        if "wait_s" in t:
            parts.append(f"trainer wait {t['wait_s']:.2f}s step {t.get('step_s', float('nan')):.2f}s"
                         + (f" loop latency {t['loop_latency_s']:.1f}s" if "loop_latency_s" in t else ""))
        if "iw_mean" in t:
            parts.append(off_policy_part(t))
        return "profile: " + (" | ".join(parts) if parts else "-")

    def _stale_pct(self) -> float:
        return stale_pct(int(self.trainer.get("count_trained", 0)), int(self.trainer.get("count_stale", 0)))

    def _lag(self) -> str:
        if not self.lag:
            return "-"
        return "/".join(str(self.lag.get(role, "-")) for role in ("stream-ops", "trainer")) + " (score/train)"


class MetricsFollower:
    def __init__(self, kafka: KafkaConfig, namespace: str, logger=None):
        """`logger`: a `monitor.loggers.MetricLogger` that every Metric read is logged to (the
        caller closes it)."""
        self.kafka, self.namespace = kafka, namespace
        self.consumer = make_consumer(kafka, None)
        self.consumer.assign([TopicPartition(topic_name(namespace, "metrics"), 0, 0)])
        self.view = RunView()
        self.logger = logger

    def poll(self, timeout: float = 0.2) -> RunView:
        for msg in self.consumer.consume(1000, timeout=timeout):
            if msg.error() is not None:
                continue
            try:
                m = decode(msg.value(), Metric)
            except DecodeError:
                continue
            now = m.created_at - self.view.t0
            if m.role == "trainer":
                self.view.trainer = {**m.values, "step": m.step}
                self.view.train_rewards.append((now, m.step, m.values.get("reward_mean", 0.0)))
            elif m.role == "eval":
                self.view.evals.append((now, int(m.values["version"]), m.values["eval_reward"]))
            elif m.role == "explorer":
                self.view.explorers[m.role_id] = m.values
            elif m.role == "feedback_join":
                self.view.feedback = m.values
            elif m.role == "gateway":
                if ":" in m.role_id:  # a team's counters (the gateway's own figures have no team)
                    self.view.gateway[m.role_id] = m.values
            else:
                self.view.stream_ops[m.role_id] = m.values
            if self.logger is not None:
                self.logger.log(m)
        return self.view

    def start_lag_thread(self, every_s: float = 15.0) -> None:
        """Measure lag in the background: reading to the true end offsets can take seconds."""
        import threading

        self._stop = threading.Event()

        def loop() -> None:
            while not self._stop.wait(every_s):
                try:
                    self.measure_lag()
                except Exception as e:  # a broker hiccup must not end the progress view
                    log.warning("lag measurement failed: %s", e)

        threading.Thread(target=loop, name="lag", daemon=True).start()

    def measure_lag(self) -> None:
        """Committed-offset lag of the stream-ops and trainer groups (true end offsets)."""
        from streamrft.infra.status import group_lags, topic_ends

        # only the topics those two groups read: reading a busy topic to its true end takes long
        topics = {**topic_ends(self.kafka, self.namespace + ".rollouts."),
                  **topic_ends(self.kafka, self.namespace + ".experiences")}
        lag: dict[str, int] = {}
        for g in group_lags(self.kafka, topics):
            role = g.group.removeprefix(self.namespace + ".")
            if role in ("stream-ops", "trainer"):  # stream ops read one topic per team: sum them
                lag[role] = lag.get(role, 0) + g.total_lag
        self.view.lag = lag

    def close(self) -> None:
        if hasattr(self, "_stop"):
            self._stop.set()
        self.consumer.close()
