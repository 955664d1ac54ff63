"""Model and tokenizer building, loading and saving, all in Hugging Face format (safetensors).

`build_char_tokenizer` + `build_tiny_model` make the CPU demo's policy from nothing (no hub):
a char-level tokenizer over a given alphabet and a small Qwen2 from a config. `load_policy`
loads any HF causal LM directory, the demo's or a real one.
"""
from __future__ import annotations

import os
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from streamrft.infra.tokenizer import load_tokenizer

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)
"""Ids 0..3, in this order, in every char tokenizer."""


def build_char_tokenizer(alphabet: str, out_dir: str | Path | None = None) -> PreTrainedTokenizerFast:
    """One token per character of `alphabet` after the special tokens; BOS is prepended on encode.

    Plain prompts, no chat template. Characters outside the alphabet become `<unk>`.
    Saved with `save_pretrained(out_dir)` when `out_dir` is given.
    """
    chars = sorted(set(alphabet))
    if not chars:
        raise ValueError("the alphabet is empty")
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in chars:
        vocab[ch] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    # every character (newlines included) is its own pre-token, so WordLevel sees single chars
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, vocab[BOS])]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token=PAD, bos_token=BOS, eos_token=EOS, unk_token=UNK, padding_side="left"
    )
    if out_dir is not None:
        fast.save_pretrained(str(out_dir))
    return fast


def build_tiny_model(
    out_dir: str | Path,
    tokenizer: PreTrainedTokenizerFast,
    hidden_size: int = 128,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int | None = None,
    intermediate_size: int | None = None,
    max_positions: int = 128,
    seed: int = 0,
) -> Qwen2ForCausalLM:
    """A freshly initialised Qwen2ForCausalLM sized for `tokenizer`, saved with it to `out_dir`."""
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or 4 * hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads or heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    # the init draws from the global RNG; fork it so building a model leaves the caller's stream alone
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    out_dir = Path(out_dir)
    model.save_pretrained(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))
    return model


def resolve_device(name: str | None = None) -> str:
    """`name` when given, else where this process trains: its GPU when one is visible (under
    torchrun, the one of its LOCAL_RANK), else the CPU."""
    if name:
        return name
    if torch.cuda.is_available():
        return f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}"
    return "cpu"


def is_vision_language(path: str | Path) -> bool:
    """Whether the HF directory holds a vision-language model (its config has a vision tower)."""
    import json

    config = Path(path) / "config.json"
    return config.is_file() and "vision_config" in json.loads(config.read_text())


def load_policy(path: str | Path, dtype: str = "float32", device: str = "cpu"):
    """(model, tokenizer) from an HF directory; the model is in eval mode on `device`. A
    vision-language model (`is_vision_language`) loads as an image-text-to-text model."""
    if is_vision_language(path):
        from transformers import AutoModelForImageTextToText as Auto
    else:
        Auto = AutoModelForCausalLM
    model = Auto.from_pretrained(str(path), dtype=getattr(torch, dtype), local_files_only=True).to(device)
    model.eval()
    if Auto is not AutoModelForCausalLM:
        from streamrft.engine.placeholders import ban_placeholders

        ban_placeholders(model)  # never sampled, never scored: the same for explorers and trainer
    return model, load_tokenizer(path)


def load_processor(path: str | Path):
    """The multi-modal processor saved beside a vision-language model (its image processor and
    tokenizer); None for a text model."""
    if not is_vision_language(path):
        return None
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(str(path), local_files_only=True)


def state_dict_to_cpu(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A detached CPU copy of the model's state dict (safe to ship or to load into another model)."""
    return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
