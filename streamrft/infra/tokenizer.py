"""Loading a run's tokenizer from a local directory: below the engine (no torch), so that the
dashboard and stream ops decode with the same tokenizer the engine samples with."""
from __future__ import annotations

import json
from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerFast


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerFast:
    """The tokenizer saved in `path`, with a pad token.

    A generic tokenizers-backed tokenizer (such as the char tokenizer) is loaded as such: AutoTokenizer
    would swap in the model type's own class (Qwen2Tokenizer for a Qwen2 config), which re-derives its
    pre-tokenizer and silently drops characters.
    """
    config_file = Path(path) / "tokenizer_config.json"
    saved_class = json.loads(config_file.read_text()).get("tokenizer_class") if config_file.exists() else None
    if saved_class in ("TokenizersBackend", "PreTrainedTokenizerFast"):
        tokenizer = PreTrainedTokenizerFast.from_pretrained(str(path), local_files_only=True)
    else:
        tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer
