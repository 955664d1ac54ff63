"""Scoring throughput: rule, local-judge and HTTP-judge rewards, called directly vs through 1 and 2 stream-ops workers.

    .venv/bin/python benchmarks/scoring.py [--groups-rule 3000] [--groups-judge 400] [--group-size 4]
                                           [--http-latency-ms 50] [--judge-model DIR]
    .venv/bin/python benchmarks/scoring.py --modes sandbox [--solutions 200]

`--modes sandbox` (no stack): the code_tests sandbox's cost per solution and per test against a
bare `python -I -S -c` running the same solution and tests (`sandbox_section`).

Starts a private embedded stack (free ports, a temp dir) and, in this process, an OpenAI-compatible
judge server (FastAPI under uvicorn on 127.0.0.1) that answers "Score: N" after a fixed latency,
standing in for an LLM server. For each reward (`exact_match`; `judge` with `backend: local`, by
default a tiny random char-level Qwen2 built here whose digits are read as the score, or the model at
--judge-model; `judge` with `backend: http`, max_concurrency 16 per worker), it measures records
(groups) per second: (1) calling the scorer directly in this process, every group at once as a
worker does (`Scorer.ascore`, up to 1000 in flight); (2) one stream-ops worker subprocess and
(3) two, over the same groups in a topic of 4 partitions, produced once every worker has scored
warm-up groups (start-up, model loads and group joins left out), from the first to the last
experience's create timestamp. Prints each rate and its ratio to (1).
On 2 shared cores the numbers move with whatever else runs; a CPU-bound local judge cannot gain
from a second worker there, an I/O-bound HTTP judge can.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml
from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from streamrft.config import KafkaConfig, RunConfig
from streamrft.infra.kafka import ensure_topics, flush_or_raise, make_consumer, make_producer, run_topics
from streamrft.infra.stack import EmbeddedStack, free_ports
from streamrft.schemas import ExperienceGroup, Metric, RolloutGroup, Task, Trajectory, decode, encode, topic_name
from streamrft.stream_ops.scoring import build_scorer

REPO = Path(__file__).resolve().parents[1]
PARTITIONS = 4


def make_groups(n: int, size: int, prefix: str = "g") -> list[RolloutGroup]:
    out = []
    for g in range(n):
        task = Task(task_id=f"t{g}", prompt=f"reverse {g}", answer=str(g)[::-1])
        trajs = [Trajectory(group_id=f"{prefix}{g}", task_id=task.task_id, model_version=0, prompt_ids=list(range(1, 33)),
                            response_ids=list(range(1, 17)), logprobs=[-0.5] * 16,
                            response_text=str(g)[::-1] if i % 2 else str(g))
                 for i in range(size)]
        out.append(RolloutGroup(group_id=f"{prefix}{g}", task=task, trajectories=trajs))
    return out


def start_judge_server(latency_s: float) -> tuple[str, object]:
    import uvicorn
    from fastapi import FastAPI

    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(body: dict):
        await asyncio.sleep(latency_s)  # the LLM's time; the server itself stays free meanwhile
        text = body["messages"][-1]["content"]
        content = f"Score: {len(text) % 11}"
        return {"id": "x", "object": "chat.completion", "model": body["model"],
                "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}]}

    port = free_ports()["kafka_port"]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    return f"http://127.0.0.1:{port}/v1", server


def tiny_judge(workdir: Path) -> str:
    from streamrft.engine.models import build_char_tokenizer, build_tiny_model

    path = workdir / "tiny-judge"
    build_tiny_model(path, build_char_tokenizer("0123456789 "), hidden_size=64, layers=2, heads=4, max_positions=256)
    return str(path)


def stream_ops_section(mode: str, judge_model: str, url: str) -> dict:
    if mode == "rule":
        terms = [{"name": "exact_match"}]
    elif mode == "judge_local":
        terms = [{"name": "judge", "retries": 0, "fallback": 0.0, "timeout_s": 120,
                  "params": {"backend": "local", "model": judge_model, "template": "{answer} {response} ",
                             "max_new_tokens": 4, "score_range": [0, 1e12], "batch_size": 16, "batch_wait_s": 0.005}}]
    else:
        terms = [{"name": "judge", "retries": 2, "timeout_s": 30,
                  "params": {"backend": "http", "base_url": url, "model": "judge", "max_concurrency": 16}}]
    return {"rewards": terms, "drop_zero_variance": False}


def direct_rate(cfg: RunConfig, groups: list[RolloutGroup]) -> float:
    scorer = build_scorer(cfg)

    async def run() -> float:
        limit = asyncio.Semaphore(1000)  # the worker's MAX_IN_FLIGHT

        async def one(g):
            async with limit:
                return await scorer.ascore(g)

        t0 = time.monotonic()
        results = await asyncio.gather(*(one(g) for g in groups))
        assert all(r is not None for r in results)
        return len(groups) / (time.monotonic() - t0)

    asyncio.run(run())  # warm-up: model load, first batches, connections
    try:
        return asyncio.run(run())
    finally:
        scorer.close()


def produce(kafka: KafkaConfig, topic: str, groups: list[RolloutGroup]) -> None:
    producer = make_producer(kafka)
    for g in groups:
        producer.produce(topic, encode(g), g.group_id.encode())
    flush_or_raise(producer, 120)


def worker_rate(kafka: KafkaConfig, ns: str, base: dict, groups: list[RolloutGroup], workers: int,
                workdir: Path) -> float:
    """Start `workers` workers, let each score warm-up groups (so the consumer group has settled and
    every model is loaded), then put out `groups` and time them."""
    ensure_topics(kafka, run_topics(kafka, ns))
    topic = topic_name(ns, "rollouts", "default")
    config = workdir / f"{ns}.yaml"
    config.write_text(yaml.safe_dump({**base, "namespace": ns, "output_dir": str(workdir / ns),
                                      "kafka": kafka.model_dump()}))
    procs = []
    for w in range(workers):
        log = open(workdir / f"{ns}-w{w}.log", "wb")
        procs.append(subprocess.Popen([sys.executable, "-m", "streamrft.stream_ops.cli_entry", str(config),
                                       "--worker-id", f"w{w}"], stdout=log, stderr=subprocess.STDOUT, cwd=REPO))
    consumer = make_consumer(kafka, None)
    consumer.assign([TopicPartition(topic_name(ns, "experiences"), p, OFFSET_BEGINNING) for p in range(PARTITIONS)]
                    + [TopicPartition(topic_name(ns, "metrics"), 0, OFFSET_BEGINNING)])
    stamps: list[int] = []
    busy: set[str] = set()  # workers that reported scoring something
    deadline = time.monotonic() + 900

    def read() -> None:
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            raise SystemExit(f"{ns}: {len(stamps)}/{len(groups)} experiences; logs in {workdir}")
        for m in consumer.consume(num_messages=5000, timeout=0.5):
            if m.error() is not None:
                continue
            msg = decode(m.value())
            if isinstance(msg, Metric) and msg.values.get("scored", 0) > 0:
                busy.add(msg.role_id)
            elif isinstance(msg, ExperienceGroup) and not msg.group_id.startswith("warm"):
                stamps.append(m.timestamp()[1])

    try:
        warmups = 0
        while len(busy) < workers:  # warm-up groups until every worker has scored some (a late joiner gets its share)
            produce(kafka, topic, make_groups(4 * PARTITIONS, 2, prefix=f"warm{warmups}-"))
            warmups += 1
            for _ in range(4):
                read()
        produce(kafka, topic, groups)
        while len(stamps) < len(groups):
            read()
    finally:
        consumer.close()
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)
    return len(groups) / max((max(stamps) - min(stamps)) / 1000, 1e-3)


def sandbox_section(n: int) -> list[tuple[str, float, float]]:
    """The code_tests sandbox against a bare interpreter, side by side: (what, ms per unit, CPU ms per unit).

    The same honest solution (3 tests, or 10 for the per-test rows) is run n times each way:
    - bare: `python -I -S -c "<solution + asserts>"` per solution, no isolation at all;
    - cold: a jail started for each solution (warm=0): bubblewrap, a cgroup, a tmpfs, the runner;
    - warm, paced: jails kept warm (warm=2), solutions arriving 150 ms apart (the pool refills in
      between), the latency a scorer thread sees;
    - warm, back to back: the same pool drained as fast as it goes: throughput, start-up included;
    - 4 at once: four threads (as the scorer's thread pool calls it), bare vs warm=4: throughput;
    - per test: isolate="test", 10 tests, a fresh warm jail for each, paced.
    CPU is the whole machine's busy time from /proc/stat (every process and kernel thread: the
    jails' processes are killed before they are all reaped, so no rusage counts them whole, and
    namespace teardown runs in kernel workers), so run it on an otherwise idle machine.
    """
    from dataclasses import replace as with_

    from streamrft.stream_ops.sandbox import Limits, close_pools, run_tests

    code = "def add(a, b):\n    return a + b"
    tests3 = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(10, 5) == 15"]
    tests10 = [f"assert add({i}, {i}) == {2 * i}" for i in range(10)]
    exe = sys.executable

    tick = os.sysconf("SC_CLK_TCK")

    def cpu() -> float:
        fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        return (sum(fields[:8]) - fields[3] - fields[4]) / tick  # all but idle and iowait

    def timed(label: str, fn, units: int, pace_s: float = 0.0) -> tuple[str, float, float]:
        wall = 0.0
        c0 = cpu()
        for _ in range(n):
            if pace_s:
                time.sleep(pace_s)
            t0 = time.perf_counter()
            fn()
            wall += time.perf_counter() - t0
        if pace_s:
            time.sleep(pace_s)  # the refill after the last run is part of its cost
        row = (label, 1000 * wall / (n * units), 1000 * (cpu() - c0) / (n * units))
        print(f"  {row[0]:42s} {row[1]:7.1f} ms  cpu {row[2]:6.1f} ms", flush=True)
        return row

    def bare(tests):
        subprocess.run([exe, "-I", "-S", "-c", code + "\n" + "\n".join(tests)], check=True, env={}, cwd="/")

    def ours(limits, tests):
        result = run_tests(code, tests, limits)
        assert result.fraction == 1.0, result

    base = Limits(wall_s=30)
    ours(base, tests3)  # the jail's root (ldd over the stdlib's extensions) is built once per process
    close_pools()
    print(f"code_tests sandbox vs bare `python -I -S -c`, {n} solutions each:")
    rows = [timed("bare python, per solution (3 tests)", lambda: bare(tests3), 1),
            timed("sandbox cold, per solution", lambda: ours(with_(base, warm=0), tests3), 1)]
    ours(base, tests3)
    time.sleep(0.5)
    rows.append(timed("sandbox warm, paced, per solution", lambda: ours(base, tests3), 1, pace_s=0.15))
    rows.append(timed("sandbox warm, back to back, per solution", lambda: ours(base, tests3), 1))
    bare_rows = [rows[0]]

    def four_at_once(fn):
        threads = [threading.Thread(target=fn) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    bare_rows.append(timed("bare python, 4 at once, per solution", lambda: four_at_once(lambda: bare(tests3)), 4))
    rows.append(bare_rows[1])
    rows.append(timed("sandbox warm=4, 4 at once, per solution",
                      lambda: four_at_once(lambda: ours(with_(base, warm=4), tests3)), 4))
    rows.append(timed("bare python, per test (1 process each)", lambda: [bare([t]) for t in tests10], 10))
    per_test = with_(base, isolate="test", warm=2)
    ours(per_test, tests10)
    time.sleep(0.5)
    rows.append(timed("sandbox warm, isolate=test, per test", lambda: ours(per_test, tests10), 10, pace_s=0.15))
    close_pools()
    refs = {"per test": rows[6], "4 at once": rows[4], "": rows[0]}
    print("\nratio to bare python (wall per unit; target <= 1.5 with per-solution isolation):")
    for label, ms, cpu_ms in rows:
        ref = next(r for key, r in refs.items() if key in label)
        print(f"  {label:42s} {ms / ref[1]:5.2f}x wall   {cpu_ms / ref[2]:5.2f}x cpu")
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups-rule", type=int, default=3000)
    ap.add_argument("--groups-judge", type=int, default=400)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--http-latency-ms", type=float, default=50.0)
    ap.add_argument("--judge-model", default=None, help="a local causal LM directory (default: a tiny random one)")
    ap.add_argument("--modes", default="rule,judge_local,judge_http", help="any of rule, judge_local, judge_http, sandbox")
    ap.add_argument("--solutions", type=int, default=200, help="sandbox mode: solutions per row")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a stopped run still stops its stack
    modes = args.modes.split(",")
    if "sandbox" in modes:
        sandbox_section(args.solutions)
        modes.remove("sandbox")
        if not modes:
            return 0

    url, server = start_judge_server(args.http_latency_ms / 1000)
    rows = []
    with tempfile.TemporaryDirectory(prefix="scoring-bench-") as tmp:
        workdir = Path(tmp)
        judge_model = args.judge_model or tiny_judge(workdir)
        stack = EmbeddedStack(workdir / "stack", **free_ports())
        try:
            kafka = KafkaConfig(bootstrap=stack.up().kafka, partitions=PARTITIONS)
            for mode in modes:
                n = args.groups_rule if mode == "rule" else args.groups_judge
                groups = make_groups(n, args.group_size)
                base = {"model": {"path": "unused"}, "stack": {"embedded": False},
                        "stream_ops": stream_ops_section(mode, judge_model, url)}
                direct = direct_rate(RunConfig.model_validate(base), groups)
                one = worker_rate(kafka, f"{mode}-1w", base, groups, 1, workdir)
                two = worker_rate(kafka, f"{mode}-2w", base, groups, 2, workdir)
                rows.append((mode, n, direct, one, two))
                print(f"{mode:12s} {n:5d} groups x {args.group_size}: direct {direct:8.1f}/s   1 worker {one:8.1f}/s "
                      f"({one / direct:.3f})   2 workers {two:8.1f}/s ({two / direct:.3f}; {two / one:.2f}x one)",
                      flush=True)
        finally:
            print(f"stack stopped: {', '.join(stack.down()) or 'nothing running'}")
            server.should_exit = True
    print(f"\ngroups/s, ratio to calling the scorer directly (http judge latency {args.http_latency_ms:g} ms, "
          f"judge model {'tiny random char Qwen2' if not args.judge_model else args.judge_model}):")
    print(f"{'reward':12s} {'direct':>9s} {'1 worker':>9s} {'ratio':>6s} {'2 workers':>9s} {'ratio':>6s} {'2w/1w':>6s}")
    for mode, _, direct, one, two in rows:
        print(f"{mode:12s} {direct:9.1f} {one:9.1f} {one / direct:6.3f} {two:9.1f} {two / direct:6.3f} {two / one:6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
