"""A slow tool: episodes in lockstep against episodes scheduled one by one, side by side in one run.

    .venv/bin/python benchmarks/env_latency.py [--minutes 8] [--median 0.5] [--p99 5]
        [--variants lockstep,per_episode,synchronous] [--target 0.8] [--repeats 1] [--workdir DIR]
        [--set KEY=VALUE ...]

The agent example (`examples/agent_cpu.yaml`: the tiny char model learns guess-the-number) is
prepared once (its warm-up SFT stage, data), then run from that checkpoint once per variant, each
on its own embedded stack, for `--minutes`, with the same data, seeds and hyperparameters. Every
environment step waits a seeded lognormal delay (`explorer.env.latency`: median `--median` s, 99th
percentile `--p99` s), a realistic slow tool. Variants:

- `lockstep`: `explorer.scheduling: lockstep`, a batch's episodes turn by turn together, each
  environment stepped in turn (tasks_per_batch 4 x group_size 8 = 32 episodes a batch);
- `per_episode`: `explorer.scheduling: per_episode`, up to `--in-flight` (64) episodes in flight
  per explorer, each advancing when its tool answers;
- `synchronous`: the same with `trainer.max_staleness: 0` (on-policy: explorers wait for every
  version, so nothing overlaps training);
- `admitted`: `per_episode` with `explorer.publish_order: admitted` (finished groups published in
  the order they were admitted, so fast tasks do not fill the trainer's batches first);
- `bounded`: `per_episode` with the importance weight bounded on both sides: `ppo` with dual clip
  `clip_c: 3` (verl's value) and `iw_band: 2` (tokens whose ratio leaves [0.5, 2] dropped, as
  AReaL's behaviour-weight cap and slime's ICE-POP);
- `trust`: `per_episode` with a trust region on each step (`trainer.max_update_kl`, `--max-update-kl`:
  a step whose KL from the batch-start policy exceeds it is scaled back).

`per_episode@256` (or `synchronous@256`) is that variant with 256 episodes in flight instead of
`--in-flight`.

`--repeats N` runs every variant N times, the variants taking turns (repeat r, in folder `NAME-rR`:
each variant once, with `data.seed`, `trainer.seed` and the latency seed all r; `--first-repeat K`
numbers them from K, so a later session adds new seeds). On this task the greedy eval jumps
from one plateau to the next (counting up, 0.43; binary search, 0.92), so one run's time to the
target is one draw of when that jump happens: compare medians over repeats, not single runs.

It prints, per variant: seconds to the held-out greedy eval `--target` (from the evaluator's
metrics: when the version that first reached it was made), the best eval and the final one,
trajectories generated a second, versions made, and where the explorers' engines spent their time
(generate, waiting for tools with nothing else to generate, other waits), from their last metrics.
Then the ratios of the lockstep and synchronous times to the target against one by one's.

TRL is not in the comparison. TRL 1.16's GRPOTrainer does run environments (`environment_factory`,
experimental, transformers >= 5.2): their methods become tools the model calls through its chat
template's tool-call format, which the tiny char model here has not got. And its loop is the
lockstep one (`GRPOTrainer._tool_call_loop` in trl/trainer/grpo_trainer.py, 1.16.0): generate for
the batch, then, sample after sample, call that sample's tools (synchronous ones one after the
other; a sample's `async` ones gathered, but each sample waits for the previous one's with
`run_coroutine_threadsafe(...).result()`), then generate again for those that called a tool. Each
turn of a batch waits for the sum of its tools' latencies, as the `lockstep` variant does.
"""
from __future__ import annotations

import argparse
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CONFIG = ROOT / "examples" / "agent_cpu.yaml"


