"""How the embedded broker's reads cost as a partition grows, without and with the log keeper.

    .venv/bin/python benchmarks/broker_growth.py [--requests 15000] [--loop-config examples/agent_cpu.yaml --loop-minutes 30]

Probe (side by side in one run, two private stacks: the log keeper off, then on). One producer
writes `--requests` produce requests of `--records-per-request` 2 KB records (acks=all, flushed
each: one record is what an admission reservation does) to a fresh 1-partition topic; then it reports, per stack:
- objects in the partition (the broker stores one per produce request);
- the broker's S3 requests per fetch listing (it lists every object of the partition each fetch:
  one request per 1,000), counted by a proxy between the broker and S3;
- catch-up rate: records/s read by a new consumer from offset 0 (all of them behind), and the time to
  the first record from the last 500 (the replay and the live-tail cases).
The rate is capped at what `--read-s` allows: a consumer that reads everything in less reports its
real rate.

Loop (`--loop-config`): `streamrft run` on that config for `--loop-minutes` (max_wall_s set, the
step limit lifted), the keeper on or off (`--loop-keeper`; `both`: first a run with the keeper off
for `--off-minutes`, then one with it on, each on its own stack, and the two side by side); it prints versions and trajectories per minute from the run's
progress lines, the zero-variance share from stream ops' metrics (a converged run filters most
groups: fewer versions a minute for that reason is not a slowdown), and objects per partition of
the run's topics at the end. `--set KEY=VALUE` adds config overrides: with
`stream_ops.drop_zero_variance=false` every group is trained, so versions a minute measure the
loop's cost alone, not how much of the policy is still to learn.
"""
from __future__ import annotations

