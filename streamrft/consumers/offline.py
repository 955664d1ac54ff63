"""Offline training from a local dataset file: SFT, DPO or KTO, no broker needed.

Run with `streamrft train CONFIG` where `algorithm.type` is sft, dpo or kto and `data.train` is a
JSONL/Parquet file (shapes in `offline_data`). Each step trains on `trainer.micro_batch_size`
examples (seeded shuffle, epochs cycled); the loss params come from `algorithm.policy_loss.params`
(beta, label_smoothing, desirable_weight, ...). The result is saved in HF format to
`<output_dir>/final` and, with `publish=True`, published as weight version <steps>.
Departs from TRL's KTO in one detail: TRL pairs each prompt with its dataset neighbour's completion
once, before shuffling, for the KL estimate z0; here the completions of each shuffled batch are
rotated by one, so the mismatched pairs change every epoch.
"""
from __future__ import annotations

import logging
import random
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from streamrft.config import OFFLINE_TYPES, RunConfig, StageConfig
from streamrft.consumers.batch import token_logprobs
from streamrft.consumers.offline_data import SHAPES_FOR, OfflineExample, collate_sequences, load_offline_dataset
from streamrft.engine.algorithms import (OFFLINE_LOSSES, PRESETS, dpo_metrics, kto_kl_ref, masked_mean,
                                         sequence_logps, sft_loss)
from streamrft.schemas import Metric

log = logging.getLogger(__name__)


def ensure_model(cfg: RunConfig) -> str:
    """`cfg.model.path`, first importing `model.source` there (`engine.import_model`) or building the
    tiny char model from `model.build` if it holds no model."""
    path = Path(cfg.model.path)
    if (path / "config.json").exists():
        return str(path)
    if cfg.model.source is not None:
        from streamrft.engine.import_model import import_model

        return str(import_model(cfg.model.source, path))
    if cfg.model.build is None:
        raise FileNotFoundError(f"model.path {path} holds no model and neither model.source nor model.build is set")
    spec = cfg.model.build
    alphabet = spec.alphabet or default_alphabet(cfg)
    if spec.vision is not None:
        from streamrft.engine.vlm import build_tiny_vlm

        v = spec.vision
        build_tiny_vlm(path, alphabet, image_size=v.image_size, patch_size=v.patch_size, vision_hidden_size=v.hidden_size,
                       vision_layers=v.layers, vision_heads=v.heads, **spec.model_dump(exclude={"alphabet", "vision"}))
        return str(path)
    from streamrft.engine.models import build_char_tokenizer, build_tiny_model

    build_tiny_model(path, build_char_tokenizer(alphabet), **spec.model_dump(exclude={"alphabet", "vision"}))
    return str(path)


def default_alphabet(cfg: RunConfig) -> str:
    """The tiny char model's characters when `model.build.alphabet` is not set: the synthetic task's;
    else the environment's (`envs.env_alphabet`: your own environment's `ALPHABET`); else the
    reverse demo's. Raises where they would miss characters: your own environment without
    `ALPHABET`, or task files holding characters outside it (they would all read as `<unk>`)."""
    from streamrft.producers.envs import ALPHABETS, env_alphabet
    from streamrft.producers.synthetic import ALPHABET

    env, task = cfg.explorer.env, (cfg.data.synthetic or {}).get("task")
    if task == "images":
        from streamrft.producers import image_tasks

        alphabet = image_tasks.ALPHABET
    elif task is not None:
        alphabet = ALPHABETS.get(task, ALPHABET)
    elif env is not None and env.import_path:
        alphabet = env_alphabet(env.type, env.import_path)
        if not alphabet:
            raise ValueError(f"model.build.alphabet is not set, and explorer.env.import_path {env.import_path!r} has no "
                             "ALPHABET (on its class or in its module): set one of them to every character your tasks "
                             "and environment write; any other character becomes <unk>")
    else:
        alphabet = (env_alphabet(env.type) if env is not None else None) or ALPHABET
    for split in ("train", "eval"):  # an online run's task files (offline ones hold pairs)
        path = getattr(cfg.data, split)
        if cfg.algorithm.type not in OFFLINE_TYPES and path and Path(path).suffix == ".jsonl" and Path(path).exists():
            from streamrft.producers.tasks import load_task_file

            seen = {c for t in load_task_file(path, cfg.data.prompt_key, cfg.data.answer_key, with_images=False)
                    for c in t.prompt + (t.answer or "")}
            missing = "".join(sorted(seen - set(alphabet)))
            if missing:
                raise ValueError(f"model.build.alphabet is not set, and the default ({alphabet!r}) misses characters of "
                                 f"data.{split} ({path}): {missing!r}; set model.build.alphabet to every character your "
                                 "tasks and environment write")
    return alphabet


def batches(n: int, size: int, seed: int, shuffle: bool = True) -> Iterator[list[int]]:
    """Endless batches of `size` indices into `n` examples: epoch after epoch, each reshuffled by a
    `seed`ed RNG, a batch spanning two epochs where `size` does not divide `n`."""
    rng = random.Random(seed)
    pending: list[int] = []
    while True:
        while len(pending) < size:
            order = list(range(n))
            if shuffle:
                rng.shuffle(order)
            pending += order
        yield pending[:size]
        pending = pending[size:]


