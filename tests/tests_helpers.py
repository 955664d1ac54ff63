"""Helpers shared by the end-to-end tests (not a test module)."""
from __future__ import annotations

from pathlib import Path


def stack_overrides(stack, out: Path) -> list[str]:
    """A run on the test's stack, writing under `out`, with a tiny char model built at `out/base`."""
    return [
        "stack.embedded=false", f"kafka.bootstrap={stack.kafka.bootstrap}", f"s3.endpoint={stack.s3.endpoint}",
        f"s3.access_key={stack.s3.access_key}", f"s3.secret_key={stack.s3.secret_key}", f"output_dir={out}",
        f"model.path={out / 'base'}", "model.build={hidden_size: 32, layers: 1, heads: 2, seed: 0}",
        "monitor.dashboard.port=0",  # runs side by side never race for the dashboard's port
        "fork_roles=true",  # roles forked from one process that imported torch once: CI spends ~5 s less CPU a role
    ]


def demo_overrides(stack, out: Path, extra: list[str] = ()) -> list[str]:
    return [
        *stack_overrides(stack, out),
        "stages=[{type: sft, steps: 20, batch_size: 16, lr: 0.003, data: {size: 200, synthetic: {min_len: 1, max_len: 3}}}]",
        "data.synthetic={task: reverse, train_size: 300, eval_size: 20, min_len: 3, max_len: 5, seed: 0}",
        "explorer.group_size=4", "explorer.tasks_per_batch=4", "explorer.sampling.max_new_tokens=8",
        "trainer.batch_groups=4", "trainer.max_staleness=1", "eval.every_versions=2", "eval.max_tasks=20",
        *extra,
    ]


def read_all(kafka, topic: str, deadline_s: float = 60.0) -> list:
    """Every record of `topic`, read from the start of each partition up to its true end
    (`infra.kafka.read_topic`)."""
    from streamrft.infra.kafka import read_topic

    return read_topic(kafka, topic, deadline_s)


def trainer_version(ckpt: Path) -> int:
    """The version of the trainer's newest complete checkpoint under `ckpt` (-1 before the first):
    the highest `v<N>` with a `state.json`, as the trainer itself resumes (not the LATEST pointer)."""
    import re

    done = [int(m.group(1)) for d in Path(ckpt).glob("v*")
            if (m := re.fullmatch(r"v(\d+)", d.name)) and (d / "state.json").exists()]
    return max(done, default=-1)


def stop_all(procs: dict, timeout: float = 30.0) -> None:
    """SIGTERM every process still running, then wait; kill -9 what outlives `timeout`."""
    import signal
    import subprocess

    for p in procs.values():
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs.values():
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


class Countdown:
    """A user's environment, the envs package docstring's example: say start, ..., 1, one per turn.
    Tests load it by `import_path: "tests_helpers:Countdown"`, as a user's config would."""

    def __init__(self, start: int = 3):
        self.start = start

    def reset(self, task) -> str:
        self.next = self.start
        return task.prompt

    def step(self, action: str):
        from streamrft.producers.envs.base import StepResult

        if action.strip() != str(self.next):
            return StepResult("wrong", 0.0, True, {"reached": self.next})
        self.next -= 1
        if self.next == 0:
            return StepResult("done", 1.0, True, {})
        return StepResult(" next:", 0.0, False, {})


def process_tree(pid: int) -> list[int]:
    """`pid` and every process descended from it, parents first, read from /proc. Children that
    torchrun starts run in sessions of their own: only the parent links find them, so take this
    while the parents are alive."""
    import os

    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    tree, todo = [], [pid]
    while todo:
        p = todo.pop(0)
        tree.append(p)
        todo += children.get(p, [])
    return tree


def kill_tree(pids: list[int]) -> None:
    """SIGKILL each of `pids` (a `process_tree` snapshot) that still runs."""
    import os
    import signal

    from streamrft.infra.stack import pid_alive

    for pid in pids:
        if pid_alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def random_samples(n: int, seed: int, vocab: int) -> list[tuple]:
    """`n` (trajectory, advantage, reward) of varied prompt and response lengths, the same for a seed."""
    import random

    from streamrft.schemas import Trajectory

    rng = random.Random(seed)
    out = []
    for i in range(n):
        prompt = [1] + [rng.randrange(4, vocab) for _ in range(rng.randint(2, 6))]
        response = [rng.randrange(4, vocab) for _ in range(rng.randint(1, 7))]
        t = Trajectory(traj_id=f"s{seed}-{i}", group_id=f"g{seed}", task_id=f"t{seed}", model_version=0,
                       prompt_ids=prompt, response_ids=response,
                       logprobs=[-rng.uniform(0.5, 4.0) for _ in response])
        out.append((t, rng.uniform(-1.5, 1.5), rng.random()))
    return out


def update_loop(cfg, engine, ref_model, tokenizer, world: int = 1):
    """`consumers.update.UpdateLoop` on `engine` without the rest of a Trainer (no Kafka, no S3):
    `train_step(samples)` as the trainer makes it (no batch-level advantage)."""
    from streamrft.consumers.checkpoint import TrainerState
    from streamrft.consumers.update import Objective, UpdateLoop

    loop = UpdateLoop()
    loop.cfg, loop.tc, loop.engine, loop.model = cfg, cfg.trainer, engine, engine.model
    loop.objective, loop.batch_advantage, loop.reward_kl = Objective(cfg), None, None
    loop.ref_model = ref_model if loop.objective.kl_fn is not None else None
    loop.tokenizer, loop.device, loop.world = tokenizer, "cpu", world
    loop.state, loop.update_metrics = TrainerState(), []
    return loop


def wait_for(predicate, timeout: float, what: str, every: float = 0.05):
    """`predicate()`'s first truthy value, polled every `every` s; AssertionError naming `what` after `timeout`."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def read_tensorboard(logdir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar series written under `logdir` (all its event files): tag -> [(step, value)]."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
