"""The trainer's learning-rate warm-up: the factor by hand, the torch engine's updates taking it, and a
resumed engine going on from its optimiser's own step count. (DeepSpeed's: tests/consumers/ds_ranks_worker.py,
the `dr_grpo` case, checked against the torch engine's weights.)"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from streamrft.config import TrainerConfig  # noqa: E402
from streamrft.engine.models import build_char_tokenizer, build_tiny_model, load_policy  # noqa: E402
from streamrft.engine.training.torch_engine import TorchTrainEngine, warmup_factor  # noqa: E402
from streamrft.producers.synthetic import ALPHABET  # noqa: E402


@pytest.mark.parametrize("update,steps,factor", [
    (0, 0, 1.0), (5, 0, 1.0),                    # no warm-up
    (0, 4, 0.25), (1, 4, 0.5), (3, 4, 1.0), (9, 4, 1.0),
    (0, 1, 1.0), (0, 10, 0.1), (4, 10, 0.5),
])
def test_warmup_factor(update, steps, factor):
    assert warmup_factor(update, steps) == pytest.approx(factor)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    torch.set_num_threads(1)
    path = tmp_path_factory.mktemp("tiny")
    build_tiny_model(path, build_char_tokenizer(ALPHABET), hidden_size=32, layers=1, heads=2, seed=0)
    return path


def _step(engine: TorchTrainEngine, seed: int) -> float:
    ids = torch.randint(4, 16, (3, 7), generator=torch.Generator().manual_seed(seed))
    engine.backward(engine.model(input_ids=ids, labels=ids).loss)
    return engine.step()


def _weights(engine: TorchTrainEngine) -> torch.Tensor:
    return torch.cat([p.detach().flatten().clone() for p in engine.params])


def test_updates_take_the_warmed_up_rate_and_a_resumed_engine_goes_on(model_dir, tmp_path):
    lr, warm = 0.01, 4
    engine = TorchTrainEngine(load_policy(model_dir)[0].train(), TrainerConfig(lr=lr, warmup_steps=warm))
    before = _weights(engine)
    _step(engine, 0)
    # Adam's first update moves every weight with a gradient by lr * g / (|g| + eps): lr/4 here
    moved = (_weights(engine) - before).abs()
    assert float(moved.max()) == pytest.approx(lr / warm, rel=1e-3)
    assert [g["lr"] for g in engine.optimizer.param_groups] == [pytest.approx(lr / warm)]
    assert engine.last_lr == pytest.approx(lr / warm)
    _step(engine, 1)
    assert engine.optimizer.param_groups[0]["lr"] == pytest.approx(lr * 2 / warm)
    engine.save(tmp_path)

    resumed = TorchTrainEngine(load_policy(model_dir)[0].train(), TrainerConfig(lr=lr, warmup_steps=warm))
    resumed.load(tmp_path)
    assert resumed.updates == 2
    lrs = []
    for seed in (2, 3, 4):
        _step(resumed, seed)
        lrs.append(resumed.optimizer.param_groups[0]["lr"])
    assert lrs == [pytest.approx(lr * 3 / warm), pytest.approx(lr), pytest.approx(lr)]


def test_no_warmup_moves_the_first_update_by_the_whole_rate(model_dir):
    lr = 0.01
    engine = TorchTrainEngine(load_policy(model_dir)[0].train(), TrainerConfig(lr=lr))
    before = _weights(engine)
    _step(engine, 0)
    assert float((_weights(engine) - before).abs().max()) == pytest.approx(lr, rel=1e-3)
