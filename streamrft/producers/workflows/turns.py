"""Token ids between model turns: the environment's observation, plain or through the chat template.

A multi-turn workflow appends the model's tokens exactly as sampled and asks `TurnEncoder` only for
what comes between two model turns. Plain: the observation's tokens (no BOS). Chat template: the
template's close of the assistant turn (less the stop token the model already sampled), the
observation as a user turn and the generation prompt, e.g. `\\n<|im_start|>user\\n{obs}<|im_end|>\\n
<|im_start|>assistant\\n` for ChatML. All of it is masked 0 by the workflow. The chat delta is found
by rendering a conversation whose assistant content is a sentinel and taking the text after it,
so the model's own text is never re-rendered into the ids.
"""
from __future__ import annotations

from typing import Any

from streamrft.producers.workflows.single_turn import encode_prompt
from streamrft.schemas import Task

_SENTINEL = "\u2063streamrft-assistant-turn\u2063"  # text no template rewrites, marking where content ends


class TurnEncoder:
    def __init__(self, tokenizer: Any, chat: bool = False):
        self.tokenizer = tokenizer
        self.chat = chat

    def prompt(self, task: Task, observation: str) -> list[int]:
        """The episode's prompt: the first observation, as a single-turn prompt (the task's own
        `prompt_ids`, when given, win as they do in single-turn)."""
        return encode_prompt(self.tokenizer, task.model_copy(update={"prompt": observation}), self.chat)

    def between(self, observation: str, stop_id: int | None) -> list[int]:
        """Ids to append after a model turn so that the next model turn answers `observation`;
        `stop_id` is the stop token that ended the model's turn (None: it ended without one)."""
        if not self.chat:
            return self.tokenizer(observation, add_special_tokens=False)["input_ids"]
        text = self._after_assistant(observation)
        if stop_id is not None:
            # the model sampled the template's end-of-turn token itself (e.g. <|im_end|>): keep its copy only
            stop_text = self.tokenizer.decode([stop_id], skip_special_tokens=False)
            if stop_text and text.startswith(stop_text):
                text = text[len(stop_text):]
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def _after_assistant(self, observation: str) -> str:
        messages = [{"role": "user", "content": "."}, {"role": "assistant", "content": _SENTINEL},
                    {"role": "user", "content": observation}]
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        if text.count(_SENTINEL) != 1:
            raise ValueError("the chat template does not render an assistant turn's content verbatim; "
                             "multi-turn chat cannot tell its own tokens from the model's")
        return text[text.index(_SENTINEL) + len(_SENTINEL):]
