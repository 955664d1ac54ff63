"""The dashboard's ASGI app (FastAPI, as the gateway): one page, its JSON, and a live SSE stream.

- `GET /` the page; `/static/*` its script, style, icon and the vendored chart library.
- `GET /api/events`: server-sent events `update`, each a `Feed` message: the first has every line
  (downsampled to about 1,000 points) and every table, the later ones only what changed, at most
  once per `push_s`. Nothing changed, nothing is sent but a comment every `keepalive_s`.
- `GET /api/lines?keys=K1,K2&x0=&x1=&n=`: those lines between x0 and x1, downsampled to n points
  only if more (the page's zoom: full resolution once zoomed in far enough).
- `GET /api/groups?team=&task=&min_reward=&max_reward=&min_version=&max_version=&finish=&before=&limit=`:
  a page of the run's groups matching the filters, newest first, with the count that match and
  the cursor of the next page (`next_before`).
- `GET /api/media/<sha256>`: an image a trajectory of the groups served shows, from the run's S3 store.
- `GET /api/summary`: everything at once (lines downsampled), for scripts.
- `GET /api/stats`: what the live stream has sent (pages open, messages, bytes).
"""
from __future__ import annotations

import asyncio
import json
import time
from collections import OrderedDict
from pathlib import Path
from typing import Callable

from fastapi import FastAPI, HTTPException, Query, Request
from fastapi.responses import FileResponse, JSONResponse, Response, StreamingResponse
from fastapi.staticfiles import StaticFiles

from streamrft.infra.media import MediaError
from streamrft.monitor.dashboard.feed import Feed, find_line
from streamrft.monitor.dashboard.state import LINE_POINTS, RunState, downsample, version_at
from streamrft.monitor.dashboard.trajectories import Decode, GroupQuery, group_view, ids_text, select
from streamrft.schemas import ImageRef

STATIC = Path(__file__).parent / "static"
VENDOR = STATIC / "vendor"
CHART_JS = "chart.umd.min.js"
VIEWS_MAX = 1000  # decoded groups kept (decoding is the costly part)


class Stats:
    """What the live stream sent, for `/api/stats` and `Dashboard.settle`."""

    def __init__(self):
        self.feeds: set[Feed] = set()
        self.messages = 0
        self.bytes = 0
        self.keepalives = 0
        self.closing = False  # set by the server's owner before it stops: open streams end by themselves


