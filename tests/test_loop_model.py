"""The loop model (`benchmarks/loop_model.py`) against closed forms: a deterministic pipeline, with
and without the admission bound, and M/M/1 (Poisson arrivals, exponential steps, batches of one)."""
import pytest

from benchmarks.loop_model import LoopParams, simulate

PIPE = dict(explorers=1, concurrency=1, batch_groups=1, gen_dist="constant", gen_s=1.0, bus_s=0.0)


def test_a_deterministic_pipeline_with_a_fast_trainer():
    # a group a second; each trains in 0.5 s, so the trainer idles half the time; a group is
    # started while the version before it trains: staleness 1
    st = simulate(LoopParams(**PIPE, step_s=0.5, max_staleness=None), 1000, warmup_s=100)
    assert st.groups_per_s == pytest.approx(1.0, rel=1e-2)
    assert st.trainer_idle == pytest.approx(0.5, rel=1e-2)
    assert st.staleness == {1: st.groups_trained}


def test_on_policy_admission_serialises_generation_and_training():
    # max_staleness 0: one group per version; generate 1 s, train 2 s: a group every 3 s, the
    # trainer idle 1 s of 3, every group trained on the weights it was made with
    st = simulate(LoopParams(**PIPE, step_s=2.0, max_staleness=0), 3000, warmup_s=300)
    assert st.groups_per_s == pytest.approx(1 / 3, rel=1e-2)
    assert st.trainer_idle == pytest.approx(1 / 3, rel=1e-2)
    assert set(st.staleness) == {0} and st.dropped_stale == 0


def test_the_admission_bound_holds_staleness_under_it_with_many_explorers():
    p = LoopParams(explorers=8, concurrency=4, batch_groups=8, max_staleness=2, gen_s=2.0, gen_sigma=1.5, step_s=0.5)
    st = simulate(p, 2000, seed=3, warmup_s=200)
    assert max(st.staleness) <= 2 and st.dropped_stale == 0 and st.groups_trained > 0


def test_mm1_idle_share_and_mean_staleness():
    """Poisson arrivals at rate 1 (one explorer, exponential generation), exponential steps at
    rate 2, batches of one, no bound: rho = 0.5. The trainer idles 1 - rho of the time. A group's
    staleness counts the versions made while it was generated (one interarrival time: 1 on average,
    since departures balance arrivals) plus those ahead of it at arrival (rho / (1 - rho) on
    average, PASTA): 1 / (1 - rho) = 2."""
    p = LoopParams(explorers=1, concurrency=1, batch_groups=1, max_staleness=None, gen_dist="exponential",
                   gen_s=1.0, bus_s=0.0, step_dist="exponential", step_s=0.5)
    st = simulate(p, 200_000, seed=1, warmup_s=1000)
    assert st.groups_per_s == pytest.approx(1.0, rel=0.02)
    assert st.trainer_idle == pytest.approx(0.5, rel=0.02)
    assert st.mean_staleness == pytest.approx(2.0, rel=0.03)