import argparse
import math
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def probe(requests: int, keeper: bool, read_s: float, per_request: int = 1) -> dict:
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic
    from minio import Minio

    from streamrft.infra.chaos import DelayingS3Proxy
    from streamrft.infra.stack import S3_KEY, TANSU_BUCKET, EmbeddedStack, free_ports

    with tempfile.TemporaryDirectory() as tmp:
        ports = free_ports()
        es = EmbeddedStack(Path(tmp) / "stack", log_keeper={"enabled": keeper}, **ports)
        proxy = DelayingS3Proxy(f"127.0.0.1:{ports['s3_port']}", p=0.0)
        es.tansu_s3_endpoint = proxy.url
        try:
            state = es.up()
            admin = AdminClient({"bootstrap.servers": state.kafka})
            for f in admin.create_topics([NewTopic("probe", 1, 1)]).values():
                f.result()
            time.sleep(1)
            producer = Producer({"bootstrap.servers": state.kafka, "linger.ms": 0, "acks": "all"})
            t0 = time.monotonic()
            lat = []
            for i in range(requests):
                t = time.monotonic()
                for j in range(per_request):
                    producer.produce("probe", key=b"k", value=b"%08d" % (i * per_request + j) + b"x" * 2040)
                producer.flush()
                lat.append(time.monotonic() - t)
            records = requests * per_request
            fill_s = time.monotonic() - t0
            if keeper:  # what the keeper leaves once the newest objects are older than its min age
                time.sleep(20)
            client = Minio(state.s3, access_key=S3_KEY, secret_key=S3_KEY, secure=False)
            objects = sum(1 for o in client.list_objects(
                TANSU_BUCKET, prefix="clusters/tansu_cluster/topics/probe/partitions/0000000000/records/",
                recursive=True))

            def read(start: int, want: int) -> tuple[int, float | None, float, dict]:
                before = dict(proxy.counts)
                c = Consumer({"bootstrap.servers": state.kafka, "group.id": "probe", "enable.auto.commit": False,
                              "fetch.max.bytes": 64 << 20, "max.partition.fetch.bytes": 16 << 20})
                c.assign([TopicPartition("probe", 0, start)])
                n, first, t = 0, None, time.monotonic()
                while n < want and time.monotonic() - t < read_s:
                    for m in c.consume(1000, timeout=0.5):
                        if m.error() is None:
                            n += 1
                            first = first if first is not None else time.monotonic() - t
                took = time.monotonic() - t
                c.close()
                after = dict(proxy.counts)
                return n, first, took, {k: after.get(k, 0) - before.get(k, 0) for k in after}

            n0, first0, took0, req0 = read(0, records)
            nt, firstt, _, _ = read(records - 500, 500)
            lists = req0.get("list", 0)
            return {"keeper": keeper, "requests": requests, "records": records, "fill_s": fill_s,
                    "produce_p50_ms": 1000 * sorted(lat)[len(lat) // 2], "objects": objects,
                    "s3_per_listing": (lists + req0.get("list_page", 0)) / lists if lists else math.nan,
                    "expected_per_listing": max(1, math.ceil(objects / 1000)),
                    "from0_records": n0, "from0_rate": n0 / took0, "from0_first_s": first0,
                    "tail_records": nt, "tail_first_s": firstt}
        finally:
            es.down()
            proxy.close()


def loop(config: str, minutes: float, workdir: Path, keeper: bool = True, overrides: list[str] = ()) -> dict | None:
    from minio import Minio

    from streamrft.infra.stack import S3_KEY, TANSU_BUCKET, EmbeddedStack

    workdir.mkdir(parents=True, exist_ok=True)
    stack_dir = workdir / "stack"
    cmd = [str(Path(sys.executable).parent / "streamrft"), "run", config, f"stack.data_dir={stack_dir}",
           f"output_dir={workdir / 'out'}", f"max_wall_s={int(minutes * 60)}", "trainer.max_steps=100000",
           f"stack.log_keeper.enabled={str(keeper).lower()}", *overrides]
    print("loop:", " ".join(cmd), flush=True)
    progress = re.compile(r"^\[\s*(\d+)s\] step\s+\d+\s+version\s+(\d+).*trajectories (\d+)")
    points, profiles = [], 0
    with subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as p:
        for line in p.stdout:
            m = progress.match(line)
            if m:
                points.append(tuple(int(x) for x in m.groups()))
            elif line.startswith("profile:"):
                profiles += 1
                if profiles % 10 == 1:  # one in 5 minutes
                    print(f"[{points[-1][0] if points else 0:5d}s] {line.rstrip()}", flush=True)
            elif line.startswith(("final:", "run ")):
                print(line.rstrip(), flush=True)
    if not points:
        print("loop: no progress lines")
        return None
    # the run stopped the stack it started: up again to read what it left. With the keeper off its
    # topics are as unreadable as they are slow for the loop (the point of the run): objects only
    es = EmbeddedStack(stack_dir, log_keeper={"enabled": keeper})
    state = es.up()
    try:
        filtered = _filtered_by_minute(state) if keeper else {}
        replays = _replay_rates(state) if keeper else {}
        client = Minio(state.s3, access_key=S3_KEY, secret_key=S3_KEY, secure=False)
        counts: dict[str, int] = {}
        for o in client.list_objects(TANSU_BUCKET, prefix="clusters/tansu_cluster/topics/", recursive=True):
            if o.object_name.endswith(".batch"):
                key = o.object_name.split("/records/")[0].replace("clusters/tansu_cluster/topics/", "")
                counts[key] = counts.get(key, 0) + 1
    finally:
        es.down()
    print("minute  versions/min  trajectories/s  zero-variance share of scored groups")
    t_end = points[-1][0]
    rows = []
    for start in range(0, t_end, 60):
        inside = [pt for pt in points if start <= pt[0] < start + 60]
        if len(inside) >= 2:
            span = max(1, inside[-1][0] - inside[0][0])
            zv = filtered.get(start // 60)
            rows.append((start // 60, (inside[-1][1] - inside[0][1]) * 60 / span,
                         (inside[-1][2] - inside[0][2]) / span, zv))
            print(f"{rows[-1][0]:6d}  {rows[-1][1]:12.1f}  {rows[-1][2]:14.1f}  {'-' if zv is None else f'{zv:.2f}'}")
    plot(rows, workdir / "loop_curve.png", config, keeper)
    print(f"curve: {workdir / 'loop_curve.png'}")
    first = [pt for pt in points if pt[0] < 300]
    last = [pt for pt in points if pt[0] >= t_end - 600]

    def rate(pts, i):
        return (pts[-1][i] - pts[0][i]) * (60 if i == 1 else 1) / max(1, pts[-1][0] - pts[0][0])

    print(f"versions/min: first 5 min {rate(first, 1):.1f}, last 10 min {rate(last, 1):.1f} "
          f"(ratio {rate(last, 1) / max(rate(first, 1), 1e-9):.2f}; target >= 0.67)")
    print(f"trajectories/s: first 5 min {rate(first, 2):.1f}, last 10 min {rate(last, 2):.1f} "
          f"(ratio {rate(last, 2) / max(rate(first, 2), 1e-9):.2f})")
    # issue 52's window: trajectories generated a minute in minutes 1-6 against the last 5 minutes
    early = [pt for pt in points if 60 <= pt[0] < 360]
    late = [pt for pt in points if pt[0] >= t_end - 300]
    if len(early) >= 2 and len(late) >= 2:
        e, lt = rate(early, 2) * 60, rate(late, 2) * 60
        print(f"trajectories/min: minutes 1-6 {e:,.0f}, last 5 min {lt:,.0f} "
              f"(ratio {lt / max(e, 1e-9):.2f}; target >= 0.9 over 25 min, >= 0.85 over 60)")
    for key, n in sorted(counts.items(), key=lambda kv: -kv[1])[:12]:
        print(f"objects at the end {n:6d}  {key}")
    for topic, (n, secs) in replays.items():
        print(f"read from offset 0 after the run: {topic}: {n} records in {secs:.2f} s ({n / max(secs, 1e-9):,.0f}/s)")
    _trainer_parts(workdir / "out")
    return {"keeper": keeper, "minutes": t_end / 60, "rows": rows, "versions": (rate(first, 1), rate(last, 1)),
            "trajectories": (rate(first, 2), rate(last, 2)),
            "max_objects": max(counts.values(), default=0)}


def side_by_side(runs: list[dict], path: Path, title: str) -> None:
    """The keeper-off and keeper-on runs' rates in one table and one figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    print(f"{'keeper':7} {'minutes':>8} {'versions/min first 5':>21} {'last 10':>8} {'ratio':>6} "
          f"{'trajectories/s first 5':>23} {'last 10':>8} {'ratio':>6} {'most objects in a partition':>28}")
    fig, ax = plt.subplots(figsize=(7, 3.5))
    for r in runs:
        (v0, v1), (t0, t1) = r["versions"], r["trajectories"]
        print(f"{'on' if r['keeper'] else 'off':7} {r['minutes']:8.1f} {v0:21.1f} {v1:8.1f} {v1 / max(v0, 1e-9):6.2f} "
              f"{t0:23.1f} {t1:8.1f} {t1 / max(t0, 1e-9):6.2f} {r['max_objects']:28d}")
        ax.plot([row[0] for row in r["rows"]], [row[1] for row in r["rows"]], ".-",
                label=f"keeper {'on' if r['keeper'] else 'off'}")
    ax.set_ylim(bottom=0)
    ax.set_xlabel("minute of the run")
    ax.set_ylabel("versions / min")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    print(f"side by side: {path}")


def _replay_rates(state) -> dict[str, tuple[int, float]]:
    """Each of the run's topics read whole from offset 0 (a replay, an explorer's fold at start)."""
    from confluent_kafka.admin import AdminClient

    from streamrft.config import KafkaConfig
    from streamrft.infra.kafka import read_topic

    kafka = KafkaConfig(bootstrap=state.kafka)
    out = {}
    for topic in sorted(AdminClient({"bootstrap.servers": state.kafka}).list_topics(timeout=10).topics):
        if topic.rsplit(".", 1)[-1] in ("admission", "task-stats", "experiences", "default", "metrics"):
            t = time.monotonic()
            n = len(read_topic(kafka, topic, deadline_s=600))
            out[topic] = (n, time.monotonic() - t)
    return out


def plot(rows: list[tuple], path: Path, title: str, keeper: bool = True) -> None:
    """Versions a minute, trajectories a second and the zero-variance share, minute by minute."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    minutes = [r[0] for r in rows]
    fig, (a, b) = plt.subplots(2, 1, figsize=(7, 5), sharex=True)
    a.plot(minutes, [r[1] for r in rows], ".-", label="versions / min")
    a.plot(minutes, [r[2] for r in rows], ".-", label="trajectories / s")
    a.set_ylim(bottom=0)
    a.legend(loc="upper right")
    a.set_title(f"{title}, embedded stack, log keeper {'on' if keeper else 'off'}")
    b.plot(minutes, [r[3] if r[3] is not None else float("nan") for r in rows], ".-", color="C2")
    b.set_ylabel("zero-variance share")
    b.set_ylim(0, 1.02)
    b.set_xlabel("minute of the run")
    for ax in (a, b):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


TRAINER_PARTS = ("wait_s", "step_s", "publish_s", "publish_wait_s", "commit_s", "publish_copy_s", "checkpoint_write_s",
                 "upload_s", "checkpoint_finalize_s", "announce_s", "weights_gc_s")


def _trainer_parts(out_dir: Path, window_s: int = 300) -> None:
    """Where the trainer's time per version went, 5 minutes at a time: the median of each of its
    timing metrics (`docs/monitoring.md`) in the run's TensorBoard logs. `publish_s` is the step
    loop's share; `upload_s`..`weights_gc_s` run on the publisher thread beside the next step, and
    the loop waits for them in `publish_wait_s`."""
    import statistics

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logs = sorted(out_dir.glob("*/tensorboard"))
    if not logs:
        return
    ea = EventAccumulator(str(logs[-1]), size_guidance={"scalars": 0})
    ea.Reload()
    tags = set(ea.Tags()["scalars"])
    parts = [p for p in TRAINER_PARTS if f"trainer/{p}" in tags]
    if not parts:
        return
    t0 = min(e.wall_time for e in ea.Scalars(f"trainer/{parts[0]}"))
    table: dict[int, dict[str, float]] = {}
    for p in parts:
        by: dict[int, list[float]] = {}
        for e in ea.Scalars(f"trainer/{p}"):
            by.setdefault(int((e.wall_time - t0) // window_s), []).append(e.value)
        for w, values in by.items():
            table.setdefault(w, {})[p] = statistics.median(values)
    print("trainer, median seconds per version, by 5 minutes of the run:")
    print("minute " + " ".join(f"{p:>{max(len(p), 6)}}" for p in parts))
    for w in sorted(table):
        print(f"{w * window_s // 60:6d} " + " ".join(f"{table[w].get(p, float('nan')):>{max(len(p), 6)}.3f}" for p in parts))


def _filtered_by_minute(state) -> dict[int, float]:
    """Minute of the run -> the share of scored groups stream ops dropped as zero-variance, from
    their cumulative `scored` / `filtered` counters on the run's metrics topic."""
    from confluent_kafka.admin import AdminClient

    from streamrft.config import KafkaConfig
    from streamrft.infra.kafka import read_topic
    from streamrft.schemas import decode

    kafka = KafkaConfig(bootstrap=state.kafka)
    topics = [t for t in AdminClient({"bootstrap.servers": state.kafka}).list_topics(timeout=10).topics
              if t.endswith(".metrics")]
    samples = []  # (epoch s, worker, scored, filtered)
    for topic in topics:
        for m in read_topic(kafka, topic):
            metric = decode(m.value())
            if metric.role == "stream_ops" and "scored" in metric.values:
                samples.append((m.timestamp()[1] / 1000, metric.role_id, metric.values["scored"],
                                metric.values["filtered"]))
    if not samples:
        return {}
    samples.sort()
    t0 = samples[0][0]
    by_minute: dict[int, dict[str, tuple[float, float]]] = {}
    for t, worker, scored, filt in samples:  # each worker's last cumulative counts in each minute
        by_minute.setdefault(int((t - t0) // 60), {})[worker] = (scored, filt)
    out, before = {}, {}
    for minute in sorted(by_minute):
        d_scored = sum(sc - before.get(w, (0, 0))[0] for w, (sc, _) in by_minute[minute].items())
        d_filt = sum(f - before.get(w, (0, 0))[1] for w, (_, f) in by_minute[minute].items())
        before.update(by_minute[minute])
        if d_scored + d_filt > 0:
            out[minute] = d_filt / (d_scored + d_filt)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=15000, help="produce requests (0: no probe)")
    ap.add_argument("--records-per-request", type=int, default=1)
    ap.add_argument("--read-s", type=float, default=20.0)
    ap.add_argument("--loop-config")
    ap.add_argument("--loop-minutes", type=float, default=30.0)
    ap.add_argument("--loop-keeper", choices=("on", "off", "both"), default="on")
    ap.add_argument("--off-minutes", type=float, default=15.0, help="the keeper-off run's length with --loop-keeper both")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a config override for the loop, e.g. stream_ops.drop_zero_variance=false (repeatable)")
    args = ap.parse_args()
    if args.requests:
        rows = [probe(args.requests, keeper, args.read_s, args.records_per_request) for keeper in (False, True)]
        print(f"{args.requests} produce requests of {args.records_per_request} x 2 KB records into one partition")
        print(f"{'keeper':7} {'objects':>8} {'s3 req/listing':>15} {'produce p50':>12} "
              f"{'from 0: read':>13} {'rec/s':>8} {'tail 500: read':>15} {'first after':>12}")
        for r in rows:
            print(f"{'on' if r['keeper'] else 'off':7} {r['objects']:8d} {r['s3_per_listing']:15.1f} "
                  f"{r['produce_p50_ms']:10.1f}ms {r['from0_records']:13d} {r['from0_rate']:8.0f} "
                  f"{r['tail_records']:15d} {r['tail_first_s'] if r['tail_first_s'] is not None else float('nan'):11.2f}s")
        off, on = rows
        print(f"catch-up from offset 0: {on['from0_rate'] / max(off['from0_rate'], 1e-9):.1f}x faster with the keeper; "
              f"S3 requests per fetch listing {off['s3_per_listing']:.1f} -> {on['s3_per_listing']:.1f}")
    if args.loop_config:
        workdir = Path(args.workdir or tempfile.mkdtemp(prefix="broker-growth-"))
        if args.loop_keeper != "both":
            loop(args.loop_config, args.loop_minutes, workdir, args.loop_keeper == "on", args.set)
            return
        runs = [loop(args.loop_config, args.off_minutes, workdir / "keeper-off", False, args.set),
                loop(args.loop_config, args.loop_minutes, workdir / "keeper-on", True, args.set)]
        side_by_side([r for r in runs if r], workdir / "loop_side_by_side.png", args.loop_config)


if __name__ == "__main__":
    main()
