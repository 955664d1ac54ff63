"""`export_version`: a published weight version out of the real S3 store as a directory plain transformers
loads, its base files from the local base directory or, when its manifest names them, from S3
(`publish_base_model`); `streamrft export`'s argument errors."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from streamrft.engine.models import build_char_tokenizer, build_tiny_model, load_tokenizer  # noqa: E402
from streamrft.engine.weights import export_version, publish_state_dict  # noqa: E402
from streamrft.infra.objectstore import WeightStore  # noqa: E402


def test_export_version_holds_the_versions_weights_and_the_base_tokenizer(stack, namespace, tmp_path):
    from transformers import AutoModelForCausalLM

    base = tmp_path / "base"
    model = build_tiny_model(base, build_char_tokenizer("abc "), hidden_size=8, layers=1, heads=2, seed=0)
    trained = {k: v + 1.0 for k, v in model.state_dict().items()}  # another version than the base's
    trained["lm_head.weight"] = trained["model.embed_tokens.weight"]  # tied, as the model publishes it
    store, key = WeightStore(stack.s3), f"{namespace}/policy"
    publish_state_dict(store, key, 3, trained)
    out = export_version(store, key, 3, base, tmp_path / "v3")
    assert sorted(p.name for p in out.iterdir() if p.suffix == ".safetensors") == ["model.safetensors"]
    exported = AutoModelForCausalLM.from_pretrained(str(out), local_files_only=True)
    for name, tensor in exported.state_dict().items():
        assert torch.equal(tensor, trained[name]), name
    assert load_tokenizer(out)("ab c").input_ids == load_tokenizer(base)("ab c").input_ids


def test_a_lora_version_exports_merged_into_the_base_and_generates(stack, namespace, tmp_path):
    from transformers import AutoModelForCausalLM

    from streamrft.config import LoraSpec, TrainerConfig
    from streamrft.engine.models import load_policy
    from streamrft.engine.training.torch_engine import TorchTrainEngine

    torch.set_num_threads(1)
    base = tmp_path / "base"
    build_tiny_model(base, build_char_tokenizer("abc "), hidden_size=8, layers=1, heads=2, seed=0)
    lora = LoraSpec(r=2, alpha=4.0)
    engine = TorchTrainEngine(load_policy(base)[0], TrainerConfig(lr=0.1), lora)
    ids = torch.tensor([[1, 4, 5, 6, 7, 2]])
    engine.backward(engine.model(input_ids=ids, labels=ids).loss)
    engine.step()
    store, key = WeightStore(stack.s3), f"{namespace}/policy"
    publish_state_dict(store, key, 1, engine.publishable_state_dict(), meta={"step": 1, **lora.manifest_meta()})
    out = export_version(store, key, 1, base, tmp_path / "v1")

    exported = AutoModelForCausalLM.from_pretrained(str(out), local_files_only=True)
    engine.model.eval()
    with torch.no_grad():
        torch.testing.assert_close(exported(ids).logits, engine.model(input_ids=ids).logits, atol=1e-5, rtol=1e-4)
        assert not torch.allclose(exported(ids).logits, load_policy(base)[0](ids).logits)
    generated = exported.generate(ids[:, :3], max_new_tokens=4, min_new_tokens=4, do_sample=False)
    assert generated.shape == (1, 7)


def test_streamrft_export_writes_a_runs_version_as_a_model_directory(stack, namespace, tmp_path, capsys):
    """`streamrft export RUN_CONFIG --version N --out DIR`, on the run's config as `streamrft run` wrote it."""
    from transformers import AutoModelForCausalLM

    from streamrft.cli import main

    base = tmp_path / "base"
    model = build_tiny_model(base, build_char_tokenizer("abc "), hidden_size=8, layers=1, heads=2, seed=0)
    trained = {k: v * 0.5 for k, v in model.state_dict().items()}
    store = WeightStore(stack.s3)
    publish_state_dict(store, f"{namespace}/policy", 2, trained)
    config = tmp_path / "config.yaml"
    config.write_text(f"namespace: {namespace}\nmodel: {{path: {base}}}\n")
    endpoints = ["stack.embedded=false", f"s3.endpoint={stack.s3.endpoint}", f"s3.access_key={stack.s3.access_key}",
                 f"s3.secret_key={stack.s3.secret_key}", f"s3.bucket={stack.s3.bucket}"]
    assert main(["export", str(config), *endpoints, "--out", str(tmp_path / "latest")]) == 0  # the newest: v2
    assert f"{namespace}/policy v2" in capsys.readouterr().out
    exported = AutoModelForCausalLM.from_pretrained(str(tmp_path / "latest"), local_files_only=True)
    assert all(torch.equal(t, trained[name]) for name, t in exported.state_dict().items())
    assert main(["export", str(config), *endpoints, "--version", "7", "--out", str(tmp_path / "x")]) == 2
    assert "no version 7" in capsys.readouterr().err