def variant(name: str, a, seed: int = 0) -> list[str]:
    """The overrides of variant `name`; `per_episode@256` is `per_episode` with 256 episodes in flight."""
    base, _, n = name.partition("@")
    in_flight = int(n) if n else a.in_flight
    env = (f"explorer.env={{type: guess_number, params: {{low: 1, high: 8, max_guesses: 4}}, "
           f"latency: {{median_s: {a.median}, p99_s: {a.p99}, seed: {seed}}}}}")
    seeds = [f"data.seed={seed}", f"trainer.seed={seed}"] if seed else []
    per_episode = [env, "explorer.scheduling=per_episode", f"explorer.max_concurrent_episodes={in_flight}",
                   f"explorer.env_threads={in_flight}"]
    return seeds + {"lockstep": [env, "explorer.scheduling=lockstep"],
                    "per_episode": per_episode,
                    "synchronous": [*per_episode, "trainer.max_staleness=0"],
                    "admitted": [*per_episode, "explorer.publish_order=admitted"],
                    "bounded": [*per_episode, "algorithm.policy_loss={type: ppo, params: {clip_c: 3.0, iw_band: 2.0}}"],
                    "trust": [*per_episode, f"trainer.max_update_kl={a.max_update_kl}"],
                    }[base]


def run_variant(name: str, overrides: list[str], a, prepared, work: Path) -> dict:
    """One `streamrft run` of variant `name` (its folder: `work/name`), read back from its output and TensorBoard."""
    from streamrft.infra.stack import free_ports

    ports = free_ports()
    cmd = [sys.executable, "-m", "streamrft.cli", "run", str(CONFIG), f"model.path={prepared.model.path}", "stages=[]",
           f"data.train={prepared.data.train}", f"data.eval={prepared.data.eval}", f"output_dir={work / name}",
           f"stack.data_dir={work / name / 'stack'}", f"stack.kafka_port={ports['kafka_port']}",
           f"stack.s3_port={ports['s3_port']}", f"stack.weed_port_base={ports['weed_port_base']}",
           f"max_wall_s={int(a.minutes * 60)}", "trainer.max_steps=100000", f"eval.every_versions={a.eval_every}",
           "eval.schedule=fixed",  # every k-th version in order: variants compared at the same versions
           *overrides]
    print(f"\n== {name}: streamrft run {CONFIG.name} " + " ".join(cmd[5:]), flush=True)
    t_roles, out_dir, final, profile = None, None, {}, ""
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT) as p:
        for line in p.stdout:
            m = re.match(r"run (\S+): output (\S+); eval reward at start", line)
            if m:
                t_roles, out_dir = time.time(), m.group(2)
            if line.startswith("final:"):
                final = dict(kv.split("=", 1) for kv in line.split()[1:])
            if line.startswith("profile:"):
                profile = line.strip()
            if line.startswith(("final:", "profile:", "run ")) or "Traceback" in line or "Error" in line:
                print("  | " + line.rstrip(), flush=True)
    if t_roles is None or not final:
        raise RuntimeError(f"{name}: streamrft run gave no final line (exit {p.returncode})")
    return {"t_roles": t_roles, "out": out_dir, "final": final, "profile": profile, **_from_tensorboard(out_dir, t_roles)}