class OfflineTrainer:
    def __init__(self, cfg: RunConfig):
        from streamrft.engine.models import load_policy, resolve_device
        from streamrft.engine.training import make_train_engine

        algo = cfg.algorithm
        if algo.type not in OFFLINE_TYPES:
            raise ValueError(f"algorithm.type={algo.type!r} is not offline (one of {list(OFFLINE_TYPES)})")
        if not cfg.data.train:
            raise ValueError("offline training needs data.train (a JSONL or Parquet file)")
        if algo.type == "kto" and cfg.trainer.micro_batch_size < 2:
            raise ValueError("KTO needs trainer.micro_batch_size >= 2 (its KL pairs mismatch examples of one batch)")
        torch.manual_seed(cfg.trainer.seed)
        torch.set_num_threads(cfg.trainer.torch_threads)
        self.cfg, self.type = cfg, algo.type
        self.params = dict(algo.policy_loss.params)
        self.agg_mode = algo.aggregation or PRESETS[algo.type]["aggregation"]
        self.loss = {"sft": self._sft, "dpo": self._dpo, "kto": self._kto}[algo.type]
        self.device = resolve_device(cfg.trainer.device)
        self.model, self.tokenizer = load_policy(ensure_model(cfg), dtype=cfg.model.dtype, device=self.device)
        self.data = load_offline_dataset(cfg.data.train, self.tokenizer)
        if self.data.shape not in SHAPES_FOR[algo.type]:
            raise ValueError(f"{cfg.data.train} holds {self.data.shape!r} data; algorithm.type={algo.type!r} "
                             f"trains on {list(SHAPES_FOR[algo.type])}")
        self.ref_model = None
        if algo.type != "sft":
            self.ref_model, _ = load_policy(cfg.model.path, dtype=cfg.model.dtype, device=self.device)
            self.ref_model.requires_grad_(False)
        self.engine = make_train_engine(cfg.trainer, self.model)
        self.pad_id = self.tokenizer.pad_token_id

    def _seq_logps(self, model, pairs: list[tuple[list[int], list[int]]]) -> torch.Tensor:
        """Per-sequence completion log-probs `[len(pairs)]` (teacher forcing, one forward)."""
        seqs = collate_sequences(pairs, self.pad_id).to(self.device)
        logp, _ = token_logprobs(model, seqs)
        return sequence_logps(logp, seqs.mask)

    def _sft(self, examples: list[OfflineExample]) -> tuple[torch.Tensor, dict[str, float]]:
        seqs = collate_sequences([(e.prompt_ids, e.completion_ids) for e in examples], self.pad_id).to(self.device)
        logp, _ = token_logprobs(self.model, seqs)
        return sft_loss(logp, seqs.mask, self.agg_mode, **self.params), {"nll": masked_mean(-logp, seqs.mask)}

    def _dpo(self, examples: list[OfflineExample]) -> tuple[torch.Tensor, dict[str, float]]:
        # chosen and rejected in one forward, as TRL's concatenated_forward
        pairs = [(e.prompt_ids, e.completion_ids) for e in examples] + [(e.prompt_ids, e.rejected_ids) for e in examples]
        logps = self._seq_logps(self.model, pairs)
        with torch.no_grad():
            ref = self._seq_logps(self.ref_model, pairs)
        n = len(examples)
        chosen, rejected, ref_chosen, ref_rejected = logps[:n], logps[n:], ref[:n], ref[n:]
        losses = OFFLINE_LOSSES["dpo"](chosen, rejected, ref_chosen, ref_rejected, **self.params)
        metrics = dpo_metrics(chosen, rejected, ref_chosen, ref_rejected, beta=self.params.get("beta", 0.1))
        return losses.mean(), metrics

    def _kto(self, examples: list[OfflineExample]) -> tuple[torch.Tensor, dict[str, float]]:
        # prompt i with completion i-1 of the same batch estimates the policy's drift (z0)
        pairs = [(e.prompt_ids, e.completion_ids) for e in examples]
        kl_pairs = [(p, c) for (p, _), (_, c) in zip(pairs, pairs[-1:] + pairs[:-1])]
        logps = self._seq_logps(self.model, pairs)
        with torch.no_grad():
            kl_policy = self._seq_logps(self.model, kl_pairs)
            ref_all = self._seq_logps(self.ref_model, pairs + kl_pairs)
        ref, kl_ref_logps = ref_all[: len(pairs)], ref_all[len(pairs):]
        z0 = kto_kl_ref(kl_policy, kl_ref_logps)
        labels = torch.tensor([e.label for e in examples], device=self.device)
        losses = OFFLINE_LOSSES["kto"](logps, ref, labels, z0, **self.params)
        return losses.mean(), {"kl_ref": float(z0), "desirable_frac": float(labels.float().mean())}

    def run(self, publish: bool = False) -> dict:
        """Train `trainer.max_steps` steps, save `<output_dir>/final`; returns the loss curve. Each
        step's metrics go to `monitor.backends` as `trainer/<name>` (rank 0 only)."""
        from streamrft.monitor.bars import bar
        from streamrft.monitor.loggers import MetricLogger

        tc, data = self.cfg.trainer, self.data.examples
        order = batches(len(data), tc.micro_batch_size, self.cfg.data.seed, self.cfg.data.shuffle)
        losses: list[float] = []
        metrics: dict[str, float] = {}
        logger = MetricLogger.for_run(self.cfg) if self.engine.is_main else None
        self.model.train()
        try:
            with bar(tc.max_steps, f"{self.type} training", hide=not self.engine.is_main) as progress:
                for step in range(1, tc.max_steps + 1):
                    loss, metrics = self.loss([data[i] for i in next(order)])  # the batch mean
                    self.engine.backward(loss)
                    metrics.update(loss=loss.item(), grad_norm=self.engine.step())
                    losses.append(metrics["loss"])
                    if logger is not None:
                        logger.log(Metric.of_finite("trainer", f"offline-{self.type}", step, metrics))
                    log.info("%s step %d loss %.4f", self.type, step, metrics["loss"])
                    progress.update(1)
        finally:
            if logger is not None:
                logger.close()
        self.model.eval()
        final = Path(self.cfg.output_dir) / "final"
        state = self.engine.publishable_state_dict()
        if self.engine.is_main:
            self.model.save_pretrained(final, state_dict=state)
            self.tokenizer.save_pretrained(final)
        version = None
        if publish and self.engine.is_main:
            from streamrft.engine.weights import publish_base_model, publish_state_dict
            from streamrft.infra.objectstore import WeightStore

            store = WeightStore(self.cfg.s3)
            store.ensure_bucket()
            version = tc.max_steps
            base = publish_base_model(store, self.cfg.weights_key, self.cfg.model.path, weights=False)
            publish_state_dict(store, self.cfg.weights_key, version, state,
                               meta={"step": tc.max_steps, "algorithm": self.type, "data": self.data.path, **base})
        return {"algorithm": self.type, "steps": tc.max_steps, "losses": losses, "metrics": metrics,
                "final_dir": str(final), "version": version}


