"""Rollout engine on vLLM (GPU): `LLM.generate` on token-id prompts, weights swapped in place.

vllm is imported when an engine is built, never at module import, so this module loads on CPU
machines. Pinned to vllm 0.27 (`pyproject.toml`, extra `gpu`: `vllm~=0.27.1`): the newest release
that installs next to this project (vllm >= 0.28 needs huggingface-hub >= 1.27, which needs
click >= 8.4.2, and faust-streaming pins click < 8.4; 0.33 also needs a certifi the registry does
not have). 0.27.1 needs torch 2.13.0, the version the CPU install uses. Every call below was
checked against the source of the vllm 0.27.1 wheel (paths under `vllm/`), and again in 0.33.0,
which has them all too; the gpu-marked tests (`pytest -m gpu`) run them.

| here | vLLM 0.27.1 API it relies on | checked in |
| --- | --- | --- |
| build | `LLM(model, dtype, gpu_memory_utilization, kv_cache_memory_bytes, max_model_len, seed, skip_tokenizer_init, logprobs_mode="processed_logprobs", generation_config="vllm", max_num_seqs, enable_lora, max_loras, max_lora_rank, limit_mm_per_prompt={"image": k, "video": 0})` | entrypoints/llm.py `LLM.__init__`; engine/arg_utils.py `EngineArgs`; config/multimodal.py `MultiModalConfig.limit_per_prompt`; config/model.py `LogprobsMode`; config/lora.py `MaxLoRARanks` |
| engine core in this process | env `VLLM_ENABLE_V1_MULTIPROCESSING=0`: `InprocClient` + `UniProcExecutor` run the worker here | envs.py; v1/engine/llm_engine.py `from_engine_args`; v1/engine/core_client.py `make_client`; v1/executor/uniproc_executor.py `collective_rpc` |
| generate | `LLM.generate(list[TokensPrompt], list[SamplingParams], use_tqdm=False, lora_request=)` -> `RequestOutput.outputs`: `CompletionOutput(token_ids, logprobs, finish_reason)`, in prompt order | entrypoints/llm.py `generate`; inputs/__init__.py; outputs.py |
| sampling | `SamplingParams(n, temperature, top_p, top_k, max_tokens, seed, stop_token_ids, logprobs, detokenize=False)`. top_k 0 = off (-1 still accepted); temperature in [0, 2], 0 < T < 0.01 raised to 0.01; greedy refuses n > 1; the n children of a seeded request get seed + i; `logprobs` at most `max_logprobs` (20) | sampling_params.py `__post_init__`, `_verify_args`, `_verify_greedy_sampling`; v1/engine/parallel_sampling.py; config/model.py |
| log-probs | per step a dict token -> `Logprob(logprob, rank)`: the sampled token (rank = how many tokens have a log-prob >= its own) and the `logprobs` most likely (ranks 1..k); `processed_logprobs` = log-softmax after temperature, min_p, top-k and top-p | logprobs.py `append_logprobs_for_next_position`; v1/worker/gpu/sample/sampler.py + logprob.py (Model Runner V2, the default for dense decoders); v1/sample/sampler.py (V1 runner) |
| stop | EOS or a `stop_token_ids` token finishes the request STOPPED (`finish_reason` "stop"), the token kept in `token_ids`; `max_tokens` -> "length"; the checkpoint's generation_config `eos_token_id`s are stop tokens too | v1/core/sched/utils.py `check_stop`; v1/engine/input_processor.py + sampling_params.py `update_from_generation_config` |
| full weights | `LLM.collective_rpc("reload_weights", kwargs={weights_iterator, is_checkpoint_format=True})` -> `Worker.reload_weights` -> `GPUModelRunner.reload_weights` (V2 runner: the same): layer-wise in-place load of HF-named tensors through the model's `load_weights` (fuses qkv / gate_up, skips a tied lm_head) into the same storage, so CUDA graphs stay valid | v1/worker/gpu_worker.py; v1/worker/gpu_model_runner.py; v1/worker/gpu/model_runner.py; model_executor/model_loader/reload/layerwise.py; model_executor/models/utils.py `AutoWeightsLoader` |
| prefix cache | `LLM.reset_prefix_cache()` -> bool (False while requests run; none do between calls) | entrypoints/llm.py; v1/engine/llm_engine.py |
| LoRA | `LoRARequest(lora_name, lora_int_id, lora_path)`; adapters cached by id. A LoRA-enabled model's layers are wrapped (`base_layer`) and 0.27's `load_weights` does not reach through them: an engine built for LoRA takes LoRA versions only | lora/request.py; lora/layers/base.py |
| images | `TokensPrompt(prompt_token_ids, multi_modal_data={"image": [PIL.Image, ...]})`: token ids whose placeholder runs the HF processor already expanded; vLLM's multi-modal processor finds the applied prompt updates and places each image's features there. `SamplingParams(logit_bias={token: bias})` keeps the placeholders from being sampled (the trainer's `engine/placeholders.py` hook), applied before `processed_logprobs`. Not yet run on a GPU (the `gpu` test `test_vllm_samples_a_vlm_with_its_images` is written) | inputs/data.py `TokensPrompt`; multimodal/processing.py `_apply_prompt_updates`; sampling_params.py `logit_bias` |
| close | `llm.llm_engine.engine_core.shutdown()` (`InprocClient` -> `EngineCore.shutdown`: executor down, `gc.unfreeze`, `cleanup_dist_env_and_memory`, which empties torch's cache); nothing else frees an in-process engine in 0.27 | v1/engine/core_client.py; v1/engine/core.py; distributed/parallel_state.py |

- The engine core runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0, set before vllm is
  imported unless the caller set it), so `reload_weights` gets the CPU tensors as they are, never
  pickled across processes.
- `logprobs_mode="processed_logprobs"` makes vLLM report log-probs after its logits processing
  (temperature, top-k, top-p), the distribution it sampled from: the convention of `base.py`
  (greedy: the untempered log-softmax, as vLLM leaves temperature-0 rows alone). The checkpoint's
  generation_config.json (repetition_penalty, top_k, ...) only ever fills the sampling defaults
  of a call made without SamplingParams (`ModelConfig.get_diff_sampling_param`), which this engine
  never makes; `generation_config="vllm"` says so explicitly.
- vLLM refuses greedy decoding with n > 1: such a call becomes n requests of n = 1 per prompt.
  A seeded call seeds each request apart (seed + its first sample's index in the call), so the
  prompts of one call do not share random streams and the same seed repeats the same samples.
  With `SamplingParams.seeds` each prompt's request is seeded with its own seed (vLLM gives each
  request a generator of its own), so its samples do not depend on what else shares the call.
- vLLM's own tokenizer is skipped (`skip_tokenizer_init`): AutoTokenizer would load a tokenizer of
  the model type's class, which for the demo's char tokenizer is wrong. Text is decoded here with
  `load_tokenizer`, and EOS is passed as a stop token explicitly.
- `kv_cache_gib` (config `explorer.engine.kv_cache_gib`) fixes the KV cache's size. Without it vLLM
  sizes the cache from a memory profile that reads the whole GPU's free memory (utils/mem_utils.py
  `memory_profiling`, v1/worker/gpu_worker.py `determine_available_memory`), so explorers and a
  trainer starting together on one GPU disturb each other's readings (a smaller cache, or vLLM's
  "Error in memory profiling" when another process frees memory meanwhile). With it,
  `gpu_memory_utilization` is only checked against the GPU's free memory at start
  (v1/worker/utils.py `request_memory`).
- LoRA (`lora` set: the run's `model.lora`): built with `enable_lora`; a LoRA version is written as a
  peft directory (`engine.lora.write_peft_dir`) and every later generate call carries a
  `LoRARequest` for it, with a new id per version, so vLLM applies it to the untouched base weights.
- `close()` gives the GPU memory back (weights, KV cache, CUDA graphs); the CUDA context stays.
"""
from __future__ import annotations

