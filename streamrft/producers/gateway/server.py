"""The HTTP side of the gateway: OpenAI-shaped endpoints on FastAPI, and the episode endpoints.

- `POST /v1/chat/completions`, `POST /v1/completions`, `GET /v1/models`: what the official `openai`
  package calls. A vision-language model's chat messages may hold `image_url` parts (`data:` URLs, or
  `s3://` URLs of the run's media). Sampling: n, temperature, top_p, top_k (extension), max_tokens (or
  max_completion_tokens), stop, seed, logprobs / top_logprobs. `return_token_ids: true` adds
  `prompt_token_ids` and each choice's `token_ids` (as vLLM names them). A response names the
  weight version that served it in `system_fingerprint` (`v<N>`).
- A call belongs to an episode when it names one: header `X-Episode-Id` (and `X-Group-Id`,
  `X-Group-Size`), or the same names in the body (`episode_id`, `group_id`, `group_size`; the
  `openai` package sends them with `extra_body`). Calls without an episode are served and not
  recorded (e.g. an agent's own evaluation).
- An eval episode (`X-Episode-Eval: true` with its `X-Episode-Id`, no group) continues its previous
  call's ids as a training episode does, and is neither recorded nor published: an agent's greedy
  evaluation sees the same token layout as its training episodes, and needs no finish.
- `POST /v1/feedback`: a rating that arrives later (`feedback.py`), published to the caller's team's
  `<ns>.feedback.<team>`.
- `POST /v1/episodes/{id}/finish` with `reward` or `rewards` (one per call), optional `task_id`,
  `answer`, `metadata`, `finish_reason` closes an episode (`groups.py`).
- `GET /label`: the labelling page (`labels.py`, a run with a `feedback` term): a person logs in
  with their team's key and rates the answers of parked groups; `GET /v1/label/next?rater=NAME`
  hands the page its next answer (leased to that rater), `GET /v1/label/counts` what waits.
- `GET /health`: the served version (no key needed).
Every other endpoint needs `Authorization: Bearer <team key>`; the key decides the team.
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import logging
import time
import uuid
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse

from streamrft.engine.rollout.base import Completion, SamplingParams
from streamrft.producers.gateway.episodes import Call
from streamrft.producers.gateway.feedback import parse_feedback
from streamrft.producers.gateway.groups import GatewayError, GroupStore, Remembered
from streamrft.producers.gateway.prompts import LastCall, PromptBuilder, PromptError, apply_stop, normalise, shows_images
from streamrft.producers.gateway.teams import TeamKeys
from streamrft.producers.gateway.worker import EngineWorker
from streamrft.schemas import RolloutGroup, Task, Trajectory

log = logging.getLogger(__name__)

STATIC = Path(__file__).parent / "static"

MAX_N = 64
MAX_TOP_LOGPROBS = 20


def _error(e: GatewayError) -> JSONResponse:
    headers = {"Retry-After": str(max(1, round(e.retry_after)))} if e.retry_after is not None else None
    return JSONResponse({"error": {"message": e.message, "type": e.type, "param": e.param, "code": e.code}},
                        status_code=e.status, headers=headers)


async def json_object(request: Request) -> dict:
    """The request's body, which must be a JSON object (400 otherwise)."""
    try:
        body = await request.json()
    except Exception:
        raise GatewayError(400, "the body is not JSON") from None
    if not isinstance(body, dict):
        raise GatewayError(400, "the body must be a JSON object")
    return body


def _number(body: dict, name: str, default: Any, lo: float, hi: float, integer: bool = False) -> Any:
    v = body.get(name)
    if v is None:
        return default
    ok = (isinstance(v, int) if integer else isinstance(v, (int, float))) and not isinstance(v, bool)
    if not ok or not lo <= v <= hi:
        raise GatewayError(400, f"`{name}` must be {'an integer' if integer else 'a number'} in [{lo}, {hi}], got {v!r}",
                           param=name)
    return v


