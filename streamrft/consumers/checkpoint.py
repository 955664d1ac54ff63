"""Trainer checkpoints on local disk: model + optimiser + the state that makes resume exact.

`<dir>/v<N>/` holds the weights (with LoRA the adapter alone, `adapter.safetensors`),
`optimizer.pt`, `trained.json` (the trajectory ids trained in version N) and, written last,
`state.json` (version, step, the next offset of every experiences partition, the window of
trained trajectory ids, counters, the replay buffer's members by log location). A directory is written as
`.tmp-v<N>`, fsynced and renamed, so a `v<N>` with `state.json` is complete; pruning renames a
directory away before deleting it. `latest()` picks the highest complete `v<N>`; `LATEST` is
still written for people and scripts, but nothing trusts it: a crash between the rename and the
pointer update, or a second writer, used to send a restarted trainer back to an old version.
`audit/v<N>.json` copies `trained.json` once v<N> is durable: the union over the audit files is
exactly what the durable versions trained. A deliberate reuse by the replay buffer
(`trainer.replay_buffer`) is recorded as `<traj_id>#r<k>` (its k-th replay), so each plain id is
still in the trail once and each reuse is counted.

With `trainer.checkpoint_every` K > 1 a checkpoint comes every K versions, and its `trained.json`
holds the ids trained since the previous checkpoint (every step of those K versions), so the audit
trail is still one file per checkpoint and their union is the lineage of the newest checkpoint's
weights. Versions published between checkpoints are not in the trail until the checkpoint after
them is durable. After a crash between checkpoints the trainer resumes from the last one: the
steps since are redone (under new, higher version numbers) and the ids they train are trained
again, which is no double training, since the weights that held them (the versions after the
checkpoint) are not in the lineage any more; `sync_audit` drops any audit file above the
checkpoint it resumes from, so the trail never holds a lost branch.

`save` = `write` (the engine's files into `.tmp-v<N>`, collective under DeepSpeed) then `finalize`
(trained.json, state.json, fsync, rename, audit, pruning; the main rank only). The trainer splits
them: it writes while it owns the weights and finalizes once the version is in S3 (`Publisher`).
"""
from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

STATE = "state.json"
TRAINED = "trained.json"
AUDIT = "audit"
_VERSION_DIR = re.compile(r"^v(\d+)$")


@dataclass
class TrainerState:
    version: int = 0
    step: int = 0
    offsets: dict[str, int] = field(default_factory=dict)  # "topic:partition" -> next offset
    seen: dict[str, int] = field(default_factory=dict)     # traj_id -> model_version
    counts: dict[str, int] = field(default_factory=dict)
    replay_buffer: list[dict] = field(default_factory=list)  # `ReplayBuffer.members()`: re-read from the log


class CheckpointBusyError(RuntimeError):
    """Another process holds the checkpoint directory: two trainers must never write one."""


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_write(path: Path, data: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _fsync_tree(root: Path) -> None:
    """Flush every file the engine wrote (torch and safetensors do not fsync) before the rename."""
    for dirpath, _, files in os.walk(root):
        for name in files:
            with open(Path(dirpath) / name, "rb") as fh:
                os.fsync(fh.fileno())
        _fsync_dir(Path(dirpath))


def _discard(path: Path) -> None:
    """Delete a directory so that a crash half-way never leaves a `v<N>` that looks complete."""
    doomed = path.with_name(f".del-{path.name}-{uuid.uuid4().hex[:8]}")
    os.replace(path, doomed)
    shutil.rmtree(doomed, ignore_errors=True)


def _version_dirs(ckpt_dir: Path) -> list[tuple[int, Path]]:
    if not ckpt_dir.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in ckpt_dir.iterdir() if (m := _VERSION_DIR.match(p.name)) and p.is_dir()]
    return sorted(found)


def latest(ckpt_dir: Path) -> tuple[Path, TrainerState] | None:
    """The highest complete checkpoint (its state.json readable), whatever LATEST says."""
    for version, d in reversed(_version_dirs(Path(ckpt_dir))):
        try:
            return d, TrainerState(**json.loads((d / STATE).read_text()))
        except FileNotFoundError:
            continue  # incomplete: an older writer's leftover
        except (OSError, ValueError, TypeError) as e:
            log.warning("skipping unreadable checkpoint %s: %s", d, e)
    return None


