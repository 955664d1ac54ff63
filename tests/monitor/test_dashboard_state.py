"""The dashboard's aggregation, from hand-made records and hand-computed values: lag from offsets
seen and committed, staleness when scored, explorer stage shares, team counters, downsampling,
what a page is sent first and then, the viewer's turns, filters and pages, and the summary a
RunState folds them into."""
from __future__ import annotations

from array import array

from streamrft.monitor.dashboard.feed import Feed
from streamrft.monitor.dashboard.state import (RunState, consumer_lag, downsample, reason_kind, role_label,
                                               stage_shares, staleness_histogram, team_table, version_at)
from streamrft.monitor.dashboard.trajectories import GroupQuery, group_view, ids_text, mask_runs, select
from streamrft.schemas import DeadLetter, ExperienceGroup, Metric, Task, Trajectory, WeightVersion


def test_lag_is_records_seen_minus_committed_per_partition_for_the_topics_a_group_commits_on():
    seen = {("ns.experiences", 0): 10, ("ns.experiences", 1): 7, ("ns.rollouts.a", 0): 5, ("ns.metrics", 0): 99}
    committed = {"ns.trainer": {("ns.experiences", 0): 4},  # partition 1 not committed yet: lags by all 7
                 "ns.stream-ops": {("ns.rollouts.a", 0): 5, ("ns.rollouts.b", 0): 3}}  # b: nothing seen yet
    assert consumer_lag(seen, committed) == {"ns.trainer": {"ns.experiences": (10 - 4) + 7},
                                             "ns.stream-ops": {"ns.rollouts.a": 0}}
    # a commit ahead of what this reader has seen so far counts as no lag, never negative
    assert consumer_lag({("t", 0): 3}, {"g": {("t", 0): 8}}) == {"g": {"t": 0}}


def test_staleness_counts_the_newest_version_announced_when_scored_minus_the_generating_one():
    announces = [(10.0, 1), (20.0, 2), (30.0, 3)]
    assert version_at(announces, 5.0) is None and version_at(announces, 20.0) == 2 and version_at(announces, 99) == 3
    # t=25: v2 announced -> 2-2=0, 2-1=1; t=31: v3 -> 3-1=2; t=1: nothing announced yet -> version 0 -> 0
    assert staleness_histogram(announces, [(25.0, 2), (25.0, 1), (31.0, 1), (1.0, 0)]) == {0: 2, 1: 1, 2: 1}


def test_stage_shares_are_seconds_over_wall_time_and_rates_are_not_stages():
    assert stage_shares({"generate_s": 30.0, "publish_s": 5.0, "traj_per_s": 3.0, "fetch_s": 2.5, "wall_s": 50.0,
                         "groups": 7.0}) == {"generate": 0.6, "publish": 0.1, "fetch": 0.05}
    assert stage_shares({"generate_s": 1.0}) == {}  # no wall time yet


def test_team_table_adds_experiences_gateways_and_dead_letters_per_team():
    from collections import Counter

    exp = {"agents": Counter(groups=2, trajectories=8, trained_tokens=40, masked_tokens=12, reward_sum=6.0)}
    gw = {"gw1:agents": {"episodes_finished": 3.0, "prompt_tokens": 10.0, "completion_tokens": 4.0,
                         "rejected_admission": 1.0, "rejected_stale": 2.0},
          "gw2:agents": {"episodes_finished": 5.0, "rejected_stale": 1.0},
          "gw1:lab": {"episodes_finished": 1.0}}
    table = team_table(exp, gw, {"lab": 2})
    assert table["agents"] == {"groups": 2, "trajectories": 8, "trained_tokens": 40, "masked_tokens": 12,
                               "reward_mean": 0.75, "episodes": 8.0, "prompt_tokens": 10.0, "completion_tokens": 4.0,
                               "rejected": 4.0, "expired": 0.0}
    assert table["lab"] == {"episodes": 1.0, "prompt_tokens": 0.0, "completion_tokens": 0.0, "rejected": 0.0,
                            "expired": 0.0, "dead_letters": 2}


