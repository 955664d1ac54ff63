"""Rollout engine on Hugging Face transformers: batched `model.generate` with the KV cache (CPU or GPU).

The CPU demo's explorers use it. Prompts are left-padded into batches of at most `max_batch`
sequences (prompts x n); each prompt is repeated n times rather than using num_return_sequences,
so greedy decoding with n > 1 works too. Log-probs come from the per-step scores `generate`
sampled from (`output_scores`: after temperature, top-k and top-p), the convention in `base.py`;
the checkpoint's own generation config is replaced by one naming only its special tokens, so no
setting of its own (repetition_penalty, top_k, ...) changes what is sampled.

The n samples of one prompt share its prefill: the prompts (all but their last token) run once,
their KV cache is repeated n times, and `generate` goes on from it. A real chat prompt is several
times longer than a short answer, so the prefill is most of the work: with SmolLM2, 2 prompts of 45
tokens x 8 samples of 12 tokens take 2.5x less time (`benchmarks/version_profile.py` runs the
explorer's generate; the ids are identical, log-probs equal to ~1e-5, tested).

With `SamplingParams.seeds` each row samples from a random stream of its own (`SeededSampler`:
Gumbel-max over the tempered, truncated log-probs, one generator per row and step), so a row's
tokens are the same whatever else shares the call; `generate` then runs greedy over the sampler's
scores, and the log-probs are the sampler's, before its noise.
"""
from __future__ import annotations

import torch
from transformers import DynamicCache, GenerationConfig, LogitsProcessorList, TopKLogitsWarper, TopPLogitsWarper

from streamrft.engine.models import load_policy, load_processor
from streamrft.engine.rollout.base import Completion, SamplingParams, check_images, check_seeds, derive_seed


class SeededSampler:
    """A logits processor that samples row r's next token from softmax(logits / temperature), top-k
    and top-p truncated as `generate` would, with the generator `derive_seed(row_seeds[r], step)`
    (Gumbel-max: the argmax of log-probs + Gumbel noise is a sample of them). It returns those
    scores for a greedy `generate` to take the argmax of, and keeps each step's log-probs."""

    def __init__(self, row_seeds: list[int], temperature: float, top_k: int, top_p: float):
        self.row_seeds, self.temperature = row_seeds, temperature
        self.warpers = ([TopKLogitsWarper(top_k)] if top_k > 0 else []) + ([TopPLogitsWarper(top_p)] if top_p < 1 else [])
        self.log_probs: list[torch.Tensor] = []  # one (rows, vocab) per step

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        x = scores.float() / self.temperature
        for warp in self.warpers:
            x = warp(input_ids, x)
        log_probs = torch.log_softmax(x, dim=-1)
        step = len(self.log_probs)
        self.log_probs.append(log_probs)
        noise = torch.empty_like(log_probs, device="cpu")
        for row, seed in enumerate(self.row_seeds):
            noise[row].uniform_(generator=torch.Generator().manual_seed(derive_seed(seed, step)))
        gumbel = -torch.log(-torch.log(noise.clamp_(min=1e-20, max=1 - 1e-7)))
        return log_probs + gumbel.to(log_probs.device)  # -inf (truncated) stays -inf


