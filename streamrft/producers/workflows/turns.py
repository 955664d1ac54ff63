"""Token ids between model turns: the environment's observation, plain or through the chat template.

A multi-turn workflow appends the model's tokens exactly as sampled and asks `TurnEncoder` only for
what comes between two model turns. Plain: the observation's tokens (no BOS). Chat template: the
template's close of the assistant turn (less the stop token the model already sampled), the
observation as a user turn and the generation prompt, e.g. `\\n<|im_start|>user\\n{obs}<|im_end|>\\n
<|im_start|>assistant\\n` for ChatML. All of it is masked 0 by the workflow. The chat delta is found
by rendering a conversation whose assistant content is a sentinel and taking the text after it,
so the model's own text is never re-rendered into the ids.

Pictures (a vision-language model's: the engine's `vision`, `prompts.TaskImages`): the first
prompt shows the task's images and the first observation's, an observation between turns its own
(`envs.Observation`). Each is stored once in the run's media store (`TaskImages.store`); the
processor expands its image token into the image's placeholders: plain, the images' tokens before
the text; with the chat template, a user turn of image parts then the text. `first` and `next`
return the ids with the references and PIL images they show (`Shown`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from streamrft.producers.envs.base import Observation
from streamrft.producers.workflows.single_turn import encode_prompt
from streamrft.schemas import Task

_SENTINEL = "\u2063streamrft-assistant-turn\u2063"  # text no template rewrites, marking where content ends


@dataclass
class Shown:
    """Ids the environment (or the task) shows the model, with the images whose placeholders they hold."""

    ids: list[int]
    images: list = field(default_factory=list)
    """`ImageRef`s, in the order of their placeholders."""
    pictures: list = field(default_factory=list)
    """The same images as PIL, what the engine samples with."""


def _split(observation: str | Observation) -> tuple[str, tuple]:
    return (observation, ()) if isinstance(observation, str) else (observation.text, tuple(observation.images))


class TurnEncoder:
    def __init__(self, tokenizer: Any, chat: bool = False, vision: Any = None):
        """`vision`: a vision-language engine's `TaskImages` (None: a text model, which shows no image)."""
        self.tokenizer = tokenizer
        self.chat = chat
        self.vision = vision

    def first(self, task: Task, observation: str | Observation) -> Shown:
        """The episode's prompt (`prompt`), showing the task's images and the first observation's."""
        text, extra = _split(observation)
        if not task.images and not extra:
            return Shown(self.prompt(task, text))
        refs = list(task.images) + self._store(extra)
        pictures = [self.vision.media.image(r) for r in refs]
        from streamrft.engine.vlm import image_prompt_ids

        return Shown(image_prompt_ids(self.vision.processor, text, pictures, self.chat), refs, pictures)

    def next(self, observation: str | Observation, stop_id: int | None) -> Shown:
        """`between`, for an observation that may show images."""
        text, extra = _split(observation)
        if not extra:
            return Shown(self.between(text, stop_id))
        refs = self._store(extra)
        pictures = [self.vision.media.image(r) for r in refs]
        processor = self.vision.processor
        if not self.chat or not getattr(processor, "chat_template", None):
            rendered = processor.image_token * len(refs) + text
        else:
            content = [*({"type": "image"} for _ in refs), {"type": "text", "text": text}]
            rendered = self._strip_stop(self._after_assistant(content, processor), stop_id)
        from streamrft.engine.vlm import expand_images

        return Shown(expand_images(processor, rendered, pictures), refs, pictures)

    def _store(self, images: tuple) -> list:
        if not images:
            return []
        if self.vision is None:
            from streamrft.infra.media import MediaError

            raise MediaError("images", "the model is not a vision-language model (no image processor beside it)")
        return [self.vision.store(im) for im in images]

    def prompt(self, task: Task, observation: str) -> list[int]:
        """The episode's prompt: the first observation, as a single-turn prompt (the task's own
        `prompt_ids`, when given, win as they do in single-turn)."""
        return encode_prompt(self.tokenizer, task.model_copy(update={"prompt": observation}), self.chat)

    def between(self, observation: str, stop_id: int | None) -> list[int]:
        """Ids to append after a model turn so that the next model turn answers `observation`;
        `stop_id` is the stop token that ended the model's turn (None: it ended without one)."""
        if not self.chat:
            return self.tokenizer(observation, add_special_tokens=False)["input_ids"]
        text = self._strip_stop(self._after_assistant(observation), stop_id)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def _strip_stop(self, text: str, stop_id: int | None) -> str:
        if stop_id is not None:
            # the model sampled the template's end-of-turn token itself (e.g. <|im_end|>): keep its copy only
            stop_text = self.tokenizer.decode([stop_id], skip_special_tokens=False)
            if stop_text and text.startswith(stop_text):
                text = text[len(stop_text):]
        return text

    def _after_assistant(self, observation: str | list, templater: Any = None) -> str:
        messages = [{"role": "user", "content": "."}, {"role": "assistant", "content": _SENTINEL},
                    {"role": "user", "content": observation}]
        text = (templater or self.tokenizer).apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        if text.count(_SENTINEL) != 1:
            raise ValueError("the chat template does not render an assistant turn's content verbatim; "
                             "multi-turn chat cannot tell its own tokens from the model's")
        return text[text.index(_SENTINEL) + len(_SENTINEL):]
