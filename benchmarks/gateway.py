"""The rollout gateway's completions/s and p50/p99 latency over real HTTP with C concurrent clients,
next to the same engine called in-process: one generate per prompt, and one generate per C prompts.

    .venv/bin/python benchmarks/gateway.py [--concurrency 1 8 32] [--requests 128] [--max-tokens 16]
        [--episodes [--group-size 4]] [--model-path DIR] [--client openai|httpx]
        [--set gateway.batch_wait_ms=5 ...]

A private embedded stack (Tansu on SeaweedFS S3) is started in a temporary directory and stopped at
the end. The gateway (`build_gateway` under uvicorn, as `streamrft serve` runs it) serves in a
process of its own the CPU demo's tiny char model (hidden 128, 2 layers, 4 heads, built with random
weights: the speed does not depend on them), or with `--model-path` a local HF model directory
(e.g. SmolLM2 converted at ~/.cache/streamrft/smollm2-hf-*; the chat endpoint when its tokenizer
has a chat template). The clients are C asyncio tasks of the official `openai` package
(AsyncOpenAI; `--client httpx`: plain httpx posts, lighter) in this process, sharing REQUESTS
requests, each one prompt, n=1, temperature 1, the same max_tokens. A request's latency is the
client's, from sending it to its parsed answer; completions/s is the level's answered requests over
its wall time.

In-process: the same engine (`engine_from_config` on the same model directory, the same torch
threads) in this process while the gateway is idle, the same prompt ids (the gateway's prompt
builder) and sampling: `engine.generate` once per prompt in turn (the latency baseline), and once
per C prompts (what the gateway's batching can at best reach; each completion's latency is its
batch call's). Both run next to each level's gateway run, so that the three see the same load.

Without `--episodes` the requests name no episode: pure serving, nothing recorded. With it each
request is a one-call episode in a group of GROUP_SIZE (consecutive requests), finished with
`POST /v1/episodes/{id}/finish` right after its completion: group admission (a reservation read
back from Kafka), recording and each group's acknowledged publish are in the figures, and the
gateway's latency is completion + finish. `trainer.batch_groups` is set high so that admission
control never refuses a group (no trainer runs).

Also per level, measured inside the gateway process: the engine worker's stats (engine calls,
requests, mean batch, engine busy time over the level's wall time), the time a completion request
spent in the server (ASGI) and waiting for the engine thread (submit to result), with episodes the
time of each group's admission and publish (private attributes of the gateway, wrapped from
here); the CPU seconds of the gateway's process and of the clients; and the mean sampled tokens
per completion on both sides (EOS ends a completion early: equal work is checked, not assumed).
The machine's load moves the figures: on a small machine the clients share the cores with the
gateway.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import random
import statistics
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEAM, KEY = "bench", "sk-bench-gateway"


def pct(xs: list[float], q: float) -> float:
    """The q-quantile of seconds `xs`, in ms (nearest rank); nan when empty."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    return 1000 * s[min(len(s) - 1, max(0, round(q * len(s)) - 1))]


def p50_99(xs: list[float]) -> str:
    return f"{pct(xs, .5):.1f}/{pct(xs, .99):.1f}"


def config(overrides: list[str]):
    from streamrft.config import load_config

    return load_config(ROOT / "examples" / "cpu_demo.yaml", overrides)


# ---- the gateway process ------------------------------------------------------------------------------
class Instrumented:
    """The gateway's app under timers, and `/bench/stats` (GET) and `/bench/reset` (POST) answering them:
    seconds each completion request spent in the server, each `worker.submit` future (batch wait,
    queue, engine call), each group admission and publish; the worker's stats and the team counters."""

    def __init__(self, app, gw):
        self.app, self.gw = app, gw
        self.times: dict[str, list[float]] = {"server": [], "worker": [], "admission": [], "publish": []}
        self.timed(gw.worker, "submit", "worker", future=True)
        self.timed(gw.store, "_open_group", "admission")
        self.timed(gw.store, "_publish_fn", "publish")

    def timed(self, obj, name: str, key: str, future: bool = False) -> None:
        fn, times = getattr(obj, name), self.times[key]

        def wrapped(*a, **kw):
            t0 = time.perf_counter()
            if future:
                fut = fn(*a, **kw)
                fut.add_done_callback(lambda _: times.append(time.perf_counter() - t0))
                return fut
            try:
                return fn(*a, **kw)
            finally:
                times.append(time.perf_counter() - t0)

        setattr(obj, name, wrapped)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if scope["path"].startswith("/bench/"):
            if scope["path"] == "/bench/reset":
                for v in self.times.values():
                    v.clear()
            body = json.dumps({"times": self.times, "worker": self.gw.worker.stats, "cpu_s": time.process_time(),
                               "counters": dict(self.gw.store.counters[TEAM])}).encode()
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": body})
            return
        t0 = time.perf_counter()
        try:
            await self.app(scope, receive, send)
        finally:
            if scope["path"].endswith("completions"):
                self.times["server"].append(time.perf_counter() - t0)