def _from_tensorboard(out_dir: str, t_roles: float) -> dict:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(Path(out_dir) / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    made: dict[int, float] = {}
    for e in acc.Scalars("trainer/version") if "trainer/version" in tags else []:
        made.setdefault(int(e.value), e.wall_time - t_roles)
    evals = [(int(v.value), r.value) for v, r in zip(acc.Scalars("eval/version"), acc.Scalars("eval/eval_reward"))] \
        if "eval/version" in tags else []
    mean = lambda tag: statistics.fmean(e.value for e in acc.Scalars(tag)) if tag in tags else float("nan")  # noqa: E731
    published = [acc.Scalars(t)[-1].value for t in tags if re.fullmatch(r"explorer/\d+/published_turns_3p", t)]
    # episodes of 3+ model turns: their share of the trainer's batches (mean over steps) against
    # their share of what the explorers published, and their mean staleness against 1-turn ones'
    lengths = {"long_trained": mean("trainer/turns_3p"),
               "long_published": sum(published) / len(published) if published else float("nan"),
               "stale_long": mean("trainer/staleness_turns_3p"), "stale_short": mean("trainer/staleness_turns_1")}
    stages: dict[str, float] = {}
    for tag in tags:  # each explorer's last cumulative value of each stage, summed over explorers
        m = re.fullmatch(r"explorer/\d+/(\w+_s)", tag)
        if m:
            stages[m.group(1)] = stages.get(m.group(1), 0.0) + acc.Scalars(tag)[-1].value
    # the steps' KL from their batch-start policy (with trainer.max_update_kl): as taken, and the
    # share of steps scaled back
    kls = [e.value for e in acc.Scalars("trainer/update_kl")] if "trainer/update_kl" in tags else []
    scales = [e.value for e in acc.Scalars("trainer/update_scale")] if "trainer/update_scale" in tags else []
    steps = {"kl_median": statistics.median(kls) if kls else float("nan"), "kl_max": max(kls, default=float("nan")),
             "scaled": sum(x < 1 for x in scales) / len(scales) if scales else float("nan")}
    return {"made": made, "evals": evals, "stages": stages, **lengths, **steps}


def summarise(r: dict, target: float) -> dict:
    made, evals, st = r["made"], r["evals"], r["stages"]
    hit = next((v for v, score in evals if score >= target and v in made), None)
    best, fall = float("-inf"), None  # the largest drop below the best so far, once 0.9 was reached
    for _, score in evals:
        best = max(best, score)
        if best >= 0.9:
            fall = max(fall or 0.0, best - score)
    wall = st.get("wall_s", 0.0) or float("nan")
    generate = st.get("generate_s", 0.0) + st.get("load_s", 0.0) + st.get("eval_s", 0.0)
    return {"to_target": None if hit is None else made[hit], "at": hit, "fall": fall,
            "best": max((s for _, s in evals), default=float("nan")),
            "final_eval": float(r["final"].get("eval_reward_end", "nan")),
            "traj_per_s": int(r["final"].get("trajectories", 0)) / max(float(r["final"].get("wall_s", 1)), 1e-9),
            "versions": int(r["final"].get("versions", 0)),
            "generate": generate / wall, "env": st.get("env_s", 0.0) / wall, "idle": 1 - generate / wall,
            "trace": " ".join(f"v{v}:{score:.2f}" for v, score in evals),
            **{k: r[k] for k in ("long_trained", "long_published", "stale_long", "stale_short", "kl_median",
                                 "kl_max", "scaled")}}


def run_label(name: str, r: int, repeats: int) -> str:
    """A run's name in the table and its folder: the variant's, with `-r<r>` when there are repeats."""
    return name if repeats == 1 else f"{name}-r{r}"


def median_to_target(rs: list[dict]) -> float | None:
    """The median over runs of the seconds to the target; a run that never reached it sorts after
    every run that did, and a median that falls on one is None (never)."""
    times = sorted((s["to_target"] is None, s["to_target"] or 0.0) for s in rs)
    lo, hi = times[(len(times) - 1) // 2], times[len(times) // 2]
    if lo[0] or hi[0]:
        return None
    return (lo[1] + hi[1]) / 2


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=8.0)
    ap.add_argument("--median", type=float, default=0.5)
    ap.add_argument("--p99", type=float, default=5.0)
    ap.add_argument("--in-flight", type=int, default=64)
    ap.add_argument("--eval-every", type=int, default=5)
    ap.add_argument("--target", type=float, default=0.8)
    ap.add_argument("--variants", default="lockstep,per_episode,synchronous")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--first-repeat", type=int, default=0,
                    help="number the repeats from here (their seeds): a later session adds repeats of its own")
    ap.add_argument("--max-update-kl", type=float, default=0.03, help="the `trust` variant's trainer.max_update_kl")
    ap.add_argument("--workdir")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a config override for every variant (after the variant's own), e.g. trainer.max_staleness=1")
    a = ap.parse_args()

    from streamrft.config import load_config
    from streamrft.launch.prepare import prepare

    work = Path(a.workdir or tempfile.mkdtemp(prefix="env_latency-"))
    t0 = time.perf_counter()
    prepared = prepare(load_config(CONFIG, [f"output_dir={work}/prepared"]))
    print(f"prepared {prepared.model.path} in {time.perf_counter() - t0:.0f} s; step latency lognormal median "
          f"{a.median} s, p99 {a.p99} s; {a.minutes} min a variant", flush=True)
    runs: dict[str, list[dict]] = {name: [] for name in a.variants.split(",")}
    for r in range(a.first_repeat, a.first_repeat + a.repeats):  # variants take turns: a drift weighs on all alike
        for name in runs:
            result = run_variant(run_label(name, r, a.repeats), [*variant(name, a, r), *a.set], a, prepared, work)
            runs[name].append(summarise(result, a.target))
    budget = a.minutes * 60
    print(f"\n{'variant':16} {'to eval ' + str(a.target):>12} {'at':>5} {'best':>6} {'final':>6} {'traj/s':>7} "
          f"{'versions':>8} {'generate':>9} {'tools':>6} {'idle':>6} {'fall':>6} {'3+ turns':>15} {'stale 1/3+':>11}")
    for name, rs in runs.items():
        for r, s in enumerate(rs, start=a.first_repeat):
            t = "-" if s["to_target"] is None else f"{s['to_target']:.0f} s"
            print(f"{run_label(name, r, a.repeats):16} {t:>12} {'-' if s['at'] is None else 'v' + str(s['at']):>5} {s['best']:6.3f} "
                  f"{s['final_eval']:6.3f} {s['traj_per_s']:7.2f} {s['versions']:8d} {100 * s['generate']:8.0f}% "
                  f"{100 * s['env']:5.0f}% {100 * s['idle']:5.0f}% {'-' if s['fall'] is None else format(s['fall'], '.3f'):>6} "
                  f"{100 * s['long_trained']:5.1f}% of {100 * s['long_published']:4.1f}% "
                  f"{s['stale_short']:5.2f}/{s['stale_long']:4.2f}"
                  + (f" step kl median {s['kl_median']:.4f} max {s['kl_max']:.3f} scaled back {100 * s['scaled']:.0f}%"
                     if s["kl_median"] == s["kl_median"] else ""))
    print("\nheld-out eval by version:")
    for name, rs in runs.items():
        for r, s in enumerate(rs, start=a.first_repeat):
            print(f"{run_label(name, r, a.repeats):16} {s['trace']}")
    medians = {name: median_to_target(rs) for name, rs in runs.items()}
    if a.repeats > 1:
        print(f"\nmedians over {a.repeats} repeats (a run that never reached eval {a.target} counts as later than "
              f"any that did):")
        for name, rs in runs.items():
            m = medians[name]
            reached = sum(s["to_target"] is not None for s in rs)
            at = sorted((s["at"] is None, s["at"] or 0) for s in rs)[len(rs) // 2]
            falls = [s["fall"] for s in rs if s["fall"] is not None]
            print(f"{name:16} to eval {a.target}: {'never' if m is None else f'{m:.0f} s':>6} at "
                  f"{'never' if at[0] else 'v' + str(at[1]):>5} (reached in {reached} of {len(rs)}); largest fall after "
                  f"0.9 {max(falls) if falls else float('nan'):.3f}; traj/s {statistics.median(s['traj_per_s'] for s in rs):.2f}; final eval "
                  f"{statistics.median(s['final_eval'] for s in rs):.3f}; idle "
                  f"{100 * statistics.median(s['idle'] for s in rs):.0f}%")
    ref = medians.get("per_episode")
    if "per_episode" in medians and ref is None:
        print(f"per_episode did not reach eval {a.target} in {'most runs' if a.repeats > 1 else 'its run'}: no ratio")
    for name in ("lockstep", "synchronous"):
        if name in medians and ref:
            other = medians[name]
            print(f"{name} / per_episode, {'median ' if a.repeats > 1 else ''}time to eval {a.target}: "
                  + (f"{other / ref:.2f}x" if other else f"> {budget / ref:.2f}x (never reached it)"))
    sync = medians.get("synchronous")
    for name in (n for n in medians if "synchronous" in medians and n.split("@")[0] in ("admitted", "bounded", "trust")
                 and medians[n]):
        print(f"synchronous / {name}, {'median ' if a.repeats > 1 else ''}time to eval {a.target}: "
              + (f"{sync / medians[name]:.2f}x" if sync else f"> {budget / medians[name]:.2f}x (synchronous never reached it)"))
    print("'generate': the engines' share of the explorers' time sampling, loading weights and evaluating; "
          "'tools': waiting for environment steps with nothing to generate; 'idle': all but 'generate'. "
          "'3+ turns': episodes of 3 or more model turns, their mean share of the trainer's batches of their "
          "share of what the explorers published; 'stale 1/3+': the mean staleness of 1-turn and 3+-turn "
          "episodes in the batches.")
    if not a.workdir:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
