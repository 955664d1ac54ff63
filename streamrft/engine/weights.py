"""Moving a policy's weights between a torch module and the weight store.

`publish_state_dict` writes safetensors shards (tied weights stored once) and publishes them as
one version; `fetch_state_dict` downloads a version, verifies its manifest and loads it, with the
manifest's meta (`LoraSpec.from_manifest(meta)`: full weights or a LoRA adapter). A version's
shards alone are no model: `publish_base_model` uploads, once per base, the files it is read with
(config, tokenizer; the base weights under a LoRA adapter), and the meta names them. `export_version`
writes a version as a plain HF directory (`AutoModelForCausalLM.from_pretrained`), an adapter
merged into the base weights or laid out as a peft directory; `export_checkpoint` does the same
for a trainer checkpoint on local disk.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from streamrft.config import LoraSpec
from streamrft.engine.shards import (ADAPTER_FILE, fetch_full_state_dict, load_shards,  # noqa: F401  (re-exported)
                                     publish_state_dict, save_shards)
from streamrft.infra.objectstore import WeightStore


def fetch_state_dict(store: WeightStore, model: str, version: int, cache_dir: Path,
                     have: tuple[int, dict[str, torch.Tensor]] | None = None) -> tuple[dict[str, torch.Tensor], dict]:
    """(state dict, manifest meta) of version `version`, downloaded and verified into
    `cache_dir/v<N>` and loaded; the files are dropped. A delta version (`engine.delta`) is
    reconstructed: onto `have` = (version, state) when that is on its chain, else from the chain's
    full snapshot, every reconstructed tensor checked against the manifest's sha256."""
    from streamrft.engine.delta import fetch_chain

    return fetch_chain(store, model, version, cache_dir, have)


def _is_weights(path: Path) -> bool:
    return path.suffix in (".safetensors", ".bin") or path.name.endswith(".index.json")


def publish_base_model(store: WeightStore, model: str, base_dir: str | Path, weights: bool) -> dict:
    """Upload the files of `base_dir` (flat) that a version of `model` is read with, unless S3
    holds them already: config, generation config, tokenizer, chat template, and with `weights`
    (for LoRA versions, which hold the adapter alone) the base's safetensors. Returns the meta every
    version carries, `{"base": <key prefix>, "base_sha256": <digest of the files>}`, so that a
    version exports from S3 alone, whatever becomes of `base_dir` (`WeightStore.publish_base`)."""
    files = [p for p in sorted(Path(base_dir).iterdir())
             if p.is_file() and (not _is_weights(p) or (weights and p.suffix == ".safetensors"))]
    prefix, digest = store.publish_base(model, files)
    return {"base": prefix, "base_sha256": digest}


def write_model_dir(state: dict[str, torch.Tensor], lora: LoraSpec | None, base_dir: str | Path,
                    out_dir: str | Path) -> Path:
    """`state` (full weights, or an adapter of `lora`, merged here into `base_dir`'s weights) in one
    `model.safetensors`, with `base_dir`'s config, tokenizer, chat template and generation config
    (a tied output head stays tied through the config, as in `base_dir`)."""
    base_dir, out_dir = Path(base_dir), Path(out_dir)
    if not (base_dir / "config.json").is_file():
        raise FileNotFoundError(f"{base_dir} is no model directory (no config.json): the export takes the base "
                                "model's config and tokenizer from it")
    if lora is not None:
        from streamrft.engine.lora import merged_weights

        base = load_shards(base_dir)
        if not base:
            raise FileNotFoundError(f"{base_dir} holds no .safetensors weights to merge the LoRA adapter into")
        state = {**base, **merged_weights(base, state, lora.scale)}
    out_dir.mkdir(parents=True, exist_ok=True)
    for path in base_dir.iterdir():
        if path.is_file() and not _is_weights(path):
            shutil.copy2(path, out_dir / path.name)
    save_file(state, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    return out_dir


def export_version(store: WeightStore, model: str, version: int, base_dir: str | Path | None, out_dir: str | Path,
                   merge_lora: bool = True) -> Path:
    """Version `version` of `model` (the store key, `RunConfig.weights_key`) as a plain HF directory
    (`write_model_dir`). The base files come from S3 when the manifest names them
    (`publish_base_model`), else from `base_dir`, the local base model the run was trained on
    (versions published before bases were uploaded). A LoRA version is merged into the base
    weights, or with `merge_lora=False` written as a peft adapter directory (no base needed)."""
    from streamrft.engine.lora import write_peft_dir
    from streamrft.monitor.bars import bar

    out_dir = Path(out_dir)
    work = out_dir / ".fetch"
    progress = bar(3, f"exporting {model} v{version}", unit="phase")  # fetch + verify, base files, write
    try:
        progress.set_postfix_str("fetching and verifying the weights")
        state, meta = fetch_state_dict(store, model, version, work)
        progress.update(1)
        lora = LoraSpec.from_manifest(meta)
        if lora is not None and not merge_lora:
            return write_peft_dir(state, lora, out_dir)
        if "base" in meta:
            progress.set_postfix_str("fetching the base model's files")
            base_dir = work / "base"
            store.fetch_base(meta["base"], meta["base_sha256"], base_dir)
        elif base_dir is None:
            raise FileNotFoundError(f"the manifest of {model} v{version} names no base model: it was published "
                                    "before bases were uploaded, give the local base directory")
        progress.update(1)
        progress.set_postfix_str(f"writing {out_dir}")
        return write_model_dir(state, lora, base_dir, out_dir)
    finally:
        progress.close()
        shutil.rmtree(work, ignore_errors=True)


def export_checkpoint(checkpoint_dir: str | Path, base_dir: str | Path, out_dir: str | Path, lora: LoraSpec | None,
                      merge_lora: bool = True) -> Path:
    """A trainer checkpoint `v<N>` directory (`consumers.checkpoint`) exported as `export_version`
    exports a version, the base files from the local `base_dir`. A full checkpoint holds the weights
    as `save_pretrained` wrote them; a LoRA one `adapter.safetensors` alone, and records neither
    rank nor alpha: `lora` is the run's `model.lora`, its rank checked against the adapter's."""
    from safetensors.torch import load_file

    from streamrft.engine.lora import LORA_A, write_peft_dir

    checkpoint_dir = Path(checkpoint_dir)
    if not (checkpoint_dir / ADAPTER_FILE).is_file():
        state = load_shards(checkpoint_dir)
        if not state:
            raise FileNotFoundError(f"{checkpoint_dir} holds no weights (*.safetensors): not a trainer checkpoint")
        return write_model_dir(state, None, base_dir, out_dir)
    if lora is None:
        raise ValueError(f"{checkpoint_dir} holds a LoRA adapter ({ADAPTER_FILE}) but the config has no model.lora: "
                         "export it with the run's config")
    state = load_file(str(checkpoint_dir / ADAPTER_FILE))
    ranks = sorted({t.shape[0] for name, t in state.items() if name.endswith(LORA_A)})
    if ranks != [lora.r]:
        raise ValueError(f"{checkpoint_dir}: the adapter has rank {ranks}, the config's model.lora.r is {lora.r}: "
                         "export it with the run's config")
    if not merge_lora:
        return write_peft_dir(state, lora, out_dir)
    return write_model_dir(state, lora, base_dir, out_dir)
