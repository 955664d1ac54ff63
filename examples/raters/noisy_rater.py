"""A simulated human rater for `examples/feedback_cpu.yaml`: it rates the run's parked answers
through the public feedback API, late and sometimes wrong.

    .venv/bin/python examples/raters/noisy_rater.py examples/feedback_cpu.yaml \\
        --url http://127.0.0.1:8010/v1 [--median-s 20] [--p99-s 120] [--wrong 0.1] [--minutes 20]

It follows the run's `<ns>.parked` topic (the groups waiting for ratings; what a labelling page
would list), decides each trajectory's rating as a careful person would (the reverse task's rule:
the share of characters in place), gives 10 % of them wrong (1 - the right value), and sends each
one after a lognormal delay (median 20 s, 99th percentile 120 s) with `POST /v1/feedback`, under
the key of its team (`STREAMRFT_RATERS_KEY`). Its team's ratings count for the explorers' groups
because the feedback term lists it in `teams`. It never touches the reward the run computes.
"""
from __future__ import annotations

import argparse
import heapq
import json
import math
import os
import random
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def right_rating(response: str, answer: str) -> float:
    """What a careful rater gives: 1 for the exact reverse, else the share of characters in place."""
    response, answer = response.strip(), answer.strip()
    if response == answer:
        return 1.0
    longest = max(len(response), len(answer)) or 1
    return sum(a == b for a, b in zip(response, answer)) / longest


def post(url: str, key: str, ratings: list[dict]) -> None:
    body = json.dumps({"feedback": ratings}).encode()
    req = urllib.request.Request(f"{url}/feedback", body, {"Content-Type": "application/json",
                                                            "Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        if r.status != 200:
            raise RuntimeError(f"POST /v1/feedback answered {r.status}: {r.read()[:300]!r}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config")
    ap.add_argument("--url", default="http://127.0.0.1:8010/v1")
    ap.add_argument("--key-env", default="STREAMRFT_RATERS_KEY")
    ap.add_argument("--median-s", type=float, default=20.0)
    ap.add_argument("--p99-s", type=float, default=120.0)
    ap.add_argument("--wrong", type=float, default=0.1, help="share of ratings given wrong (1 - the right value)")
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()

    from confluent_kafka import OFFSET_BEGINNING, TopicPartition

    from streamrft.config import load_config
    from streamrft.infra.kafka import make_consumer
    from streamrft.infra.stack import resolve_clients
    from streamrft.schemas import ParkedGroup, decode, topic_name

    cfg = load_config(a.config)
    kafka, _ = resolve_clients(cfg.stack, cfg.kafka, cfg.s3)
    key = os.environ.get(a.key_env, "")
    rng = random.Random(a.seed)
    sigma = math.log(a.p99_s / a.median_s) / 2.3263  # the 99th percentile of a standard normal
    topic = topic_name(cfg.namespace, "parked")
    consumer = make_consumer(kafka, None)
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(kafka.partitions)])
    due: list[tuple[float, int, dict]] = []  # (when, tie-break, rating)
    seen: set[str] = set()
    counts = {"seen": 0, "sent": 0, "wrong": 0}
    end = time.monotonic() + a.minutes * 60
    n = 0
    try:
        while time.monotonic() < end:
            for m in consumer.consume(500, timeout=0.2):
                if m.error() is not None or m.value() is None:
                    continue  # a tombstone: that group was settled
                group = decode(m.value(), ParkedGroup).group
                if group.group_id in seen:
                    continue
                seen.add(group.group_id)
                for t in group.trajectories:
                    value = right_rating(t.response_text, group.task.answer or "")
                    if rng.random() < a.wrong:
                        value, counts["wrong"] = 1.0 - value, counts["wrong"] + 1
                    rating = {"target": "trajectory", "target_id": t.traj_id, "reward": value, "source": "human",
                              "rater": f"rater-{a.seed}"}
                    n += 1
                    heapq.heappush(due, (time.monotonic() + a.median_s * math.exp(sigma * rng.gauss(0, 1)), n, rating))
                    counts["seen"] += 1
            batch = []
            while due and due[0][0] <= time.monotonic():
                batch.append(heapq.heappop(due)[2])
            if batch:
                post(a.url, key, batch)
                counts["sent"] += len(batch)
            if n and counts["sent"] and counts["sent"] % 200 < len(batch):
                print(f"rater: {counts}", flush=True)
    except KeyboardInterrupt:
        pass
    finally:
        consumer.close()
    print(f"rater: {counts}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
