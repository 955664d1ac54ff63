"""The demo loop's time per stage, before and after taking overhead off its critical path, side by
side in one run of this script: the same prepared checkpoint, tasks and steps, two `streamrft run`s.

    .venv/bin/python benchmarks/loop_profile.py [--config examples/cpu_demo.yaml] [--steps 80]
        [--variants before,after] [--target 0.8] [--set KEY=VALUE ...]

- before: `eval.runner=explorer` (the explorer holding slot 0 evaluates between its generations),
  `trainer.checkpoint_every=1` (a checkpoint with optimiser state at every version), full weights
  to S3 at every version;
- after: `eval.runner=evaluator` (a role of its own), `trainer.checkpoint_every=10`,
  `trainer.weight_sync.delta=true` (zstd XOR deltas, a snapshot every 10);
- the loop's consumers fetch with `kafka.fetch_wait_ms` 500 before (librdkafka's default; faust's
  own was 1500 before the setting existed), 100 after: the embedded broker holds a fetch that finds
  nothing new for all of it, so every hop of the loop waited up to that long.
- leveldb2 / sqlite: the demo's own settings on a stack made with that SeaweedFS metadata store
  (`stack.filer_store`; docs/broker-growth.md, "Flat by default").
`--set KEY=VALUE` (repeatable) adds an override to every variant; `--repeats N` runs the variants
N times taking turns (each run on a fresh stack) and prints the median of each column.
The background publisher (version N's upload overlapping step N+1) is on in both: it has no switch
(its own before / after, on the commits either side of it: benchmarks/trainer_step_loop.py).

From each run's TensorBoard log (the metrics topic as `streamrft run` logs it): seconds per
version (median gap between successive versions), the trainer's wait / step / publish per step
(median), the loop latency (a version announced -> its first trajectory in a batch, median), the
explorers' stage shares of their wall time at the end, seconds to a held-out eval >= target; then
the ratios after / before. The load average is printed before, between and after: on this 2-core
machine every role competes for the cores, so say what else ran.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from env_latency import median_to_target, run_label  # noqa: E402
from vs_trl import ROOT  # noqa: E402

from streamrft.infra.stack import free_ports  # noqa: E402

VARIANTS = {
    "before": ["eval.runner=explorer", "trainer.checkpoint_every=1", "trainer.weight_sync.delta=false",
               "kafka.fetch_wait_ms=500"],
    "after": ["eval.runner=evaluator", "trainer.checkpoint_every=10", "trainer.weight_sync.delta=true",
              "trainer.weight_sync.full_every=10", "kafka.fetch_wait_ms=100"],
    "leveldb2": ["stack.filer_store=leveldb2"],
    "sqlite": ["stack.filer_store=sqlite"],
}
TRAINER = ("wait_s", "step_s", "publish_s", "loop_latency_s")


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def run_variant(name: str, a, prepared, workdir: Path, run: str | None = None) -> dict:
    run = run or name
    ports = free_ports()
    kafka, s3, weed = ports["kafka_port"], ports["s3_port"], ports["weed_port_base"]
    overrides = [f"model.path={prepared.model.path}", "stages=[]", f"data.train={prepared.data.train}",
                 f"data.eval={prepared.data.eval}", f"output_dir={workdir / run}", f"stack.data_dir={workdir / run}/stack",
                 f"stack.kafka_port={kafka}", f"stack.s3_port={s3}", f"stack.weed_port_base={weed}",
                 f"trainer.max_steps={a.steps}", f"eval.every_versions={a.eval_every}", "max_wall_s=null",
                 *VARIANTS[name], *a.set]
    cmd = [sys.executable, "-m", "streamrft.cli", "run", a.config, *overrides]
    print(f"\n== {name}: streamrft run {a.config} {' '.join(VARIANTS[name])}", flush=True)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    t_roles, out_dir, final, profile = None, None, {}, ""
    for line in proc.stdout:
        print("  | " + line.rstrip(), flush=True)
        if m := re.match(r"run (\S+): output (\S+); eval reward at start", line):
            t_roles, out_dir = time.time(), m.group(2)
        if line.startswith("profile:"):
            profile = line.strip()
        if line.startswith("final:"):
            final = dict(kv.split("=", 1) for kv in line.split()[1:])
    if proc.wait() != 0 or t_roles is None:
        raise RuntimeError(f"{name}: streamrft run exited with {proc.returncode}")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(Path(out_dir) / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    first: dict[int, float] = {}
    for e in acc.Scalars("trainer/version"):
        first.setdefault(int(e.value), e.wall_time - t_roles)
    vs = sorted(first)
    per_version = statistics.median(first[b] - first[a] for a, b in zip(vs, vs[1:]) if b == a + 1)
    trainer = {k: statistics.median(e.value for e in acc.Scalars(f"trainer/{k}")) for k in TRAINER
               if f"trainer/{k}" in tags}
    evals = [(int(v.value), r.value) for v, r in zip(acc.Scalars("eval/version"), acc.Scalars("eval/eval_reward"))]
    hit = next((v for v, score in evals if score >= a.target and v in first), None)
    return {"per_version": per_version, "versions": vs[-1], "wall": first[vs[-1]], **trainer,
            "to_target": None if hit is None else first[hit], "evals": evals, "profile": profile,
            "final_eval": float(final.get("eval_reward_end", "nan"))}


def _medians(rs: list[dict], cols: list[str]) -> dict:
    """Each column's median over runs; a run that never reached the target counts as slowest."""
    out = {}
    for c in [*cols, "versions"]:
        if c == "to_target":
            out[c] = median_to_target(rs)
        else:
            vals = [r[c] for r in rs if r.get(c) is not None]
            out[c] = statistics.median(vals) if vals else None
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="examples/cpu_demo.yaml")
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--eval-every", type=int, default=5)
    p.add_argument("--target", type=float, default=0.8)
    p.add_argument("--variants", default="before,after")
    p.add_argument("--set", action="append", default=[], help="an override for every variant")
    p.add_argument("--repeats", type=int, default=1, help="runs of each variant, taking turns")
    p.add_argument("--workdir", help="work here (kept; a demo prepared there before is reused)")
    a = p.parse_args()

    from streamrft.config import load_config
    from streamrft.launch.prepare import prepare

    work = Path(a.workdir or tempfile.mkdtemp(prefix="loop_profile-"))
    print(f"load average at start: {load()} on {os.cpu_count()} cores", flush=True)
    try:
        prepared = prepare(load_config(a.config, [f"output_dir={work}/prepared"]))
        names = a.variants.split(",")
        runs: dict[str, list[dict]] = {name: [] for name in names}
        for rep in range(a.repeats):
            for name in names:
                label = run_label(name, rep, a.repeats)
                runs[name].append(run_variant(name, a, prepared, work, label))
                print(f"load average after {label}: {load()}", flush=True)
        fmt = lambda x: "-" if x is None else f"{x:.2f}"  # noqa: E731
        cols = ["per_version", *TRAINER, "to_target", "wall", "final_eval"]
        print(f"\n{'':<12}" + "".join(f"{c:>16}" for c in cols) + f"{'versions':>10}")
        for name, rs in runs.items():
            for i, r in enumerate(rs):
                label = run_label(name, i, a.repeats)
                print(f"{label:<12}" + "".join(f"{fmt(r.get(c)):>16}" for c in cols) + f"{r['versions']:>10}")
        res = {name: rs[0] if a.repeats == 1 else _medians(rs, cols) for name, rs in runs.items()}
        if a.repeats > 1:
            for name, r in res.items():
                reached = sum(x["to_target"] is not None for x in runs[name])
                print(f"{name + ' med':<12}" + "".join(f"{fmt(r.get(c)):>16}" for c in cols)
                      + f"{r['versions']:>10}  reached {a.target} in {reached} of {a.repeats}")
        for name, rs in runs.items():
            for i, r in enumerate(rs):
                label = run_label(name, i, a.repeats)
                print(f"{label}: {r['profile']}")
                print(f"{label} evals: " + " ".join(f"v{v}:{s:.2f}" for v, s in r["evals"]))
        for old, new in (("before", "after"), ("leveldb2", "sqlite")):
            if {old, new} <= set(res):
                b, af = res[old], res[new]
                ratios = {c: af[c] / b[c] for c in cols if af.get(c) and b.get(c)}
                print(f"ratio {new}/{old}: " + ", ".join(f"{c} {v:.2f}" for c, v in ratios.items()))
        print(f"load average at end: {load()}", flush=True)
    finally:
        if a.workdir:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
