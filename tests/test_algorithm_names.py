"""The names `streamrft.config` validates against (plain tuples, so loading a config never
imports torch) are exactly the keys of the algorithm registries."""
from __future__ import annotations

import pytest

from streamrft import config
from streamrft.engine import algorithms


@pytest.mark.parametrize("names, table", [
    ("ADVANTAGE_TYPES", "ADVANTAGES"),
    ("POLICY_LOSS_TYPES", "POLICY_LOSSES"),
    ("KL_ESTIMATOR_TYPES", "KL_ESTIMATORS"),
    ("AGGREGATION_MODES", "AGGREGATIONS"),
    ("ALGORITHM_TYPES", "PRESETS"),
])
def test_config_names_match_the_registry(names, table):
    listed = getattr(config, names)
    assert len(set(listed)) == len(listed), f"{names} repeats a name"
    assert sorted(listed) == sorted(getattr(algorithms, table)), f"config.{names} != algorithms.{table} keys"


def test_offline_types_are_the_presets_without_advantages():
    offline = {name for name, parts in algorithms.PRESETS.items() if parts["advantage"] is None}
    assert set(config.OFFLINE_TYPES) == offline
    losses = {algorithms.PRESETS[name]["policy_loss"] for name in offline}
    assert losses <= set(algorithms.OFFLINE_LOSSES) | {"sft"}
