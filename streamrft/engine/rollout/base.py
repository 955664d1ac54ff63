"""The rollout engine interface every engine implements (transformers on CPU, vLLM on GPU).

An engine turns token-id prompts into n sampled completions each, with the behaviour log-prob of
every generated token, and takes new weights in place between calls. Explorers talk only to this
interface; pick an engine with `streamrft.engine.rollout.make_engine`.

Log-prob convention (all engines): `Completion.logprobs[t]` is the log-prob of the chosen token
under exactly the distribution it was sampled from: softmax(logits_t / temperature), restricted to
the top-k / top-p tokens and renormalised when those are set, and nothing else (no setting from the
checkpoint's own generation config: no repetition penalty, no minimum length). With top_k=0 and
top_p=1 (the RL default) that is what a trainer recomputes by dividing its logits by the same
temperature; with truncation the trainer's untruncated log-prob over this one is the importance
weight that corrects for it. Under greedy decoding (temperature 0) the untempered
log softmax(logits_t) is reported.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable


@dataclass
class SamplingParams:
    n: int = 1
    """Completions per prompt."""
    max_new_tokens: int = 32
    temperature: float = 1.0
    """0 = greedy decoding."""
    top_p: float = 1.0
    top_k: int = 0
    """0 = off."""
    seed: int | None = None
    """Seeds one generate call (same seed, same weights, same prompts -> same samples)."""
    seeds: list[int] | None = None
    """One per prompt, instead of `seed`: sample k of prompt i is drawn from a random stream of its
    own, `derive_seed(seeds[i], k)`, so its tokens do not depend on what else shares the call or on
    the batch's order (same weights, prompt and seed -> same tokens; log-probs equal to float
    rounding). Explorers seed each episode's turns this way with `explorer.sampling.seed`."""
    stop_token_ids: list[int] = field(default_factory=list)
    """Stop on these as well as the tokenizer's EOS; the stop token is kept in `token_ids`."""
    top_logprobs: int = 0
    """Also return this many most likely tokens of each step's sampling distribution (0 = none)."""


def check_seeds(params: SamplingParams, prompts: int) -> None:
    """Every engine's check of `params.seeds`: one per prompt, or none."""
    if params.seeds is not None and len(params.seeds) != prompts:
        raise ValueError(f"{len(params.seeds)} seeds for {prompts} prompts: need one per prompt")


def check_images(processor: Any, prompt_ids: list[list[int]], images: list[list]) -> None:
    """Every engine's check of `images`: one list per prompt, as many placeholder tokens in the
    prompt as its images expand to (`engine.vlm.placeholders_per_image`), the last prompt token not
    an image's (the engine prefills all but the last token), and a vision-language model to see them."""
    if processor is None:
        raise ValueError("images given to a text model: the model directory has no image processor")
    if len(images) != len(prompt_ids):
        raise ValueError(f"{len(images)} image lists for {len(prompt_ids)} prompts: need one per prompt")
    from streamrft.engine.vlm import placeholders_per_image

    image_id = processor.image_token_id
    for i, (ids, imgs) in enumerate(zip(prompt_ids, images)):
        want = sum(placeholders_per_image(processor, *im.size) for im in imgs)
        if ids.count(image_id) != want:
            raise ValueError(f"prompt {i} holds {ids.count(image_id)} image placeholders ({processor.image_token}) "
                             f"but its {len(imgs)} image(s) expand to {want}")
        if ids and ids[-1] == image_id:
            raise ValueError(f"prompt {i} ends with an image placeholder: put text after the image")


def derive_seed(*parts: object) -> int:
    """A 63-bit seed from `parts` (ints, strings), the same in every process and on every platform."""
    digest = hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


@dataclass
class Completion:
    token_ids: list[int]
    """Generated tokens, ending with the stop token when finish_reason == "stop"."""
    logprobs: list[float]
    """One per token of `token_ids`; see the module docstring for the convention."""
    text: str
    """Decoded `token_ids` without special tokens."""
    finish_reason: Literal["stop", "length"]
    top_logprobs: list[list[tuple[int, float]]] | None = None
    """With `SamplingParams.top_logprobs` = k: per token, the k most likely (token id, log-prob) of
    the distribution it was sampled from, most likely first; None otherwise."""


@runtime_checkable
class RolloutEngine(Protocol):
    version: int
    """The weight version currently loaded (0 = the initial weights)."""
    tokenizer: Any

    def generate(self, prompt_ids: list[list[int]], params: SamplingParams,
                 images: list[list] | None = None) -> list[list[Completion]]:
        """`params.n` completions for each prompt, in prompt order. A vision-language model takes
        `images`: per prompt its images (PIL), whose placeholder tokens its ids hold in order."""
        ...

    def load_weights(self, state_dict: dict[str, Any], version: int, lora: Any = None) -> None:
        """Copy `state_dict` (HF parameter names) into the live model and set `version`. With `lora`
        (a `config.LoraSpec`, from the version's manifest) `state_dict` is a LoRA adapter
        (`engine.lora`), applied to the base model the engine was built on, never on top of an
        earlier version."""
        ...
