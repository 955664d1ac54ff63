"""`streamrft run`'s restart budget: at most `max_restarts` restarts of a role within any
`window_s` seconds, the first at once, each later one in the window after twice the wait before."""
import pytest

from streamrft.config import ConfigError, RestartConfig, load_config
from streamrft.launch.restarts import RestartBudget


def test_restarts_back_off_within_the_window_and_the_budget_ends_it():
    budget = RestartBudget(RestartConfig(max_restarts=4, window_s=100, backoff_s=1, max_backoff_s=3))
    waits = []
    for now in (0.0, 1.0, 2.0, 3.0):
        waits.append(budget.delay(now))
        budget.restarted(now + waits[-1])
    # first at once, then 1, 2, and 4 capped at 3
    assert waits == [0.0, 1.0, 2.0, 3.0]
    assert budget.delay(10.0) is None  # a 5th failure within 100 s: the run ends


def test_a_restart_older_than_the_window_no_longer_counts():
    budget = RestartBudget(RestartConfig(max_restarts=2, window_s=60, backoff_s=5))
    budget.restarted(0.0)
    budget.restarted(10.0)
    assert budget.delay(59.0) is None
    assert budget.recent(60.0) == 1  # the one at 0 s left the window at 60 s
    assert budget.delay(60.0) == 5.0  # one in the window: the second wait
    assert budget.delay(70.0) == 0.0 and budget.recent(70.0) == 0  # a quiet window: at once again


def test_a_long_run_with_a_fault_every_few_minutes_is_never_ended():
    budget = RestartBudget(RestartConfig())  # 5 within 600 s
    for now in range(0, 6 * 3600, 180):  # a failure every 3 minutes for six hours
        assert budget.delay(float(now)) is not None
        budget.restarted(float(now))
    assert budget.recent(6 * 3600.0) == 3


def test_zero_restarts_ends_the_run_at_the_first_failure():
    assert RestartBudget(RestartConfig(max_restarts=0)).delay(0.0) is None


@pytest.mark.parametrize("override", ["restarts.max_restarts=-1", "restarts.window_s=0", "restarts.backoff_s=inf"])
def test_a_bad_budget_names_its_field(override, tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("model: {path: m}\n")
    with pytest.raises(ConfigError, match=override.split("=")[0].replace(".", r"\.")):
        load_config(path, [override])
