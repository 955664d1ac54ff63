"""The run's progress view, from hand-made metrics: the gateway's counters, and where the time goes."""
from __future__ import annotations

from streamrft.launch.progress import RunView


def test_the_profile_shares_explorer_stages_of_their_wall_time_and_names_each_role():
    v = RunView()
    v.explorers = {"e0": {"generate_s": 30.0, "publish_s": 5.0, "admission_wait_s": 10.0, "eval_s": 2.0,
                          "fetch_s": 3.0, "wall_s": 50.0},
                   "e1": {"generate_s": 20.0, "publish_s": 5.0, "load_s": 1.0, "wall_s": 50.0}}
    v.stream_ops = {"w0": {"latency_p50_s": 0.12}, "w1": {"latency_p50_s": 0.3}}
    v.trainer = {"wait_s": 0.5, "step_s": 0.18, "loop_latency_s": 4.25}
    # (30 + 20) / 100 generating, (5 + 5) / 100 publishing, 10 / 100 waiting for admission room, ...
    assert v.profile() == ("profile: explorers generate 50% publish 10% admission_wait 10% load 1% eval 2% fetch 3% | "
                           "stream ops in->out p50 0.30s | trainer wait 0.50s step 0.18s loop latency 4.2s")
    assert RunView().profile() == "profile: -"


def test_the_line_counts_trajectories_from_explorers_and_the_gateway():
    v = RunView()
    v.explorers = {"e0": {"trajectories": 40.0}}
    v.gateway = {"gw:agents": {"trajectories": 8.0, "episodes_finished": 8.0, "open_episodes": 3.0,
                               "rejected_admission": 1.0, "rejected_stale": 1.0},
                 "gw:lab": {"trajectories": 2.0, "episodes_finished": 2.0}}
    assert v.trajectories == 50
    assert "trajectories 50 " in v.line() and "gateway: episodes 10 open 3 expired 0 429 2" in v.line()


def test_the_line_shows_the_feedback_join():
    v = RunView()
    assert "feedback:" not in v.line()
    v.feedback = {"parked": 12.0, "parked_age_max_s": 41.6, "joined": 30.0, "timed_out": 2.0}
    assert v.line().endswith("feedback: parked 12 (oldest 42s) joined 30 timed out 2")


def test_the_profile_shows_how_off_policy_the_last_batch_was():
    v = RunView()
    v.trainer = {"wait_s": 0.5, "step_s": 0.2, "staleness_0": 0.25, "staleness_1": 0.75, "staleness_2p": 0.0,
                 "iw_mean": 1.04, "iw_max": 3.6, "iw_ess": 0.91, "clip_frac_pos": 0.02, "clip_frac_neg": 0.05,
                 "clip_frac_turn0": 0.1, "neg_iw_over_c": 0.004, "count_stale_groups": 3}
    assert v.profile().endswith("| off-policy stale 0/1/2+ 25%/75%/0% iw 1.04 max 3.6 ess 0.91 clip +2% -5% "
                                "turn0 10% neg>c 0% groups dropped stale 3")
    # a multi-turn batch adds its episodes by length and each length's mean staleness
    v.trainer.update(turns_1=0.5, turns_2=0.0, turns_3p=0.5, staleness_turns_1=0.3, staleness_turns_3p=1.5)
    assert v.profile().endswith("groups dropped stale 3 turns 1/2/3+ 50%/0%/50% stale 0.3/-/1.5")
    # a step under the trust region (trainer.max_update_kl): its KL as taken, and the scale kept
    v.trainer.update(update_kl=0.0412, update_scale=0.61)
    assert v.profile().endswith("stale 0.3/-/1.5 step kl 0.041 x0.61")
