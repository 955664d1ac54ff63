"""Trainer checkpoints on local disk: model + optimiser + the state that makes resume exact.

`<dir>/v<N>/` holds the weights, `optimizer.pt` and `state.json` (version, step, the next
offset of every experiences partition, the window of trained trajectory ids, counters).
A checkpoint directory is written under a temporary name and renamed, then `LATEST` is swapped
atomically; a crash at any point leaves the previous checkpoint intact.
"""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class TrainerState:
    version: int = 0
    step: int = 0
    offsets: dict[str, int] = field(default_factory=dict)  # "topic:partition" -> next offset
    seen: dict[str, int] = field(default_factory=dict)     # traj_id -> model_version
    counts: dict[str, int] = field(default_factory=dict)


def _fsync_write(path: Path, data: str) -> None:
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def latest(ckpt_dir: Path) -> tuple[Path, TrainerState] | None:
    pointer = Path(ckpt_dir) / "LATEST"
    if not pointer.exists():
        return None
    d = Path(ckpt_dir) / pointer.read_text().strip()
    return d, TrainerState(**json.loads((d / "state.json").read_text()))


def save(ckpt_dir: Path, state: TrainerState, write_model, keep: int = 2, is_main: bool = True,
         barrier=lambda: None) -> Path:
    """`write_model(dir)` writes weights and optimiser; then state.json; then LATEST.

    With several data-parallel ranks every rank calls this (DeepSpeed writes its shards
    collectively); only the main rank creates, finalises and prunes directories.
    """
    ckpt_dir = Path(ckpt_dir)
    final = ckpt_dir / f"v{state.version}"
    tmp = ckpt_dir / f".tmp-v{state.version}"
    if is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    barrier()
    write_model(tmp)
    barrier()
    if not is_main:
        return final
    _fsync_write(tmp / "state.json", json.dumps(state.__dict__))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    _fsync_write(ckpt_dir / "LATEST", final.name)
    versions = sorted((p for p in ckpt_dir.glob("v*") if p.is_dir()), key=lambda p: int(p.name[1:]))
    for old in versions[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final
