"""The labelling page in headless Chromium, on the real stack: two people log in with their teams'
keys, each is shown a different answer of a parked group, each types a rating, and the feedback join
makes them the group's rewards on the experiences topic (what the trainer trains on). A wrong key
is refused."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path


from gateway_helpers import KEYS, gateway_config, serving
from streamrft.config import dump_config
from streamrft.infra.kafka import flush_or_raise, make_producer, read_topic
from streamrft.schemas import ExperienceGroup, RolloutGroup, Task, Trajectory, decode, encode, topic_name

ROOT = Path(__file__).resolve().parents[3]


def _role(args: list[str], log: Path) -> subprocess.Popen:
    with open(log, "ab") as fh:
        return subprocess.Popen([sys.executable, "-m", "streamrft.cli", *args], stdout=fh, stderr=subprocess.STDOUT,
                                cwd=ROOT, env=dict(os.environ))


def _login(driver, url: str, key: str, name: str) -> None:
    from selenium.webdriver.common.by import By

    driver.get(url + "/label")
    driver.find_element(By.ID, "key").send_keys(key)
    driver.find_element(By.ID, "rater").send_keys(name)
    driver.find_element(By.ID, "start").click()


def _wait(driver, predicate, what: str, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while True:
        got = predicate(driver)
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what}; page: {driver.page_source[-2000:]}"
        time.sleep(0.2)


def test_two_raters_rate_different_answers_on_the_page_and_the_join_makes_them_the_rewards(stack, tmp_path,
                                                                                           chrome):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    ns = f"label-{os.getpid()}-{int(time.time())}"
    cfg = gateway_config(stack, tmp_path, ns, [
        "stream_ops.rewards=[{name: feedback, params: {teams: [agents, lab], wait_s: 300}}]",
        "eval.rewards=[{name: reverse}]"])
    config = tmp_path / "run.yaml"
    config.write_text(dump_config(cfg))
    roles = {"score": _role(["score", str(config)], tmp_path / "score.log"),
             "join": _role(["join", str(config)], tmp_path / "join.log")}
    try:
        with serving(cfg) as served:
            task = Task(task_id="t-lbl", prompt="rev abc=", answer="cba")
            group = RolloutGroup(group_id="lbl", team="agents", task=task, trajectories=[
                Trajectory(traj_id=f"lbl-{i}", group_id="lbl", task_id=task.task_id, team="agents", model_version=0,
                           prompt_ids=[1], response_ids=[2], logprobs=[-0.3], response_text=text)
                for i, text in enumerate(["cba", "abc"])])
            producer = make_producer(cfg.kafka)
            producer.produce(topic_name(ns, "rollouts", "agents"), encode(group), b"lbl")
            flush_or_raise(producer)

            def shown(d) -> str | None:
                el = d.find_element(By.ID, "answer")
                return el.get_attribute("data-traj-id") if el.is_displayed() and el.text else None

            _login(chrome, served.url, KEYS["agents"], "ann")
            ann = _wait(chrome, shown, "ann's answer", 90)
            ann_tab = chrome.current_window_handle
            chrome.switch_to.new_window("tab")  # a second person: a tab of its own (its own sessionStorage)
            _login(chrome, served.url, KEYS["lab"], "bob")
            bob = _wait(chrome, shown, "bob's answer")
            assert {ann, bob} == {"lbl-0", "lbl-1"}  # never the same answer to two raters
            assert "waiting" in chrome.find_element(By.ID, "count").text
            chrome.switch_to.new_window("tab")
            _login(chrome, served.url, "sk-wrong", "eve")
            error = _wait(chrome, lambda d: d.find_element(By.ID, "error").text, "the refusal")
            assert "Refused" in error and "API key" in error
            assert not chrome.find_element(By.ID, "work").is_displayed()

            chrome.switch_to.window(bob_tab := chrome.window_handles[1])
            ActionChains(chrome).send_keys("1").perform()  # bob: 1 of 5
            _wait(chrome, lambda d: "Rated 0" in d.find_element(By.ID, "status").text, "bob's rating sent")
            chrome.switch_to.window(ann_tab)
            ActionChains(chrome).send_keys("5").perform()  # ann: 5 of 5
            _wait(chrome, lambda d: "Rated 1" in d.find_element(By.ID, "status").text, "ann's rating sent")
            assert bob_tab != ann_tab

            deadline = time.monotonic() + 90
            experiences = []
            while not experiences:
                assert time.monotonic() < deadline, (tmp_path / "join.log").read_text()[-3000:]
                experiences = [decode(m.value(), ExperienceGroup) for m in read_topic(cfg.kafka, topic_name(ns, "experiences"))]
            (exp,) = experiences
            rewards = dict(zip([t.traj_id for t in exp.trajectories], exp.rewards))
            assert rewards == {ann: 1.0, bob: 0.0}
            _wait(chrome, lambda d: d.find_element(By.ID, "count").text.startswith("0 waiting"), "nothing waiting")
    finally:
        for p in roles.values():
            p.send_signal(signal.SIGTERM)
        for p in roles.values():
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
