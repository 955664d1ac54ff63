"""The gateway on the real stack, over real HTTP, through the official `openai` client.

The tiny char model serves (no chat template: the completions API); tests/real_model/test_gateway_chat.py runs the chat
API on SmolLM2. Checks: keys decide teams (401 without or with a wrong key; a key reaches its own
team's topic only); token fidelity (recorded log-probs equal a teacher-forced forward of the
recorded ids); concatenated and step-wise assembly; a group is published only when complete and
only once; an expired episode is counted and dropped.
"""
from __future__ import annotations

import time
import uuid

import httpx
import pytest
import torch

from streamrft.schemas import RolloutGroup, decode, topic_name
from tests_helpers import read_all

from gateway_helpers import KEYS


def _groups(served, team: str) -> list[RolloutGroup]:
    return [decode(m.value(), RolloutGroup) for m in read_all(served.cfg.kafka, topic_name(served.cfg.namespace,
                                                                                          "rollouts", team))]


def _finish(served, episode: str, body: dict, key: str = KEYS["agents"]) -> httpx.Response:
    return httpx.post(f"{served.url}/v1/episodes/{episode}/finish", json=body,
                      headers={"Authorization": f"Bearer {key}"}, timeout=60)


def _episode(client, prompt: str, episode: str, group: str, size: int = 2, **kw):
    return client.completions.create(model="policy", prompt=prompt, max_tokens=4, logprobs=0,
                                     extra_headers={"X-Episode-Id": episode, "X-Group-Id": group,
                                                    "X-Group-Size": str(size)}, **kw)


def test_a_key_decides_the_team_and_nothing_else_gets_in(served):
    import openai

    assert [m.id for m in served.client().models.list().data] == ["policy"]
    for key in (None, "sk-wrong"):
        headers = {} if key is None else {"Authorization": f"Bearer {key}"}
        r = httpx.post(f"{served.url}/v1/completions", json={"prompt": "abc", "max_tokens": 2}, headers=headers)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    from openai import OpenAI

    with pytest.raises(openai.AuthenticationError):
        OpenAI(base_url=served.url + "/v1", api_key="sk-wrong", max_retries=0).completions.create(
            model="policy", prompt="abc", max_tokens=2)
    # each team's episode and group ids are its own: the agents' key cannot finish the lab's episode,
    # and reusing the lab's ids opens the agents' own episode and group, which touch nothing of the lab's
    lab, agents = served.client("lab"), served.client("agents")
    gid, e1, e3 = (uuid.uuid4().hex for _ in range(3))
    _episode(lab, "abc", e1, gid)
    assert _finish(served, e1, {"reward": 1.0}, KEYS["agents"]).status_code == 404  # no episode e1 of theirs
    _episode(agents, "xyz", e1, gid)
    _episode(lab, "abd", e3, gid)
    assert _finish(served, e1, {"reward": 1.0}, KEYS["lab"]).json()["status"] == "pending"
    assert _finish(served, e3, {"reward": 0.0}, KEYS["lab"]).json()["status"] == "published"
    assert _finish(served, e1, {"reward": 1.0}, KEYS["lab"]).json()["status"] == "published"  # a repeated finish
    assert _finish(served, e1, {"reward": 0.5}, KEYS["agents"]).json()["status"] == "pending"  # theirs: 1 of 2
    _episode(agents, "xyw", e3, gid)
    assert _finish(served, e3, {"reward": 0.25}, KEYS["agents"]).json()["status"] == "published"
    with pytest.raises(openai.ConflictError):
        _episode(lab, "abc", e1, gid)  # the lab's episode is over, whatever the agents did with its id
    lab_groups, agent_groups = _groups(served, "lab"), [g for g in _groups(served, "agents") if g.group_id == gid]
    assert [g.group_id for g in lab_groups] == [gid] and len(agent_groups) == 1
    assert sorted(t.env_reward for t in lab_groups[0].trajectories) == [0.0, 1.0]
    assert sorted(t.env_reward for t in agent_groups[0].trajectories) == [0.25, 0.5]


def _teacher_forced(engine, prompt_ids: list[int], response_ids: list[int]) -> torch.Tensor:
    ids = torch.tensor([prompt_ids + response_ids])
    with torch.no_grad():
        logits = engine.model(input_ids=ids).logits[0, len(prompt_ids) - 1: -1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(response_ids).unsqueeze(-1)).squeeze(-1)


