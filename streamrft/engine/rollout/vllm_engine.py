"""Rollout engine on vLLM (GPU): `LLM.generate` on token-id prompts, weights swapped in place.

vllm is imported when an engine is built, never at module import, so this module loads on CPU
machines. Needs vllm >= 0.10.2 (`logprobs_mode`). Written against vLLM's documented offline API
(LLM, SamplingParams, TokensPrompt, LLM.apply_model) and checked only by the gpu-marked test.

- The engine core runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0, set before vllm is
  imported unless the caller set it), so `load_weights` reaches the live model without pickling
  weights across processes.
- `logprobs_mode="processed_logprobs"` makes vLLM report log-probs after its logits processing
  (temperature, top-k, top-p), the distribution it sampled from: the convention of `base.py`.
  `generation_config="vllm"` keeps the checkpoint's generation_config.json (repetition_penalty,
  top_k, ...) out of the sampling defaults, as the transformers engine does.
- vLLM's own tokenizer is skipped (`skip_tokenizer_init`): AutoTokenizer would load a tokenizer of
  the model type's class, which for the demo's char tokenizer is wrong. Text is decoded here with
  `load_tokenizer`, and EOS is passed as a stop token explicitly.
- LoRA (`lora` set: the run's `model.lora`): built with `enable_lora`; a LoRA version is written as a
  peft directory (`engine.lora.write_peft_dir`) and every later generate call carries a
  `LoRARequest` for it, with a new id per version, so vLLM applies it to the untouched base weights.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from streamrft.engine.models import load_tokenizer
from streamrft.engine.rollout.base import Completion, SamplingParams


class VLLMEngine:
    def __init__(
        self,
        model_path: str,
        device: str = "cuda",
        dtype: str = "bfloat16",
        gpu_memory_utilization: float = 0.5,
        max_batch: int | None = None,
        max_model_len: int | None = None,
        seed: int = 0,
        lora: Any = None,
        **llm_kwargs: Any,
    ):
        if not device.startswith("cuda"):
            raise ValueError(f"VLLMEngine runs on CUDA devices, not {device!r}; use the transformers engine")
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        from vllm import LLM

        self.tokenizer = load_tokenizer(model_path)
        if max_batch is not None:
            llm_kwargs.setdefault("max_num_seqs", max_batch)
        self.max_lora_rank = None if lora is None else _vllm_max_rank(lora.r)
        if lora is not None:
            llm_kwargs.update(enable_lora=True, max_loras=1, max_lora_rank=self.max_lora_rank)
        self.llm = LLM(
            model=model_path,
            dtype=dtype,
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len,
            seed=seed,
            skip_tokenizer_init=True,
            logprobs_mode="processed_logprobs",
            generation_config="vllm",
            **llm_kwargs,
        )
        self.version = 0
        self.lora_request = None  # the LoRA version every generate call applies, if any
        self._is_base = True  # no full version loaded: LoRA versions apply to these weights
        self._adapters = tempfile.TemporaryDirectory(prefix="streamrft-lora-")
        self._lora_ids = 0

    def generate(self, prompt_ids: list[list[int]], params: SamplingParams) -> list[list[Completion]]:
        from vllm import SamplingParams as VLLMSamplingParams
        from vllm.inputs import TokensPrompt

        stop_ids = [self.tokenizer.eos_token_id, *params.stop_token_ids]
        sp = VLLMSamplingParams(
            n=params.n,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k if params.top_k > 0 else -1,
            max_tokens=params.max_new_tokens,
            seed=params.seed,
            stop_token_ids=stop_ids,
            # the sampled token's log-prob is always among those returned, next to the k most likely
            logprobs=max(1, params.top_logprobs),
            detokenize=False,
        )
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompt_ids], sp, use_tqdm=False,
                                 lora_request=self.lora_request)
        groups = []
        for out in outs:  # vLLM returns outputs in prompt order
            group = []
            for o in out.outputs:
                ids = list(o.token_ids)
                lps = [o.logprobs[i][tok].logprob for i, tok in enumerate(ids)]
                tops = None
                if params.top_logprobs > 0:  # each step's dict: the k most likely by rank, and the sampled token
                    tops = [sorted(((t, lp.logprob) for t, lp in step.items() if lp.rank <= params.top_logprobs),
                                   key=lambda x: -x[1]) for step in o.logprobs[: len(ids)]]
                text = self.tokenizer.decode(ids, skip_special_tokens=True)
                reason = "stop" if o.finish_reason == "stop" else "length"
                group.append(Completion(token_ids=ids, logprobs=lps, text=text, finish_reason=reason,
                                        top_logprobs=tops))
            groups.append(group)
        return groups

    def load_weights(self, state_dict: dict[str, Any], version: int, lora: Any = None) -> None:
        """Load HF-named tensors into the live model (vLLM fuses qkv / gate_up itself), then drop
        the prefix cache, whose KV entries were computed with the old weights. With `lora`, the
        adapter `state_dict` becomes the LoRA request of every later generate call instead."""
        if lora is not None:
            self._use_adapter(state_dict, lora, version)
            self.version = version
            return
        weights = list(state_dict.items())
        self.llm.apply_model(lambda model: model.load_weights(weights))
        self.llm.reset_prefix_cache()
        self.version = version
        self.lora_request, self._is_base = None, False

    def _use_adapter(self, adapter: dict[str, Any], lora: Any, version: int) -> None:
        from vllm.lora.request import LoRARequest

        from streamrft.engine.lora import write_peft_dir

        if not self._is_base:
            raise RuntimeError("a LoRA version after a full one: the base weights it applies to are gone")
        if self.max_lora_rank is None or lora.r > self.max_lora_rank:
            raise ValueError(f"a LoRA version of rank {lora.r}, but this engine was built with max_lora_rank="
                             f"{self.max_lora_rank}: build it with the run's model.lora")
        self._lora_ids += 1  # vLLM caches adapters by id: a new id makes it load this version's
        path = write_peft_dir(adapter, lora, Path(self._adapters.name) / f"v{version}-{self._lora_ids}")
        if self.lora_request is not None:  # loaded by vLLM already, or never to be
            shutil.rmtree(self.lora_request.lora_path, ignore_errors=True)
        self.lora_request = LoRARequest(f"v{version}", self._lora_ids, str(path))


def _vllm_max_rank(r: int) -> int:
    """The smallest `max_lora_rank` vLLM accepts (vllm.config.lora.MaxLoRARanks) that holds rank `r`."""
    allowed = (1, 8, 16, 32, 64, 128, 256, 320, 512)
    fits = [a for a in allowed if a >= r]
    if not fits:
        raise ValueError(f"model.lora.r={r}: vLLM serves LoRA ranks up to {allowed[-1]}")
    return fits[0]
