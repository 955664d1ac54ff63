"""What the dashboard sends and draws for a long run, measured side by side in one run.

    .venv/bin/python benchmarks/dashboard_scale.py [--steps 6000] [--groups 1500] [--no-browser]

A long run's records (`tests/dashboard_run.py`: a trainer metric a step, announcements, explorer,
stream-ops and eval metrics, groups of 8 multi-turn trajectories, the final record) are written to
a fresh embedded stack; a `Dashboard` reads them; then it prints:

- bytes: every point of every line as JSON (what sending the whole run would cost), the first
  message a page gets (every line downsampled to about 1,000 points, and the tables), a push after
  one new trainer step, and a push when nothing changed (none is sent);
- the server's time to make the first message and a one-step push (`Feed.next`);
- in Debian's headless Chromium (skipped with `--no-browser` or without it): the page's time to
  apply the first message, to apply a one-step push, and to redraw every line chart from scratch
  (what a page that redrew everything on each push would spend), from `window.dashboardPerf`;
- the viewer: the first page of groups (held in memory) against the oldest page (read back from
  the topic by offset).
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=30) as r:
        return r.read()


def _timed(fn, repeats: int = 5) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=6000)
    ap.add_argument("--groups", type=int, default=1500)
    ap.add_argument("--no-browser", action="store_true")
    a = ap.parse_args()

    from dashboard_run import write_long_run

    from streamrft.config import KafkaConfig, load_config
    from streamrft.infra.stack import S3_KEY, EmbeddedStack, free_ports
    from streamrft.monitor.dashboard import Dashboard

    with tempfile.TemporaryDirectory(prefix="dashboard-scale-") as tmp:
        es = EmbeddedStack(Path(tmp) / "stack", buckets=("weights",), **free_ports())
        state = es.up()
        try:
            t = time.perf_counter()
            wrote = write_long_run(KafkaConfig(bootstrap=state.kafka), "scale", a.steps, a.groups)
            print(f"wrote {wrote['steps']} steps and {wrote['trajectories']} trajectories in "
                  f"{time.perf_counter() - t:.1f} s")
            cfg = load_config(str(ROOT / "examples" / "agent_cpu.yaml"), [
                "stack.embedded=false", f"kafka.bootstrap={state.kafka}", f"s3.endpoint={state.s3}",
                f"s3.access_key={S3_KEY}", f"s3.secret_key={S3_KEY}", "namespace=scale", f"output_dir={tmp}"])
            dash = Dashboard(cfg, port=0)
            t = time.perf_counter()
            dash.start()
            while dash.state.groups_seen < wrote["groups"] or dash.state.finished is None:
                time.sleep(0.2)
            print(f"dashboard read the run in {time.perf_counter() - t:.1f} s")
            try:
                _measure(a, dash, wrote)
            finally:
                dash.stop()
        finally:
            es.down()
    return 0


def _measure(a, dash, wrote) -> None:
    from streamrft.infra.kafka import flush_or_raise, make_producer
    from streamrft.monitor.dashboard.feed import Feed, lines_of
    from streamrft.schemas import Metric, encode

    s = dash.state
    with s.lock:
        whole = len(json.dumps({k: ln.points() for k, ln, _ in lines_of([s])}, separators=(",", ":")))
        points = sum(len(ln) for ln in s.lines.values())
    t_first, first = _timed(lambda: Feed([s]).next())
    first_bytes = len(json.dumps(first, separators=(",", ":")))
    feed = Feed([s])
    feed.next()
    step = wrote["steps"]

    def one_step():
        nonlocal step
        step += 1
        with s.lock:
            s.on_metric(Metric(role="trainer", role_id="trainer-100", step=step,
                               values={"reward_mean": 0.9, "version": step, "wait_s": 0.2, "step_s": 0.3},
                               created_at=wrote["t_end"] + step * 0.5))
        return feed.next()

    t_push, push = _timed(one_step)
    push_bytes = len(json.dumps(push, separators=(",", ":")))
    idle = feed.next()
    print(f"\nlines: {len(s.lines)}, {points} points in all")
    print(f"{'what':<52}{'bytes':>12}{'server ms':>12}")
    print(f"{'every point of every line (the whole run)':<52}{whole:>12}{'':>12}")
    print(f"{'first message (lines downsampled + tables)':<52}{first_bytes:>12}{t_first * 1e3:>12.1f}")
    print(f"{'a push after one new trainer step':<52}{push_bytes:>12}{t_push * 1e3:>12.2f}")
    print(f"{'a push when nothing changed':<52}{0 if idle is None else len(json.dumps(idle)):>12}")
    print(f"ratios: whole run / first message {whole / first_bytes:.1f}x; first message / one-step push "
          f"{first_bytes / push_bytes:.0f}x (a page re-sent everything on each push before)")

    cursors = iter([20, 100, 200])  # pages never asked for before: not in the decoded-view cache

    def fresh(before=None):
        t = time.perf_counter()
        body = _get(dash.url + "api/groups?limit=20" + (f"&before={before}" if before is not None else ""))
        return time.perf_counter() - t, len(body)

    t_new, new = _timed(lambda: fresh(), 3)
    t_old = statistics.median(fresh(next(cursors))[0] for _ in range(3))
    print(f"viewer: the newest 20 groups (kept in memory) {new[0] * 1e3:.0f} ms, {new[1]} bytes; 20 of the oldest "
          f"(read back from the topic by offset, decoded), median of 3 pages: {t_old * 1e3:.0f} ms; "
          f"{json.loads(_get(dash.url + 'api/groups?limit=1'))['total']} groups reachable")

    if a.no_browser or shutil.which("chromium") is None or not Path("/usr/bin/chromedriver").exists():
        print("browser: skipped (--no-browser, or no chromium/chromedriver)")
        return
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1500,2400"):
        opts.add_argument(arg)
    chrome = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=opts)
    try:
        chrome.get(dash.url)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not chrome.execute_script("return window.dashboardPerf.length"):
            time.sleep(0.2)
        first_ms = chrome.execute_script("return window.dashboardPerf[0].ms")
        pushes = []
        for _ in range(5):
            n = chrome.execute_script("return window.dashboardPerf.length")
            producer = make_producer(dash.cfg.kafka)
            step = int(chrome.execute_script("return window.dashboardCharts['c-trainer'].data.datasets[0].data.slice(-1)[0].x")) + 1
            producer.produce("scale.metrics", key=b"trainer", value=encode(Metric(
                role="trainer", role_id="trainer-100", step=step,
                values={"reward_mean": 0.9, "version": step, "wait_s": 0.2, "step_s": 0.3},
                created_at=wrote["t_end"] + 1000 + step)))
            flush_or_raise(producer)
            del producer
            while chrome.execute_script("return window.dashboardPerf.length") == n:
                time.sleep(0.1)
            pushes.append(chrome.execute_script("return window.dashboardPerf.slice(-1)[0].ms"))
        full = []
        for _ in range(5):
            full.append(chrome.execute_script(
                "const t = performance.now(); Object.keys(LINE_CHARTS).forEach(drawLines); return performance.now() - t"))
        print(f"in the page (Chromium, ms): the first message applied {first_ms:.0f} (what every push cost a page "
              f"that was sent everything each time); a one-step push, median of 5: {statistics.median(pushes):.1f}; "
              f"every line chart redrawn from the data it holds, median of 5: {statistics.median(full):.1f}")
    finally:
        chrome.quit()


if __name__ == "__main__":
    raise SystemExit(main())
