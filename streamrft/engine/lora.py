"""LoRA adapters: trained with `peft`, shipped as plain tensors, merged by whoever serves them.

Trainer: `wrap(model, spec)` puts adapters on the targeted linear layers and freezes the rest;
`adapter_state_dict` / `load_adapter` move an adapter in and out under the BASE model's module
names (`model.layers.0.self_attn.q_proj.lora_A.weight`, `...lora_B.weight`), so a version is read
without peft. Serving: `merged_weights` is W0 + (alpha / r) * B @ A for each adapted module, always
from the base weights W0 (versions never pile up); `write_peft_dir` lays an adapter out as a peft
directory (vLLM's LoRA requests, `PeftModel.from_pretrained`).
"""
from __future__ import annotations

from pathlib import Path

import torch

from streamrft.config import LoraSpec

LORA_A, LORA_B = ".lora_A.weight", ".lora_B.weight"
ADAPTER = "default"  # peft's name for the one adapter a wrapped model holds
PEFT_PREFIX = "base_model.model."  # what peft's own files put before the base model's names


def wrap(model: torch.nn.Module, spec: LoraSpec) -> torch.nn.Module:
    """`model` with LoRA adapters on `spec.target_modules` (B = 0: it computes what `model` did);
    only the adapters require grad. The adapters' A is drawn from torch's global RNG."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=spec.r, lora_alpha=spec.alpha, lora_dropout=spec.dropout,
                        target_modules=list(spec.target_modules), bias="none")
    wrapped = get_peft_model(model, config)
    _check_targets(wrapped)
    return wrapped


def _check_targets(wrapped: torch.nn.Module) -> None:
    """Only untied nn.Linear weights: what `merged_weights` can merge in place on an explorer."""
    base = wrapped.get_base_model()
    owners: dict[int, list[str]] = {}
    for name, p in base.named_parameters(remove_duplicate=False):
        owners.setdefault(p.data_ptr(), []).append(name)
    for name, layer in adapted_modules(wrapped).items():
        if type(layer.base_layer) is not torch.nn.Linear:
            raise ValueError(f"model.lora.target_modules: {name} is a {type(layer.base_layer).__name__}; "
                             "only nn.Linear layers can be adapted")
        tied = [n for n in owners[layer.base_layer.weight.data_ptr()] if not n.startswith(name + ".")]
        if tied:
            raise ValueError(f"model.lora.target_modules: {name}.weight is tied to {tied}; merging an adapter "
                             "into it would change those too")


def adapted_modules(wrapped: torch.nn.Module) -> dict:
    """The LoRA layers of a wrapped model by the base model's module name."""
    from peft.tuners.lora import LoraLayer

    return {name: m for name, m in wrapped.get_base_model().named_modules() if isinstance(m, LoraLayer)}


def adapter_state_dict(wrapped: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The adapter's tensors under base module names (the live parameters, not copies)."""
    state = {}
    for name, layer in adapted_modules(wrapped).items():
        state[name + LORA_A] = layer.lora_A[ADAPTER].weight
        state[name + LORA_B] = layer.lora_B[ADAPTER].weight
    return state


@torch.no_grad()
def load_adapter(wrapped: torch.nn.Module, adapter: dict[str, torch.Tensor]) -> None:
    """Copy an `adapter_state_dict` into a wrapped model; it must hold exactly the model's adapters."""
    own = adapter_state_dict(wrapped)
    if set(adapter) != set(own):
        raise KeyError(f"adapter does not fit the model: missing {sorted(set(own) - set(adapter))}, "
                       f"unexpected {sorted(set(adapter) - set(own))}")
    for name, tensor in adapter.items():
        own[name].copy_(tensor)


def adapter_modules(adapter: dict[str, torch.Tensor]) -> list[str]:
    """The module names an adapter holds an (A, B) pair for; raises on any other key."""
    modules = sorted({k.removesuffix(LORA_A).removesuffix(LORA_B) for k in adapter})
    expected = {m + suffix for m in modules for suffix in (LORA_A, LORA_B)}
    if set(adapter) != expected:
        raise KeyError(f"not an adapter of lora_A/lora_B pairs: missing {sorted(expected - set(adapter))}")
    return modules


def merged_weights(base: dict[str, torch.Tensor], adapter: dict[str, torch.Tensor],
                   scale: float) -> dict[str, torch.Tensor]:
    """`{module.weight: W0 + scale * B @ A}` for each module of `adapter`, in W0's dtype and device
    (computed in float32); `base` maps `module.weight` to W0."""
    merged = {}
    for module in adapter_modules(adapter):
        w0 = base[module + ".weight"]
        a = adapter[module + LORA_A].to(w0.device, torch.float32)
        b = adapter[module + LORA_B].to(w0.device, torch.float32)
        if (b.shape[0], a.shape[1]) != tuple(w0.shape):
            raise ValueError(f"{module}: adapter B @ A is {b.shape[0]}x{a.shape[1]}, the weight {tuple(w0.shape)}")
        merged[module + ".weight"] = (w0.float() + scale * (b @ a)).to(w0.dtype)
    return merged


def write_peft_dir(adapter: dict[str, torch.Tensor], spec: LoraSpec, out_dir: Path) -> Path:
    """`adapter_config.json` + `adapter_model.safetensors`, the layout vLLM and peft load."""
    from peft import LoraConfig
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    LoraConfig(r=spec.r, lora_alpha=spec.alpha, target_modules=list(spec.target_modules), bias="none",
               task_type="CAUSAL_LM").save_pretrained(str(out_dir))
    save_file({PEFT_PREFIX + k: v.detach().to("cpu").contiguous() for k, v in adapter.items()},
              str(out_dir / "adapter_model.safetensors"))
    return out_dir
