"""LoRA: the merge an explorer does (hand-computed), the adapter the trainer publishes and
checkpoints, and the same adapter served three ways (merged, peft forward, a peft directory)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from streamrft.config import LoraSpec, TrainerConfig  # noqa: E402
from streamrft.engine.lora import adapter_modules, merged_weights, write_peft_dir  # noqa: E402
from streamrft.engine.models import build_char_tokenizer, build_tiny_model, load_policy  # noqa: E402
from streamrft.engine.rollout.hf import TransformersEngine  # noqa: E402
from streamrft.engine.training.torch_engine import TorchTrainEngine  # noqa: E402
from streamrft.producers.synthetic import ALPHABET  # noqa: E402

LORA = LoraSpec(r=2, alpha=4.0)  # scale 2
ATTENTION, MLP = ("q_proj", "k_proj", "v_proj", "o_proj"), ("gate_proj", "up_proj", "down_proj")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    torch.set_num_threads(1)
    path = tmp_path_factory.mktemp("tiny")
    build_tiny_model(path, build_char_tokenizer(ALPHABET), hidden_size=32, layers=2, heads=4, seed=0)
    return path


def _engine(model_dir, lora=LORA, lr=0.05):
    model, _ = load_policy(model_dir)
    return TorchTrainEngine(model, TrainerConfig(lr=lr), lora)


def _train_step(engine, seed=0):
    ids = torch.randint(4, 16, (3, 7), generator=torch.Generator().manual_seed(seed))  # the char vocabulary
    engine.model.train()
    engine.backward(engine.model(input_ids=ids, labels=ids).loss)
    return engine.step()


def _logits(model, text="rev abc="):
    tok = build_char_tokenizer(ALPHABET)
    with torch.no_grad():
        return model(input_ids=torch.tensor([tok(text).input_ids])).logits


# ---- the merge, by hand ----

def test_merge_is_w0_plus_scale_b_a_and_never_accumulates():
    w0 = {"lin.weight": torch.tensor([[1.0, 2.0], [3.0, 4.0]])}
    v1 = {"lin.lora_A.weight": torch.tensor([[1.0, 0.0]]), "lin.lora_B.weight": torch.tensor([[1.0], [2.0]])}
    v2 = {"lin.lora_A.weight": torch.tensor([[0.0, 1.0]]), "lin.lora_B.weight": torch.tensor([[1.0], [0.0]])}
    # B1 @ A1 = [[1, 0], [2, 0]], times alpha / r = 2 / 1
    assert torch.equal(merged_weights(w0, v1, 2.0)["lin.weight"], torch.tensor([[3.0, 2.0], [7.0, 4.0]]))
    # B2 @ A2 = [[0, 1], [0, 0]]: from W0 again, not from version 1's weights
    assert torch.equal(merged_weights(w0, v2, 2.0)["lin.weight"], torch.tensor([[1.0, 4.0], [3.0, 4.0]]))
    half = {"lin.weight": w0["lin.weight"].to(torch.bfloat16)}
    assert merged_weights(half, v1, 2.0)["lin.weight"].dtype == torch.bfloat16  # the live model's dtype
    with pytest.raises(KeyError, match="lora_B"):
        adapter_modules({"lin.lora_A.weight": torch.zeros(1, 2)})


def test_transformers_engine_merges_each_version_from_the_base(model_dir):
    eng = TransformersEngine(str(model_dir))
    q, v = "model.layers.0.self_attn.q_proj", "model.layers.1.self_attn.v_proj"
    w0 = {m: eng.model.state_dict()[m + ".weight"].clone() for m in (q, v)}
    gen = torch.Generator().manual_seed(0)

    def adapter(*modules):
        return {f"{m}{s}": torch.randn(shape, generator=gen) for m in modules
                for s, shape in ((".lora_A.weight", (2, 32)), (".lora_B.weight", (32, 2)))}

    first, second = adapter(q, v), adapter(q)
    eng.load_weights(first, 1, LORA)
    eng.load_weights(second, 2, LORA)
    live = eng.model.state_dict()
    expected_q = w0[q] + 2.0 * second[q + ".lora_B.weight"] @ second[q + ".lora_A.weight"]
    torch.testing.assert_close(live[q + ".weight"], expected_q)
    assert torch.equal(live[v + ".weight"], w0[v])  # adapted by version 1 only: back to W0
    assert eng.version == 2
    with pytest.raises(KeyError, match="no weights"):
        eng.load_weights({"nope.lora_A.weight": torch.zeros(2, 2), "nope.lora_B.weight": torch.zeros(2, 2)}, 3, LORA)


# ---- the trainer's engine ----

def test_lora_engine_trains_only_the_adapter_and_publishes_it_alone(model_dir):
    engine = _engine(model_dir)
    frozen = {k: v.clone() for k, v in engine.model.get_base_model().state_dict().items() if "lora_" not in k}
    published = engine.publishable_state_dict()
    # B = 0 before any step: version 0, the adapter alone, is the base model itself
    assert all(torch.count_nonzero(t) == 0 for k, t in published.items() if k.endswith("lora_B.weight"))
    assert _train_step(engine) > 0
    published = engine.publishable_state_dict()
    modules = adapter_modules(published)
    assert modules == sorted([f"model.layers.{i}.self_attn.{t}" for i in range(2) for t in ATTENTION]
                             + [f"model.layers.{i}.mlp.{t}" for i in range(2) for t in MLP])
    assert any(torch.count_nonzero(t) for k, t in published.items() if k.endswith("lora_B.weight"))
    after = engine.model.get_base_model().state_dict()
    assert all(torch.equal(after[k], v) for k, v in frozen.items())  # the base did not move
    assert sum(p.numel() for g in engine.optimizer.param_groups for p in g["params"]) == \
        sum(t.numel() for t in published.values())
    full = sum(t.numel() for t in load_policy(model_dir)[0].state_dict().values())
    assert sum(t.numel() for t in published.values()) < full / 4


def test_the_published_adapter_served_merged_or_as_a_peft_dir_computes_what_the_trainer_does(model_dir, tmp_path):
    from peft import PeftModel

    engine = _engine(model_dir)
    for seed in range(3):
        _train_step(engine, seed)
    engine.model.eval()
    trained = _logits(engine.model)
    assert not torch.allclose(trained, _logits(load_policy(model_dir)[0]), atol=1e-3)  # it learned something
    adapter = {k: v.detach().clone() for k, v in engine.publishable_state_dict().items()}

    explorer = TransformersEngine(str(model_dir))
    explorer.load_weights(adapter, 1, LORA)
    torch.testing.assert_close(_logits(explorer.model), trained, atol=1e-5, rtol=1e-4)

    peft_dir = write_peft_dir(adapter, LORA, tmp_path / "peft")  # what vLLM's LoRA request loads
    served = PeftModel.from_pretrained(load_policy(model_dir)[0], str(peft_dir))
    torch.testing.assert_close(_logits(served), trained, atol=1e-5, rtol=1e-4)


def test_lora_checkpoint_holds_the_adapter_and_its_optimiser_state_and_resumes_them(model_dir, tmp_path):
    engine = _engine(model_dir)
    for seed in range(2):
        _train_step(engine, seed)
    engine.save(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adapter.safetensors", "optimizer.pt"]

    torch.manual_seed(123)  # another draw of the adapters' A than the saved one
    resumed = _engine(model_dir)
    resumed.load(tmp_path)
    for name, tensor in engine.publishable_state_dict().items():
        assert torch.equal(resumed.publishable_state_dict()[name], tensor), name
    saved, loaded = engine.optimizer.state_dict(), resumed.optimizer.state_dict()
    assert saved["state"].keys() == loaded["state"].keys() and saved["state"]
    for i, state in saved["state"].items():
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(loaded["state"][i][key], state[key]), (i, key)
    # the next step is the same step: the resumed engine continues where the saved one was
    _train_step(engine, 7)
    _train_step(resumed, 7)
    for name, tensor in engine.publishable_state_dict().items():
        torch.testing.assert_close(resumed.publishable_state_dict()[name], tensor)

    with pytest.raises(RuntimeError, match="no LoRA adapter"):
        _engine(model_dir).load(tmp_path / "missing")


def test_a_tied_or_non_linear_target_is_refused(model_dir):
    with pytest.raises(ValueError, match="lm_head.weight is tied"):
        _engine(model_dir, LoraSpec(target_modules=["lm_head"]))
    with pytest.raises(ValueError, match="only nn.Linear"):
        _engine(model_dir, LoraSpec(target_modules=["embed_tokens"]))
