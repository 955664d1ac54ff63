"""Roles killed with pictures in flight: the vision-language loop (`examples/vlm_cpu.yaml`, shrunk) as
separate role processes on the real stack, each explorer, the stream-ops worker and the trainer
killed with SIGKILL once while groups of picture tasks are on their way, and the run's local image
cache wiped before each restart (a role restarted on a fresh machine fetches every picture again
from S3 by its reference).

Afterwards, from durable records only (`loop_helpers.check_loop_accounting`): every version made
and announced, every rollout group an experience or a zero-variance group, no dead letter (no
picture lost or half-read), nothing trained twice; and every trajectory's pictures are in S3 under
their sha256, as the task file drew them.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import time
from pathlib import Path

import pytest

from loop_helpers import Roles, check_loop_accounting
from streamrft.config import dump_config, load_config
from streamrft.infra.stack import pid_alive
from streamrft.launch.roles import start_server
from streamrft.schemas import RolloutGroup, decode, topic_name
from tests_helpers import read_all, stack_overrides, trainer_version

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "vlm_cpu.yaml"
MAX_STEPS = 12
VICTIMS = ["explorer-0", "stream-ops", "trainer", "explorer-1"]

pytestmark = pytest.mark.slow


def test_roles_killed_with_pictures_in_flight_lose_nothing_and_train_nothing_twice(stack, tmp_path):
    from streamrft.infra.kafka import ensure_topics, run_topics
    from streamrft.infra.media import MediaStore
    from streamrft.launch.prepare import prepare

    cfg = load_config(EXAMPLE, [
        *stack_overrides(stack, tmp_path), f"namespace=vlm-restart-{os.getpid()}",
        "model.build={hidden_size: 32, layers: 1, heads: 2, seed: 0, vision: {hidden_size: 32, layers: 1, heads: 2}}",
        "data.synthetic={task: images, train_size: 120, eval_size: 12, seed: 0}", "stages=[]",
        "explorer.num_explorers=2", "explorer.group_size=4", "explorer.tasks_per_batch=4", "trainer.batch_groups=4",
        "trainer.max_staleness=1", "stream_ops.drop_zero_variance=false", f"trainer.max_steps={MAX_STEPS}",
        "trainer.keep_versions=1000", "eval.every_versions=0"])
    cfg = prepare(cfg)
    config = tmp_path / "config.yaml"
    config.write_text(dump_config(cfg))
    ns, ckpt, cache = cfg.namespace, Path(cfg.output_dir) / "trainer", Path(cfg.output_dir) / "cache" / "media"
    ensure_topics(stack.kafka, run_topics(stack.kafka, ns, [cfg.explorer.team]))

    start_server()
    roles = Roles(config, tmp_path / "logs")
    for name in roles.args:
        roles.start(name)
    kills = []
    try:
        version = trainer_version(ckpt)
        for victim in VICTIMS:  # each once the trainer has moved on since the last kill
            version = roles.wait_for_a_version(ckpt, version, 240, f"kills {kills}", not_before=time.monotonic() + 2)
            roles.kill(victim)
            shutil.rmtree(cache, ignore_errors=True)  # restarted on a fresh machine: no picture cached
            kills.append(f"{victim}@v{version}")
            roles.start(victim)
        roles.wind_down(stack.kafka, ns, cfg.explorer.team)
    finally:
        roles.kill_all()
    print("kills:", ", ".join(kills), "; exits besides the kills", roles.exits)
    assert len(kills) == len(VICTIMS)
    assert not any(pid_alive(pid) for pid in roles.pids), "a role process is still running"
    check_loop_accounting(cfg, stack.kafka, ckpt, MAX_STEPS, tmp_path / "logs", f"kills {kills}")

    # every picture a trajectory names is in S3 under its own sha256 (fetched past any cache)
    media = MediaStore(cfg.s3, ns, tmp_path / "check-cache")
    groups = [decode(m.value(), RolloutGroup) for m in read_all(stack.kafka, topic_name(ns, "rollouts", cfg.explorer.team))]
    refs = {r.sha256: r for g in groups for t in g.trajectories for r in t.images}
    assert refs and all(len(t.images) == 1 for g in groups for t in g.trajectories)
    for sha, ref in refs.items():
        assert hashlib.sha256(media.get(ref)).hexdigest() == sha