def test_a_multi_turn_episode_is_one_concatenated_trajectory_with_the_sampled_log_probs(served):
    client, gid = served.client(), uuid.uuid4().hex
    episodes, texts = [uuid.uuid4().hex, uuid.uuid4().hex], {}
    for e in episodes:  # two turns each: the second prompt continues the first call's text
        first = _episode(client, "abc", e, gid, seed=1)
        assert first.system_fingerprint == "v0"
        turn = "abc" + first.choices[0].text + "cb"
        second = _episode(client, turn, e, gid)
        texts[e] = (first, second)
    before = {g.group_id for g in _groups(served, "agents")}
    assert gid not in before
    assert _finish(served, episodes[0], {"rewards": [0.25, 0.5], "task_id": "t-1"}).json()["status"] == "pending"
    assert gid not in {g.group_id for g in _groups(served, "agents")}, "published before the group was complete"
    answer = _finish(served, episodes[1], {"reward": 1.0, "task_id": "t-1", "metadata": {"env": "test"}}).json()
    assert answer["status"] == "published"
    assert _finish(served, episodes[1], {"reward": 1.0}).json() == answer  # repeated: same answer, no new group
    published = [g for g in _groups(served, "agents") if g.group_id == gid]
    assert len(published) == 1
    group = published[0]
    assert group.task.task_id == "t-1" and len(group.trajectories) == 2
    tok = served.engine.tokenizer
    for traj, e in zip(group.trajectories, episodes):
        assert traj.info["assembly"] == "concatenated" and traj.info["episode_id"] == e
        first, second = texts[e]
        # ids exactly as sampled: the first turn's tokens (its EOS included when it stopped) sit in
        # the response verbatim, followed by the new text's ids (mask 0), then the second turn's
        mask = traj.loss_mask
        assert traj.prompt_ids == tok("abc")["input_ids"]
        assert tok.decode(traj.response_ids, skip_special_tokens=True) == first.choices[0].text + "cb" + second.choices[0].text
        gap = tok("cb", add_special_tokens=False)["input_ids"]
        n1 = mask.index(0)
        assert mask == [1] * n1 + [0] * len(gap) + [1] * (len(mask) - n1 - len(gap))
        assert traj.response_ids[n1: n1 + len(gap)] == gap
        assert [round(lp, 6) for lp in traj.logprobs[:n1]][: len(first.choices[0].logprobs.token_logprobs)] == \
            [round(lp, 6) for lp in first.choices[0].logprobs.token_logprobs][:n1]
        # fidelity: the recorded log-probs are the policy's at v0 (temperature 1): teacher-forced
        forward = _teacher_forced(served.engine, traj.prompt_ids, traj.response_ids)
        sampled = torch.tensor(traj.logprobs)[torch.tensor(mask) == 1]
        assert (forward[torch.tensor(mask) == 1] - sampled).abs().max().item() <= 1e-4
        assert traj.model_version == 0 and traj.info["versions"] == [0, 0]
    assert group.trajectories[0].info["step_rewards"] == [0.25, 0.5] and group.trajectories[0].env_reward == 0.75
    assert group.trajectories[1].info["step_rewards"] == [0.0, 1.0]


def test_a_prompt_that_does_not_continue_the_episode_makes_it_step_wise(served):
    client, gid, e = served.client(), uuid.uuid4().hex, uuid.uuid4().hex
    _episode(client, "abc", e, gid, size=1)
    _episode(client, "xyz", e, gid, size=1)  # not the first prompt + completion: a fresh prompt
    assert _finish(served, e, {"reward": 0.5}).json()["status"] == "published"
    group = next(g for g in _groups(served, "agents") if g.group_id == gid)
    steps = group.trajectories
    assert [t.info["assembly"] for t in steps] == ["step_wise", "step_wise"]
    assert [t.info["step"] for t in steps] == [0, 1] and all(t.env_reward == 0.5 for t in steps)
    tok = served.engine.tokenizer
    assert steps[1].prompt_ids == tok("xyz")["input_ids"] and all(t.loss_mask is None for t in steps)


def test_an_idle_episode_expires_and_its_group_publishes_what_finished(served):
    store = served.gw.store
    client, gid, e1, e2 = served.client(), uuid.uuid4().hex, uuid.uuid4().hex, uuid.uuid4().hex
    _episode(client, "abc", e1, gid)
    _episode(client, "abd", e2, gid)
    assert _finish(served, e1, {"reward": 1.0}).json()["status"] == "pending"
    expired = store.counters["agents"]["episodes_expired"]
    old, store.episode_timeout_s = store.episode_timeout_s, 0.5
    try:
        deadline = time.monotonic() + 30
        while ("agents", gid) in store.groups and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        store.episode_timeout_s = old
    assert store.counters["agents"]["episodes_expired"] == expired + 1
    assert ("agents", e2) not in store.episodes and ("agents", gid) not in store.groups
    group = next(g for g in _groups(served, "agents") if g.group_id == gid)
    assert [t.info["episode_id"] for t in group.trajectories] == [e1]
    r = httpx.post(f"{served.url}/v1/completions", json={"prompt": "abc", "max_tokens": 2},
                   headers={"Authorization": f"Bearer {KEYS['agents']}", "X-Episode-Id": e2})
    assert r.status_code == 409 and r.json()["error"]["code"] == "episode_over"
    assert _finish(served, e2, {"reward": 1.0}).json()["status"] == "expired"