def serve_gateway(overrides: list[str], port: int) -> None:
    """The gateway process: `streamrft serve`'s uvicorn (SIGTERM stops it gracefully)."""
    import threading

    import uvicorn
    from tqdm import tqdm

    from streamrft.producers.gateway import build_gateway

    tqdm.set_lock(threading.RLock())  # not its multiprocessing lock: a spawned child leaves that semaphore behind
    app, gw = build_gateway(config(overrides))
    uvicorn.run(Instrumented(app, gw), host="127.0.0.1", port=port, log_level="warning", timeout_graceful_shutdown=10)


# ---- the clients ----------------------------------------------------------------------------------
async def client_level(url: str, prompts: list[str], chat: bool, concurrency: int, max_tokens: int,
                       episodes: bool, group_size: int, raw: bool = False) -> dict:
    """`raw`: plain httpx posts and `json()` instead of the openai package (lighter on the CPU)."""
    import httpx
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=600)
    http = httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {KEY}"}, timeout=600,
                             limits=httpx.Limits(max_connections=concurrency + 4))
    tag = uuid.uuid4().hex[:8]
    todo = iter(range(len(prompts)))  # shared by the tasks (one thread: next() never races)
    out: dict = {"latency": [], "completion": [], "finish": [], "tokens": 0, "errors": [], "statuses": {}}

    async def one(i: int) -> None:
        extra = {}
        if episodes:
            eid, gid = f"{tag}-e{i}", f"{tag}-g{i // group_size}"
            extra = {"extra_headers": {"X-Episode-Id": eid, "X-Group-Id": gid, "X-Group-Size": str(group_size)}}
        body = {"model": "policy", "max_tokens": max_tokens, "temperature": 1.0, "n": 1,
                **({"messages": [{"role": "user", "content": prompts[i]}]} if chat else {"prompt": prompts[i]})}
        t0 = time.perf_counter()
        if raw:
            r = await http.post("/v1/chat/completions" if chat else "/v1/completions", json=body,
                                headers=extra.get("extra_headers"))
            r.raise_for_status()
            tokens = r.json()["usage"]["completion_tokens"]
        else:
            create = client.chat.completions.create if chat else client.completions.create
            tokens = (await create(**body, **extra)).usage.completion_tokens
        t1 = time.perf_counter()
        out["tokens"] += tokens
        if episodes:
            f = await http.post(f"/v1/episodes/{eid}/finish", json={"reward": 1.0, "task_id": gid})
            f.raise_for_status()
            status = f.json()["status"]
            out["statuses"][status] = out["statuses"].get(status, 0) + 1
        t2 = time.perf_counter()
        out["latency"].append(t2 - t0)
        out["completion"].append(t1 - t0)
        out["finish"].append(t2 - t1)

    async def worker() -> None:
        for i in todo:
            try:
                await one(i)
            except Exception as e:  # counted and shown; the level goes on
                out["errors"].append(f"{type(e).__name__}: {str(e)[:200]}")

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    out["wall"] = time.perf_counter() - t0
    await client.close()
    await http.aclose()
    return out


def http_floor(url: str, n: int = 50) -> list[float]:
    """Seconds of `GET /health` round trips in turn (httpx, one connection): the HTTP floor."""
    import httpx

    out = []
    with httpx.Client(base_url=url) as http:
        for _ in range(n + 5):
            t0 = time.perf_counter()
            http.get("/health").raise_for_status()
            out.append(time.perf_counter() - t0)
    return out[5:]


# ---- in-process -----------------------------------------------------------------------------------
def prompts_for(chat: bool, n: int, seed: int) -> list[str]:
    from streamrft.producers.synthetic import LETTERS, make_prompt

    rng = random.Random(seed)
    words = ["".join(rng.choice(LETTERS) for _ in range(rng.randint(3, 6))) for _ in range(n)]
    if chat:
        return [f"Reverse the string '{w}'. Answer with the reversed string only." for w in words]
    return [make_prompt(w) for w in words]