def create_app(state: RunState | list[RunState], decoder: Callable[[], Decode] | None = None, fetcher=None,
               push_s: float = 1.0, keepalive_s: float = 60.0, stats: Stats | None = None, media=None) -> FastAPI:
    """`state`: the run shown, or several (the first in full, the others' rewards beside it).
    `decoder()` returns the tokenizer's decode once loaded (loading takes seconds, so the page comes
    up first and shows ids until then). `fetcher`: a `reader.GroupFetcher` for groups older than
    those the state keeps whole. `media`: the run's `infra.media.MediaStore`, from which
    `/api/media/<sha256>` serves the images of the groups the viewer has shown (and no other)."""
    states = state if isinstance(state, list) else [state]
    main = states[0]
    stats = stats if stats is not None else Stats()
    app = FastAPI(title=f"streamrft dashboard: {main.namespace}", docs_url=None, redoc_url=None)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    app.state.stats = stats
    views: OrderedDict[str, dict] = OrderedDict()
    shown_images: dict[str, ImageRef] = {}  # sha256 -> reference, of the images in the groups served

    @app.get("/")
    def index() -> FileResponse:
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-store"})

    @app.get("/favicon.ico")
    def favicon() -> FileResponse:
        return FileResponse(STATIC / "favicon.svg", media_type="image/svg+xml")

    @app.get("/api/summary")
    def summary() -> JSONResponse:
        return JSONResponse({**main.summary(), "charts": (VENDOR / CHART_JS).is_file()})

    @app.get("/api/stats")
    def get_stats() -> JSONResponse:
        return JSONResponse({"pages": len(stats.feeds), "messages": stats.messages, "bytes": stats.bytes,
                             "keepalives": stats.keepalives})

    @app.get("/api/lines")
    def lines(keys: str, x0: float | None = None, x1: float | None = None,
              n: int = Query(LINE_POINTS, ge=10, le=20000)) -> JSONResponse:
        out = {}
        for key in keys.split(","):
            found = find_line(states, key)
            if found is None:
                raise HTTPException(404, f"keys: no line {key!r}")
            state, line = found
            with state.lock:
                out[key] = downsample(line.xs, line.ys, n, x0, x1)
        return JSONResponse({"lines": out})

    @app.get("/api/groups")
    def groups(team: str | None = None, task: str | None = None, min_reward: float | None = None,
               max_reward: float | None = None, min_version: int | None = None, max_version: int | None = None,
               finish: str | None = None, before: int | None = None,
               limit: int = Query(20, ge=1, le=200)) -> JSONResponse:
        decode = (decoder() if decoder else None) or ids_text
        q = GroupQuery(team or None, task or None, min_reward, max_reward, min_version, max_version, finish or None)
        with main.lock:
            rows, total, next_before = select(main.index, main.prompts, q, before, limit)
            whole = {(r.topic, r.partition, r.offset): main.recent.get((r.topic, r.partition, r.offset))
                     for r in rows}
            announces = list(main.announces)
            teams, reasons = sorted(main.team_exp), sorted(main.finish_reasons)
        tag = "ids" if decode is ids_text else "text"
        missing = [w for w, eg in whole.items() if eg is None and f"{w}:{tag}" not in views]
        if missing and fetcher is not None:
            whole.update(fetcher.fetch(missing))
        out = []
        for r in rows:
            where = (r.topic, r.partition, r.offset)
            key = f"{where}:{tag}"
            if key not in views:
                eg = whole.get(where)
                if eg is None:
                    out.append({"group_id": None, "missing": True, "team": r.team, "task_id": r.task_id,
                                "reward_mean": r.reward_mean, "topic": r.topic, "partition": r.partition,
                                "offset": r.offset, "trajectories": []})
                    continue
                views[key] = group_view(eg, decode, where, version_at(announces, eg.created_at))
                shown_images.update((ref.sha256, ref) for t in eg.trajectories for ref in t.images)
                while len(views) > VIEWS_MAX:
                    views.popitem(last=False)
            views.move_to_end(key)
            out.append(views[key])
        return JSONResponse({"groups": out, "total": total, "next_before": next_before, "teams": teams,
                             "finish_reasons": reasons, "tokenizer": decode is not ids_text})

    @app.get("/api/media/{sha256}")
    def image(sha256: str) -> Response:
        """An image a shown trajectory names, fetched by its reference and checked (`MediaStore.get`)."""
        ref = shown_images.get(sha256)
        if ref is None:
            raise HTTPException(404, f"sha256: no image {sha256[:64]!r} in the groups shown")
        if media is None:
            raise HTTPException(404, "this dashboard has no media store")
        try:
            data = media.get(ref)
        except MediaError as e:
            raise HTTPException(502, str(e)) from None
        return Response(data, media_type=ref.mime, headers={"Cache-Control": "max-age=31536000, immutable"})

    @app.get("/api/events")
    async def events(request: Request) -> StreamingResponse:
        feed = Feed(states)

        async def stream():
            stats.feeds.add(feed)
            quiet_since = time.monotonic()
            try:
                while not stats.closing and not await request.is_disconnected():
                    msg = await asyncio.to_thread(feed.next)
                    if msg is not None:
                        msg["charts"] = (VENDOR / CHART_JS).is_file()
                        text = f"event: update\ndata: {json.dumps(msg, separators=(',', ':'))}\n\n"
                        stats.messages += 1
                        stats.bytes += len(text)
                        quiet_since = time.monotonic()
                        yield text
                    elif time.monotonic() - quiet_since > keepalive_s:
                        stats.keepalives += 1
                        quiet_since = time.monotonic()
                        yield ": idle\n\n"  # keeps proxies from closing a quiet stream
                    await asyncio.sleep(push_s)
            finally:
                stats.feeds.discard(feed)

        return StreamingResponse(stream(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})

    return app