def test_a_base_is_uploaded_once_addressed_by_its_content(stack, namespace, tmp_path):
    from streamrft.engine.weights import publish_base_model
    from streamrft.infra.objectstore import MANIFEST, CorruptVersionError

    base = tmp_path / "base"
    build_tiny_model(base, build_char_tokenizer("abc "), hidden_size=8, layers=1, heads=2, seed=0)
    store, key = WeightStore(stack.s3), f"{namespace}/policy"
    meta = publish_base_model(store, key, base, weights=False)
    manifest = store.client.stat_object(store.bucket, meta["base"] + MANIFEST)
    assert publish_base_model(store, key, base, weights=False) == meta  # a restarted trainer: nothing uploaded
    assert store.client.stat_object(store.bucket, meta["base"] + MANIFEST).last_modified == manifest.last_modified
    names = store.fetch_base(meta["base"], meta["base_sha256"], tmp_path / "fetched")
    assert "config.json" in names and "tokenizer.json" in names and "model.safetensors" not in names
    with_weights = publish_base_model(store, key, base, weights=True)  # what LoRA versions are merged into
    assert with_weights["base"] != meta["base"]
    assert "model.safetensors" in store.fetch_base(with_weights["base"], with_weights["base_sha256"], tmp_path / "w")
    with pytest.raises(CorruptVersionError):  # a version names its base's exact content
        store.fetch_base(meta["base"], with_weights["base_sha256"], tmp_path / "x")


def test_a_version_naming_its_base_exports_without_the_base_directory(stack, namespace, tmp_path):
    from transformers import AutoModelForCausalLM

    from streamrft.engine.weights import publish_base_model

    base = tmp_path / "base"
    model = build_tiny_model(base, build_char_tokenizer("abc "), hidden_size=8, layers=1, heads=2, seed=0)
    trained = {k: v * 2.0 for k, v in model.state_dict().items() if k != "lm_head.weight"}
    store, key = WeightStore(stack.s3), f"{namespace}/policy"
    publish_state_dict(store, key, 1, trained, meta={"kind": "full", **publish_base_model(store, key, base, False)})
    tokenizer_ids = load_tokenizer(base)("ab c").input_ids
    base.rename(tmp_path / "elsewhere")
    out = export_version(store, key, 1, base, tmp_path / "v1")
    assert not (out / ".fetch").exists()
    exported = AutoModelForCausalLM.from_pretrained(str(out), local_files_only=True)
    assert all(torch.equal(exported.state_dict()[name], t) for name, t in trained.items())
    assert load_tokenizer(out)("ab c").input_ids == tokenizer_ids


def test_streamrft_export_argument_errors_exit_2(stack, namespace, tmp_path, capsys):
    from streamrft.cli import main

    config = tmp_path / "config.yaml"
    config.write_text(f"namespace: {namespace}\nmodel: {{path: {tmp_path / 'base'}}}\n")
    endpoints = ["stack.embedded=false", f"s3.endpoint={stack.s3.endpoint}", f"s3.access_key={stack.s3.access_key}",
                 f"s3.secret_key={stack.s3.secret_key}", f"s3.bucket={stack.s3.bucket}"]
    out = ["--out", str(tmp_path / "out")]
    with pytest.raises(SystemExit) as both:
        main(["export", str(config), "--version", "1", "--checkpoint", str(tmp_path), *out])
    assert both.value.code == 2 and "not allowed with argument" in capsys.readouterr().err
    assert main(["export", str(config), *endpoints, *out]) == 2  # neither, and nothing published yet
    err = capsys.readouterr().err
    assert f"no version of {namespace}/policy" in err and "--checkpoint" in err
    assert main(["export", str(config), "--checkpoint", str(tmp_path), *out]) == 2
    assert "no trainer checkpoint" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
