"""The CPU demo's job in TRL's GRPOTrainer and in streamrft, side by side in one run: seconds to a
greedy held-out eval reward of 0.8, seconds per optimiser step (TRL) / weight version (streamrft),
and their ratios streamrft / TRL.

    /work/trl-venv/bin/python benchmarks/vs_trl.py [--config examples/cpu_demo.yaml] [--steps 100]
        [--eval-every 5] [--target 0.8] [--skip-trl] [--skip-streamrft] [--trl-python PYTHON]
        [--scheduling lockstep,per_episode]

`--scheduling`: one streamrft run per `explorer.scheduling` (default lockstep, the demo's), each
with its own stack; rows `streamrft` (lockstep) and `sr-per_episode`.

TRL is the optional `bench` extra (`pip install -e '.[bench]'`, trl 1.16.0). When `trl` is not
importable from this interpreter, the TRL side runs in a subprocess of `--trl-python` (default
/work/trl-venv/bin/python, which needs streamrft installed too).

What is shared. The demo is prepared once (`streamrft.launch.prepare.prepare`: the char Qwen2 built,
data.train / data.eval written, the two SFT warm-up stages run) into a temporary directory, and
both sides start from that warmed-up checkpoint and its tokenizer: TRL loads it, and `streamrft
run` gets `model.path=<it> stages=[] data.train=... data.eval=...`, so neither warms up again.
Both train on data.train's prompts, score with the demo's reward (`stream_ops.rewards`: reverse,
imported from streamrft), and are evaluated by the same function: `streamrft.producers.evaluate.
evaluate_run` (greedy, explorer.sampling.max_new_tokens, the first eval.max_tasks of data.eval),
which TRL's callback runs on a `TransformersEngine` loaded with the live TRL weights every
`--eval-every` steps; streamrft's evaluator role runs it on the newest version once it is
`eval.every_versions` (set to `--eval-every`) past the last one evaluated. The hyperparameters that exist on both sides are mapped one to one (the script
prints the mapping): group 8, 64 completions per step (TRL per-device batch 64 = 8 prompts x 8;
streamrft trainer.batch_groups 8 x group_size 8), lr constant (HF's default schedule is linear
decay: set to constant), AdamW with weight decay 0 and grad-norm clip 1.0, one PPO epoch,
clip 0.2 / 0.2, no KL (beta 0: the demo sets no kl.coef), token-mean aggregation (TRL
loss_type "dapo": normalised by the step's active tokens), group-std-scaled advantages,
temperature 1, no top-k / top-p, max_completion_length = explorer.sampling.max_new_tokens,
float32 (TRL's GRPOConfig defaults to bf16: turned off), seed trainer.seed.

What cannot be matched, and how it was handled:
- Asynchrony. streamrft's explorers sample with weights up to trainer.max_staleness versions old
  while the trainer trains; TRL generates with the current weights, then trains (num_iterations 1:
  its ratio is exactly 1, the clip never binds). The demo's decoupled PPO takes its ratio against
  the trainer's weights at the start of the step (1 at one epoch, as TRL's) and weights each token
  by min(pi / pi_behaviour, 2), the explorers' log-probs being pi_behaviour; with plain PPO (the
  ratio against pi_behaviour) the clip bound on about 6% of the tokens. Left as it is: that
  difference is what is being compared. The figures
  are per optimiser step / version on both sides, and the trainer's stale drops are in its final
  line.
- Zero-variance groups. streamrft's stream ops drop groups whose 8 rewards are equal
  (stream_ops.drop_zero_variance) and the trainer waits for 8 informative groups, refilled by the
  explorers; TRL has no refill: such a group stays in the batch with advantage 0 (no gradient, but
  its tokens count in the token-mean denominator). Not emulated; the script prints TRL's mean
  `frac_reward_zero_std`, the share of groups a streamrft step would have replaced.
- Processes and threads. streamrft runs its stack (Tansu, SeaweedFS), 2 explorers, a stream-ops
  worker and a trainer (torch_threads 1) as processes on the machine's cores; TRL is one process
  using `--trl-threads` torch threads, default 1 as each streamrft role (on a loaded 2-core machine,
  load average ~5, TRL with 2 threads took 2.3 s a step, with 1 thread 0.29 s: oversubscribed
  threads spin). The load average is printed before, between and after the two.
- Where the eval time goes. TRL's eval blocks training: its clock excludes the time in the eval
  callback. streamrft's eval runs in its evaluator role concurrently (it pauses no explorer,
  but shares the cores; it is in streamrft's clock). The time to 0.8 is, on both sides, when the step / version whose eval
  first reached the target was produced (TRL: end of that step; streamrft: the trainer's metric
  reporting that version), not when its eval finished.
- Start of the clock. TRL: before loading the checkpoint and building GRPOTrainer (after its
  imports). streamrft: when `streamrft run` spawns its roles (after starting its stack, creating
  topics and the start eval, which the "run ...: eval reward at start" line reports), so it includes
  the roles' start: five processes loading the model on the shared cores (about 6-7 s here with
  the demo's `fork_roles: true`, which imports torch and transformers once before the clock
  starts; 12-15 s with a fresh interpreter per role). "first step s" is when the first step / version was made, and
  "s to it after" the time to the target counted from then: the two loops compared without their
  start.
- Sampling order and RNG streams differ (different task shuffles and samplers): one run each, no
  repeats; an eval curve is noisy on 100 tasks.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULT_TAG = "VS_TRL_RESULT "


# ---------------------------------------------------------------------------------------------- TRL


def trl_job(model_dir: str, train: str, eval_path: str, config: str, steps: int, eval_every: int, threads: int,
            workdir: str) -> dict:
    """GRPOTrainer from `model_dir` with the demo's settings; greedy evals every `eval_every` steps."""
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from streamrft.config import load_config
    from streamrft.engine.models import load_policy
    from streamrft.engine.rollout.hf import TransformersEngine
    from streamrft.producers.evaluate import evaluate_run
    from streamrft.producers.tasks import load_task_file
    from streamrft.stream_ops.rewards.reverse import reverse_reward

    torch.set_num_threads(threads)
    cfg = load_config(config, [f"model.path={model_dir}", "stages=[]", f"data.train={train}", f"data.eval={eval_path}"])
    eval_tasks = load_task_file(cfg.data.eval, cfg.data.prompt_key, cfg.data.answer_key)[: cfg.eval.max_tasks]
    rows = [json.loads(line) for line in Path(train).read_text().splitlines() if line.strip()]
    dataset = Dataset.from_list([{"prompt": r["prompt"], "answer": r["answer"]} for r in rows])
    tr, ex = cfg.trainer, cfg.explorer
    ppo = cfg.algorithm.policy_loss.params

    def reward(completions, answer, **kwargs):
        return [reverse_reward(c, a) for c, a in zip(completions, answer)]

    reward.__name__ = "reverse"
    args = GRPOConfig(
        output_dir=workdir, max_steps=steps, per_device_train_batch_size=ex.group_size * tr.batch_groups,
        gradient_accumulation_steps=1, num_generations=ex.group_size, learning_rate=tr.lr,
        lr_scheduler_type="constant_with_warmup" if tr.warmup_steps else "constant", warmup_steps=tr.warmup_steps,
        weight_decay=tr.weight_decay, max_grad_norm=tr.grad_clip,
        num_iterations=tr.ppo_epochs, beta=cfg.algorithm.kl.coef, loss_type="dapo", scale_rewards="group",
        epsilon=ppo.get("clip_low", 0.2), epsilon_high=ppo.get("clip_high", 0.2),
        temperature=ex.sampling.temperature, top_p=1.0, top_k=0, max_completion_length=ex.sampling.max_new_tokens,
        bf16=False, fp16=False, use_cpu=True, seed=tr.seed, logging_steps=1, report_to=[], save_strategy="no",
        remove_unused_columns=False, dataloader_num_workers=0, disable_tqdm=True,
    )
    t_start = time.perf_counter()
    model, tokenizer = load_policy(model_dir, dtype="float32", device="cpu")
    engine = TransformersEngine(model_dir)
    log = {"eval_s": 0.0, "steps": [], "evals": [], "zero_std": []}

    def clock() -> float:
        return time.perf_counter() - t_start - log["eval_s"]

    def run_eval(step: int, m) -> None:
        t0 = time.perf_counter()
        engine.load_weights({k: v.detach() for k, v in m.state_dict().items()}, step)
        score = evaluate_run(engine, eval_tasks, cfg)
        log["evals"].append((step, score, clock()))
        log["eval_s"] += time.perf_counter() - t0
        print(f"trl: step {step:4d}  eval {score:.3f}  t {clock():6.1f}s", flush=True)

    class Timing(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **kw):
            run_eval(0, model)

        def on_step_end(self, args, state, control, model=None, **kw):
            log["steps"].append((state.global_step, clock()))
            if state.global_step % eval_every == 0:
                run_eval(state.global_step, model)

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "frac_reward_zero_std" in logs:
                log["zero_std"].append(logs["frac_reward_zero_std"])

    trainer = GRPOTrainer(model=model, processing_class=tokenizer, reward_funcs=[reward], args=args,
                          train_dataset=dataset, callbacks=[Timing()])
    from transformers.trainer_callback import PrinterCallback

    trainer.remove_callback(PrinterCallback)  # one dict per step: the eval lines and the summary say enough
    trainer.train()
    if not log["evals"] or log["evals"][-1][0] != log["steps"][-1][0]:
        run_eval(log["steps"][-1][0], trainer.model)
    import trl

    return {"version": trl.__version__, "threads": threads, **log}


