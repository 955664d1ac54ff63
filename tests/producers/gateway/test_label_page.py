"""People and users rating on the real stack, with a stream-ops worker and the feedback join running.

The labelling page in headless Chromium: two people log in with their teams' keys, each is shown a
different answer of a parked group, each types a rating, and the join makes them the group's
rewards on the experiences topic (what the trainer trains on). A wrong key is refused.
`gateway.mode: serve`: a user's call of two completions is logged as a group, the user rates each by
its `completion_id`, and the ratings become the group's rewards; a training episode is refused."""
from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import httpx
import pytest


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


@contextmanager
def feedback_gateway(stack, tmp_path: Path, extra: list[str] = (), params: str = "") -> Iterator:
    """A gateway (in this process) of a run with a feedback term, its stream-ops worker and join."""
    ns = f"label-{os.getpid()}-{int(time.time() * 1000) % 10**8}"
    cfg = gateway_config(stack, tmp_path, ns, [
        f"stream_ops.rewards=[{{name: feedback, params: {{teams: [agents, lab], wait_s: 300{params}}}}}]",
        "eval.rewards=[{name: reverse}]", *extra])
    config = tmp_path / "run.yaml"
    config.write_text(dump_config(cfg))
    roles = {"score": _role(["score", str(config)], tmp_path / "score.log"),
             "join": _role(["join", str(config)], tmp_path / "join.log")}
    try:
        with serving(cfg) as served:
            yield served
    finally:
        for p in roles.values():
            p.send_signal(signal.SIGTERM)
        for p in roles.values():
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()


def _experiences(cfg, join_log: Path, timeout: float = 90.0) -> list[ExperienceGroup]:
    deadline = time.monotonic() + timeout
    while True:
        got = [decode(m.value(), ExperienceGroup) for m in read_topic(cfg.kafka, topic_name(cfg.namespace, "experiences"))]
        if got:
            return got
        assert time.monotonic() < deadline, join_log.read_text()[-3000:]


def _park(cfg, gid: str, texts: list[str]) -> RolloutGroup:
    task = Task(task_id=f"t-{gid}", prompt="rev abc=", answer="cba")
    group = RolloutGroup(group_id=gid, team="agents", task=task, trajectories=[
        Trajectory(traj_id=f"{gid}-{i}", group_id=gid, task_id=task.task_id, team="agents", model_version=0,
                   prompt_ids=[1], response_ids=[2], logprobs=[-0.3], response_text=text)
        for i, text in enumerate(texts)])
    producer = make_producer(cfg.kafka)
    producer.produce(topic_name(cfg.namespace, "rollouts", "agents"), encode(group), gid.encode())
    flush_or_raise(producer)
    return group


def test_an_ab_choice_on_the_page_is_a_preference_and_bradley_terry_makes_the_rewards(stack, tmp_path, chrome):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    with feedback_gateway(stack, tmp_path, params=", aggregate: bradley_terry") as served:
        _park(served.cfg, "ab", ["cba", "abc"])
        chrome.get(served.url + "/label")
        chrome.find_element(By.ID, "key").send_keys(KEYS["agents"])
        chrome.find_element(By.ID, "rater").send_keys("ann")
        chrome.find_element(By.ID, "ab").click()
        chrome.find_element(By.ID, "start").click()
        _wait(chrome, lambda d: d.find_element(By.ID, "answer-b").is_displayed() and d.find_element(By.ID, "answer-b").text,
              "the pair", 90)
        texts = [chrome.find_element(By.ID, f"answer-{x}").text for x in "ab"]
        assert sorted(texts) == ["abc", "cba"]
        ActionChains(chrome).send_keys("a").perform()  # A is better
        _wait(chrome, lambda d: "Preferred A" in d.find_element(By.ID, "rated").text, "the preference sent")
        (exp,) = _experiences(served.cfg, tmp_path / "join.log")
        rewards = dict(zip([t.response_text for t in exp.trajectories], exp.rewards))
        # one win of A over B and the virtual tie (half a win each way): strengths 1.5 : 0.5, centred
        # log-strengths +-ln(3)/2
        assert rewards[texts[0]] == pytest.approx(math.log(3) / 2, abs=1e-6)
        assert rewards[texts[1]] == pytest.approx(-math.log(3) / 2, abs=1e-6)


def test_two_raters_rate_different_answers_on_the_page_and_the_join_makes_them_the_rewards(stack, tmp_path,
                                                                                           chrome):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    with feedback_gateway(stack, tmp_path) as served:
        cfg = served.cfg
        _park(cfg, "lbl", ["cba", "abc"])

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
        _wait(chrome, lambda d: "Rated 0" in d.find_element(By.ID, "rated").text, "bob's rating sent")
        chrome.switch_to.window(ann_tab)
        ActionChains(chrome).send_keys("5").perform()  # ann: 5 of 5
        _wait(chrome, lambda d: "Rated 1" in d.find_element(By.ID, "rated").text, "ann's rating sent")
        assert bob_tab != ann_tab

        (exp,) = _experiences(cfg, tmp_path / "join.log")
        rewards = dict(zip([t.traj_id for t in exp.trajectories], exp.rewards))
        assert rewards == {ann: 1.0, bob: 0.0}
        _wait(chrome, lambda d: d.find_element(By.ID, "count").text.startswith("0 waiting"), "nothing waiting")


def test_served_users_rate_their_completions_by_id_and_the_ratings_become_the_rewards(stack, tmp_path):
    import openai

    with feedback_gateway(stack, tmp_path, ["gateway.mode=serve"]) as served:
        client = served.client("agents")
        answer = client.completions.create(model="policy", prompt="rev abc=", n=2, max_tokens=4, temperature=1.0,
                                           seed=3)
        ids = [c.model_extra["completion_id"] for c in answer.choices]
        assert ids == [f"{answer.id}-0", f"{answer.id}-1"]
        with pytest.raises(openai.BadRequestError, match="records no training episodes"):
            client.completions.create(model="policy", prompt="rev abc=", max_tokens=4,
                                      extra_headers={"X-Episode-Id": "e1"})
        for completion_id, rating in zip(ids, (0.9, 0.1)):  # the short form, one rating a call
            r = httpx.post(f"{served.url}/v1/feedback", json={"completion_id": completion_id, "rating": rating},
                           headers={"Authorization": f"Bearer {KEYS['agents']}"}, timeout=30)
            assert r.status_code == 200, r.text
        (exp,) = _experiences(served.cfg, tmp_path / "join.log")
        assert exp.group_id == answer.id and [t.traj_id for t in exp.trajectories] == ids
        assert exp.rewards == [0.9, 0.1] and exp.trajectories[0].response_text == answer.choices[0].text
        bad = httpx.post(f"{served.url}/v1/feedback", json={"completion_id": ids[0], "rating": "good"},
                         headers={"Authorization": f"Bearer {KEYS['agents']}"}, timeout=30)
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "rating"
