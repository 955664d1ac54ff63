"""A real OpenAI-compatible judge endpoint for tests: FastAPI under uvicorn on 127.0.0.1, in a thread.

It grades by the rubric it is sent (`rubric.DEFAULT_TEMPLATE` or `reward_model.YES_NO_TEMPLATE`):
"Score: 10" (or P(Yes) 0.9 with `logprobs`) when the response equals the reference answer, else
"Score: 0" (P(Yes) 0.2). Markers in the response make it misbehave: `SLOW` sleeps `slow_s`, `FLAKY`
answers 500 to the first two requests for that response, `DOWN` always 500, `GARBLED` answers
without a score. `state` counts requests and the most it served at once.
"""
from __future__ import annotations

import asyncio
import math
import re
import threading
import time
from contextlib import contextmanager
from typing import Iterator

from fastapi import FastAPI, Request  # module level: FastAPI resolves the string annotations here
from fastapi.responses import JSONResponse

from gateway_helpers import free_port

_FIELDS = re.compile(r"Reference answer: (.*)\nResponse: (.*)\n")


def make_app(state: dict):
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await request.json()
        text = body["messages"][-1]["content"]
        state["requests"] += 1
        state["active"] += 1
        state["max_active"] = max(state["max_active"], state["active"])
        try:
            answer, response = _FIELDS.search(text).groups()
            if "SLOW" in response:
                await asyncio.sleep(state["slow_s"])
            if "DOWN" in response:
                return JSONResponse({"error": "judge down"}, status_code=500)
            if "FLAKY" in response:
                state["flaky"][response] = state["flaky"].get(response, 0) + 1
                if state["flaky"][response] <= 2:
                    return JSONResponse({"error": "overloaded"}, status_code=500)
            await asyncio.sleep(state["latency_s"])
            right = response.strip() == answer.strip()
            content = "I will not grade this." if "GARBLED" in response else f"Score: {10 if right else 0}"
            choice = {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}
            if body.get("logprobs"):
                p = 0.9 if right else 0.2
                choice["logprobs"] = {"content": [{"token": "Yes", "logprob": math.log(p), "top_logprobs": [
                    {"token": "Yes", "logprob": math.log(p)}, {"token": " no", "logprob": math.log(1 - p)},
                    {"token": "Maybe", "logprob": -9.0}]}]}
            return {"id": "cmpl-1", "object": "chat.completion", "model": body["model"], "choices": [choice]}
        finally:
            state["active"] -= 1

    return app


@contextmanager
def judge_server(slow_s: float = 60.0, latency_s: float = 0.0) -> Iterator[tuple[str, dict]]:
    """(base_url, state) of a running judge server; stopped on exit."""
    import uvicorn

    state = {"requests": 0, "active": 0, "max_active": 0, "flaky": {}, "slow_s": slow_s, "latency_s": latency_s}
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(make_app(state), host="127.0.0.1", port=port, log_level="warning",
                                           timeout_graceful_shutdown=1))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the judge server did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}/v1", state
    finally:
        server.should_exit = True
        thread.join(30)
