"""SmolLM2's GGUF converted to a plain HF directory: the same logits, the same tokens, a chat template."""
from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.real_model

TEXT = "<|im_start|>user\nWhat is 17 + 25? Answer with just the number.<|im_end|>\n<|im_start|>assistant\n42 ✓ é"


def test_converted_directory_equals_the_gguf_model(smollm2_gguf, smollm2_dir, smollm2):
    from streamrft.engine.import_model import load_gguf

    gguf_model, gguf_tok = load_gguf(smollm2_gguf)
    model, tok = smollm2.model, smollm2.tokenizer
    ids = tok(TEXT, add_special_tokens=False).input_ids
    assert ids == gguf_tok(TEXT, add_special_tokens=False).input_ids
    assert tok.convert_ids_to_tokens(ids[:2]) == ["<|im_start|>", "user"]  # special tokens stay single tokens
    with torch.no_grad():
        x = torch.tensor([ids])
        diff = (model(x).logits - gguf_model(x).logits).abs().max().item()
    assert diff <= 1e-5, diff
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in gguf_model.parameters())
    assert (tok.eos_token, tok.eos_token_id, tok.pad_token_id) == ("<|im_end|>", 2, 2)


def test_converted_directory_is_plain_and_keeps_the_chat_template(smollm2_dir, smollm2):
    files = {p.name for p in smollm2_dir.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "generation_config.json"} <= files
    assert "quantization_config" not in json.loads((smollm2_dir / "config.json").read_text())
    assert json.loads((smollm2_dir / "generation_config.json").read_text())["eos_token_id"] == 2
    text = smollm2.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                                 add_generation_prompt=True)
    assert text.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