import gc
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from streamrft.engine.models import load_processor, load_tokenizer
from streamrft.engine.rollout.base import Completion, SamplingParams, check_images, check_seeds

MIN_TEMPERATURE = 0.01  # vllm.sampling_params._MAX_TEMP: a lower non-zero temperature is raised to it
SEED_RANGE = 2**63  # vLLM seeds are int64


class VLLMEngine:
    def __init__(
        self,
        model_path: str,
        device: str = "cuda",
        dtype: str = "bfloat16",
        gpu_memory_utilization: float = 0.5,
        kv_cache_gib: float | None = None,
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
        self.processor = load_processor(model_path)  # a vision-language model's; None for text
        self.banned: dict[int, float] = {}  # placeholder token -> logit bias: never sampled, as the trainer's hook
        if self.processor is not None:
            from transformers import AutoConfig

            from streamrft.engine.placeholders import BANNED_LOGIT, placeholder_ids

            self.banned = {i: BANNED_LOGIT for i in placeholder_ids(AutoConfig.from_pretrained(model_path))}
        if max_batch is not None:
            llm_kwargs.setdefault("max_num_seqs", max_batch)
        if kv_cache_gib is not None:
            llm_kwargs.setdefault("kv_cache_memory_bytes", int(kv_cache_gib * 2**30))
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

    def generate(self, prompt_ids: list[list[int]], params: SamplingParams,
                 images: list[list] | None = None) -> list[list[Completion]]:
        """`images`: a vision-language model's, per prompt its images (PIL) in the order of the
        placeholder runs its ids already hold (the processor expanded them): vLLM's multi-modal
        processor finds those runs and puts the images' features there (`multi_modal_data`)."""
        from vllm import SamplingParams as VLLMSamplingParams
        from vllm.inputs import TokensPrompt

        if images is not None:
            check_images(self.processor, prompt_ids, images)

        if params.n < 1 or params.max_new_tokens < 1:
            raise ValueError(f"need n >= 1 and max_new_tokens >= 1, got {params.n}, {params.max_new_tokens}")
        if 0 < params.temperature < MIN_TEMPERATURE:
            raise ValueError(f"temperature {params.temperature}: vLLM samples at {MIN_TEMPERATURE} below that, so "
                             f"its log-probs would not be this temperature's; use 0 (greedy) or >= {MIN_TEMPERATURE}")
        greedy = params.temperature == 0
        per_prompt, n = (params.n, 1) if greedy else (1, params.n)  # requests per prompt, samples per request
        stop_ids = list(dict.fromkeys([self.tokenizer.eos_token_id, *params.stop_token_ids]))
        k = params.top_logprobs

        check_seeds(params, len(prompt_ids))

        def seed(i: int) -> int | None:
            if params.seeds is not None:  # the prompt's own seed; its greedy copies (i % per_prompt) agree anyway
                return params.seeds[i // per_prompt] % SEED_RANGE
            return None if params.seed is None else (params.seed + i * n) % SEED_RANGE

        def request_params(i: int) -> Any:
            return VLLMSamplingParams(
                n=n,
                temperature=params.temperature,
                top_p=params.top_p,
                top_k=params.top_k,  # 0 = off, as in base.SamplingParams
                max_tokens=params.max_new_tokens,
                seed=seed(i),
                stop_token_ids=stop_ids,
                # the sampled token's log-prob always comes back, next to the k most likely
                logprobs=max(1, k),
                detokenize=False,
                **({"logit_bias": self.banned} if self.banned else {}),
            )

        def prompt(i: int) -> Any:
            if images is None or not images[i]:
                return TokensPrompt(prompt_token_ids=prompt_ids[i])
            return TokensPrompt(prompt_token_ids=prompt_ids[i], multi_modal_data={"image": list(images[i])})

        prompts = [prompt(i) for i in range(len(prompt_ids)) for _ in range(per_prompt)]
        outs = self.llm.generate(prompts, [request_params(i) for i in range(len(prompts))], use_tqdm=False,
                                 lora_request=self.lora_request)
        flat = [self._completion(o, k) for out in outs for o in out.outputs]  # outputs come in prompt order
        return [flat[i * params.n:(i + 1) * params.n] for i in range(len(prompt_ids))]

    def _completion(self, o: Any, k: int) -> Completion:
        ids = list(o.token_ids)
        lps = [o.logprobs[i][tok].logprob for i, tok in enumerate(ids)]
        tops = None
        if k > 0:  # each step's dict: the k most likely (ranks 1..k) and the sampled token (its own rank)
            tops = [[(t, lp.logprob) for t, lp in sorted(((t, lp) for t, lp in step.items()
                                                          if lp.rank is not None and lp.rank <= k),
                                                         key=lambda x: x[1].rank)]
                    for step in o.logprobs[: len(ids)]]
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        reason = "stop" if o.finish_reason == "stop" else "length"
        return Completion(token_ids=ids, logprobs=lps, text=text, finish_reason=reason, top_logprobs=tops)

    def load_weights(self, state_dict: dict[str, Any], version: int, lora: Any = None) -> None:
        """Load HF-named tensors into the live model in place (vLLM fuses qkv / gate_up itself), then
        drop the prefix cache, whose KV entries were computed with the old weights. With `lora`, the
        adapter `state_dict` becomes the LoRA request of every later generate call instead."""
        if lora is not None:
            self._use_adapter(state_dict, lora, version)
            self.version = version
            return
        if self.max_lora_rank is not None:
            raise RuntimeError("a full version on an engine built for LoRA versions (model.lora): vLLM's LoRA "
                               "layers wrap the base weights, which its reload cannot reach")
        weights = list(state_dict.items())
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights, "is_checkpoint_format": True})
        if not self.llm.reset_prefix_cache():
            raise RuntimeError("vLLM kept its prefix cache (requests still running?): it holds the old weights' KV")
        self.version = version
        self.lora_request, self._is_base = None, False

    def close(self) -> None:
        """Shut the engine down and give its GPU memory back; the process keeps its CUDA context."""
        llm, self.llm = getattr(self, "llm", None), None
        if llm is None:
            return
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()
        import torch

        torch.cuda.empty_cache()
        self._adapters.cleanup()

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
    """The smallest `max_lora_rank` vLLM accepts (vllm/config/lora.py MaxLoRARanks) that holds rank `r`."""
    allowed = (1, 8, 16, 32, 64, 128, 256, 320, 512)
    fits = [a for a in allowed if a >= r]
    if not fits:
        raise ValueError(f"model.lora.r={r}: vLLM serves LoRA ranks up to {allowed[-1]}")
    return fits[0]
