"""The local back end of model rewards: a transformers model loaded once per worker, batched across records.

`Batcher` gathers the calls that blocking reward functions make from the scorer's threads (one
per trajectory, from every record scoring at once) and runs them as one batch on its own thread:
up to `batch_size` inputs, waiting at most `wait_s` for more after the first. `LocalLM` wraps a
causal LM (greedy generation for a judge; P(yes) for a reward model) and `LocalClassifier` a
sequence-classification model. Models load from a local Hugging Face directory (never a hub id).
"""
from __future__ import annotations

import queue
import threading
from concurrent.futures import Future
from typing import Any, Callable, Sequence


class Batcher:
    """Runs `run(inputs) -> outputs` on batches of the inputs that `submit` callers wait on."""

    def __init__(self, run: Callable[[list[Any]], Sequence[Any]], batch_size: int = 8, wait_s: float = 0.01,
                 name: str = "reward-batcher"):
        if batch_size < 1 or wait_s < 0:
            raise ValueError(f"batch_size must be >= 1 and wait_s >= 0, got {batch_size}, {wait_s}")
        self.run, self.batch_size, self.wait_s = run, batch_size, wait_s
        self.batches = 0  # how many batches ran (tests and the benchmark read it)
        self.items = 0
        self._queue: queue.Queue[tuple[Any, Future]] = queue.Queue()
        # a daemon: a worker exits even while a batch runs (its records are redone after a restart)
        threading.Thread(target=self._loop, name=name, daemon=True).start()

    def submit(self, item: Any) -> Any:
        """Blocks until the batch holding `item` has run; returns its output or raises the batch's error."""
        future: Future = Future()
        self._queue.put((item, future))
        return future.result()

    def _loop(self) -> None:
        while True:
            batch = [self._queue.get()]
            try:
                while len(batch) < self.batch_size:
                    batch.append(self._queue.get(timeout=self.wait_s))
            except queue.Empty:
                pass
            batch = [(item, f) for item, f in batch if f.set_running_or_notify_cancel()]
            if not batch:
                continue
            try:
                outputs = list(self.run([item for item, _ in batch]))
                if len(outputs) != len(batch):
                    raise RuntimeError(f"a batch of {len(batch)} gave {len(outputs)} outputs")
            except Exception as e:  # the model failed on this batch: each of its calls fails (and retries)
                for _, f in batch:
                    f.set_exception(e)
                continue
            self.batches += 1
            self.items += len(batch)
            for (_, f), out in zip(batch, outputs):
                f.set_result(out)


def _load_tokenizer(path: str):
    # the policy's loader: AutoTokenizer would load a char tokenizer as its model type's class, which
    # drops spaces and newlines (a judge would read "Expected:dcbaGot:dcba")
    from streamrft.engine.models import load_tokenizer

    tok = load_tokenizer(path)
    tok.padding_side = "left"  # generation and last-token scores read the right end of each row
    return tok


class LocalLM:
    """A causal LM from a local directory: `generate(prompts)` greedy, `yes_probability(prompts)`.

    Prompts go through the tokenizer's chat template as one user turn when it has one and
    `chat` is true; otherwise the text is used as is.
    """

    def __init__(self, path: str, *, device: str = "cpu", dtype: str = "float32", chat: bool = True,
                 system: str | None = None, max_prompt_tokens: int = 1024):
        import torch
        from transformers import AutoModelForCausalLM

        self.torch = torch
        self.tokenizer = _load_tokenizer(path)
        self.model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=getattr(torch, dtype)).to(device).eval()
        self.device, self.system, self.max_prompt_tokens = device, system, max_prompt_tokens
        self.chat = chat and bool(getattr(self.tokenizer, "chat_template", None))

    def _text(self, prompt: str) -> str:
        if not self.chat:
            return prompt
        messages = ([{"role": "system", "content": self.system}] if self.system else []) + \
            [{"role": "user", "content": prompt}]
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def _encode(self, prompts: list[str]):
        # the left end is cut when a prompt is too long: the rubric's instruction comes last
        self.tokenizer.truncation_side = "left"
        enc = self.tokenizer([self._text(p) for p in prompts], return_tensors="pt", padding=True, truncation=True,
                             max_length=self.max_prompt_tokens, add_special_tokens=not self.chat)
        return {k: v.to(self.device) for k, v in enc.items()}

    def generate(self, prompts: list[str], max_new_tokens: int = 16) -> list[str]:
        enc = self._encode(prompts)
        with self.torch.inference_mode():
            out = self.model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False,
                                      pad_token_id=self.tokenizer.pad_token_id, temperature=None, top_p=None,
                                      top_k=None)
        width = enc["input_ids"].shape[1]
        return self.tokenizer.batch_decode(out[:, width:], skip_special_tokens=True)

    def yes_probability(self, prompts: list[str], yes: str = "Yes", no: str = "No") -> list[float]:
        """P(yes) / (P(yes) + P(no)) over the first token of the answer."""
        yes_id, no_id = self.token_id(yes), self.token_id(no)
        enc = self._encode(prompts)
        with self.torch.inference_mode():
            logits = self.model(**enc).logits[:, -1, :].float()
        pair = self.torch.stack([logits[:, yes_id], logits[:, no_id]], dim=1).softmax(dim=1)
        return pair[:, 0].tolist()

    def token_id(self, word: str) -> int:
        ids = self.tokenizer.encode(word, add_special_tokens=False)
        if not ids:
            raise ValueError(f"{word!r} encodes to no token")
        return ids[0]


class LocalClassifier:
    """A sequence-classification model: `scores(texts)` is the logit of a one-label head, else the
    softmax probability of `label` (default: the last label)."""

    def __init__(self, path: str, *, device: str = "cpu", dtype: str = "float32", label: int = -1,
                 max_tokens: int = 1024):
        import torch
        from transformers import AutoModelForSequenceClassification

        self.torch = torch
        self.tokenizer = _load_tokenizer(path)
        self.model = AutoModelForSequenceClassification.from_pretrained(path, torch_dtype=getattr(torch, dtype))
        self.model = self.model.to(device).eval()
        if self.model.config.pad_token_id is None:  # batched scoring finds each row's last token by it
            self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.device, self.label, self.max_tokens = device, label, max_tokens

    def scores(self, texts: list[str]) -> list[float]:
        self.tokenizer.truncation_side = "left"
        enc = self.tokenizer(texts, return_tensors="pt", padding=True, truncation=True, max_length=self.max_tokens)
        with self.torch.inference_mode():
            logits = self.model(**{k: v.to(self.device) for k, v in enc.items()}).logits.float()
        if logits.shape[1] == 1:
            return logits[:, 0].tolist()
        return logits.softmax(dim=1)[:, self.label].tolist()