def test_dead_letters_are_counted_by_error_type_and_the_reason_up_to_its_first_colon():
    assert reason_kind("DecodeError", "trajectories.0.logprobs: 3 entries for 4 tokens") == \
        "DecodeError: trajectories.0.logprobs"
    assert reason_kind("", "no reward") == "no reward"
    assert reason_kind("ValueError", "") == "ValueError: (no reason)"


def test_mask_runs_cut_a_response_into_turns():
    assert mask_runs([1, 1, 0, 0, 0, 1, 0]) == [(0, 2, 1), (2, 5, 0), (5, 6, 1), (6, 7, 0)]
    assert mask_runs([]) == [] and mask_runs([1]) == [(0, 1, 1)]


def _group(team: str = "a", rewards=(1.0, 0.0), prompt: str = "guess 1-8:") -> ExperienceGroup:
    task = Task(task_id=f"t-{team}", prompt=prompt, answer="3")
    trajs = [Trajectory(group_id="g", task_id=task.task_id, team=team, model_version=1, prompt_ids=[7, 8],
                        response_ids=[1, 2, 3, 4], logprobs=[-0.1, 0.0, 0.0, -0.2], loss_mask=[1, 0, 0, 1]),
             Trajectory(group_id="g", task_id=task.task_id, team=team, model_version=2, prompt_ids=[7, 8],
                        response_ids=[5], logprobs=[-0.3])]
    return ExperienceGroup(group_id="g", team=team, task=task, trajectories=trajs, rewards=list(rewards),
                           advantages=[0.5, -0.5], reward_components={"env": list(rewards)}, created_at=100.0)


def test_a_group_view_decodes_each_turn_and_marks_what_is_trained():
    view = group_view(_group(), ids_text, ("ns.experiences", 1, 42), version_at_scoring=3)
    first, second = view["trajectories"]
    assert [(u["trained"], u["text"], u["tokens"]) for u in first["turns"]] == \
        [(True, "[1]", 1), (False, "[2 3]", 2), (True, "[4]", 1)]
    assert (first["prompt"], first["masked"], first["staleness"], first["components"]) == ("[7 8]", 2, 2, {"env": 1.0})
    assert second["turns"] == [{"trained": True, "text": "[5]", "tokens": 1}] and second["staleness"] == 1
    assert (view["offset"], view["reward_mean"]) == (42, 0.5)


def _index(groups):
    s = RunState("ns")
    with s.lock:
        for i, g in enumerate(groups):
            s.on_experience(g, "ns.experiences", 0, i)
    return s


def test_the_viewer_filters_by_team_task_reward_version_and_finish_reason():
    s = _index([_group(team="a", rewards=(1.0, 0.0)), _group(team="b", rewards=(1.0, 1.0), prompt="other")])
    rows = s.index  # a: mean 0.5, versions 1 and 2 (the group's is its oldest, 1); b: mean 1.0
    assert [r.reward_mean for r in rows] == [0.5, 1.0] and rows[0].version == 1
    pick = lambda **q: [r.team for r in select(rows, s.prompts, GroupQuery(**q))[0]]  # noqa: E731
    assert pick() == ["b", "a"]  # newest first
    assert pick(team="a") == ["a"] and pick(task="guess") == ["a"] and pick(task="t-b") == ["b"]
    assert pick(min_reward=0.6) == ["b"] and pick(max_reward=0.5) == ["a"] and pick(min_reward=0.5, max_reward=0.5) == ["a"]
    assert pick(min_version=2) == [] and pick(max_version=1) == ["b", "a"]
    assert pick(finish="stop") == ["b", "a"] and pick(finish="length") == []


def test_the_viewer_pages_through_every_group_of_the_run_newest_first():
    s = _index([_group(rewards=(r, 0.0)) for r in (0.0, 0.2, 0.4, 0.6, 0.8)])  # seq 0..4
    page, total, cursor = select(s.index, s.prompts, GroupQuery(), None, 2)
    assert ([r.seq for r in page], total, cursor) == ([4, 3], 5, 3)
    page, total, cursor = select(s.index, s.prompts, GroupQuery(), cursor, 2)
    assert ([r.seq for r in page], cursor) == ([2, 1], 1)
    page, total, cursor = select(s.index, s.prompts, GroupQuery(), cursor, 2)
    assert ([r.seq for r in page], cursor) == ([0], None)  # the last page
    # filtered: means 0, 0.1, 0.2, 0.3, 0.4; >= 0.2 is seq 2..4
    page, total, cursor = select(s.index, s.prompts, GroupQuery(min_reward=0.2), None, 2)
    assert ([r.seq for r in page], total, cursor) == ([4, 3], 3, 3)
    # only the newest groups are kept whole; every group keeps its row
    assert len(s.index) == 5 and len(s.recent) == 5


