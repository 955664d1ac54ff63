"""Offline SFT, DPO and KTO on the committed example data with a tiny model: the losses fall,
the result is saved in HF format, published to the real embedded S3 when asked, and an SFT
stage's output loads as a policy."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from streamrft.config import RunConfig, StageConfig
from streamrft.consumers.offline import OfflineTrainer, ensure_model, sft_stage
from streamrft.engine.models import load_policy
from tests_helpers import read_tensorboard

DATA = Path(__file__).resolve().parents[2] / "examples" / "data"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    cfg = make_cfg(tmp_path_factory.mktemp("model") / "tiny", "sft", "sft.jsonl", "unused")
    return ensure_model(cfg)


def make_cfg(model_path, algo: str, data: str, out, steps: int = 24, lr: float = 3e-3, **params) -> RunConfig:
    return RunConfig.model_validate({
        "output_dir": str(out),
        "model": {"path": str(model_path), "build": {"hidden_size": 32, "layers": 1, "heads": 2}},
        "data": {"train": str(DATA / data)},
        "trainer": {"micro_batch_size": 8, "max_steps": steps, "lr": lr},
        "algorithm": {"type": algo, "policy_loss": {"params": params}},
    })


def first_vs_last(losses: list[float]) -> tuple[float, float]:
    return sum(losses[:3]) / 3, sum(losses[-3:]) / 3


def test_sft_lowers_its_loss_and_saves_hf(model_dir, tmp_path):
    result = OfflineTrainer(make_cfg(model_dir, "sft", "sft.jsonl", tmp_path)).run()
    first, last = first_vs_last(result["losses"])
    assert len(result["losses"]) == 24 and last < first - 0.3
    # monitor.backends' default, TensorBoard, holds every step's loss under the trainer's name
    logged = read_tensorboard(tmp_path / "tensorboard")["trainer/loss"]
    assert logged == [(i + 1, pytest.approx(loss, rel=1e-6)) for i, loss in enumerate(result["losses"])]
    model, tok = load_policy(result["final_dir"])
    assert tok.eos_token_id == 2 and model.config.hidden_size == 32


def test_dpo_lowers_its_loss(model_dir, tmp_path):
    result = OfflineTrainer(make_cfg(model_dir, "dpo", "prefs.jsonl", tmp_path, beta=0.5)).run()
    first, last = first_vs_last(result["losses"])
    assert abs(result["losses"][0] - 0.6931) < 1e-3  # policy == reference at step 1: log 2
    assert last < first - 0.1
    assert result["metrics"]["reward_margin"] > 0


def test_kto_runs_and_its_loss_falls(model_dir, tmp_path):
    result = OfflineTrainer(make_cfg(model_dir, "kto", "kto.jsonl", tmp_path, beta=0.5)).run()
    losses = result["losses"]
    assert all(torch.isfinite(torch.tensor(losses)))
    assert abs(losses[0] - 0.5) < 1e-3  # r = z0 = 0 at step 1: 1 - sigmoid(0)
    first, last = first_vs_last(losses)
    assert last < first - 0.02 and result["metrics"]["kl_ref"] >= 0


def test_data_shape_must_fit_the_algorithm(model_dir, tmp_path):
    with pytest.raises(ValueError, match="holds 'sft' data; algorithm.type='dpo' trains on \\['dpo'\\]"):
        OfflineTrainer(make_cfg(model_dir, "dpo", "sft.jsonl", tmp_path))


def test_publish_writes_version_steps_to_the_store(model_dir, tmp_path, stack):
    from streamrft.engine.weights import fetch_state_dict
    from streamrft.infra.objectstore import WeightStore

    cfg = make_cfg(model_dir, "sft", "sft.jsonl", tmp_path, steps=2)
    cfg.s3 = stack.s3
    cfg.model.name = f"offline-{tmp_path.name}"
    result = OfflineTrainer(cfg).run(publish=True)
    store = WeightStore(stack.s3)
    assert result["version"] == 2 and store.list_versions(cfg.weights_key) == [2]
    published, meta = fetch_state_dict(store, cfg.weights_key, 2, tmp_path / "cache")
    assert meta.get("kind", "full") == "full"
    saved, _ = load_policy(result["final_dir"])
    for name, tensor in published.items():
        torch.testing.assert_close(tensor, saved.state_dict()[name])


def test_sft_stage_output_loads_as_a_policy(model_dir, tmp_path):
    from streamrft.config import MonitorConfig
    from streamrft.monitor.loggers import MetricLogger

    pairs = [("rev abc=", "cba"), ("rev hgf=", "fgh")]
    logger = MetricLogger(MonitorConfig(backends=["tensorboard"]), tmp_path, "stages")
    out = sft_stage(model_dir, str(tmp_path / "stage"), StageConfig(steps=3, batch_size=2, lr=1e-3), pairs,
                    index=1, logger=logger)
    logger.close()
    assert [step for step, _ in read_tensorboard(tmp_path / "tensorboard")["stage/1/loss"]] == [1, 2, 3]
    model, tok = load_policy(out)
    before, _ = load_policy(model_dir)
    assert tok.decode(tok("rev abc=").input_ids[1:]) == "rev abc="
    changed = [n for n, p in model.state_dict().items() if not torch.equal(p, before.state_dict()[n])]
    assert changed  # it trained