def test_per_team_counters_reach_the_metrics_topic_and_status(served):
    from streamrft.infra import status

    deadline, counters = time.monotonic() + 30, {}
    while time.monotonic() < deadline:
        counters = status.gateway_counters(served.cfg.kafka, served.cfg.namespace)
        teams = {who.rsplit(":", 1)[1]: v for who, v in counters.items()}
        if teams.get("agents", {}).get("episodes_finished", 0) >= 1 and "lab" in teams:
            break
        time.sleep(1)
    teams = {who.rsplit(":", 1)[1]: v for who, v in counters.items()}
    local = served.gw.store.counters
    for team in ("agents", "lab"):
        assert teams[team]["episodes_finished"] >= 1 and teams[team]["completion_tokens"] > 0
        assert teams[team]["episodes_finished"] <= local[team]["episodes_finished"]
    st = status.Status(kafka_ok=True, s3_ok=True, gateway=counters)
    assert "gateway teams:" in status.render(st) and "agents" in status.render(st)
    # the same counters on the gateway's own GET /metrics (monitor.prometheus.enabled in conftest)
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(served.url + "/metrics", timeout=10).text
    finished = {s.labels["team"]: s.value for f in text_string_to_metric_families(text)
                if f.name == "streamrft_gateway_episodes_finished" for s in f.samples}
    for team in ("agents", "lab"):
        assert teams[team]["episodes_finished"] <= finished[team] <= local[team]["episodes_finished"]


def test_concurrent_requests_share_engine_calls(served):
    from concurrent.futures import ThreadPoolExecutor

    stats = served.gw.worker.stats
    calls, requests = stats["engine_calls"], stats["requests"]
    client = served.client()
    with ThreadPoolExecutor(16) as pool:
        outs = list(pool.map(lambda i: client.completions.create(model="policy", prompt="abc", max_tokens=4, logprobs=0),
                             range(16)))
    assert all(len(o.choices[0].logprobs.token_logprobs) == o.usage.completion_tokens for o in outs)
    assert stats["requests"] - requests == 16
    assert stats["engine_calls"] - calls < 16, "every request got an engine call of its own"


def test_a_text_model_refuses_an_image_url_naming_the_part(served):
    r = httpx.post(f"{served.url}/v1/chat/completions", headers={"Authorization": f"Bearer {KEYS['agents']}"}, timeout=60,
                   json={"model": "policy", "max_tokens": 2, "messages": [{"role": "user", "content": [
                       {"type": "text", "text": "abc"}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages[0].content[1]", r.text
    assert "text model" in r.json()["error"]["message"]


def _feedback(served, body, key: str = KEYS["agents"]) -> httpx.Response:
    return httpx.post(f"{served.url}/v1/feedback", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=60)


def test_feedback_reaches_the_callers_team_topic_strictly_decoded(served):
    from streamrft.schemas import Feedback

    def on_topic(team: str) -> list[Feedback]:
        return [decode(m.value(), Feedback) for m in read_all(served.cfg.kafka, topic_name(served.cfg.namespace,
                                                                                          "feedback", team))]

    one = {"target": "trajectory", "target_id": "traj-1", "reward": 0.75, "source": "human", "rater": "ann",
           "comment": "close"}
    answer = _feedback(served, one).json()
    assert answer["accepted"] == 1
    batch = {"feedback": [
        {"target": "completion", "preference": {"chosen": "c-1", "rejected": "c-2"}, "source": "user", "rater": "u-9"},
        {"target": "episode", "target_id": "e-1", "label": "helpful", "source": "verifier", "rater": "ci"}]}
    assert _feedback(served, batch).json()["accepted"] == 2
    got = {f.rated()[0]: f for f in on_topic("agents")}  # keyed by the rated id: partitions differ
    assert got["traj-1"].feedback_id == answer["feedback_ids"][0]
    assert sorted((f.target, f.rated(), f.reward, f.label) for f in got.values()) == [
        ("completion", ["c-1", "c-2"], None, None), ("episode", ["e-1"], None, "helpful"),
        ("trajectory", ["traj-1"], 0.75, None)]
    assert got["traj-1"].comment == "close" and got["c-1"].preference.rejected == "c-2"
    assert on_topic("lab") == []  # the key decided the team
    # refused, naming the field; nothing of a refused batch is published
    assert _feedback(served, one, key="sk-wrong").status_code == 401
    for body, param in (({**one, "team": "lab"}, "team"), ({**one, "label": "good"}, "label"),
                        ({**one, "reward": "1"}, "reward"), ({**one, "source": "admin"}, "source"),
                        ({"feedback": [one, {**one, "reward": None}]}, "feedback[1].reward"),
                        ({"feedback": []}, "feedback"), ({**one, "kind": "task"}, "kind")):
        r = _feedback(served, body)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (body, r.text)
    assert len(on_topic("agents")) == 3
