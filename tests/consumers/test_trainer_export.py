"""`streamrft export` of what a real trainer wrote: its versions out of S3 alone (the local base model
moved away: every version's manifest names the base files the trainer uploaded beside it), and its
checkpoints on local disk, full and LoRA, merged or as a peft adapter directory; each loaded with
plain transformers (or peft) and made to generate."""
from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from streamrft.config import LoraSpec, dump_config  # noqa: E402
from streamrft.engine.models import load_tokenizer  # noqa: E402
from streamrft.engine.weights import fetch_state_dict, load_shards  # noqa: E402
from streamrft.infra.objectstore import WeightStore  # noqa: E402

LORA = "model.lora={r: 4, alpha: 8, target_modules: [q_proj, v_proj]}"
Q_PROJ = "model.layers.0.self_attn.q_proj"
IDS = torch.tensor([[1, 7, 4, 5, 6, 15]])  # the prompt ids of `kit.group`


def _trained_run(stack, namespace, trainer_config, kit, *extra: str):
    """One trainer step on the real stack (v0, then v1), its config written as `streamrft run` writes it."""
    kit.produce(stack.kafka, namespace, [kit.group("A", 0)])
    cfg = trainer_config(stack, *extra, "trainer.batch_groups=1", "trainer.max_steps=1")
    assert kit.run(cfg)["version"] == 1
    config = Path(cfg.output_dir) / "config.yaml"
    config.write_text(dump_config(cfg))
    return cfg, str(config)


def _loads_and_generates(out: Path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(out), local_files_only=True).eval()
    with torch.no_grad():
        generated = model.generate(IDS, max_new_tokens=4, min_new_tokens=4, do_sample=False)
    assert generated.shape == (1, IDS.shape[1] + 4)
    return model


def test_a_full_run_exports_from_s3_alone_and_from_its_checkpoint(stack, namespace, trainer_config, kit, tmp_path,
                                                                 capsys):
    from streamrft.cli import main

    cfg, config = _trained_run(stack, namespace, trainer_config, kit)
    store, key = WeightStore(stack.s3), cfg.weights_key
    metas = [store.read_manifest(key, v).meta for v in (0, 1)]
    assert metas[0]["base"] == metas[1]["base"] and metas[0]["base_sha256"] == metas[1]["base_sha256"]
    assert metas[1]["base"].startswith(f"{key}/base/") and metas[1]["kind"] == "full"
    base_names = {o.object_name.rsplit("/", 1)[1] for o in store.client.list_objects(store.bucket, metas[1]["base"])}
    assert "config.json" in base_names and "tokenizer.json" in base_names
    assert not any(n.endswith(".safetensors") for n in base_names)  # full versions carry their weights
    v1, _ = fetch_state_dict(store, key, 1, tmp_path / "cache")
    tokenizer_ids = load_tokenizer(cfg.model.path)("rev ab=").input_ids

    base = Path(cfg.model.path)
    base.rename(base.with_name("base-moved"))  # from here on the run's base model is gone from disk
    assert main(["export", config, "--out", str(tmp_path / "from-s3")]) == 0
    assert f"{key} v1" in capsys.readouterr().out
    model = _loads_and_generates(tmp_path / "from-s3")
    assert all(torch.equal(model.state_dict()[name], t) for name, t in v1.items())  # a tied head published once
    assert load_tokenizer(tmp_path / "from-s3")("rev ab=").input_ids == tokenizer_ids

    base.with_name("base-moved").rename(base)  # a checkpoint takes its config and tokenizer from model.path
    ckpt = Path(cfg.output_dir) / "trainer"
    assert main(["export", config, "--checkpoint", str(ckpt), "--out", str(tmp_path / "ckpt")]) == 0
    assert f"{ckpt / 'v1'}" in capsys.readouterr().out  # the newest complete checkpoint
    model = _loads_and_generates(tmp_path / "ckpt")
    assert all(torch.equal(model.state_dict()[name], t) for name, t in v1.items())  # the checkpoint is v1


def test_a_lora_run_exports_merged_or_as_a_peft_adapter(stack, namespace, trainer_config, kit, tmp_path, capsys):
    from peft import PeftModel
    from safetensors.torch import load_file

    from streamrft.cli import main

    cfg, config = _trained_run(stack, namespace, trainer_config, kit, LORA)
    store, key, lora = WeightStore(stack.s3), cfg.weights_key, cfg.model.lora
    v1, meta = fetch_state_dict(store, key, 1, tmp_path / "cache")
    assert LoraSpec.from_manifest(meta) == lora  # what explorers read: the base keys are ignored
    base_names = {o.object_name.rsplit("/", 1)[1] for o in store.client.list_objects(store.bucket, meta["base"])}
    assert "model.safetensors" in base_names  # a LoRA version is merged into these weights
    base = Path(cfg.model.path)
    w0 = load_shards(base)[Q_PROJ + ".weight"]
    a, b = v1[Q_PROJ + ".lora_A.weight"], v1[Q_PROJ + ".lora_B.weight"]
    assert float(b.norm()) > 0  # trained: the merge changes the weight
    by_hand = w0 + (8 / 4) * (b @ a)  # W0 + (alpha / r) * B @ A

    base.rename(base.with_name("base-moved"))
    assert main(["export", config, "--version", "1", "--out", str(tmp_path / "merged-v1")]) == 0
    merged = _loads_and_generates(tmp_path / "merged-v1")
    torch.testing.assert_close(merged.state_dict()[Q_PROJ + ".weight"], by_hand, rtol=1e-6, atol=1e-7)
    assert main(["export", config, "--no-merge-lora", "--out", str(tmp_path / "peft-v1")]) == 0  # needs no base
    assert torch.equal(load_file(str(tmp_path / "peft-v1" / "adapter_model.safetensors"))[
        f"base_model.model.{Q_PROJ}.lora_B.weight"], b)
    base.with_name("base-moved").rename(base)

    ckpt = Path(cfg.output_dir) / "trainer" / "v1"
    assert torch.equal(load_file(str(ckpt / "adapter.safetensors"))[Q_PROJ + ".lora_B.weight"], b)
    assert main(["export", config, "--checkpoint", str(ckpt), "--out", str(tmp_path / "merged-ckpt")]) == 0
    from_ckpt = _loads_and_generates(tmp_path / "merged-ckpt")
    torch.testing.assert_close(from_ckpt.state_dict()[Q_PROJ + ".weight"], by_hand, rtol=1e-6, atol=1e-7)
    # a checkpoint records no alpha: the run's config says it, and one that does not fit is refused
    assert main(["export", config, "model.lora=null", "--checkpoint", str(ckpt), "--out", str(tmp_path / "x")]) == 1
    assert "no model.lora" in capsys.readouterr().err
    assert main(["export", config, "model.lora.r=8", "--checkpoint", str(ckpt), "--out", str(tmp_path / "x")]) == 1
    assert "rank [4]" in capsys.readouterr().err

    assert main(["export", config, "--checkpoint", str(ckpt), "--no-merge-lora", "--out", str(tmp_path / "peft")]) == 0
    assert sorted(p.name for p in (tmp_path / "peft").iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    from transformers import AutoModelForCausalLM

    adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(str(base), local_files_only=True),
                                        str(tmp_path / "peft")).eval()
    with torch.no_grad():
        torch.testing.assert_close(adapted(IDS).logits, from_ckpt(IDS).logits, rtol=1e-4, atol=1e-5)
        assert adapted.generate(input_ids=IDS, max_new_tokens=4, min_new_tokens=4, do_sample=False).shape == (1, 10)