class Gateway:
    """The app's state: the engine thread, the open episodes, the team keys and limits."""

    def __init__(self, worker: EngineWorker, store: GroupStore, keys: TeamKeys, *, model_name: str,
                 max_tokens: int, max_context: int, can_start: "Any" = None, sweep_s: float = 1.0,
                 media: "Any" = None):
        """`can_start()` -> (ok, why): whether an episode may start now on the served weights
        (their staleness; admission decides the rest when its group opens). `media`: the run's
        `MediaStore`, where a vision-language model's `image_url` parts are stored."""
        self.worker, self.store, self.keys = worker, store, keys
        self.model_name, self.max_tokens, self.max_context = model_name, max_tokens, max_context
        self.tokenizer = worker.engine.tokenizer
        processor = getattr(worker.engine, "processor", None)
        self.media = media if processor is not None else None
        self.prompts = PromptBuilder(self.tokenizer, processor, None if self.media is None else self.media.image)
        self.byte_level = is_byte_level(self.tokenizer)
        self.can_start = can_start or (lambda: (True, ""))
        self.sweep_s = sweep_s
        self.report: Any = None  # called on the event loop every `report_every_s` (the metrics)
        self.report_every_s = 5.0
        self.unauthorized = 0
        self.arriving = 0  # requests received, not handed to the engine thread yet (read by it)
        self.eval_episodes = Remembered(limit=10_000)  # (team, episode id) -> LastCall: eval episodes' last calls
        self.send_feedback: Any = None  # send_feedback(team, [Feedback]): publish, acknowledged (`POST /v1/feedback`)
        self.labels: Any = None  # `labels.LabelQueue` of the labelling page (a run with a feedback term), else None
        self.publish_served: Any = None  # gateway.mode serve: publish(RolloutGroup) of a call's completions
        self.created = int(time.time())

    # ---- request parsing --------------------------------------------------------------------------
    def team(self, request: Request) -> str:
        team = self.keys.team_of(request.headers.get("authorization"))
        if team is None:
            self.unauthorized += 1
            raise GatewayError(401, "missing or wrong API key (Authorization: Bearer <team key>)",
                               type_="authentication_error", code="invalid_api_key")
        return team

    @staticmethod
    def _episode_ids(request: Request, body: dict) -> tuple[str | None, str | None, int | None, bool]:
        def field(header: str, name: str) -> Any:
            v = request.headers.get(header)
            return v if v is not None else body.pop(name, None)

        episode, group, size = field("x-episode-id", "episode_id"), field("x-group-id", "group_id"), \
            field("x-group-size", "group_size")
        evaluation = field("x-episode-eval", "episode_eval")
        evaluation = evaluation in (True, "1", "true", "True")
        for name, v in (("episode_id", episode), ("group_id", group)):
            if v is not None and (not isinstance(v, str) or not 0 < len(v) <= 200):
                raise GatewayError(400, f"`{name}` must be a string of 1-200 characters", param=name)
        if group is not None and episode is None:
            raise GatewayError(400, "a group id without an episode id: name the episode (X-Episode-Id)",
                               param="episode_id")
        if size is not None:
            try:
                size = int(size)
            except (TypeError, ValueError):
                size = 0
            if not 1 <= size <= 4096:
                raise GatewayError(400, "`group_size` must be an integer in [1, 4096]", param="group_size")
        if evaluation and (episode is None or group is not None):
            raise GatewayError(400, "an eval episode names its episode id and no group", param="episode_eval")
        return episode, group, size, evaluation

    def _params(self, body: dict, chat: bool) -> tuple[SamplingParams, list[str], bool, int]:
        n = _number(body, "n", 1, 1, MAX_N, integer=True)
        max_tokens = _number(body, "max_completion_tokens", None, 1, self.max_context, integer=True)
        max_tokens = _number(body, "max_tokens", max_tokens or self.max_tokens, 1, self.max_context, integer=True)
        temperature = _number(body, "temperature", 1.0, 0.0, 2.0)
        top_p = _number(body, "top_p", 1.0, 1e-6, 1.0)
        top_k = _number(body, "top_k", 0, 0, 1 << 20, integer=True)
        seed = _number(body, "seed", None, -(2**63), 2**63 - 1, integer=True)
        if chat:
            want = body.get("logprobs") or False
            if not isinstance(want, bool):
                raise GatewayError(400, "`logprobs` must be a boolean", param="logprobs")
            top = _number(body, "top_logprobs", 0, 0, MAX_TOP_LOGPROBS, integer=True)
            if top and not want:
                raise GatewayError(400, "`top_logprobs` needs `logprobs: true`", param="top_logprobs")
        else:
            lp = _number(body, "logprobs", None, 0, MAX_TOP_LOGPROBS, integer=True)
            want, top = lp is not None, lp or 0
            if body.get("echo"):
                raise GatewayError(400, "`echo` is not supported", param="echo")
        stop = body.get("stop")
        stop = [stop] if isinstance(stop, str) else stop or []
        if not isinstance(stop, list) or len(stop) > 4 or not all(isinstance(s, str) and s for s in stop):
            raise GatewayError(400, "`stop` must be a string or a list of at most 4 non-empty strings", param="stop")
        if body.get("stream"):
            raise GatewayError(400, "streaming is not supported: send stream=false", param="stream")
        params = SamplingParams(n=n, max_new_tokens=max_tokens, temperature=float(temperature), top_p=float(top_p),
                                top_k=top_k, seed=seed, top_logprobs=top)
        return params, stop, want, top

    # ---- one generation, recorded under its episode --------------------------------------------
    async def generate(self, request: Request, chat: bool) -> dict:
        self.arriving += 1  # until handed to the engine thread, which may wait for it to batch with others
        waiting = [True]

        def handed() -> None:
            if waiting[0]:
                waiting[0] = False
                self.arriving -= 1

        try:
            return await self._generate(request, chat, handed)
        finally:
            handed()

    async def _generate(self, request: Request, chat: bool, handed) -> dict:
        team = self.team(request)
        body = await json_object(request)
        episode_id, group_id, size, evaluation = self._episode_ids(request, body)
        params, stop, want_lp, top = self._params(body, chat)
        if episode_id is not None and params.n != 1:
            raise GatewayError(400, "n must be 1 within an episode: run n episodes of one group instead", param="n")
        if self.publish_served is not None and (episode_id is not None or evaluation):
            raise GatewayError(400, "this gateway serves users (gateway.mode: serve): it records no training "
                                    "episodes", param="episode_id")
        ep, last = None, None
        if evaluation:
            last = self.eval_episodes.get((team, episode_id))
        elif episode_id is not None:
            # a new episode starts on fresh enough weights, unless its group is open already: its
            # admission is taken, and refusing it would hold that slot until the group timed out
            if (team, episode_id) not in self.store.episodes and (team, group_id) not in self.store.groups:
                ok, why = self.can_start()
                if not ok:
                    self.store.counters[team]["rejected_stale"] += 1
                    raise GatewayError(429, why, type_="rate_limit_error", code="stale_weights", retry_after=1.0)
            ep = await self.store.episode(team, episode_id, group_id, size, self.worker.version)
            last = ep.last
        try:
            if chat:
                raw, prompt_text = body.get("messages"), None
                messages, prompt_ids, images = (  # images read and write the media store: off the loop
                    await asyncio.to_thread(self._chat_prompt, raw, last) if shows_images(raw)
                    else self._chat_prompt(raw, last))
            else:
                messages = None
                prompt_ids, prompt_text, images = self.prompts.completion_prompt(body.get("prompt"), last)
            pictures = await asyncio.to_thread(lambda: [self.media.image(r) for r in images]) if images else None
        except PromptError as e:
            raise GatewayError(400, str(e), param=e.param) from None
        if len(prompt_ids) + params.max_new_tokens > self.max_context:
            raise GatewayError(400, f"prompt ({len(prompt_ids)} tokens) + max_tokens ({params.max_new_tokens}) is "
                                    f"over the context the gateway serves ({self.max_context}, gateway.max_context)",
                               param="max_tokens", code="context_length_exceeded")
        if ep is not None:
            self.store.begin(ep)
        call = last_call = None
        try:
            handed()
            gen = await self.worker.submit(prompt_ids, params, pictures)
            cut = [apply_stop(self.tokenizer, c.token_ids, c.logprobs, stop, c.top_logprobs) for c in gen.completions]
            if episode_id is not None:
                (ids, lps, text, by_string, _), c = cut[0], gen.completions[0]
                reason = "stop" if by_string else c.finish_reason
                call = Call(prompt_ids, ids, lps, gen.version, reason, images)
                stopped = reason == "stop" and not by_string and bool(ids)
                full = self.tokenizer.decode(ids, skip_special_tokens=True)
                last_call = LastCall(prompt_ids, ids, text if chat else full, stopped, prompt_text, messages, images)
        finally:
            if ep is not None:
                self.store.record(ep, call, last_call)
        if evaluation and last_call is not None:
            self.eval_episodes.remember((team, episode_id), last_call)
        counters = self.store.counters[team]
        counters["requests"] += 1
        counters["prompt_tokens"] += len(prompt_ids)
        counters["completion_tokens"] += sum(len(c[0]) for c in cut)
        out = self._response(chat, gen.version, prompt_ids, gen.completions, cut, want_lp, top,
                             bool(body.get("return_token_ids")))
        if self.publish_served is not None:  # logged for its users' ratings, acknowledged before the answer
            group = served_group(out, team, prompt_ids, self.tokenizer.decode(prompt_ids, skip_special_tokens=True),
                                 gen.version, cut)
            if group is not None:
                await asyncio.to_thread(self.publish_served, group)
                counters["served_groups"] += 1
        return out

    def _chat_prompt(self, raw: Any, last: LastCall | None) -> tuple[list[dict], list[int], list]:
        """(normalised messages, prompt ids, their `ImageRef`s)."""
        messages = normalise(raw, None if self.media is None else self._image_of)
        return (messages, *self.prompts.chat_prompt(messages, last))

    def _image_of(self, url: str, param: str) -> Any:
        """An `image_url`'s reference: a `data:` URL stored in the run's media, or an `s3://` URL
        already there. Never a path or `file://` (the gateway's own disk), nor any other object."""
        from streamrft.infra.media import MediaError, resolve_source

        try:
            if url.startswith("data:"):
                return self.media.put(resolve_source(url))
            if url.startswith("s3://"):
                return self.media.reference(url)
        except MediaError as e:
            raise PromptError(e.reason, f"{param}.url") from None
        raise PromptError("an image_url must be a data: URL (data:image/png;base64,...) or an s3:// URL of "
                          "this run's media", f"{param}.url")

    # ---- OpenAI shapes --------------------------------------------------------------------------
    def _token(self, tid: int) -> str:
        return self.tokenizer.decode([tid], skip_special_tokens=False)

    def _bytes(self, tid: int) -> list[int]:
        """The token's own bytes: a byte-level BPE token that holds part of a character decodes to
        U+FFFD alone, so its bytes come from its vocabulary entry instead (`token_bytes`)."""
        return list(token_bytes(self.tokenizer, tid, self.byte_level))

    def _response(self, chat: bool, version: int, prompt_ids: list[int], completions: list[Completion],
                  cut: list[tuple], want_lp: bool, top: int, token_ids: bool) -> dict:
        choices = []
        for i, (c, (ids, lps, text, by_string, tops)) in enumerate(zip(completions, cut)):
            reason = "stop" if by_string else c.finish_reason
            choice: dict[str, Any] = {"index": i, "finish_reason": reason}
            if chat:
                choice["message"] = {"role": "assistant", "content": text}
                choice["logprobs"] = None if not want_lp else {"content": [
                    {"token": self._token(t), "logprob": lp, "bytes": self._bytes(t),
                     "top_logprobs": [{"token": self._token(a), "logprob": alp, "bytes": self._bytes(a)}
                                      for a, alp in (tops[k] if tops else [])][:top]}
                    for k, (t, lp) in enumerate(zip(ids, lps))]}
            else:
                choice["text"] = text
                choice["logprobs"] = None if not want_lp else {
                    "tokens": [self._token(t) for t in ids], "token_logprobs": lps,
                    "top_logprobs": [{self._token(a): alp for a, alp in tops[k][:top]} for k in range(len(ids))]
                    if tops else None,
                    "text_offset": self._offsets(ids)}
            if token_ids:
                choice["token_ids"] = ids
            choices.append(choice)
        done = sum(len(c[0]) for c in cut)
        out = {"id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
               "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
               "model": self.model_name, "system_fingerprint": f"v{version}", "choices": choices,
               "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": done,
                         "total_tokens": len(prompt_ids) + done}}
        if token_ids:
            out["prompt_token_ids"] = prompt_ids
        return out

    def _offsets(self, ids: list[int]) -> list[int]:
        """Where each token starts in the text (a token inside a character starts where it does)."""
        return [len(self.tokenizer.decode(ids[:k], skip_special_tokens=True)) for k in range(len(ids))]


