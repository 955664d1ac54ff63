"""The dashboard in a real browser (Debian's headless Chromium), on the real embedded stack.

1. A short real multi-turn run (the agent example, a few versions) serves its page (port 0) and
   prints the URL; the page, open from the start, must end saying "finished" with the run's final
   eval. A malformed record on its rollouts topic becomes a dead letter; then `streamrft dashboard`
   on the finished run must draw the reward series, list a trajectory with masked (environment)
   tokens and the dead letter with its source offset, and draw a metric produced while it is open,
   without a reload. The screenshot is left in the test's tmp dir (`DASHBOARD_SCREENSHOT=path`
   copies it).
2. A long run's records (`tests/dashboard_run.py`: 6,000 steps, 12,000 trajectories) on the real
   broker: the first and last steps are on the charts; typing a filter fast ends with that
   filter's groups; paging reaches the oldest group; an idle finished page is sent nothing; a push
   of one new point redraws (its time, measured in the page, is printed); a hidden series stays
   hidden.
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
        chrome.get(live_url)  # the page `streamrft run` opened, left open until the run ends
        producer = make_producer(stack.kafka)  # a record no schema accepts: stream ops dead-letter it
        producer.produce(f"{ns}.rollouts.default", key=b"not-a-group", value=b"\xc1 not msgpack")
        flush_or_raise(producer)
        del producer  # its connections end here, not after the session's stack is gone
        rest, _ = run.communicate(timeout=400)
        seen.append(rest)
        assert run.returncode == 0, "".join(seen)[-4000:]
        final = re.search(r"final: eval_reward_start=\S+ eval_reward_end=(\S+) versions=(\d+)", rest)
        assert final, rest
        # the run's end reached the open page before its server stopped: "finished", the final eval
        assert chrome.find_element("id", "live").text.startswith("finished"), chrome.find_element("id", "live").text
        shown = chrome.find_element("id", "final").text
        assert f"→ {float(final.group(1)):.3f}" in shown and f"{final.group(2)} versions" in shown, shown
        assert "(finished)" in chrome.title and ns in chrome.title
        end_eval = chrome.execute_script(
            "const d = window.dashboardCharts['c-reward-version'].data.datasets.find(d => d.label === 'eval (launcher)');"
            "return d.data.map(p => p.x)")
        assert end_eval == [0, int(final.group(2))], end_eval  # the start's and the end's, the last included

        # the finished run, from its topics alone, as on another machine (no model.path there: the
        # tokenizer comes from the base files in S3): `streamrft dashboard` on its resolved config
        config = next(tmp_path.glob("*/config.yaml"))
        dash = subprocess.Popen([sys.executable, "-m", "streamrft.cli", "dashboard", "--port", "0", str(config),
                                 f"model.path={tmp_path / 'not-on-this-machine'}"],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=env)
        url = _lines_until(dash, URL, [], timeout=60).group(1)
        chrome.get(url)
        js = ("const c = window.dashboardCharts['c-reward-time'];"
              "return c ? c.data.datasets.filter(d => !d.isRaw).map(d => d.data.length) : null")
        evals_js = ("const c = window.dashboardCharts['c-reward-time'];"
                    "return c.data.datasets.filter(d => d.label.startsWith('eval')).map(d => d.data.length)"
                    ".reduce((a, b) => a + b, 0)")
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
        evals = chrome.execute_script(evals_js)
        producer = make_producer(stack.kafka)
        late = Metric.of_finite("eval", "test", 99, {"eval_reward": 0.5, "version": 99})
        producer.produce(f"{ns}.metrics", key=b"test", value=encode(late))
        flush_or_raise(producer)
        del producer
        wait_for(lambda: chrome.execute_script(evals_js) == evals + 1, 30, "the new eval point, live", every=0.5)
        shot = tmp_path / "dashboard.png"
        chrome.save_screenshot(str(shot))
        assert shot.stat().st_size > 10_000
        if os.environ.get("DASHBOARD_SCREENSHOT"):
            shutil.copy(shot, os.environ["DASHBOARD_SCREENSHOT"])
    finally:
        stop_all({"run": run, **({"dashboard": dash} if dash else {})})


def _dashboard_on(stack, tmp_path, ns: str):
    from streamrft.config import load_config
    from streamrft.monitor.dashboard import Dashboard

    cfg = load_config(str(AGENT), [*stack_overrides(stack, tmp_path), f"namespace={ns}"])
    dash = Dashboard(cfg, port=0)
    dash.start()
    return dash


def test_a_long_runs_page_keeps_the_whole_run_filters_right_and_sends_nothing_when_idle(stack, tmp_path, chrome):
    from dashboard_run import write_long_run

    ns = f"dash-long-{os.getpid()}"
    wrote = write_long_run(stack.kafka, ns)
    assert wrote["trajectories"] >= 10_000 and wrote["steps"] >= 5_000
    dash = _dashboard_on(stack, tmp_path, ns)
    try:
        wait_for(lambda: dash.state.groups_seen == wrote["groups"] and dash.state.finished is not None, 120,
                 "the dashboard reading the whole run", every=0.5)
        chrome.get(dash.url)
        # the first and the last step are both on the charts (the line is downsampled, never cut)
        steps_js = ("const c = window.dashboardCharts['c-trainer'];"
                    "if (!c) return null; const d = c.data.datasets.find(d => d.label === 'step_s' && d.isRaw);"
                    "return d ? [d.data.length, d.data[0].x, d.data[d.data.length - 1].x] : null")
        wait_for(lambda: chrome.execute_script(steps_js), 60, "the trainer chart", every=0.5)
        n, first, last = chrome.execute_script(steps_js)
        assert (first, last) == (1, wrote["steps"]) and n <= 1000, (n, first, last)
        versions = chrome.execute_script(
            "const d = window.dashboardCharts['c-reward-version'].data.datasets.find(d => d.label === 'train reward');"
            "return [d.data[0].x, d.data[d.data.length - 1].x]")
        assert versions == [1, wrote["steps"]]
        assert "finished" in chrome.find_element("id", "live").text and "(finished)" in chrome.title

        # typing a filter fast always ends with that filter's groups (an older answer never wins)
        box = chrome.find_element("css selector", "#filters [name=min_reward]")
        for text in ("0.5", "0.75", "0.25"):
            box.clear()
            box.send_keys(text)
            want = [g for g in _get(dash.url + f"api/groups?min_reward={text}&limit=20")["groups"]]
            wait_for(lambda: chrome.find_element("id", "groups").get_attribute("data-query") == f"min_reward={text}",
                     30, f"the viewer's answer for >= {text}", every=0.2)
            shown = [float(e.get_attribute("data-reward-mean"))
                     for e in chrome.find_elements("css selector", "#groups .group")]
            assert shown == [g["reward_mean"] for g in want] and min(shown) >= float(text), (text, shown)
        box.clear()
        # zoomed in, the span comes at full resolution: every step between 100 and 200
        chrome.execute_script("setZoom('trainer', 100, 200)")
        zoomed_js = ("const d = window.dashboardCharts['c-trainer'].data.datasets.find(d => d.label === 'step_s' && d.isRaw);"
                     "return d.data.map(p => p.x)")
        wait_for(lambda: chrome.execute_script(zoomed_js) == list(range(100, 201)), 30, "steps 100-200, all of them",
                 every=0.2)
        chrome.execute_script("setZoom('trainer', null, null)")
        assert chrome.execute_script(zoomed_js)[-1] == wrote["steps"]

        # paging reaches the run's oldest group, read back from the topic by offset
        total = _get(dash.url + "api/groups?limit=1")["total"]
        assert total == wrote["groups"]
        oldest = _get(dash.url + f"api/groups?before=1&limit=1")["groups"]
        first = dash.state.index[0]  # the first group read: a partition's first record (which partition is the reader's)
        assert (oldest[0]["partition"], oldest[0]["offset"]) == (first.partition, first.offset) and first.offset == 0
        assert oldest[0]["group_id"] is not None and len(oldest[0]["trajectories"]) == 8
        assert any(t["turns"] and not t["turns"][1]["trained"] for t in oldest[0]["trajectories"])

        # an idle finished page is sent nothing: no update, no request, for 30 s
        time.sleep(3)
        before = (dash.stats.bytes, chrome.execute_script("return performance.getEntriesByType('resource').length"),
                  chrome.execute_script("return window.dashboardStats.messages"))
        time.sleep(30)
        after = (dash.stats.bytes, chrome.execute_script("return performance.getEntriesByType('resource').length"),
                 chrome.execute_script("return window.dashboardStats.messages"))
        assert after == before, (before, after)

        # a hidden series stays hidden through pushes; a push of one new point redraws that chart
        chrome.execute_script(
            "const c = window.dashboardCharts['c-trainer'];"
            "const i = c.data.datasets.findIndex(d => d.label === 'wait_s' && !d.isRaw);"
            "const item = c.legend.legendItems.find(it => it.datasetIndex === i);"
            "c.options.plugins.legend.onClick(null, item, c.legend)")
        perf_before = chrome.execute_script("return window.dashboardPerf.length")
        producer = make_producer(stack.kafka)
        producer.produce(f"{ns}.metrics", key=b"trainer", value=encode(Metric(
            role="trainer", role_id="trainer-100", step=wrote["steps"] + 1,
            values={"reward_mean": 0.9, "version": wrote["steps"] + 1, "wait_s": 0.2, "step_s": 0.3},
            created_at=wrote["t_end"] + 2)))
        flush_or_raise(producer)
        del producer
        wait_for(lambda: chrome.execute_script(steps_js)[2] == wrote["steps"] + 1, 30, "the new step, live", every=0.2)
        hidden = chrome.execute_script("return window.dashboardCharts['c-trainer'].data.datasets"
                                       ".filter(d => d.label === 'wait_s').map(d => d.hidden)")
        assert hidden and all(hidden), hidden
        perf = chrome.execute_script("return window.dashboardPerf.slice(arguments[0])", perf_before)
        pushed = [p for p in perf if p["points"] > 0]
        assert pushed and max(p["points"] for p in pushed) <= 4, perf  # the new points only, not the run again
        print(f"\na push with one new step redrew {pushed[-1]['charts']} charts in {pushed[-1]['ms']:.1f} ms "
              f"(in the page); {chrome.execute_script('return window.dashboardStats.bytes')} bytes sent to the page "
              f"in all, the first message (the whole run, downsampled) nearly all of it")
        chrome.refresh()  # the hidden series is remembered across a reload too
        wait_for(lambda: chrome.execute_script(steps_js), 60, "the trainer chart again", every=0.5)
        hidden = chrome.execute_script("return window.dashboardCharts['c-trainer'].data.datasets"
                                       ".filter(d => d.label === 'wait_s').map(d => d.hidden)")
        assert hidden and all(hidden), hidden
    finally:
        dash.stop()


def test_dashboard_of_two_runs_overlays_their_rewards(stack, tmp_path, chrome):
    from dashboard_run import write_long_run

    from streamrft.config import dump_config, load_config

    configs = []
    for name, seed in (("a", 0), ("b", 1)):
        ns = f"dash-cmp-{name}-{os.getpid()}"
        write_long_run(stack.kafka, ns, steps=300, groups=10, seed=seed)
        path = tmp_path / f"{name}.yaml"
        path.write_text(dump_config(load_config(str(AGENT), [*stack_overrides(stack, tmp_path), f"namespace={ns}"])))
        configs.append((ns, path))
    (ns_a, a), (ns_b, b) = configs
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    dash = subprocess.Popen([sys.executable, "-m", "streamrft.cli", "dashboard", str(a), str(b), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=env)
    try:
        url = _lines_until(dash, URL, [], timeout=60).group(1)
        chrome.get(url)
        labels_js = ("const c = window.dashboardCharts['c-reward-version'];"
                     "return c ? c.data.datasets.filter(d => !d.isRaw).map(d => [d.label, d.data.length]) : []")
        want = {f"{ns}: {what}" for ns in (ns_a, ns_b) for what in ("train reward", "eval (launcher)", "eval (evaluator)")}
        wait_for(lambda: want <= {label for label, n in chrome.execute_script(labels_js) if n}, 60,
                 "both runs' rewards and evals", every=0.5)
        wait_for(lambda: dict(chrome.execute_script(labels_js))[f"{ns_b}: train reward"] == 300, 60,
                 "every step of the second run", every=0.5)
        # the other charts are the first run's alone
        trainer = chrome.execute_script("return window.dashboardCharts['c-trainer'].data.datasets.map(d => d.label)")
        assert trainer and not any(ns_b in label for label in trainer)
        assert f"{ns_a} vs {ns_b}" in chrome.find_element("id", "ns").text
    finally:
        stop_all({"dashboard": dash})


def test_the_viewer_shows_the_pictures_of_a_vision_language_trajectory(stack, tmp_path, chrome):
    """A VLM run's group (its picture stored once in S3 by hash, the trajectory naming it): the viewer
    draws the picture beside the prompt, fetched through `/api/media/<sha256>`, which serves the
    images of the groups shown and nothing else."""
    import urllib.error

    from streamrft.infra.media import MediaStore
    from streamrft.schemas import ExperienceGroup, Task, Trajectory

    ns = f"dash-vlm-{os.getpid()}"
    dash = _dashboard_on(stack, tmp_path, ns)
    try:
        media = MediaStore.for_run(dash.cfg)
        ref = media.put(_png((220, 40, 40)))
        other = media.put(_png((40, 70, 220)))  # in the store, in no group
        task = Task(task_id="count-eval-0", prompt="how many shapes?", answer="1", images=[ref])
        trajs = [Trajectory(group_id="gv", task_id=task.task_id, team="default", model_version=0, prompt_ids=[1, 2, 3],
                            response_ids=[5, 6], logprobs=[-0.1, -0.2], images=[ref]) for _ in range(2)]
        producer = make_producer(stack.kafka)
        producer.produce(f"{ns}.experiences", key=b"gv", value=encode(ExperienceGroup(
            group_id="gv", team="default", task=task, trajectories=trajs, rewards=[1.0, 0.0], advantages=[0.5, -0.5],
            created_at=time.time())))
        flush_or_raise(producer)
        del producer
        wait_for(lambda: dash.state.groups_seen == 1, 60, "the dashboard reading the group", every=0.5)
        chrome.get(dash.url)
        sizes_js = ("return [...document.querySelectorAll('#groups img.picture')]"
                    ".map(i => [i.complete, i.naturalWidth, i.naturalHeight, i.getAttribute('src')])")
        wait_for(lambda: (s := chrome.execute_script(sizes_js)) and all(c and w for c, w, _, _ in s), 60,
                 "the pictures drawn", every=0.3)
        assert chrome.execute_script(sizes_js) == [[True, 32, 32, f"/api/media/{ref.sha256}"]] * 2
        # the pixels the page drew are the stored picture's
        red = chrome.execute_script(
            "const i = document.querySelector('#groups img.picture'); const c = document.createElement('canvas');"
            "c.width = 32; c.height = 32; const x = c.getContext('2d'); x.drawImage(i, 0, 0);"
            "return [...x.getImageData(5, 5, 1, 1).data]")
        assert red == [220, 40, 40, 255]
        with pytest.raises(urllib.error.HTTPError, match="404"):  # stored, but in no group shown: not served
            urllib.request.urlopen(dash.url + f"api/media/{other.sha256}", timeout=10)
    finally:
        dash.stop()


def _png(rgb: tuple[int, int, int]) -> bytes:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (32, 32), rgb).save(buf, format="PNG")
    return buf.getvalue()
