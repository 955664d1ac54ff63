"""Task selection on a task set that mixes trivial, impossible and learnable tasks: the same run
with each selector, one after the other, on one private embedded stack.

    .venv/bin/python benchmarks/curriculum.py examples/cpu_demo.yaml [overrides ...] \
        [--mix 0.33,0.33] [--selectors sequential,difficulty]

The demo's synthetic train set gets `trivial_frac` one-letter strings (the warmed-up policy already
answers them) and `impossible_frac` mislabelled ones (the answer is not the reversal), the rest
plain (`producers/synthetic.py`); the held-out eval stays plain. `difficulty` runs with
`pass_threshold: null` (the partial-credit reward is the success: at the start no sample of a
learnable task is fully right). Printed per selector: the run's `final:` line, the eval curve, and
from the run's topics the groups generated per task kind, the share of them stream ops filtered
(zero variance: no learning signal), then the ratios difficulty / sequential.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SELECTORS = {"sequential": {"type": "sequential"}, "random": {"type": "random"},
             "difficulty": {"type": "difficulty", "params": {"pass_threshold": None}}}


def read_topic(kafka, topic: str) -> list:
    from confluent_kafka import TopicPartition

    from streamrft.infra.kafka import make_consumer, partition_ends
    from streamrft.schemas import decode

    ends = partition_ends(kafka, topic)
    consumer = make_consumer(kafka, None)
    consumer.assign([TopicPartition(topic, e.partition, e.start) for e in ends])
    want, got = sum(e.end - e.start for e in ends), []
    while len(got) < want:
        msgs = consumer.consume(1000, timeout=1.0)
        if not msgs:
            break
        got += [decode(m.value()) for m in msgs if m.error() is None]
    consumer.close()
    return got


def summarize(kafka, ns: str, kind_of: dict[str, str]) -> dict:
    from streamrft.schemas import topic_name

    groups = Counter(kind_of.get(g.task.task_id, "?") for g in read_topic(kafka, topic_name(ns, "rollouts", "default")))
    filtered, scored, reward = Counter(), Counter(), defaultdict(list)
    for o in read_topic(kafka, topic_name(ns, "task-stats")):
        kind = kind_of.get(o.task_id, "?")
        scored[kind] += 1
        filtered[kind] += max(o.rewards) - min(o.rewards) <= 1e-12
        reward[kind].extend(o.rewards)
    evals = sorted((int(m.values["version"]), m.values["eval_reward"]) for m in read_topic(kafka, topic_name(ns, "metrics"))
                   if m.role == "eval")
    return {"groups": groups, "filtered": filtered, "scored": scored,
            "reward": {k: sum(v) / len(v) for k, v in reward.items()}, "evals": evals}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("config")
    ap.add_argument("overrides", nargs="*")
    ap.add_argument("--mix", default="0.33,0.33", help="trivial_frac,impossible_frac")
    ap.add_argument("--selectors", default="sequential,difficulty")
    ap.add_argument("--out", default=None, help="output dir (default: a temporary one, removed)")
    args = ap.parse_args(argv)

    from streamrft.config import load_config
    from streamrft.infra.stack import S3_KEY, EmbeddedStack, free_ports

    trivial, impossible = (float(x) for x in args.mix.split(","))
    tmp = Path(args.out or tempfile.mkdtemp(prefix="curriculum-")).resolve()
    stack = EmbeddedStack(tmp / "stack", buckets=("weights",), **free_ports())
    state = stack.up()
    results = {}
    try:
        base = load_config(args.config, list(args.overrides))
        synthetic = {**(base.data.synthetic or {}), "trivial_frac": trivial, "impossible_frac": impossible}
        common = [*args.overrides, f"data.synthetic={json.dumps(synthetic)}", "stack.embedded=false",
                  f"kafka.bootstrap={state.kafka}", f"s3.endpoint={state.s3}", f"s3.access_key={S3_KEY}",
                  f"s3.secret_key={S3_KEY}", "s3.bucket=weights", f"output_dir={tmp / 'run'}",
                  f"model.path={tmp / 'run' / 'base-model'}"]
        for name in args.selectors.split(","):
            ns = f"curriculum-{name}"
            cmd = [sys.executable, "-m", "streamrft.cli", "run", args.config, *common, f"namespace={ns}",
                   f"explorer.task_selector={json.dumps(SELECTORS[name])}"]
            print(f"== {name}: {' '.join(cmd[3:])}", flush=True)
            res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
            final = next((line for line in res.stdout.splitlines() if line.startswith("final:")), None)
            if res.returncode != 0 or final is None:
                print(res.stdout[-3000:], res.stderr[-3000:])
                raise SystemExit(f"{name}: the run failed ({res.returncode})")
            run_dir = max((tmp / "run").glob(f"{ns}-*/config.yaml")).parent
            cfg = load_config(run_dir / "config.yaml")  # the resolved one: its data.train is the run's
            train = Path(cfg.data.train)
            kind_of = {r["task_id"]: r.get("kind", "learnable") for r in map(json.loads, train.read_text().splitlines())}
            results[name] = {"final": final, **summarize(cfg.kafka, cfg.namespace, kind_of)}
            report(name, results[name])
        if len(results) > 1:
            compare(results)
    finally:
        stack.down()
        if args.out is None:
            shutil.rmtree(tmp, ignore_errors=True)


def report(name: str, r: dict) -> None:
    total = sum(r["groups"].values())
    print(f"{name}: {r['final']}")
    print(f"  eval curve: {', '.join(f'v{v} {e:.3f}' for v, e in r['evals'])}")
    for kind in ("learnable", "trivial", "impossible"):
        n, s = r["groups"][kind], r["scored"][kind]
        print(f"  {kind:10s} groups {n:5d} ({n / max(total, 1):.0%})  filtered {r['filtered'][kind] / max(s, 1):.0%}  "
              f"mean reward {r['reward'].get(kind, float('nan')):.3f}")
    scored = sum(r["scored"].values())
    print(f"  all groups {total}, filtered {sum(r['filtered'].values()) / max(scored, 1):.0%} of {scored} scored", flush=True)


def compare(results: dict) -> None:
    names = list(results)
    a, b = results[names[0]], results[names[-1]]

    def share(r, kind):
        return r["groups"][kind] / max(sum(r["groups"].values()), 1)

    def signal(r):  # groups with a learning signal per group generated
        return 1 - sum(r["filtered"].values()) / max(sum(r["scored"].values()), 1)

    common = sorted(set(dict(a["evals"])) & set(dict(b["evals"])))
    print(f"{names[-1]} / {names[0]}: learnable share {share(b, 'learnable'):.2f} / {share(a, 'learnable'):.2f}; "
          f"groups with signal {signal(b):.2f} / {signal(a):.2f}; eval at equal versions: "
          + ", ".join(f"v{v} {dict(b['evals'])[v]:.3f} / {dict(a['evals'])[v]:.3f}" for v in common))


if __name__ == "__main__":
    sys.exit(main())