def trl_side(a, model_dir: str, train: str, eval_path: str, workdir: str) -> dict:
    try:
        import trl  # noqa: F401
    except ImportError:
        cmd = [a.trl_python, __file__, "--_trl-worker", json.dumps([model_dir, train, eval_path, a.config, a.steps,
                                                                     a.eval_every, a.trl_threads, workdir])]
        out = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True, cwd=ROOT).stdout
        for line in out.splitlines():
            if line.startswith(RESULT_TAG):
                return json.loads(line[len(RESULT_TAG):])
            print(line, flush=True)
        raise RuntimeError("the TRL worker printed no result")
    return trl_job(model_dir, train, eval_path, a.config, a.steps, a.eval_every, a.trl_threads, workdir)


# ---------------------------------------------------------------------------------------- streamrft


def streamrft_side(a, model_dir: str, train: str, eval_path: str, workdir: str, scheduling: str) -> dict:
    """`streamrft run CONFIG` from the prepared checkpoint with `explorer.scheduling=scheduling`; its eval
    and version times from its TensorBoard log."""
    from streamrft.infra.stack import free_ports

    ports = free_ports()
    kafka, s3, weed = ports["kafka_port"], ports["s3_port"], ports["weed_port_base"]
    overrides = [f"model.path={model_dir}", "stages=[]", f"data.train={train}", f"data.eval={eval_path}",
                 f"output_dir={workdir}/streamrft-{scheduling}", f"stack.data_dir={workdir}/stack-{scheduling}",
                 f"stack.kafka_port={kafka}", f"stack.s3_port={s3}", f"stack.weed_port_base={weed}",
                 f"trainer.max_steps={a.steps}", f"eval.every_versions={a.eval_every}",
                 f"explorer.scheduling={scheduling}"]
    cmd = [sys.executable, "-m", "streamrft.cli", "run", a.config, *overrides]
    print("streamrft:", " ".join(cmd[2:]), flush=True)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    t_roles, out_dir, final, profile = None, None, None, ""
    for line in proc.stdout:
        print("  | " + line.rstrip(), flush=True)
        m = re.match(r"run (\S+): output (\S+); eval reward at start", line)
        if m:
            t_roles, out_dir = time.time(), m.group(2)
        if line.startswith("final:"):
            final = dict(kv.split("=", 1) for kv in line.split()[1:])
        if line.startswith("profile:"):
            profile = line.strip()
    rc = proc.wait()
    if rc != 0 or t_roles is None:
        raise RuntimeError(f"streamrft run exited with {rc}")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(Path(out_dir) / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    versions = [(e.wall_time - t_roles, int(e.value)) for e in acc.Scalars("trainer/version")]
    evals = [(int(v.value), r.value) for v, r in zip(acc.Scalars("eval/version"), acc.Scalars("eval/eval_reward"))]
    first_seen: dict[int, float] = {}
    for t, v in versions:
        first_seen.setdefault(v, t)
    tags = set(acc.Tags()["scalars"])
    # the trainer's own medians per step: waiting for data against computing (issue: wait <= compute)
    trainer = {k: statistics.median(e.value for e in acc.Scalars(f"trainer/{k}"))
               for k in ("wait_s", "step_s") if f"trainer/{k}" in tags}
    return {"versions": sorted(first_seen.items()), "evals": evals, "final": final, "trainer": trainer,
            "profile": profile}


# ------------------------------------------------------------------------------------------ report


def summarise_trl(r: dict, target: float) -> dict:
    steps = r["steps"]
    times = [0.0] + [t for _, t in steps]
    per = statistics.median(b - a for a, b in zip(times, times[1:]))
    hit = next(((s, t) for s, score, t in r["evals"] if score >= target), None)
    return {"to_target": None if hit is None else hit[1], "at": None if hit is None else hit[0], "per_step": per,
            "steps": steps[-1][0], "final_eval": r["evals"][-1][1], "start_eval": r["evals"][0][1],
            "train_s": steps[-1][1], "first": steps[0][1]}


def summarise_streamrft(r: dict, target: float) -> dict:
    seen = dict(r["versions"])
    vs = sorted(seen)
    per = statistics.median(seen[b] - seen[a] for a, b in zip(vs, vs[1:]) if b == a + 1)
    hit = next((v for v, score in r["evals"] if score >= target and v in seen), None)
    final = r["final"] or {}
    return {"to_target": None if hit is None else seen[hit], "at": hit, "per_step": per, "steps": vs[-1],
            "final_eval": float(final.get("eval_reward_end", "nan")), "start_eval": float(final.get("eval_reward_start", "nan")),
            "train_s": seen[vs[-1]], "first": seen[vs[0]]}


def print_mapping(cfg, a) -> None:
    tr, ex = cfg.trainer, cfg.explorer
    ppo = cfg.algorithm.policy_loss.params
    rows = [
        ("checkpoint", "prepared demo (build + 2 SFT stages)", "model.path=<same>, stages=[]"),
        ("tokenizer", "the checkpoint's (BOS + chars)", "the checkpoint's"),
        ("train / eval tasks", "data.train prompts; data.eval[:max_tasks]", "data.train, data.eval"),
        ("reward", "reverse_reward (streamrft)", "stream_ops.rewards: reverse"),
        ("eval", f"evaluate_run, greedy, every {a.eval_every} steps", f"evaluate_run, eval.every_versions={a.eval_every}"),
        ("group size", f"num_generations={ex.group_size}", f"explorer.group_size={ex.group_size}"),
        ("completions/step", f"per_device_train_batch_size={ex.group_size * tr.batch_groups}, grad_accum=1",
         f"trainer.batch_groups={tr.batch_groups} x {ex.group_size}"),
        ("steps", f"max_steps={a.steps}", f"trainer.max_steps={a.steps} (sync_interval={tr.sync_interval})"),
        ("optimiser", f"AdamW lr={tr.lr} constant, wd={tr.weight_decay}", f"AdamW lr={tr.lr}, wd={tr.weight_decay}"),
        ("lr warm-up", f"warmup_steps={tr.warmup_steps} (HF: update k at k/{tr.warmup_steps} of lr, the first at 0)"
         if tr.warmup_steps else "none", f"trainer.warmup_steps={tr.warmup_steps} (update k at (k+1)/"
         f"{tr.warmup_steps} of lr)" if tr.warmup_steps else "none"),
        ("grad clip", f"max_grad_norm={tr.grad_clip}", f"trainer.grad_clip={tr.grad_clip}"),
        ("PPO epochs", f"num_iterations={tr.ppo_epochs}", f"trainer.ppo_epochs={tr.ppo_epochs}"),
        ("clip", f"epsilon={ppo.get('clip_low', 0.2)}, epsilon_high={ppo.get('clip_high', 0.2)}",
         f"policy_loss {cfg.algorithm.policy_loss.type or 'ppo'} clip {ppo.get('clip_low', 0.2)}/{ppo.get('clip_high', 0.2)}"),
        ("KL", f"beta={cfg.algorithm.kl.coef}", f"algorithm.kl.coef={cfg.algorithm.kl.coef}"),
        ("aggregation", "loss_type=dapo (active tokens of the step)", "token-mean (grpo preset)"),
        ("advantage", "scale_rewards=group, (r-mean)/(std+1e-4)", "grpo: (r-mean)/(std+1e-6)"),
        ("sampling", f"temperature={ex.sampling.temperature}, top_p=1, top_k=0, max_completion_length="
         f"{ex.sampling.max_new_tokens}", f"explorer.sampling: temperature={ex.sampling.temperature}, "
         f"max_new_tokens={ex.sampling.max_new_tokens}"),
        ("dtype", "float32 (bf16=False)", f"model.dtype={cfg.model.dtype}"),
        ("zero-variance groups", "kept (advantage 0)", f"dropped and refilled (drop_zero_variance="
         f"{cfg.stream_ops.drop_zero_variance})"),
        ("staleness", "0 (generate, then train)", f"max_staleness={tr.max_staleness}"),
        ("processes / threads", f"1 process, {a.trl_threads} torch threads",
         f"{ex.num_explorers} explorers + stream ops + trainer (torch_threads={tr.torch_threads}) + stack"),
    ]
    w0, w1 = max(len(r[0]) for r in rows), max(len(r[1]) for r in rows)
    print(f"\n{'setting':<{w0}}  {'TRL GRPOTrainer':<{w1}}  streamrft")
    for name, t, s in rows:
        print(f"{name:<{w0}}  {t:<{w1}}  {s}")


def fmt(x, spec=".1f") -> str:
    return "-" if x is None else format(x, spec)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="examples/cpu_demo.yaml")
    p.add_argument("--steps", type=int, default=100, help="optimiser steps (TRL) and versions (streamrft)")
    p.add_argument("--eval-every", type=int, default=5)
    p.add_argument("--target", type=float, default=0.8)
    p.add_argument("--trl-threads", type=int, default=1)
    p.add_argument("--trl-python", default="/work/trl-venv/bin/python")
    p.add_argument("--skip-trl", action="store_true")
    p.add_argument("--skip-streamrft", action="store_true")
    p.add_argument("--scheduling", default="lockstep",
                   help="streamrft's explorer.scheduling, comma-separated for one streamrft run each: "
                        "lockstep, per_episode")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory")
    p.add_argument("--workdir", help="work here (kept; a demo prepared there before is reused) instead of a temporary directory")
    p.add_argument("--_trl-worker", dest="trl_worker", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.trl_worker:
        print(RESULT_TAG + json.dumps(trl_job(*json.loads(a.trl_worker))), flush=True)
        return 0

    from streamrft.config import load_config
    from streamrft.launch.prepare import prepare

    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} cores", flush=True)
    work = a.workdir or tempfile.mkdtemp(prefix="vs_trl-")
    a.keep = a.keep or bool(a.workdir)
    try:
        t0 = time.perf_counter()
        cfg = prepare(load_config(a.config, [f"output_dir={work}/prepared", f"trainer.max_steps={a.steps}"]))
        print(f"prepared {cfg.model.path} in {time.perf_counter() - t0:.0f} s", flush=True)
        model_dir, train, eval_path = cfg.model.path, cfg.data.train, cfg.data.eval
        print_mapping(cfg, a)
        res: dict[str, dict] = {}
        if not a.skip_trl:
            print("\n== TRL GRPOTrainer", flush=True)
            r = trl_side(a, model_dir, train, eval_path, f"{work}/trl")
            res["TRL"] = summarise_trl(r, a.target)
            zs = r["zero_std"]
            print(f"trl {r['version']}: mean frac_reward_zero_std {statistics.mean(zs) if zs else float('nan'):.2f} "
                  f"(groups a streamrft step would have dropped and refilled)", flush=True)
            print(f"load average after TRL: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
        for scheduling in [] if a.skip_streamrft else a.scheduling.split(","):
            name = "streamrft" if scheduling == "lockstep" else f"sr-{scheduling}"
            print(f"\n== streamrft run, explorer.scheduling={scheduling}", flush=True)
            r = streamrft_side(a, model_dir, train, eval_path, work, scheduling)
            res[name] = summarise_streamrft(r, a.target)
            print(f"{name} evals (version, reward):", " ".join(f"v{v}:{s:.2f}" for v, s in r["evals"]), flush=True)
            if {"wait_s", "step_s"} <= set(r["trainer"]):
                w, c = r["trainer"]["wait_s"], r["trainer"]["step_s"]
                print(f"{name} trainer per version (median): waiting for data {w:.3f} s, computing {c:.3f} s "
                      f"(wait / compute {w / c:.2f}, target <= 1)", flush=True)
            if r["profile"]:
                print(f"{name} {r['profile']}", flush=True)
            print(f"load average after {name}: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
        for s in res.values():
            s["after_first"] = None if s["to_target"] is None else s["to_target"] - s["first"]
        print(f"\n{'':<14} {'start eval':>10} {f's to eval>={a.target}':>14} {'(at step)':>9} {'first step s':>12} "
              f"{'s to it after':>13} {'s/step (median)':>16} {'steps':>6} {'train s':>8} {'final eval':>10}")
        for name, s in res.items():
            print(f"{name:<14} {s['start_eval']:>10.3f} {fmt(s['to_target']):>14} {fmt(s['at'], 'd'):>9} "
                  f"{s['first']:>12.1f} {fmt(s['after_first']):>13} "
                  f"{s['per_step']:>16.3f} {s['steps']:>6d} {s['train_s']:>8.1f} {s['final_eval']:>10.3f}")
        ratio = (lambda x, y: None if x is None or y is None else x / y)  # noqa: E731
        for name in [n for n in res if n != "TRL"] if "TRL" in res else []:
            t, s = res["TRL"], res[name]
            print(f"ratio {name}/TRL: seconds to eval>={a.target} {fmt(ratio(s['to_target'], t['to_target']), '.2f')}, "
                  f"the same counted from the first step/version {fmt(ratio(s['after_first'], t['after_first']), '.2f')}, "
                  f"seconds per step/version {fmt(ratio(s['per_step'], t['per_step']), '.2f')}, "
                  f"total train seconds {fmt(ratio(s['train_s'], t['train_s']), '.2f')}")
        print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    finally:
        if a.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
