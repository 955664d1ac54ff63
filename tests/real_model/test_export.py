"""A SmolLM2 weight version through the real S3 store, out as a directory plain transformers loads."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from streamrft.engine.weights import export_version, publish_state_dict  # noqa: E402
from streamrft.infra.objectstore import WeightStore  # noqa: E402

pytestmark = pytest.mark.real_model


def test_an_exported_version_loads_with_plain_transformers_and_generates(stack, namespace, smollm2, smollm2_dir,
                                                                        tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    store, key = WeightStore(stack.s3), f"{namespace}/policy"
    original = smollm2.model.state_dict()  # as the trainer publishes it: the tied output head shares storage
    publish_state_dict(store, key, 1, original)
    out = export_version(store, key, 1, smollm2_dir, tmp_path / "exported")  # fetched as explorers fetch it
    model = AutoModelForCausalLM.from_pretrained(str(out), local_files_only=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(out), local_files_only=True)
    assert all(torch.equal(tensor, original[name]) for name, tensor in model.state_dict().items())
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # still tied
    text = tokenizer.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                         tokenize=False, add_generation_prompt=True)
    enc = tokenizer(text, return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        exported = model.generate(**enc, max_new_tokens=6, do_sample=False)
        expected = smollm2.model.generate(**enc, max_new_tokens=6, do_sample=False)
    assert exported.shape[1] > enc.input_ids.shape[1]
    assert exported.tolist() == expected.tolist()
