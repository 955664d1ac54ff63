"""Where one version's time goes: generate / score / train / publish / checkpoint / load, each stage
run by the real code on the real stack, one after another in one process (no stage competes with
another for the cores), for a run config such as `examples/smollm2_cpu.yaml`.

    .venv/bin/python benchmarks/version_profile.py examples/smollm2_cpu.yaml [overrides ...] [--repeats 3]

- generate: the explorer's workflow (chat template, the config's sampling) on `tasks_per_batch`
  tasks x `group_size` samples, with the explorer's `torch_threads`;
- score: stream ops' reward terms and advantages on those groups;
- train: `Trainer.train_step` on `batch_groups` scored groups (the trainer's threads);
- publish: the version's weights (`publishable_state_dict`) uploaded to the S3 store;
- checkpoint: the trainer's checkpoint (weights, optimiser state) written to local disk;
- load: an explorer's fetch of that version from S3 (download, checksum, safetensors load) and
  the copy into its live model.

It starts its own embedded stack in a temporary directory and stops it. Medians of `--repeats`
after one warm-up; each stage's share of the sum, and the bytes a version moves.
"""
from __future__ import annotations

import argparse
import gc
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch


def timed(fn, repeats: int):
    fn()  # warm-up
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("config")
    ap.add_argument("overrides", nargs="*")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)

    from streamrft.config import load_config
    from streamrft.consumers import checkpoint
    from streamrft.consumers.trainer import Trainer
    from streamrft.engine.lora import LoraSpec
    from streamrft.engine.rollout import engine_from_config
    from streamrft.engine.rollout.base import SamplingParams
    from streamrft.engine.weights import fetch_state_dict, publish_state_dict
    from streamrft.infra.stack import S3_KEY, EmbeddedStack, free_ports
    from streamrft.launch.prepare import prepare
    from streamrft.producers.tasks import load_task_file
    from streamrft.producers.workflows import make_workflow
    from streamrft.stream_ops.scoring import build_scorer

    tmp = Path(tempfile.mkdtemp(prefix="version-profile-"))
    stack = EmbeddedStack(tmp / "stack", buckets=("weights",), **free_ports())
    state = stack.up()
    try:
        # every group scored, none dropped for equal rewards: the train stage needs groups
        cfg = load_config(args.config, [
            "stream_ops.drop_zero_variance=false", *args.overrides, "stack.embedded=false",
            f"kafka.bootstrap={state.kafka}", f"s3.endpoint={state.s3}", f"s3.access_key={S3_KEY}",
            f"s3.secret_key={S3_KEY}", "s3.bucket=weights", f"output_dir={tmp / 'run'}"])
        cfg = prepare(cfg)
        ex, tc = cfg.explorer, cfg.trainer
        tasks = load_task_file(cfg.data.train, cfg.data.prompt_key, cfg.data.answer_key)
        print(f"model {cfg.model.path} ({cfg.model.dtype}), {ex.tasks_per_batch} tasks x {ex.group_size} samples, "
              f"max_new_tokens {ex.sampling.max_new_tokens}, train {tc.batch_groups} groups; threads: explorer "
              f"{ex.torch_threads}, trainer {tc.torch_threads}; median of {args.repeats}")

        trainer = Trainer(cfg)  # loads the policy, its optimiser; talks to the stack's Kafka and S3
        torch.set_num_threads(ex.torch_threads)
        engine = engine_from_config(cfg)
        workflow = make_workflow(ex)
        s = ex.sampling
        params = SamplingParams(n=ex.group_size, max_new_tokens=s.max_new_tokens, temperature=s.temperature,
                                top_p=s.top_p, top_k=s.top_k)
        batches = iter(range(10**6))

        def generate():
            i = next(batches) * ex.tasks_per_batch % (len(tasks) - ex.tasks_per_batch)
            return workflow(engine, tasks[i: i + ex.tasks_per_batch], params, version=0, team=ex.team,
                            chat=ex.chat_template)

        t_gen, groups = timed(generate, args.repeats)
        n_tokens = sum(len(t.response_ids) for g in groups for t in g.trajectories)
        scorer = build_scorer(cfg)
        t_score, scored = timed(lambda: [scorer(g) for g in groups], args.repeats)
        samples = [(t, a, r) for eg in (scored * tc.batch_groups)[: tc.batch_groups]
                   for t, a, r in zip(eg.trajectories, eg.advantages, eg.rewards)]
        torch.set_num_threads(tc.torch_threads)
        t_train, _ = timed(lambda: trainer.train_step(samples), args.repeats)
        weights = trainer.engine.publishable_state_dict()
        unique = {t.data_ptr(): t for t in weights.values()}  # a tied output head is published once
        n_bytes = sum(t.numel() * t.element_size() for t in unique.values())
        versions = iter(range(1, 10**6))
        t_publish, _ = timed(lambda: publish_state_dict(trainer.store, cfg.weights_key, next(versions), weights,
                                                        meta=trainer._version_meta()), args.repeats)
        ckpt = tmp / "ckpt"

        def save_checkpoint():
            shutil.rmtree(ckpt, ignore_errors=True)
            checkpoint.save(ckpt, trainer.state, trainer._write_checkpoint, trained=[])

        t_ckpt, _ = timed(save_checkpoint, args.repeats)
        ckpt_bytes = sum(f.stat().st_size for f in ckpt.rglob("*") if f.is_file())
        torch.set_num_threads(ex.torch_threads)

        def load():
            weights, meta = fetch_state_dict(trainer.store, cfg.weights_key, 1, tmp / "cache")
            engine.load_weights(weights, 1, lora=LoraSpec.from_manifest(meta))

        t_load, _ = timed(load, args.repeats)
        rows = [("generate", t_gen, f"{len(groups) * ex.group_size} samples, {n_tokens} tokens, "
                                    f"{n_tokens / t_gen:.1f} tok/s"),
                ("score", t_score, f"{len(groups)} groups"),
                ("train", t_train, f"{len(samples)} trajectories, forward + backward + optimiser step"),
                ("publish", t_publish, f"{n_bytes / 2**20:.1f} MiB to S3, {n_bytes / 2**20 / t_publish:.0f} MiB/s"),
                ("checkpoint", t_ckpt, f"{ckpt_bytes / 2**20:.1f} MiB to disk"),
                ("load", t_load, "fetch from S3, verify, copy into the explorer's model")]
        total = sum(t for _, t, _ in rows)
        print(f"{'stage':<11} {'seconds':>8} {'share':>6}  what")
        for name, t, what in rows:
            print(f"{name:<11} {t:8.2f} {t / total:6.1%}  {what}")
        print(f"{'sum':<11} {total:8.2f}")
        trainer.consumer.close()
        trainer = None  # drops its producer before the broker goes away
        gc.collect()
    finally:
        stack.down()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
