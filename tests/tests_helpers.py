"""Helpers shared by the end-to-end tests (not a test module)."""
from __future__ import annotations

from pathlib import Path


def demo_overrides(stack, out: Path, extra: list[str] = ()) -> list[str]:
    return [
        "stack.embedded=false", f"kafka.bootstrap={stack.kafka.bootstrap}", f"s3.endpoint={stack.s3.endpoint}",
        f"s3.access_key={stack.s3.access_key}", f"s3.secret_key={stack.s3.secret_key}", f"output_dir={out}",
        f"model.path={out / 'base'}", "model.build={hidden_size: 32, layers: 1, heads: 2, seed: 0}",
        "stages=[{type: sft, steps: 20, batch_size: 16, lr: 0.003, data: {size: 200, synthetic: {min_len: 1, max_len: 3}}}]",
        "data.synthetic={task: reverse, train_size: 300, eval_size: 20, min_len: 3, max_len: 5, seed: 0}",
        "explorer.group_size=4", "explorer.tasks_per_batch=4", "explorer.sampling.max_new_tokens=8",
        "trainer.batch_groups=4", "trainer.max_staleness=1", "eval.every_versions=2", "eval.max_tasks=20",
        *extra,
    ]