def served_group(out: dict, team: str, prompt_ids: list[int], prompt_text: str, version: int,
                 cut: list[tuple]) -> RolloutGroup | None:
    """A served call's completions as one group (`gateway.mode: serve`): each choice gets a
    `completion_id` (the response's id, `-` and its index) in the answer and in its trajectory's
    `info.completion_ids`, which a user's rating names. Its task is the prompt (its id the prompt
    tokens' hash, so every call of one prompt shares it). Empty completions are left out; None if
    every one is."""
    task = Task(task_id="served-" + hashlib.sha256(json.dumps(prompt_ids).encode()).hexdigest()[:24],
                prompt=prompt_text)
    trajectories = []
    for choice, (ids, lps, text, _, _) in zip(out["choices"], cut):
        choice["completion_id"] = f"{out['id']}-{choice['index']}"
        if ids:
            trajectories.append(Trajectory(
                traj_id=choice["completion_id"], group_id=out["id"], task_id=task.task_id, team=team,
                model_version=version, prompt_ids=prompt_ids, response_ids=ids, logprobs=lps, response_text=text,
                finish_reason=choice["finish_reason"], info={"completion_ids": [choice["completion_id"]]}))
    if not trajectories:
        return None
    return RolloutGroup(group_id=out["id"], team=team, task=task, trajectories=trajectories)


