"""The dashboard in a real browser: a short real multi-turn run on the embedded stack (the agent
example, a few versions) serves its page (port 0) and prints the URL; a malformed record on its
rollouts topic becomes a dead letter; then `streamrft dashboard` on the finished run is opened in
Debian's headless Chromium, which must draw the reward series, list a trajectory with masked
(environment) tokens and the dead letter with its source offset, and draw a metric produced while
it is open, without a reload. The screenshot is left in the test's tmp dir
(`DASHBOARD_SCREENSHOT=path` copies it).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from streamrft.infra.kafka import flush_or_raise, make_producer
from streamrft.schemas import Metric, encode
from tests_helpers import stack_overrides, stop_all, wait_for

ROOT = Path(__file__).resolve().parents[2]
AGENT = ROOT / "examples" / "agent_cpu.yaml"
CHROMEDRIVER = "/usr/bin/chromedriver"
URL = re.compile(r"^dashboard: (http://\S+/)")


def _overrides(stack, out: Path) -> list[str]:
    return [
        *stack_overrides(stack, out),
        "stages=[{type: sft, steps: 20, batch_size: 16, lr: 0.003,"
        " data: {demos: {linear: 0.5, bisect: 0.5}, size: 100}}]",
        "data.synthetic={task: guess_number, train_size: 200, eval_size: 8, seed: 0}",
        "explorer.num_explorers=1", "explorer.group_size=4", "explorer.tasks_per_batch=4",
        "trainer.batch_groups=2", "trainer.max_staleness=1", "trainer.max_steps=3",
        "eval.every_versions=2", "eval.max_tasks=8", "max_wall_s=null",
    ]


def _lines_until(proc: subprocess.Popen, pattern: re.Pattern, seen: list[str], timeout: float = 300) -> re.Match:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise AssertionError(f"exited before printing {pattern.pattern!r}:\n" + "".join(seen[-40:]))
        seen.append(line)
        if m := pattern.match(line):
            return m
    raise AssertionError(f"no {pattern.pattern!r} within {timeout}s:\n" + "".join(seen[-40:]))


def _get(url: str):
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read()) if "/api/" in url else r.read().decode()


@pytest.fixture
def chrome(tmp_path):
    if not Path(CHROMEDRIVER).exists() or shutil.which("chromium") is None:
        missing = "Debian's chromium and chromium-driver are not installed (bash scripts/install.sh installs them)"
        if os.environ.get("STREAMRFT_REQUIRE_BROWSER"):  # CI: a browser test that skips proves nothing
            pytest.fail(missing)
        pytest.skip(missing)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1500,2400", f"--user-data-dir={tmp_path / 'chrome-profile'}"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    try:
        yield driver
    finally:
        driver.quit()  # ends chromedriver and every chromium process it started


def test_a_short_runs_dashboard_draws_reward_trajectories_and_dead_letters(stack, tmp_path, chrome):
    from streamrft.monitor.dashboard.app import CHART_JS, VENDOR

    assert (VENDOR / CHART_JS).is_file(), f"no {VENDOR / CHART_JS}: `bash scripts/install.sh` fetches it with npm"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    run = subprocess.Popen([sys.executable, "-m", "streamrft.cli", "run", str(AGENT), *_overrides(stack, tmp_path)],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=env)
    dash, seen = None, []
    try:
        # `streamrft run` serves the page while it runs, on the free port it printed
        live_url = _lines_until(run, URL, seen).group(1)
        assert "<canvas" in _get(live_url)
        ns = _lines_until(run, re.compile(r"^run (\S+): output"), seen).group(1)
        assert _get(live_url + "api/summary")["namespace"] == ns
        producer = make_producer(stack.kafka)  # a record no schema accepts: stream ops dead-letter it
        producer.produce(f"{ns}.rollouts.default", key=b"not-a-group", value=b"\xc1 not msgpack")
        flush_or_raise(producer)
        del producer  # its connections end here, not after the session's stack is gone
        rest, _ = run.communicate(timeout=400)
        seen.append(rest)
        assert run.returncode == 0, "".join(seen)[-4000:]
        assert "final:" in rest

        # the finished run, from its topics alone, as on another machine (no model.path there: the
        # tokenizer comes from the base files in S3): `streamrft dashboard` on its resolved config
        config = next(tmp_path.glob("*/config.yaml"))
        dash = subprocess.Popen([sys.executable, "-m", "streamrft.cli", "dashboard", "--port", "0", str(config),
                                 f"model.path={tmp_path / 'not-on-this-machine'}"],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=env)
        url = _lines_until(dash, URL, [], timeout=60).group(1)
        chrome.get(url)
        js = ("const c = window.dashboardCharts['c-reward-time'];"
              "return c ? c.data.datasets.map(d => d.data.length) : null")
        wait_for(lambda: min(chrome.execute_script(js) or [0]) > 0, 60, "the reward chart's train and eval series",
                 every=0.5)
        wait_for(lambda: chrome.find_elements("css selector", ".traj .turn.masked"), 60,
                 "a trajectory with masked tokens", every=0.5)
        wait_for(lambda: chrome.find_elements("xpath", "//table[@id='dead']//td[contains(., 'rollouts.default[')]"),
                 60, "the dead letter with its source", every=0.5)
        # the tokenizer is fetched and loaded in the background: wait until the viewer shows text, not ids
        wait_for(lambda: not chrome.find_element("id", "tokinfo").text, 60, "the tokenizer", every=0.5)
        wait_for(lambda: "guess" in chrome.find_element("css selector", ".traj .prompt").text, 30, "decoded prompts",
                 every=0.5)
        masked = chrome.find_elements("css selector", ".traj .turn.masked")
        trained = chrome.find_elements("css selector", ".traj .turn.trained")
        assert masked and trained and any(m.text.strip() for m in masked)
        # the trainer's off-policy figures, one point a step (importance weight, clip shares, staleness)
        off = chrome.execute_script("const c = window.dashboardCharts['c-offpolicy'];"
                                    "return c ? c.data.datasets.map(d => [d.label, d.data.length]) : null")
        assert off and dict(off)["iw_mean"] >= 1 and dict(off)["iw_ess"] >= 1, off
        lag = chrome.execute_script("return window.dashboardCharts['c-lag'].data.labels")
        assert any(label.startswith("trainer") and label.endswith("experiences") for label in lag), lag
        # live, without a reload: a record produced now reaches the open page through the event stream
        evals = chrome.execute_script(js)[1]
        producer = make_producer(stack.kafka)
        late = Metric.of_finite("eval", "test", 99, {"eval_reward": 0.5, "version": 99})
        producer.produce(f"{ns}.metrics", key=b"test", value=encode(late))
        flush_or_raise(producer)
        del producer
        wait_for(lambda: chrome.execute_script(js)[1] == evals + 1, 30, "the new eval point, live", every=0.5)
        shot = tmp_path / "dashboard.png"
        chrome.save_screenshot(str(shot))
        assert shot.stat().st_size > 10_000
        if os.environ.get("DASHBOARD_SCREENSHOT"):
            shutil.copy(shot, os.environ["DASHBOARD_SCREENSHOT"])
    finally:
        stop_all({"run": run, **({"dashboard": dash} if dash else {})})