def test_downsample_keeps_the_ends_and_each_buckets_lowest_and_highest_point():
    xs, ys = array("d", range(10)), array("d", [0, 5, 1, 9, 2, 2, 8, 0, 3, 4])
    # 6 points: the ends (x 0 and 9) and 2 buckets of x 1-4 and 5-8: lowest x2 (1), highest x3 (9);
    # lowest x7 (0), highest x6 (8), in x order
    assert downsample(xs, ys, 6) == [[0, 0], [2, 1], [3, 9], [6, 8], [7, 0], [9, 4]]
    assert downsample(xs, ys, 20) == [[float(i), y] for i, y in enumerate(ys)]  # few enough: all
    assert downsample(xs, ys, 6, x0=2, x1=5) == [[2, 1], [3, 9], [4, 2], [5, 2]]  # a zoomed span, whole


def test_roles_are_named_by_role_and_index():
    taken = {}
    assert role_label("explorer-3-12721", taken, "explorer") == "explorer 3"
    assert role_label("vm-12720", taken, "stream ops") == "stream ops 0"
    assert role_label("vm-12999", taken, "stream ops") == "stream ops 1"
    assert role_label("vm-12720", taken, "stream ops") == "stream ops 0"


def _trainer(step: int, reward: float, t: float) -> Metric:
    return Metric(role="trainer", role_id="trainer-1", step=step, values={"reward_mean": reward, "version": step},
                  created_at=t)


def test_a_page_is_sent_everything_once_then_only_what_is_new():
    s = RunState("ns")
    with s.lock:
        for step in range(1, 6):
            s.on_metric(_trainer(step, step / 10, 100.0 + step))
    feed = Feed([s], points=4)
    first = feed.next()
    line = first["lines"]["0:reward_version/train reward"]
    # 5 points downsampled to 4: the ends and one bucket of x 2-4 (lowest 2, highest 4)
    assert line["reset"] and line["points"] == [[1, 0.1], [2, 0.2], [4, 0.4], [5, 0.5]] and line["x"] == "version"
    assert first["tables"]["trainer"]["step"] == 5 and first["tables"]["groups_seen"] == 0
    assert feed.next() is None  # nothing new: nothing sent
    with s.lock:
        s.on_metric(_trainer(6, 0.6, 106.0))
    second = feed.next()
    assert second["lines"]["0:reward_version/train reward"] == {"append": [[6, 0.6]]}
    assert set(second["tables"]) == {"trainer"}  # only the table that changed
    with s.lock:  # the page's copy has taken more than `points` new points since it was whole: whole again
        for step in range(7, 11):
            s.on_metric(_trainer(step, step / 10, 100.0 + step))
    third = feed.next()["lines"]["0:reward_version/train reward"]
    assert third["reset"] and len(third["points"]) == 4 and third["points"][0] == [1, 0.1]
    assert third["points"][-1] == [10, 1.0]


def test_compared_runs_add_their_reward_lines_labelled_by_namespace():
    a, b = RunState("run-a"), RunState("run-b")
    for s in (a, b):
        with s.lock:
            s.on_metric(_trainer(1, 0.5, 10.0))
            s.on_metric(Metric(role="trainer", role_id="t", step=2, values={"wait_s": 1.0}, created_at=11.0))
    lines = Feed([a, b]).next()["lines"]
    assert lines["0:reward_version/train reward"]["label"] == "run-a: train reward"
    assert lines["1:reward_version/train reward"]["label"] == "run-b: train reward"
    assert "0:trainer/wait_s" in lines and "1:trainer/wait_s" not in lines  # the others' rewards only


