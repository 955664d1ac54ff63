"""The HTTP back end of model rewards: any OpenAI-compatible endpoint (vLLM, SGLang, TGI, OpenAI, the
gateway), called with `httpx` from the worker's event loop.

`ChatClient.chat(prompt, ...)` posts one `/chat/completions` request, at most `max_concurrency` at
a time per worker, and returns the response's JSON; an HTTP error status raises. Timeouts and
retries with backoff are the reward term's (`slow_terms`): one attempt is one request. The API key
comes from the environment variable named by `api_key_env`, never from the config file.
"""
from __future__ import annotations

import asyncio
import math
import os


class ChatClient:
    def __init__(self, base_url: str, model: str, *, api_key_env: str | None = None, max_concurrency: int = 16,
                 system: str | None = None):
        if not base_url or not model:
            raise ValueError("the http back end needs `base_url` (e.g. http://host:8000/v1) and `model`")
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        key = None
        if api_key_env:
            key = os.environ.get(api_key_env)
            if not key:
                raise ValueError(f"api_key_env: environment variable {api_key_env!r} is not set")
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model, self.system, self.max_concurrency = model, system, max_concurrency
        self.headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._loop = None  # the client and semaphore belong to one event loop; made again in another

    def _session(self):
        import httpx

        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            # the term's timeout bounds each attempt; httpx's own is only a backstop
            self._client = httpx.AsyncClient(timeout=300.0, headers=self.headers,
                                             limits=httpx.Limits(max_connections=self.max_concurrency))
            self._limit = asyncio.Semaphore(self.max_concurrency)
            self._loop = loop
        return self._client, self._limit

    async def chat(self, prompt: str, *, max_tokens: int, temperature: float = 0.0, **extra) -> dict:
        client, limit = self._session()
        messages = ([{"role": "system", "content": self.system}] if self.system else []) + \
            [{"role": "user", "content": prompt}]
        body = {"model": self.model, "messages": messages, "max_tokens": max_tokens, "temperature": temperature,
                **extra}
        async with limit:
            response = await client.post(self.url, json=body)
        response.raise_for_status()  # 429 and 5xx too: the term retries with backoff
        return response.json()


def answer_text(reply: dict) -> str:
    """The first choice's message content of a chat completion."""
    content = reply["choices"][0]["message"]["content"]
    if not isinstance(content, str):
        raise ValueError(f"the endpoint's answer has no text content: {content!r}")
    return content


def yes_probability(reply: dict, yes: str = "Yes", no: str = "No") -> float:
    """P(yes) / (P(yes) + P(no)) from the first generated token's `top_logprobs` (case and
    surrounding spaces ignored); raises when neither word is among them."""
    top = reply["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
    mass = {yes.strip().lower(): 0.0, no.strip().lower(): 0.0}
    for entry in top:
        word = entry["token"].strip().lower()
        if word in mass:
            mass[word] += math.exp(entry["logprob"])
    total = sum(mass.values())
    if total <= 0.0:
        raise ValueError(f"neither {yes!r} nor {no!r} among the first token's top_logprobs")
    return mass[yes.strip().lower()] / total
