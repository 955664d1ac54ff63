"""Token ids of a request's prompt, reusing the exact ids of the episode's previous call.

An agent sends its whole conversation again on every call: the text of the previous prompt, the
completion it got, and what happened since. Tokenizing that text anew would not give back the ids
the model sampled (a BPE merge across the boundary, a stripped space, the end-of-turn token the
model sampled itself): the trajectory would train on tokens that were never sampled. So when a
request continues the episode's previous call (its prompt text, or its messages plus the assistant
message we returned, come first), the prompt is that call's prompt ids + its sampled ids + the ids
of only what is new; anything else is tokenized from scratch, and the episode will be assembled
step-wise (`episodes.py` decides on the ids).

Chat requests render through the tokenizer's chat template: what follows a returned assistant
message is rendered with the template's close of that turn (less the stop token the model already
sampled), the new messages and the generation prompt (`workflows.turns`' sentinel method).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from streamrft.producers.workflows.turns import _SENTINEL


class PromptError(ValueError):
    """A request whose prompt cannot be served (HTTP 400); `param` names the field."""

    def __init__(self, message: str, param: str = "messages"):
        super().__init__(message)
        self.param = param


@dataclass
class LastCall:
    """What an episode's previous call left: how the client sent it, and what it got back."""

    prompt_ids: list[int]
    completion_ids: list[int]
    completion_text: str
    stopped: bool
    """The completion ended with a stop token the model sampled (it is in `completion_ids`)."""
    prompt_text: str | None = None
    """Completions API: the prompt as sent."""
    messages: list[dict] | None = None
    """Chat API: the messages as sent (normalised)."""


def message_text(content: Any) -> str:
    """A message's content as text: a string, or the text parts of a list of content parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for p in content:
            if isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str):
                parts.append(p["text"])
            else:
                raise PromptError("only text content parts are supported", "messages")
        return "".join(parts)
    raise PromptError(f"message content must be a string or a list of text parts, got {type(content).__name__}")


def normalise(messages: Any) -> list[dict]:
    if not isinstance(messages, list) or not messages:
        raise PromptError("`messages` must be a non-empty list")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise PromptError(f"messages[{i}] must be an object with a `role`", f"messages[{i}]")
        n = {"role": m["role"], "content": message_text(m.get("content"))}
        for key in ("name", "tool_call_id"):
            if isinstance(m.get(key), str):
                n[key] = m[key]
        out.append(n)
    return out


class PromptBuilder:
    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self.chat = bool(getattr(tokenizer, "chat_template", None))

    # ---- completions API ------------------------------------------------------------------------
    def completion_prompt(self, prompt: Any, last: LastCall | None) -> tuple[list[int], str | None]:
        """(ids, the prompt text or None for a token-id prompt)."""
        if isinstance(prompt, list) and len(prompt) == 1 and not isinstance(prompt[0], int):
            prompt = prompt[0]  # the openai client sends a list of one prompt
        if isinstance(prompt, list):
            vocab = len(self.tokenizer)
            if not prompt or not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in prompt):
                raise PromptError(f"a token-id prompt must be a non-empty list of ids in [0, {vocab})", "prompt")
            return list(prompt), None
        if not isinstance(prompt, str) or not prompt:
            raise PromptError("`prompt` must be a non-empty string, a list of token ids, or a list of one string",
                              "prompt")
        if last is not None and last.prompt_text is not None:
            before = last.prompt_text + last.completion_text
            if prompt.startswith(before):
                rest = prompt[len(before):]
                extra = self.tokenizer(rest, add_special_tokens=False)["input_ids"] if rest else []
                return last.prompt_ids + last.completion_ids + extra, prompt
        return self.tokenizer(prompt)["input_ids"], prompt

    # ---- chat API -------------------------------------------------------------------------------
    def chat_prompt(self, messages: list[dict], last: LastCall | None) -> list[int]:
        if not self.chat:
            raise PromptError("the served model has no chat template: use /v1/completions")
        if last is not None and last.messages is not None:
            k = len(last.messages)
            if (len(messages) > k + 1 and messages[:k] == last.messages and messages[k]["role"] == "assistant"
                    and messages[k]["content"] == last.completion_text):
                return last.prompt_ids + last.completion_ids + self._after_assistant(messages[k + 1:], last)
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def _after_assistant(self, new: list[dict], last: LastCall) -> list[int]:
        """Ids that close the returned assistant turn and render `new` up to the generation prompt."""
        rendered = self.tokenizer.apply_chat_template(
            [{"role": "user", "content": "."}, {"role": "assistant", "content": _SENTINEL}, *new],
            tokenize=False, add_generation_prompt=True)
        if rendered.count(_SENTINEL) != 1:
            raise PromptError("the chat template does not render an assistant turn verbatim")
        text = rendered[rendered.index(_SENTINEL) + len(_SENTINEL):]
        if last.stopped:
            # the model sampled the end-of-turn token itself (e.g. <|im_end|>): keep its copy only
            stop_text = self.tokenizer.decode(last.completion_ids[-1:], skip_special_tokens=False)
            if stop_text and text.startswith(stop_text):
                text = text[len(stop_text):]
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]


def apply_stop(tokenizer: Any, ids: list[int], logprobs: list[float], stop: list[str],
               tops: list | None = None) -> tuple[list[int], list[float], str, bool, list | None]:
    """Cut a completion at the first stop string: (ids through the token that completed it, their
    log-probs, the text before the stop string, whether one was found, their top log-probs)."""
    text = tokenizer.decode(ids, skip_special_tokens=True)
    if not stop or not any(s in text for s in stop):
        return ids, logprobs, text, False, tops
    for end in range(1, len(ids) + 1):
        prefix = tokenizer.decode(ids[:end], skip_special_tokens=True)
        hits = [prefix.index(s) for s in stop if s in prefix]
        if hits:
            return ids[:end], logprobs[:end], prefix[: min(hits)], True, None if tops is None else tops[:end]
    return ids, logprobs, text, False, tops  # unreachable: the whole text holds a stop string
