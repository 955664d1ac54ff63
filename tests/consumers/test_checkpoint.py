"""Trainer checkpoints on disk: resume from the newest complete one whatever LATEST says, prune
without ever leaving a half-deleted checkpoint that looks complete, keep the audit trail in step
with what is durable, and refuse a second writer."""
from __future__ import annotations

import json
import os
import shutil

import pytest

from streamrft.consumers.checkpoint import (
    CheckpointBusyError,
    TrainerState,
    latest,
    lock,
    save,
    sync_audit,
    unlock,
)


def _weights(directory) -> None:
    (directory / "model.safetensors").write_bytes(b"weights")


def _save(ckpt, version: int, keep: int = 2, trained=None):
    return save(ckpt, TrainerState(version=version, step=version), _weights, trained=trained or [f"t{version}"],
                keep=keep)


def test_latest_is_the_newest_complete_checkpoint_whatever_latest_says(tmp_path):
    assert latest(tmp_path / "none") is None
    for v in (1, 2, 3, 10):
        _save(tmp_path, v, keep=10)
    assert latest(tmp_path)[1].version == 10  # numeric order: v10 after v3
    (tmp_path / "LATEST").write_text("v2")  # a crash between the rename and the pointer update
    assert latest(tmp_path)[1].version == 10
    (tmp_path / "LATEST").write_text("v7")  # a pointer to a pruned directory
    assert latest(tmp_path)[1].version == 10
    (tmp_path / "LATEST").unlink()
    assert latest(tmp_path)[1].version == 10

    # what is not a complete checkpoint never wins: a directory without state.json (left by an
    # old-style prune), one still being written, one being deleted, an unreadable state
    (tmp_path / "v11").mkdir()
    _weights(tmp_path / "v11")
    shutil.copytree(tmp_path / "v10", tmp_path / ".tmp-v12")
    shutil.copytree(tmp_path / "v10", tmp_path / ".del-v13-0000")
    (tmp_path / "v14").mkdir()
    (tmp_path / "v14" / "state.json").write_text('{"version": 14, "st')
    path, state = latest(tmp_path)
    assert (path.name, state.version, state.step) == ("v10", 10, 10)


def test_save_keeps_the_newest_and_cleans_up_after_crashes(tmp_path):
    (tmp_path / ".tmp-v1").mkdir(parents=True)  # a crash mid-write of an earlier run
    (tmp_path / ".del-v0-1234").mkdir()         # a crash mid-delete
    for v in range(5):
        final = _save(tmp_path, v)
    assert final == tmp_path / "v4"
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["audit", "v3", "v4"]
    assert (tmp_path / "LATEST").read_text() == "v4"
    assert json.loads((tmp_path / "v4" / "state.json").read_text())["version"] == 4
    assert json.loads((tmp_path / "v4" / "trained.json").read_text()) == ["t4"]


def test_audit_trail_holds_exactly_the_durable_versions(tmp_path):
    for v in range(3):
        _save(tmp_path, v)
    audit = tmp_path / "audit"
    assert {f.name: json.loads(f.read_text()) for f in audit.glob("v*.json")} == {
        "v0.json": ["t0"], "v1.json": ["t1"], "v2.json": ["t2"]}
    # a crash after v2's rename, before its audit copy; and a file of a version that never was durable
    (audit / "v2.json").unlink()
    (audit / "v3.json").write_text('["lost"]')
    sync_audit(tmp_path, tmp_path / "v2", 2)  # what a resuming trainer does
    assert json.loads((audit / "v2.json").read_text()) == ["t2"]
    assert not (audit / "v3.json").exists()
    # a version redone after a crash (its first checkpoint complete, LATEST not yet moved)
    _save(tmp_path, 2, trained=["t2-redone"])
    assert json.loads((audit / "v2.json").read_text()) == ["t2-redone"]
    assert latest(tmp_path)[1].version == 2
    # after its first checkpoint a trainer's versions only grow: it copies without listing the folder
    (audit / "v9.json").write_text('["lost"]')
    sync_audit(tmp_path, tmp_path / "v2", 2, drop_higher=False)
    assert (audit / "v9.json").exists() and json.loads((audit / "v2.json").read_text()) == ["t2-redone"]
    sync_audit(tmp_path, tmp_path / "v2", 2)
    assert not (audit / "v9.json").exists()


def test_a_second_trainer_on_the_same_directory_is_refused(tmp_path):
    fd = lock(tmp_path)
    with pytest.raises(CheckpointBusyError, match=str(os.getpid())):
        lock(tmp_path)
    unlock(fd)
    unlock(lock(tmp_path))  # free again once the first let go (or died: the kernel frees it)
