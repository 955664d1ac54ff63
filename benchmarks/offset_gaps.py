"""Records a live consumer skips on the embedded broker, plain vs behind `OffsetGaps`
(`kafka.gap_wait_s`), under two faults side by side in one run.

    .venv/bin/python benchmarks/offset_gaps.py [--seed 3] [--seconds 20] [--kills 6] [--gap-wait-s 10]

On a private embedded stack, 4 producers write batches of 1-4 records to one partition, and two
consumers read it live, side by side: plain librdkafka (fetch wait 500 ms, its default), and the
same behind `infra.offset_gaps.take_contiguous`. Afterwards the topic is read back whole. Faults:
- slow S3 writes: Tansu writes to SeaweedFS through `infra.chaos.DelayingS3Proxy`, which holds
  half the PUTs back up to 0.2 s (a loaded S3 server), for `--seconds`;
- kills: Tansu or SeaweedFS killed -9 and restarted, `--kills` times (more until a hole is met).
Prints, for each consumer, the records on the topic it never delivered; the holes the guard met,
how many filled (records the broker listed late) and after how long, how many it took as empty;
and the offsets no record fills.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from streamrft.config import KafkaConfig
from streamrft.infra.chaos import read_through_server_kills
from streamrft.infra.stack import EmbeddedStack, free_ports


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--kills", type=int, default=6)
    ap.add_argument("--gap-wait-s", type=float, default=10.0)
    args = ap.parse_args()
    faults = {"slow S3 writes": dict(slow_puts_s=0.2, duration_s=args.seconds),
              "kills": dict(min_kills=args.kills)}
    print(f"{'fault':<16}{'on topic':>9}{'plain missed':>14}{'guarded missed':>16}{'holes filled':>14}"
          f"{'skipped':>9}{'fill p50/max s':>16}{'empty offsets':>15}")
    for name, kw in faults.items():
        with tempfile.TemporaryDirectory() as tmp:
            es = EmbeddedStack(Path(tmp), **free_ports())
            try:
                state = es.up()
                r = read_through_server_kills(es, KafkaConfig(bootstrap=state.kafka), "gaps", seed=args.seed,
                                              gap_wait_s=args.gap_wait_s, **kw)
            finally:
                es.down()
        waits = r.fill_waits or [float("nan")]
        print(f"{name:<16}{r.on_topic:>9}{len(r.missed_raw):>14}{len(r.missed_guarded):>16}"
              f"{r.gaps['offset_holes_filled']:>14}{r.gaps['offset_holes_skipped']:>9}"
              f"{statistics.median(waits):>9.2f}/{max(waits):<6.2f}{len(r.holes):>15}", flush=True)
        if r.kills:
            print(f"  kills: {', '.join(r.kills)}")
        if r.lost:
            print(f"  acked but not on the topic: {len(r.lost)}")


if __name__ == "__main__":
    main()
