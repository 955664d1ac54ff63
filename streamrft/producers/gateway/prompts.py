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

Images: a vision-language model's chat requests may carry OpenAI `image_url` content parts (a
`data:` URL, or an `s3://` URL of the run's own media). `normalise` turns each into the image's
`ImageRef` (stored once in the run's media store by the caller's `image_of`), so a request that
repeats the conversation compares equal on references, not on base64. Messages with images render
through the processor's chat template, whose image tokens the processor expands into each image's
placeholders. A prompt must hold exactly the placeholders of its images: an image token typed as
text (or sent as a token id) is refused, since it would train a half-built prompt.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

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
    images: list = field(default_factory=list)
    """The `ImageRef`s whose placeholders `prompt_ids` holds, in order."""


ImageOf = Callable[[str, str], Any]
"""`image_of(url, param)` -> the image's `ImageRef` (stored in the run's media), or PromptError."""


def message_content(content: Any, where: str, image_of: ImageOf | None = None) -> str | list[dict]:
    """A message's content: a string, or the list of its parts when it shows images (`{"type":
    "text", "text"}` and `{"type": "image", "image": ImageRef}`)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise PromptError(f"message content must be a string or a list of content parts, got "
                          f"{type(content).__name__}", where)
    parts = []
    for j, p in enumerate(content):
        at = f"{where}[{j}]"
        kind = p.get("type") if isinstance(p, dict) else None
        if kind == "text" and isinstance(p.get("text"), str):
            parts.append({"type": "text", "text": p["text"]})
        elif kind == "image_url":
            if image_of is None:
                raise PromptError("the served model is a text model: it takes no images", at)
            url = p.get("image_url")
            url = url.get("url") if isinstance(url, dict) else url
            if not isinstance(url, str) or not url:
                raise PromptError("an image_url part needs `image_url: {url: ...}`", f"{at}.image_url")
            parts.append({"type": "image", "image": image_of(url, f"{at}.image_url")})
        else:
            raise PromptError("a content part must be {type: text, text} or {type: image_url, image_url: {url}}", at)
    if not any(p["type"] == "image" for p in parts):
        return "".join(p["text"] for p in parts)
    return parts


def shows_images(messages: Any) -> bool:
    """Whether raw request messages hold an `image_url` part (normalising them then reads S3)."""
    return isinstance(messages, list) and any(
        isinstance(m, dict) and isinstance(m.get("content"), list)
        and any(isinstance(p, dict) and p.get("type") == "image_url" for p in m["content"]) for m in messages)


def images_of(messages: list[dict]) -> list:
    """The `ImageRef`s of normalised messages, in order."""
    return [p["image"] for m in messages if isinstance(m["content"], list) for p in m["content"] if p["type"] == "image"]


def _templated(messages: list[dict]) -> list[dict]:
    """Messages as chat templates take them: an image part is `{"type": "image"}`."""
    return [{**m, "content": [{"type": "image"} if p["type"] == "image" else p for p in m["content"]]}
            if isinstance(m["content"], list) else m for m in messages]


def normalise(messages: Any, image_of: ImageOf | None = None) -> list[dict]:
    if not isinstance(messages, list) or not messages:
        raise PromptError("`messages` must be a non-empty list")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise PromptError(f"messages[{i}] must be an object with a `role`", f"messages[{i}]")
        n = {"role": m["role"], "content": message_content(m.get("content"), f"messages[{i}].content", image_of)}
        for key in ("name", "tool_call_id"):
            if isinstance(m.get(key), str):
                n[key] = m[key]
        out.append(n)
    return out


class PromptBuilder:
    def __init__(self, tokenizer: Any, processor: Any = None, load_image: Callable[[Any], Any] | None = None):
        """`processor`: a vision-language model's (None for a text model); `load_image(ref)` -> PIL."""
        self.tokenizer, self.processor, self.load_image = tokenizer, processor, load_image
        self.chat = bool(getattr(tokenizer, "chat_template", None))
        self.image_id = None if processor is None else processor.image_token_id

    def check_placeholders(self, ids: list[int], images: list, param: str) -> None:
        """A prompt holds exactly its images' placeholder tokens (none for a text prompt)."""
        if self.image_id is None:
            return
        from streamrft.engine.vlm import placeholders_per_image

        want = sum(placeholders_per_image(self.processor, r.width, r.height) for r in images)
        got = ids.count(self.image_id)
        if got != want:
            raise PromptError(f"the prompt holds {got} image placeholder token(s) for {len(images)} image(s) of "
                              f"{want}: send images as image_url parts, never their tokens as text or ids", param)

    # ---- completions API ------------------------------------------------------------------------
    def completion_prompt(self, prompt: Any, last: LastCall | None) -> tuple[list[int], str | None, list]:
        """(ids, the prompt text or None for a token-id prompt, the `ImageRef`s whose placeholders
        they hold: those of the episode's previous call when they continue it, else none)."""
        ids, text = self._completion_prompt(prompt, last)
        images = last.images if last is not None and ids[: len(last.prompt_ids)] == last.prompt_ids else []
        self.check_placeholders(ids, images, "prompt")
        return ids, text, images

    def _completion_prompt(self, prompt: Any, last: LastCall | None) -> tuple[list[int], str | None]:
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
    def chat_prompt(self, messages: list[dict], last: LastCall | None) -> tuple[list[int], list]:
        """(ids, the `ImageRef`s whose placeholders they hold, in order)."""
        if not self.chat:
            raise PromptError("the served model has no chat template: use /v1/completions")
        ids, images = self._chat_prompt(messages, last)
        self.check_placeholders(ids, images, "messages")
        return ids, images

    def _chat_prompt(self, messages: list[dict], last: LastCall | None) -> tuple[list[int], list]:
        if last is not None and last.messages is not None:
            k = len(last.messages)
            if (len(messages) > k + 1 and messages[:k] == last.messages and messages[k]["role"] == "assistant"
                    and messages[k]["content"] == last.completion_text):
                new = messages[k + 1:]
                return last.prompt_ids + last.completion_ids + self._after_assistant(new, last), \
                    last.images + images_of(new)
        images = images_of(messages)
        if images:
            text = self._vision_template().apply_chat_template(_templated(messages), tokenize=False,
                                                               add_generation_prompt=True)
            return self._expand(text, images), images
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"], []

    def _vision_template(self) -> Any:
        if not getattr(self.processor, "chat_template", None):
            raise PromptError("the served model's processor has no chat template to lay out images")
        return self.processor

    def _expand(self, text: str, images: list) -> list[int]:
        from streamrft.engine.vlm import expand_images

        return expand_images(self.processor, text, [self.load_image(r) for r in images])

    def _after_assistant(self, new: list[dict], last: LastCall) -> list[int]:
        """Ids that close the returned assistant turn and render `new` up to the generation prompt."""
        images = images_of(new)
        rendered = (self._vision_template() if images else self.tokenizer).apply_chat_template(
            [{"role": "user", "content": "."}, {"role": "assistant", "content": _SENTINEL}, *_templated(new)],
            tokenize=False, add_generation_prompt=True)
        if rendered.count(_SENTINEL) != 1:
            raise PromptError("the chat template does not render an assistant turn verbatim")
        text = rendered[rendered.index(_SENTINEL) + len(_SENTINEL):]
        if last.stopped:
            # the model sampled the end-of-turn token itself (e.g. <|im_end|>): keep its copy only
            stop_text = self.tokenizer.decode(last.completion_ids[-1:], skip_special_tokens=False)
            if stop_text and text.startswith(stop_text):
                text = text[len(stop_text):]
        if images:
            return self._expand(text, images)
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
