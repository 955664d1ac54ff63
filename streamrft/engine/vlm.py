"""A small vision-language model made here, from configs alone (no hub): LLaVA's layout.

`build_tiny_vlm` makes a `LlavaForConditionalGeneration`: a CLIP vision tower (a few layers over
patches of a small image), a two-layer projector, and the char-level Qwen2 of the CPU demo as the
language model, all randomly initialised. It is saved with its processor (`LlavaProcessor`: a
CLIP image processor that resizes and normalises, and the char tokenizer with one more special
token, `<image>`, and a role-free chat template, `CHAT_TEMPLATE`), so `AutoProcessor` and
`AutoModelForImageTextToText` load the directory as
they load any hub VLM.

A prompt is `<image>` then the text: the processor expands the one `<image>` into as many image
placeholder tokens as the tower yields patch features ((image_size / patch_size)^2), whose
embeddings the model replaces with the projected features. `image_positions` marks them: they
are prompt tokens, never trained.
"""
from __future__ import annotations

from pathlib import Path

import torch
from transformers import CLIPVisionConfig, LlavaConfig, LlavaForConditionalGeneration, LlavaProcessor, Qwen2Config

from streamrft.engine.models import build_char_tokenizer

IMAGE_TOKEN = "<image>"

# The tiny VLM's chat template: no roles, BOS, then each message's images and text in order. One
# user turn of an image and a text renders exactly as `image_prompt_ids` lays out a prompt
# without chat (and SFT trains on), so an agent on the gateway's chat API sees the explorers'
# layout; an assistant turn renders verbatim (what the gateway needs to continue an episode).
CHAT_TEMPLATE = ("{{- bos_token -}}{%- for m in messages -%}{%- if m.content is string -%}{{- m.content -}}{%- else -%}"
                 "{%- for p in m.content -%}{%- if p.type == 'image' -%}" + IMAGE_TOKEN +
                 "{%- elif p.type == 'text' -%}{{- p.text -}}{%- endif -%}{%- endfor -%}{%- endif -%}{%- endfor -%}")


def image_processor(image_size: int):
    """CLIP's image processor sized for `image_size`, PIL-backed (torchvision is not installed here)."""
    try:
        from transformers import CLIPImageProcessorPil as Processor
    except ImportError:  # older transformers: the PIL backend was the only one
        from transformers import CLIPImageProcessor as Processor
    return Processor(size={"shortest_edge": image_size}, crop_size={"height": image_size, "width": image_size},
                     do_center_crop=True, image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5])


