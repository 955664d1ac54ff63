"""The trainer's time per step with publishing in the loop: `Trainer.run()` on pre-produced
experience groups (the CPU demo's model and batch unless overridden), so every step is collect +
train + that version's publishing (upload, checkpoint, announce, commit), as in a run.

    .venv/bin/python benchmarks/trainer_step_loop.py examples/cpu_demo.yaml [overrides ...] [--steps 30]

It starts its own embedded stack in a temporary directory and stops it. The interval between the
starts of consecutive `train_step` calls is one step's wall time; printed: median, mean, and the
median time the step loop spends outside `train_step` (collect + publish hand-off). Runs on any
commit of the trainer (it only wraps `train_step`), so before/after numbers come from one script.
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("config")
    ap.add_argument("overrides", nargs="*")
    ap.add_argument("--steps", type=int, default=30)
    args = ap.parse_args(argv)

    from streamrft.config import load_config
    from streamrft.consumers.trainer import Trainer
    from streamrft.infra.kafka import ensure_topics, flush_or_raise, make_producer, run_topics
    from streamrft.infra.stack import S3_KEY, EmbeddedStack, free_ports
    from streamrft.launch.prepare import prepare
    from streamrft.schemas import ExperienceGroup, Task, Trajectory, encode, topic_name

    tmp = Path(tempfile.mkdtemp(prefix="trainer-step-loop-"))
    stack = EmbeddedStack(tmp / "stack", buckets=("weights",), **free_ports())
    state = stack.up()
    try:
        cfg = load_config(args.config, [
            "stages=[]", "trainer.max_staleness=100000", "trainer.keep_versions=3", *args.overrides,
            f"trainer.max_steps={args.steps}", "stack.embedded=false", f"kafka.bootstrap={state.kafka}",
            f"s3.endpoint={state.s3}", f"s3.access_key={S3_KEY}", f"s3.secret_key={S3_KEY}", "s3.bucket=weights",
            f"output_dir={tmp / 'run'}", f"model.path={tmp / 'run' / 'base'}", "namespace=bench"])
        cfg = prepare(cfg)
        ensure_topics(cfg.kafka, run_topics(cfg.kafka, cfg.namespace))
        tc, n = cfg.trainer, cfg.explorer.group_size
        producer = make_producer(cfg.kafka)
        task = Task(prompt="rev abc=", answer="cba")
        for g in range(tc.batch_groups * args.steps):
            rewards = [float(i % 2) for i in range(n)]
            trajs = [Trajectory(traj_id=f"g{g}-{i}", group_id=f"g{g}", task_id=task.task_id, model_version=0,
                                prompt_ids=[1, 7, 4, 5, 6, 15], response_ids=[5, 4, 2, 3], logprobs=[-0.7, -0.9, -0.2, -0.4])
                     for i in range(n)]
            eg = ExperienceGroup(group_id=f"g{g}", task=task, trajectories=trajs, rewards=rewards,
                                 advantages=[r - 0.5 for r in rewards])
            producer.produce(topic_name(cfg.namespace, "experiences"), key=f"g{g}".encode(), value=encode(eg))
        flush_or_raise(producer)

        trainer = Trainer(cfg)
        starts, inside = [], []
        step = trainer.train_step

        def timed_step(samples):
            starts.append(time.perf_counter())
            out = step(samples)
            inside.append(time.perf_counter() - starts[-1])
            return out

        trainer.train_step = timed_step
        result = trainer.run()
        assert result["step"] == args.steps, result
        intervals = [b - a for a, b in zip(starts, starts[1:])][2:]  # the first steps warm up
        outside = [iv - t for iv, t in zip(intervals, inside[2:])]
        params = sum(p.numel() for p in trainer.model.parameters())
        print(f"{args.config} {' '.join(args.overrides)}: {params / 1e6:.2f} M parameters, {tc.batch_groups} groups x "
              f"{n} per step, {len(intervals)} steps timed")
        print(f"per step: median {statistics.median(intervals) * 1000:.1f} ms, mean {statistics.mean(intervals) * 1000:.1f} ms; "
              f"train_step median {statistics.median(inside[2:]) * 1000:.1f} ms; outside it (collect + publish) "
              f"median {statistics.median(outside) * 1000:.1f} ms")
        trainer.consumer.close()
    finally:
        stack.down()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
