"""The dashboard's ASGI app (FastAPI, as the gateway): one page, its JSON, and a live SSE stream.

`GET /` the page; `/static/*` its script, style and the vendored chart library; `GET /api/summary`
every chart's data; `GET /api/groups?team=&task=&min_reward=&max_reward=&limit=` the trajectory
viewer's groups, newest first; `GET /api/events` a server-sent event `summary` whenever the state
moved (at most once per `push_s`), so the page updates without a reload.
"""
from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Callable

from fastapi import FastAPI, Query, Request
from fastapi.responses import FileResponse, JSONResponse, StreamingResponse
from fastapi.staticfiles import StaticFiles

from streamrft.monitor.dashboard.state import RunState, version_at
from streamrft.monitor.dashboard.trajectories import Decode, group_view, ids_text, matches

STATIC = Path(__file__).parent / "static"
VENDOR = STATIC / "vendor"
CHART_JS = "chart.umd.min.js"


def create_app(state: RunState, decoder: Callable[[], Decode] | None = None, push_s: float = 1.0) -> FastAPI:
    """`decoder()` returns the tokenizer's decode once loaded (loading takes seconds, so the page
    comes up first and shows ids until then)."""
    app = FastAPI(title=f"streamrft dashboard: {state.namespace}", docs_url=None, redoc_url=None)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    views: dict[str, dict] = {}  # group_id -> its decoded view (decoding is the costly part)

    @app.get("/")
    def index() -> FileResponse:
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-store"})

    @app.get("/api/summary")
    def summary() -> JSONResponse:
        return JSONResponse({**state.summary(), "charts": (VENDOR / CHART_JS).is_file()})

    @app.get("/api/groups")
    def groups(team: str | None = None, task: str | None = None, min_reward: float | None = None,
               max_reward: float | None = None, limit: int = Query(20, ge=1, le=200)) -> JSONResponse:
        decode = (decoder() if decoder else None) or ids_text
        with state.lock:
            picked = [g for g in reversed(state.groups) if matches(g[0], team, task, min_reward, max_reward)][:limit]
            announces = list(state.announces)
            teams = sorted({g[0].team for g in state.groups})
        out = []
        for eg, topic, partition, offset in picked:
            key = f"{eg.group_id}@{topic}:{partition}:{offset}:{decode is ids_text}"
            if key not in views:
                if len(views) > 1000:
                    views.clear()  # bounded: recent groups are decoded again when asked for
                views[key] = group_view(eg, decode, (topic, partition, offset), version_at(announces, eg.created_at))
            out.append(views[key])
        return JSONResponse({"groups": out, "teams": teams, "tokenizer": decode is not ids_text})

    @app.get("/api/events")
    async def events(request: Request) -> StreamingResponse:
        async def stream():
            last = -1
            while not await request.is_disconnected():
                if state.revision != last:
                    last = state.revision
                    data = await asyncio.to_thread(state.summary)
                    data["charts"] = (VENDOR / CHART_JS).is_file()
                    yield f"event: summary\ndata: {json.dumps(data)}\n\n"
                else:
                    yield ": idle\n\n"  # keeps proxies from closing a quiet stream
                await asyncio.sleep(push_s)

        return StreamingResponse(stream(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})

    return app