@functools.cache
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet inverted: the printable character standing for each byte."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1), *range(ord("\u00ae"), ord("\u00ff") + 1)]
    cs, n = list(bs), 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def is_byte_level(tokenizer: Any) -> bool:
    """Whether the tokenizer's decoder maps GPT-2's byte alphabet back to bytes (GPT-2, SmolLM2, Qwen)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return False
    return '"ByteLevel"' in json.dumps(json.loads(backend.to_str()).get("decoder"))


def token_bytes(tokenizer: Any, tid: int, byte_level: bool) -> bytes:
    """The bytes one token stands for: with a byte-level decoder its vocabulary entry mapped back
    through the byte alphabet; a byte-fallback token `<0xE3>` is that byte; special and other tokens
    are their text in UTF-8."""
    if tid in tokenizer.all_special_ids:
        return tokenizer.decode([tid], skip_special_tokens=False).encode()
    piece = tokenizer.convert_ids_to_tokens(tid)
    if isinstance(piece, str):
        if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            return bytes([int(piece[3:5], 16)])
        table = _byte_decoder()
        if byte_level and all(c in table for c in piece):
            return bytes(table[c] for c in piece)
    return tokenizer.decode([tid], skip_special_tokens=False).encode()


def create_app(gw: Gateway, on_start: Any = None, on_stop: Any = None) -> FastAPI:
    """The ASGI app; `on_start`/`on_stop` run in its lifespan (the engine thread, watchers, metrics)."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        if on_start is not None:
            await asyncio.to_thread(on_start)

        async def sweeping() -> None:
            reported = time.monotonic()
            while True:
                await asyncio.sleep(gw.sweep_s)
                try:
                    await gw.store.sweep()
                    if gw.report is not None and time.monotonic() - reported >= gw.report_every_s:
                        reported = time.monotonic()
                        gw.report()
                except Exception:
                    log.exception("gateway sweep failed")

        task = asyncio.create_task(sweeping())
        try:
            yield
        finally:
            task.cancel()
            if on_stop is not None:
                await asyncio.to_thread(on_stop)

    app = FastAPI(title="streamrft rollout gateway", lifespan=lifespan)

    @app.exception_handler(GatewayError)
    async def gateway_error(request: Request, e: GatewayError) -> JSONResponse:
        return _error(e)

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "model": gw.model_name, "version": gw.worker.version}

    @app.get("/v1/models")
    async def models(request: Request) -> dict:
        gw.team(request)
        return {"object": "list", "data": [{"id": gw.model_name, "object": "model", "created": gw.created,
                                            "owned_by": "streamrft"}]}

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> dict:
        return await gw.generate(request, chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request) -> dict:
        return await gw.generate(request, chat=False)

    @app.post("/v1/feedback")
    async def feedback(request: Request) -> dict:
        team = gw.team(request)
        items = parse_feedback(await json_object(request))
        if gw.send_feedback is None:
            raise GatewayError(503, "this gateway takes no feedback")
        await asyncio.to_thread(gw.send_feedback, team, items)  # acknowledged by the broker
        gw.store.counters[team]["feedback"] += len(items)
        if gw.labels is not None:  # an answer rated from the page leaves that rater's queue
            for f in items:
                for rated in f.rated():
                    gw.labels.rated(f"{team}/{f.rater}", rated)
        return {"accepted": len(items), "feedback_ids": [f.feedback_id for f in items]}

    @app.get("/label")
    async def label_page() -> FileResponse:
        return FileResponse(STATIC / "label.html", headers={"Cache-Control": "no-store"})

    def labels() -> Any:
        if gw.labels is None:
            raise GatewayError(404, "this run parks no groups for rating (no `feedback` reward term)")
        return gw.labels

    @app.get("/v1/label/next")
    async def label_next(request: Request, rater: str = "rater", pair: bool = False) -> dict:
        team = gw.team(request)
        if not 0 < len(rater) <= 128:
            raise GatewayError(400, "`rater` must be 1-128 characters", param="rater")
        queue, now = labels(), time.time()

        def shown(a) -> dict:
            return {"traj_id": a.traj_id, "group_id": a.group_id, "prompt": a.prompt, "text": a.text}

        if pair:  # two answers of one group, for an A/B preference
            got = queue.next_pair(f"{team}/{rater}", team, now)
            return {"pair": None if got is None else [shown(a) for a in got], "counts": queue.counts(now)}
        answer = queue.next(f"{team}/{rater}", team, now)
        return {"answer": None if answer is None else shown(answer), "counts": queue.counts(now)}

    @app.get("/v1/label/counts")
    async def label_counts(request: Request) -> dict:
        gw.team(request)
        return labels().counts(time.time())

    @app.post("/v1/episodes/{episode_id}/finish")
    async def finish(episode_id: str, request: Request) -> dict:
        team = gw.team(request)
        return await gw.store.finish(team, episode_id, await json_object(request))

    return app