def test_run_state_summary_folds_records_in_any_order():
    s = RunState("ns")
    with s.lock:
        s.on_experience(_group(), "ns.experiences", 0, 0)  # read before the announce that precedes it
        s.on_weights(WeightVersion(model="p", version=2, bucket="b", prefix="p/v2/", created_at=50.0))
        s.on_metric(Metric(role="trainer", role_id="t", step=4, values={"reward_mean": 0.5, "version": 2.0,
                                                                         "wait_s": 1.5, "step_s": 0.25},
                           created_at=110.0))
        s.on_metric(Metric(role="eval", role_id="launcher", step=0, values={"eval_reward": 0.25, "version": 0.0},
                           created_at=40.0))
        s.on_dead_letter(DeadLetter(reason="bad: x", error_type="DecodeError", source_topic="ns.rollouts.a",
                                    source_offset=9, value=b"\x00\x01", created_at=120.0), offset=0)
        for offset in range(3):
            s.on_offset("ns.experiences", 0, offset)
        s.on_committed({"ns.trainer": {("ns.experiences", 0): 1}})
    out = s.summary()
    assert out["t0"] == 40.0
    lines = out["lines"]
    assert lines["reward_time/train reward"]["points"] == [[110.0, 0.5]]
    assert lines["reward_version/train reward"]["points"] == [[2.0, 0.5]]
    assert lines["reward_version/eval (launcher)"]["points"] == [[0.0, 0.25]]
    assert lines["trainer/wait_s"]["points"] == [[4.0, 1.5]] and lines["trainer/step_s"]["points"] == [[4.0, 0.25]]
    assert "trainer/publish_s" not in lines
    assert out["last_eval"] == {"t": 40.0, "version": 0, "reward": 0.25, "source": "launcher"}
    assert out["staleness"] == {0: 1, 1: 1}  # v2 announced at 50, trajectories of v1 and v2 scored at 100
    assert out["lag"] == {"ns.trainer": {"ns.experiences": 2}}
    assert out["dead_reasons"] == {"DecodeError: bad": 1} and out["teams"]["a"]["dead_letters"] == 1
    assert out["dead_letters"][0]["source_offset"] == 9 and out["dead_letters"][0]["bytes"] == 2
    assert out["teams"]["a"]["trained_tokens"] == 3 and out["teams"]["a"]["masked_tokens"] == 2
    assert out["finished"] is None
    with s.lock:  # the launcher's last word
        s.on_metric(Metric(role="run", role_id="launcher", step=7, values={"eval_reward_end": 0.75, "versions": 7.0},
                           created_at=130.0))
    assert s.summary()["finished"] == {"t": 130.0, "eval_reward_end": 0.75, "versions": 7.0}


def test_off_policy_series_takes_the_trainer_metrics_that_carry_it():
    s = RunState("ns")
    with s.lock:
        s.on_metric(Metric(role="trainer", role_id="t", step=1, values={"reward_mean": 0.5}, created_at=10.0))
        s.on_metric(Metric(role="trainer", role_id="t", step=2, values={"reward_mean": 0.5, "iw_mean": 1.25,
                                                                         "clip_frac_neg": 0.5, "turns_3p": 0.25},
                                  created_at=11.0))
    lines = s.summary()["lines"]
    assert lines["offpolicy/iw_mean"]["points"] == [[2.0, 1.25]] and lines["offpolicy/clip_frac_neg"]["points"] == [[2.0, 0.5]]
    assert lines["offpolicy/turns_3p"]["points"] == [[2.0, 0.25]] and "offpolicy/iw_max" not in lines


def test_the_feedback_joins_figures_make_the_feedback_chart_and_other_runs_have_none():
    s = RunState("ns")
    s.on_metric(Metric(role="feedback_join", role_id="join-0", step=1, created_at=10.0,
                       values={"parked": 12.0, "parked_age_max_s": 40.5, "joined": 3.0, "timed_out": 1.0,
                               "ratings_ratings": 9.0}))
    lines = {ln.label: ln for ln in s.lines.values() if ln.chart == "feedback"}
    assert sorted(lines) == ["groups parked", "joined", "oldest parked, s", "timed out"]
    assert list(lines["groups parked"].ys) == [12.0] and list(lines["oldest parked, s"].xs) == [10.0]
    other = RunState("ns")
    other.on_metric(Metric(role="stream_ops", role_id="w", step=1, created_at=1.0, values={"scored": 1.0}))
    assert not [ln for ln in other.lines.values() if ln.chart == "feedback"]