def lock(ckpt_dir: Path) -> int:
    """Hold `<dir>/LOCK` for the life of the process (the kernel frees it even on kill -9).

    A second trainer on the same directory, say a predecessor that hung and was presumed dead,
    would write older versions over newer ones; it fails here instead.
    """
    ckpt_dir = Path(ckpt_dir)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(ckpt_dir / "LOCK", os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 64, 0).decode(errors="replace").strip()
        os.close(fd)
        raise CheckpointBusyError(f"{ckpt_dir} is in use by another trainer (pid {holder or '?'})") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    return fd


def unlock(fd: int) -> None:
    os.close(fd)  # closing the descriptor releases the flock


def sync_audit(ckpt_dir: Path, checkpoint: Path, version: int, drop_higher: bool = True) -> None:
    """Make `audit/` match the durable checkpoint `checkpoint` of `version`.

    Copies its `trained.json` to `audit/v<version>.json` (re-creating it after a crash between
    the checkpoint's rename and the copy) and, with `drop_higher`, removes audit files of higher
    versions: they belong to versions that were not durable and will be trained again. That
    lists the folder (a file per checkpoint of the run): a trainer does it once, its versions
    only grow after that.
    """
    audit = Path(ckpt_dir) / AUDIT
    audit.mkdir(parents=True, exist_ok=True)
    src = checkpoint / TRAINED
    if src.exists():
        _fsync_write(audit / f"v{version}.json", src.read_text())
    if not drop_higher:
        return
    for f in audit.glob("v*.json"):
        m = _VERSION_DIR.match(f.stem)
        if m and int(m.group(1)) > version:
            f.unlink()


def save(ckpt_dir: Path, state: TrainerState, write_model, trained: list[str] | None = None, keep: int = 2,
         is_main: bool = True, barrier=lambda: None) -> Path:
    """`write_model(dir)` writes weights and optimiser; then trained.json, state.json, the rename,
    the audit copy, LATEST, and pruning to the newest `keep` checkpoints.

    With several data-parallel ranks every rank calls this (DeepSpeed writes its shards
    collectively); only the main rank creates, finalises and prunes directories.
    """
    tmp = write(ckpt_dir, state.version, write_model, is_main=is_main, barrier=barrier)
    if not is_main:
        return Path(ckpt_dir) / f"v{state.version}"
    return finalize(ckpt_dir, tmp, state, trained, keep)


def write(ckpt_dir: Path, version: int, write_model, is_main: bool = True, barrier=lambda: None) -> Path:
    """`write_model(<dir>/.tmp-v<version>)` on every rank; the directory made by the main rank."""
    tmp = Path(ckpt_dir) / f".tmp-v{version}"
    if is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    barrier()
    write_model(tmp)
    barrier()
    return tmp


def finalize(ckpt_dir: Path, tmp: Path, state: TrainerState, trained: list[str] | None = None, keep: int = 2,
             drop_higher_audit: bool = True) -> Path:
    """Make `tmp` (from `write`) the durable checkpoint `v<state.version>` (main rank only);
    `drop_higher_audit`: `sync_audit`'s `drop_higher`."""
    ckpt_dir = Path(ckpt_dir)
    final = ckpt_dir / f"v{state.version}"
    (tmp / TRAINED).write_text(json.dumps(trained or []))
    (tmp / STATE).write_text(json.dumps(state.__dict__))
    _fsync_tree(tmp)
    if final.exists():  # this version redone after a crash before its checkpoint was durable
        _discard(final)
    os.replace(tmp, final)
    _fsync_dir(ckpt_dir)
    sync_audit(ckpt_dir, final, state.version, drop_higher=drop_higher_audit)
    _fsync_write(ckpt_dir / "LATEST", final.name)
    older = [d for v, d in _version_dirs(ckpt_dir) if v < state.version]
    complete = [d for d in older if (d / STATE).exists()]
    kept = set(complete[max(0, len(complete) - (keep - 1)):]) if keep > 1 else set()
    for d in older:
        if d not in kept:
            _discard(d)
    for junk in [*ckpt_dir.glob(".del-*"), *(p for p in ckpt_dir.glob(".tmp-v*") if p != tmp)]:
        shutil.rmtree(junk, ignore_errors=True)  # left by a crash mid-delete or mid-write
    return final