def run_offline(cfg: RunConfig, publish: bool = False) -> int:
    """CLI entry for `streamrft train CONFIG` with an offline `algorithm.type`."""
    if cfg.stages:
        log.warning("offline training ignores `stages:` (the run launcher runs them)")
    result = OfflineTrainer(cfg).run(publish=publish)
    curve = result["losses"]
    print(f"{result['algorithm']} done: {result['steps']} steps, loss {curve[0]:.4f} -> {curve[-1]:.4f}, "
          f"saved {result['final_dir']}" + (f", published v{result['version']}" if result["version"] is not None else ""),
          flush=True)
    return 0


def sft_stage(model_path: str, out_dir: str, stage: StageConfig, pairs: list[tuple] | Callable[[Any], list],
              seed: int = 0, index: int = 0, logger=None) -> str:
    """Run one SFT warm-up stage from `model_path`; save the model and tokenizer (and a
    vision-language model's processor) as an HF directory at `out_dir` and return it. `pairs` are
    (prompt, completion) pairs, (prompt, completion, images) for a vision-language model, or a
    function of the tokenizer returning token sequences with their masks (`engine.sft.Sequence`,
    e.g. multi-turn demonstrations). Each step's loss goes to `logger` (a `MetricLogger`) as
    `stage/<index>/loss`."""
    from streamrft.engine.models import load_policy, load_processor
    from streamrft.engine.sft import image_pair_sequence, pair_sequence, sft_on_sequences

    model, tokenizer = load_policy(model_path)
    processor = load_processor(model_path)
    if callable(pairs):
        sequences = pairs(tokenizer)
    else:
        if processor is None and any(len(p) > 2 for p in pairs):
            raise ValueError(f"stage {index}: its examples show images, and {model_path} is not a vision-language model")
        sequences = [image_pair_sequence(processor, *p) if len(p) > 2 else pair_sequence(tokenizer, *p) for p in pairs]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        on_step = None if logger is None else \
            (lambda step, loss: logger.log(Metric.of_finite("stage", str(index), step, {"loss": loss})))
        losses = sft_on_sequences(model, tokenizer, sequences, steps=stage.steps, batch_size=stage.batch_size,
                                  lr=stage.lr, seed=seed, on_step=on_step, desc=f"stage {index} ({stage.type})",
                                  warmup_steps=stage.warmup_steps, schedule=stage.schedule,
                                  min_lr_ratio=stage.min_lr_ratio, max_grad_norm=stage.max_grad_norm,
                                  weight_decay=stage.weight_decay)
    log.info("sft stage: %d steps, loss %.4f -> %.4f", stage.steps, losses[0], losses[-1])
    model.save_pretrained(out_dir)
    (processor or tokenizer).save_pretrained(out_dir)
    return out_dir