def in_process(engine, prompt_ids: list[list[int]], params, batch: int) -> dict:
    latency, tokens = [], 0
    t0 = time.perf_counter()
    for k in range(0, len(prompt_ids), batch):
        t = time.perf_counter()
        outs = engine.generate(prompt_ids[k:k + batch], params)
        latency += [time.perf_counter() - t] * len(outs)
        tokens += sum(len(o[0].token_ids) for o in outs)
    return {"wall": time.perf_counter() - t0, "latency": latency, "tokens": tokens}


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--requests", type=int, default=128, help="requests per level (a multiple of --group-size)")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--episodes", action="store_true", help="each request a one-call episode, finished")
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--model-path", default=None, help="a local HF model directory instead of the tiny char model")
    ap.add_argument("--client", choices=["openai", "httpx"], default="openai",
                    help="the official openai package (AsyncOpenAI), or plain httpx posts (less client CPU)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a config override")
    args = ap.parse_args()
    if args.episodes and args.requests % args.group_size:
        ap.error("--requests must be a multiple of --group-size with --episodes")

    import signal
    import sys

    import httpx
    import torch

    from streamrft.engine.rollout import engine_from_config
    from streamrft.engine.rollout.base import SamplingParams
    from streamrft.infra.stack import S3_KEY, EmbeddedStack, free_ports
    from streamrft.launch.prepare import prepare
    from streamrft.producers.gateway.prompts import PromptBuilder, normalise
    from streamrft.producers.gateway.teams import digest

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a kill still stops the gateway and the stack
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        es = EmbeddedStack(tmp / "stack", buckets=("weights",), **free_ports())
        gateway = None
        try:
            state = es.up()
            out, port = tmp / "out", free_port()
            model = ([f"model.path={Path(args.model_path).resolve()}", "model.build=null"] if args.model_path
                     else [f"model.path={out / 'base'}"])  # the CPU demo's model.build: hidden 128, 2 layers
            overrides = [
                "stack.embedded=false", f"kafka.bootstrap={state.kafka}", f"s3.endpoint={state.s3}",
                f"s3.access_key={S3_KEY}", f"s3.secret_key={S3_KEY}", "s3.bucket=weights", f"output_dir={out}",
                *model, f"namespace=bench-{uuid.uuid4().hex[:8]}", "stages=[]",
                "data.synthetic={task: reverse, train_size: 10, eval_size: 2, min_len: 3, max_len: 6, seed: 0}",
                "explorer.num_explorers=0", "gateway.enabled=true", "gateway.host=127.0.0.1", f"gateway.port={port}",
                f"gateway.teams=[{{name: {TEAM}, key_sha256: {digest(KEY)}}}]", f"gateway.group_size={args.group_size}",
                "trainer.batch_groups=100000", *args.set]
            cfg = prepare(config(overrides))  # builds the tiny model once, before either side loads it
            overrides.append(f"model.path={cfg.model.path}")
            gateway = mp.get_context("spawn").Process(target=serve_gateway, args=(overrides, port), name="gateway")
            gateway.start()

            torch.set_num_threads(cfg.explorer.torch_threads)  # as build_gateway sets it in its process
            engine = engine_from_config(cfg)
            builder = PromptBuilder(engine.tokenizer)
            chat = builder.chat
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 180
            while True:  # /health answers once the lifespan's start (admission caught up) is done
                if not gateway.is_alive() or time.monotonic() > deadline:
                    raise RuntimeError("the gateway did not start")
                try:
                    if httpx.get(url + "/health").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                time.sleep(0.1)

            n_params = sum(p.numel() for p in engine.model.parameters())
            c = engine.model.config
            print(f"model: {args.model_path or 'tiny char model (CPU demo build)'}: {type(engine.model).__name__}, "
                  f"hidden {c.hidden_size}, {c.num_hidden_layers} layers, {n_params / 1e6:.2f}M parameters, "
                  f"{cfg.explorer.engine.dtype or cfg.model.dtype} on {cfg.explorer.engine.device}; torch threads "
                  f"{torch.get_num_threads()} (gateway and in-process); {args.client} clients")
            print(f"{'chat' if chat else 'completions'} endpoint, {args.requests} requests per level, n=1, "
                  f"max_tokens {args.max_tokens}, temperature 1; gateway.batch_wait_ms {cfg.gateway.batch_wait_ms}, "
                  f"engine max_batch {cfg.explorer.engine.max_batch}; "
                  + (f"EPISODES: one-call episodes in groups of {args.group_size}, each finished (recorded, "
                     "published to Kafka); gateway latency = completion + finish" if args.episodes
                     else "pure serving (no episode ids: nothing recorded)"))

            params = SamplingParams(n=1, max_new_tokens=args.max_tokens, temperature=1.0, top_p=1.0, top_k=0)

            def ids_of(texts: list[str]) -> list[list[int]]:
                if chat:
                    return [builder.chat_prompt(normalise([{"role": "user", "content": t}]), None) for t in texts]
                return [builder.completion_prompt(t, None)[0] for t in texts]

            def level(prompts: list[str], conc: int) -> dict:
                return asyncio.run(client_level(url, prompts, chat, conc, args.max_tokens, args.episodes,
                                                args.group_size, args.client == "httpx"))

            # warm-up: connections, the first groups, both engines' first calls
            warm = prompts_for(chat, 4 * args.group_size, seed=1000)
            level(warm, args.group_size)
            in_process(engine, ids_of(warm[:4]), params, 1)
            in_process(engine, ids_of(warm[:4]), params, 4)
            floor = http_floor(url)
            print(f"HTTP floor (GET /health in turn): p50/p99 {p50_99(floor)} ms")

            prompts = prompts_for(chat, args.requests, seed=0)
            ids = ids_of(prompts)
            print(f"prompt tokens: mean {statistics.mean(map(len, ids)):.1f}, max {max(map(len, ids))}")
            rows = []
            for conc in args.concurrency:  # each level's three measurements close in time: the load moves
                seq = in_process(engine, ids, params, 1)
                before = httpx.post(url + "/bench/reset").json()
                cpu = time.process_time()
                g = level(prompts, conc)
                g["cpu_s"] = time.process_time() - cpu
                time.sleep(0.2)  # the last answers' bookkeeping
                after = httpx.get(url + "/bench/stats").json()
                g["gateway_cpu_s"] = after["cpu_s"] - before["cpu_s"]
                inside = {"worker": {k: after["worker"][k] - before["worker"][k] for k in before["worker"]},
                          "counters": {k: v - before["counters"].get(k, 0) for k, v in after["counters"].items()},
                          "times": after["times"]}
                rows.append((conc, g, seq, in_process(engine, ids, params, conc), inside))
        finally:
            if gateway is not None and gateway.pid is not None:
                gateway.terminate()  # SIGTERM: uvicorn's graceful stop, the gateway's producers flushed
                gateway.join(60)
                if gateway.is_alive():
                    gateway.kill()
                    gateway.join()
                if gateway.exitcode not in (0, -signal.SIGTERM):  # uvicorn re-raises SIGTERM once stopped
                    print(f"the gateway process exited with {gateway.exitcode}")
            es.down()

    n = args.requests
    unit = "episodes/s" if args.episodes else "completions/s"
    print()
    print(f"{'':>4} | {unit + ': gateway':>22} {'in-proc seq':>12} {'in-proc batch':>14} |"
          f" {'p50/p99 ms: gateway':>21} {'in-proc seq':>13} {'in-proc batch':>14} | {'gateway / seq':>13}"
          f" {'gateway / batch':>15}")
    for conc, g, seq, b, _ in rows:
        g_rate, seq_rate, b_rate = len(g["latency"]) / g["wall"], n / seq["wall"], n / b["wall"]
        print(f"C={conc:<2} | {g_rate:>22.1f} {seq_rate:>12.1f} {b_rate:>14.1f} | {p50_99(g['latency']):>21}"
              f" {p50_99(seq['latency']):>13} {p50_99(b['latency']):>14} | {g_rate / seq_rate:>12.2f}x"
              f" {g_rate / b_rate:>14.2f}x")
    print()
    for conc, g, seq, b, inside in rows:
        w, t, counters = inside["worker"], inside["times"], inside["counters"]
        calls, reqs = w["engine_calls"], w["requests"]
        line = (f"C={conc:<2} worker: {calls} engine calls for {reqs} requests "
                f"(mean batch {reqs / max(calls, 1):.2f}), "
                f"engine busy {w['busy_s']:.2f} s of {g['wall']:.2f} s ({100 * w['busy_s'] / g['wall']:.0f}%), "
                f"{1000 * w['busy_s'] / max(calls, 1):.1f} ms per call; CPU s: gateway process "
                f"{g['gateway_cpu_s']:.2f}, clients {g['cpu_s']:.2f}\n      tokens/completion gateway "
                f"{g['tokens'] / max(len(g['completion']), 1):.1f}, in-proc seq {seq['tokens'] / n:.1f}, "
                f"batch {b['tokens'] / n:.1f}\n"
                f"      completion p50/p99 ms: client {p50_99(g['completion'])}, in the server {p50_99(t['server'])}, "
                f"of which submit to result {p50_99(t['worker'])}")
        if args.episodes:
            line += (f"\n      finish p50/p99 {p50_99(g['finish'])} ms; group admission "
                     f"{p50_99(t['admission'])} ms ({len(t['admission'])} groups; waiting ones share a decision), publish "
                     f"{p50_99(t['publish'])} ms; finishes {g['statuses']}; groups published "
                     f"{counters.get('groups_published', 0)}, trajectories {counters.get('trajectories', 0)}")
        if g["errors"]:
            line += f"\n      {len(g['errors'])} ERRORS, first: {g['errors'][0]}"
        print(line)


if __name__ == "__main__":
    main()