class TransformersEngine:
    def __init__(self, model_path: str, device: str = "cpu", dtype: str = "float32", max_batch: int = 64):
        self.model, self.tokenizer = load_policy(model_path, dtype=dtype, device=device)
        self.processor = load_processor(model_path)  # a vision-language model's; None for text
        # sample from exactly what SamplingParams names: `generate` fills every setting left unset
        # from the checkpoint's own generation config (a real one may set repetition_penalty, top_k,
        # min_length, ...), which would change the distribution behind the recorded log-probs
        own = self.model.generation_config
        self.model.generation_config = GenerationConfig(bos_token_id=own.bos_token_id, eos_token_id=own.eos_token_id,
                                                        pad_token_id=own.pad_token_id)
        self.device = device
        # a seeded `generate` leaves the process's RNGs as it found them: the CPU's, and the GPU's it samples on
        gpu = torch.device(device)
        self._rng_devices = ([torch.cuda.current_device() if gpu.index is None else gpu.index]
                             if gpu.type == "cuda" else [])
        self.max_batch = max_batch
        self.version = 0
        self._base: dict[str, torch.Tensor] = {}  # W0 of each weight a LoRA version adapted so far
        self._is_base = True  # the live weights outside `_base` are the base model's (no full version loaded)

    @torch.no_grad()
    def generate(self, prompt_ids: list[list[int]], params: SamplingParams,
                 images: list[list] | None = None) -> list[list[Completion]]:
        """`images`: a vision-language model's, per prompt the images (PIL) whose placeholder tokens
        its ids hold, in order (`check_images`)."""
        if params.n < 1 or params.max_new_tokens < 1:
            raise ValueError(f"need n >= 1 and max_new_tokens >= 1, got {params.n}, {params.max_new_tokens}")
        per_call = max(1, self.max_batch // params.n)
        out: list[list[Completion]] = []
        check_seeds(params, len(prompt_ids))
        pixels = None if images is None else self._pixels(prompt_ids, images)
        with torch.random.fork_rng(devices=self._rng_devices, enabled=params.seed is not None):
            if params.seed is not None:
                torch.manual_seed(params.seed)
            for start in range(0, len(prompt_ids), per_call):
                seeds = None if params.seeds is None else params.seeds[start : start + per_call]
                part = None if pixels is None else pixels[start : start + per_call]
                out.extend(self._generate_batch(prompt_ids[start : start + per_call], params, seeds, part))
        return out

    def _pixels(self, prompt_ids: list[list[int]], images: list[list]) -> list[torch.Tensor | None]:
        """Per prompt its images' pixel values ([k, C, H, W], the processor's: what the trainer
        recomputes with), or None for a prompt without images."""
        check_images(self.processor, prompt_ids, images)
        from streamrft.engine.vlm import pixel_values

        return [pixel_values(self.processor, imgs).to(self.device, self.model.dtype) if imgs else None
                for imgs in images]

    def _generate_batch(self, prompts: list[list[int]], params: SamplingParams,
                        seeds: list[int] | None = None,
                        pixels: list[torch.Tensor | None] | None = None) -> list[list[Completion]]:
        if any(len(p) == 0 for p in prompts):
            raise ValueError("empty prompt")
        pad_id = self.tokenizer.pad_token_id
        stop_ids = [self.tokenizer.eos_token_id, *params.stop_token_ids]
        width = max(len(p) for p in prompts)
        rows = [p for p in prompts for _ in range(params.n)]
        input_ids, attention_mask = self._left_padded(rows, width)
        greedy = params.temperature == 0
        sampler = None
        if seeds is not None and not greedy:  # each row its own stream: greedy over the sampler's scores
            sampler = SeededSampler([derive_seed(s, k) for s in seeds for k in range(params.n)],
                                    params.temperature, params.top_k, params.top_p)
        sampling = {} if greedy or sampler else {"temperature": params.temperature, "top_p": params.top_p,
                                                 "top_k": params.top_k}
        config = GenerationConfig(
            do_sample=not greedy and sampler is None,
            **sampling,
            max_new_tokens=params.max_new_tokens,
            eos_token_id=stop_ids,
            pad_token_id=pad_id,
            return_dict_in_generate=True,
            output_scores=True,  # after temperature, top-k and top-p: the distribution each token came from
        )
        cache = self._shared_prefill(prompts, width, params.n, pixels)
        images = {}
        if cache is None and pixels is not None and any(p is not None for p in pixels):
            # no shared prefill: generate's first forward sees every row's images, row by row
            images = {"pixel_values": torch.cat([p for p in pixels for _ in range(params.n) if p is not None])}
        res = self.model.generate(input_ids=input_ids, attention_mask=attention_mask, generation_config=config,
                                  **({} if cache is None else {"past_key_values": cache}), **images,
                                  **({} if sampler is None else {"logits_processor": LogitsProcessorList([sampler])}))
        new = res.sequences[:, width:]
        if sampler is None:
            scores = torch.stack(res.scores, dim=1).float()  # (rows, steps, vocab); -inf where truncated
            log_probs = torch.log_softmax(scores, dim=-1)
        else:
            log_probs = torch.stack(sampler.log_probs, dim=1)
        chosen = log_probs.gather(-1, new.unsqueeze(-1)).squeeze(-1)
        tops = None
        if params.top_logprobs > 0:
            values, indices = log_probs.topk(min(params.top_logprobs, log_probs.shape[-1]), dim=-1)
            tops = [[list(zip(i, v)) for i, v in zip(row_i, row_v)]
                    for row_i, row_v in zip(indices.tolist(), values.tolist())]
        stop = set(stop_ids)
        completions = []
        for row, (ids, lps) in enumerate(zip(new.tolist(), chosen.tolist())):
            end = next((i + 1 for i, t in enumerate(ids) if t in stop), None)
            reason = "length" if end is None else "stop"
            ids, lps = ids[:end], lps[:end]
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            completions.append(Completion(token_ids=ids, logprobs=lps, text=text, finish_reason=reason,
                                          top_logprobs=None if tops is None else tops[row][: len(ids)]))
        return [completions[i : i + params.n] for i in range(0, len(completions), params.n)]

    def _left_padded(self, rows: list[list[int]], width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(input_ids, attention_mask) of `rows` left-padded to `width`."""
        pad_id = self.tokenizer.pad_token_id
        ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in rows], device=self.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in rows], device=self.device)
        return ids, mask

    def _shared_prefill(self, prompts: list[list[int]], width: int, n: int,
                        pixels: list[torch.Tensor | None] | None = None) -> DynamicCache | None:
        """The KV cache of each left-padded prompt but its last token, computed once and repeated
        n times (rows in `_generate_batch`'s order); None when there is nothing to share. The
        prompts' images go into it: `generate` then goes on from text tokens only."""
        if n == 1 or width < 2:
            return None
        ids, mask = (t[:, :-1] for t in self._left_padded(prompts, width))
        positions = (mask.cumsum(-1) - 1).clamp(min=0)  # as `generate` numbers left-padded rows
        images = {}
        if pixels is not None and any(p is not None for p in pixels):
            images = {"pixel_values": torch.cat([p for p in pixels if p is not None])}
        cache = DynamicCache()
        self.model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache, use_cache=True,
                   logits_to_keep=1, **images)
        cache.batch_repeat_interleave(n)
        return cache

    @torch.no_grad()
    def load_weights(self, state_dict: dict[str, torch.Tensor], version: int, lora=None) -> None:
        """Copy `state_dict` into the live model in place (a tied lm_head may be left out), or with
        `lora` merge that adapter into the base weights."""
        if lora is not None:
            self._merge_adapter(state_dict, lora)
            self.version = version
            return
        own = self.model.state_dict()
        unexpected = set(state_dict) - set(own)
        # a tied output head shares storage with the embedding, so copying one fills both
        given_ptrs = {own[k].data_ptr() for k in state_dict if k in own}
        missing = {k for k in set(own) - set(state_dict) if own[k].data_ptr() not in given_ptrs}
        if unexpected or missing:
            raise KeyError(f"state dict does not fit the model: missing {sorted(missing)}, unexpected {sorted(unexpected)}")
        for name, tensor in state_dict.items():
            own[name].copy_(tensor)
        self.version = version
        self._base.clear()
        self._is_base = False

    def _merge_adapter(self, adapter: dict[str, torch.Tensor], lora) -> None:
        """W = W0 + (alpha / r) * B @ A in place for the adapter's modules, from a copy of W0 taken the
        first time each is adapted (memory: one more copy of the adapted weights); modules an earlier
        version adapted and this one does not go back to W0."""
        from streamrft.engine.lora import adapter_modules, merged_weights

        if not self._is_base:
            raise RuntimeError("a LoRA version after a full one: the base weights it applies to are gone")
        own = self.model.state_dict()
        weights = [m + ".weight" for m in adapter_modules(adapter)]
        unknown = [w for w in weights if w not in own]
        if unknown:
            raise KeyError(f"adapter does not fit the model: no weights {unknown}")
        for w in weights:
            if w not in self._base:
                self._base[w] = own[w].detach().clone()
        merged = merged_weights(self._base, adapter, lora.scale)
        for w, w0 in self._base.items():
            own[w].copy_(merged.get(w, w0))