def build_tiny_vlm(out_dir: str | Path, alphabet: str, hidden_size: int = 128, layers: int = 2, heads: int = 4,
                   image_size: int = 32, patch_size: int = 8, vision_hidden_size: int = 64,
                   vision_layers: int = 2, vision_heads: int = 4, max_positions: int = 256,
                   seed: int = 0, kv_heads: int | None = None,
                   intermediate_size: int | None = None) -> tuple[LlavaForConditionalGeneration, LlavaProcessor]:
    """A freshly initialised tiny LLaVA over a char tokenizer of `alphabet`, saved with its
    processor to `out_dir` (`model.build` with `vision`: `TinyModelSpec`, `TinyVisionSpec`)."""
    if image_size % patch_size:
        raise ValueError(f"image_size ({image_size}) must be a multiple of patch_size ({patch_size})")
    tok = build_char_tokenizer(alphabet)
    tok.add_special_tokens({"additional_special_tokens": [IMAGE_TOKEN]})
    tok.chat_template = CHAT_TEMPLATE
    image_id = tok.convert_tokens_to_ids(IMAGE_TOKEN)
    vision = CLIPVisionConfig(hidden_size=vision_hidden_size, intermediate_size=4 * vision_hidden_size,
                              num_hidden_layers=vision_layers, num_attention_heads=vision_heads,
                              image_size=image_size, patch_size=patch_size, num_channels=3)
    text = Qwen2Config(vocab_size=len(tok), hidden_size=hidden_size, intermediate_size=intermediate_size or 4 * hidden_size,
                       num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads or heads,
                       max_position_embeddings=max_positions, tie_word_embeddings=True,
                       bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    config = LlavaConfig(vision_config=vision, text_config=text, image_token_index=image_id,
                         vision_feature_select_strategy="default", vision_feature_layer=-1,
                         projector_hidden_act="gelu", tie_word_embeddings=True)
    with torch.random.fork_rng(devices=[]):  # the init draws from the global RNG: leave the caller's alone
        torch.manual_seed(seed)
        model = LlavaForConditionalGeneration(config)
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        setattr(model.generation_config, key, getattr(tok, key))
    # "default" drops CLIP's class token: one placeholder per patch
    processor = LlavaProcessor(image_processor=image_processor(image_size), tokenizer=tok, patch_size=patch_size,
                               vision_feature_select_strategy="default", image_token=IMAGE_TOKEN,
                               num_additional_image_tokens=1, chat_template=CHAT_TEMPLATE)
    out = Path(out_dir)
    model.save_pretrained(str(out))
    processor.save_pretrained(str(out))
    return model, processor


def image_prompt_ids(processor, prompt: str, images: list, chat: bool = False) -> list[int]:
    """The prompt's token ids with every image's placeholders: one image token per image before the
    text, or with `chat` and a processor that has a chat template, one user turn of image parts and
    the text; the processor expands each image token into its placeholders. What explorers roll
    out from and what warm-up SFT trains on, alike."""
    if chat and getattr(processor, "chat_template", None):
        content = [*({"type": "image"} for _ in images), {"type": "text", "text": prompt}]
        text = processor.apply_chat_template([{"role": "user", "content": content}], tokenize=False,
                                             add_generation_prompt=True)
        return expand_images(processor, text, images)  # the template lays out its special tokens
    text = processor.image_token * len(images) + prompt
    return processor(text=[text], images=images, return_tensors="pt")["input_ids"][0].tolist()


def expand_images(processor, text: str, images: list) -> list[int]:
    """The ids of rendered chat text whose image tokens (one per image of `images`, in order) the
    processor expands into their placeholders; no special tokens added (the template has them)."""
    return processor(text=[text], images=images or None, add_special_tokens=False,
                     return_tensors="pt")["input_ids"][0].tolist()


_PLACEHOLDERS: dict[tuple[int, int, int], int] = {}  # (id(processor), width, height) -> count


def placeholders_per_image(processor, width: int, height: int) -> int:
    """How many placeholder tokens `processor` expands an image of `width` x `height` into (counted
    once per processor and size, on a blank image)."""
    key = (id(processor), width, height)
    if key not in _PLACEHOLDERS:
        from PIL import Image

        ids = processor(text=[processor.image_token], images=[Image.new("RGB", (width, height))],
                        return_tensors="pt")["input_ids"][0].tolist()
        _PLACEHOLDERS[key] = ids.count(processor.image_token_id)
    return _PLACEHOLDERS[key]


def pixel_values(processor, images: list) -> torch.Tensor:
    """The pixel values ([k, C, H, W]) of `images` (PIL), as the model sees them: the one place both
    the explorers' engines and the trainer make them, so its recomputed log-probs see the same pixels."""
    return processor.image_processor(images=images, return_tensors="pt")["pixel_values"]


def trajectory_pixels(processor, media):
    """`pixels(trajectory)` for the trainer's batches: the trajectory's images fetched by reference
    through `media` (an `infra.media.MediaStore`: checked against their hashes, cached), then
    `pixel_values`."""
    return lambda t: pixel_values(processor, [media.image(r) for r in t.images])


def image_positions(input_ids: torch.Tensor, image_token_id: int) -> torch.Tensor:
    """A bool mask of the image placeholder tokens (prompt tokens: never trained)."""
    return input_ids == image_token_id


# where transformers' vision-language models keep their vision encoder, and its projector into the
# language model, which stays trainable (LLaVA: `multi_modal_projector` beside the tower; Qwen2-VL
# and Qwen2.5-VL: `visual.merger` inside it)
_TOWERS = ("model.vision_tower", "model.visual", "vision_tower", "visual")
_PROJECTORS = ("merger",)


def freeze_vision_tower(model: torch.nn.Module) -> int:
    """Stop training `model`'s vision encoder (`trainer.freeze_vision_tower`): its parameters keep no
    gradient, no optimiser state, and the trainer's forward saves no activations for them. The
    projector into the language model stays trainable. Returns the parameters frozen."""
    for path in _TOWERS:
        tower = model
        for name in path.split("."):
            tower = getattr(tower, name, None)
            if tower is None:
                break
        if isinstance(tower, torch.nn.Module):
            frozen = 0
            for name, p in tower.named_parameters():
                if name.split(".")[0] not in _PROJECTORS:
                    p.requires_grad_(False)
                    frozen += p.numel()
            return frozen
    raise ValueError(f"trainer.freeze_vision_tower: {type(model).__name__} has no vision tower "
                     f"(looked for {', '.join(_TOWERS)})")

