"""The config tree: every example validates, dotted overrides, errors that name the field."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from streamrft.config import ConfigError, RunConfig, dump_config, load_config, parse_config

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted(p for ext in ("yaml", "yml") for p in (ROOT / "examples").rglob(f"*.{ext}"))

INLINE = """
namespace: demo
model:
  name: policy
  path: out/models/tiny
data: {train: data/train.jsonl}
explorer: {group_size: 4}
trainer: {lr: 1.0e-4, max_steps: 3}
algorithm: {type: grpo, kl: {coef: 0.0}}
"""


@pytest.fixture
def inline_yaml(tmp_path) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(INLINE)
    return path


@pytest.mark.parametrize("path", [*EXAMPLES, None],
                         ids=[str(p.relative_to(ROOT)) for p in EXAMPLES] + ["inline"])
def test_config_validates(path, inline_yaml):
    cfg = load_config(path or inline_yaml)
    assert isinstance(cfg, RunConfig)
    # what a run dumps at start-up loads back to the same config
    assert parse_config(yaml.safe_load(dump_config(cfg))) == cfg


def test_defaults(inline_yaml):
    cfg = load_config(inline_yaml)
    assert cfg.namespace == "demo" and cfg.model.path == "out/models/tiny" and cfg.model.build is None
    assert cfg.stack.embedded is True and cfg.kafka.session_timeout_ms == 6000
    assert cfg.stream_ops.rewards[0].name == "exact_match"


def test_dotted_overrides(inline_yaml):
    cfg = load_config(inline_yaml, [
        "trainer.lr=1e-6",
        "stack.embedded=false",
        "kafka.bootstrap=kafka:9092",
        "explorer.sampling.temperature=0.7",
        "algorithm.kl.coef=0.05",
        "eval.max_tasks=10",  # a section the file does not have yet
        "algorithm.policy_loss.params.clip.low=0.2",  # nested keys that do not exist yet
        "stream_ops.rewards=[{name: format, weight: 0.5}]",  # YAML values
    ])
    assert cfg.trainer.lr == pytest.approx(1e-6)
    assert cfg.stack.embedded is False
    assert cfg.kafka.bootstrap == "kafka:9092"
    assert cfg.explorer.sampling.temperature == 0.7
    assert cfg.algorithm.kl.coef == 0.05
    assert cfg.eval.max_tasks == 10
    assert cfg.algorithm.policy_loss.params == {"clip": {"low": 0.2}}
    assert [(r.name, r.weight) for r in cfg.stream_ops.rewards] == [("format", 0.5)]
    assert cfg.trainer.max_steps == 3  # untouched values stay


def test_override_later_wins(inline_yaml):
    assert load_config(inline_yaml, ["trainer.lr=1e-3", "trainer.lr=2e-3"]).trainer.lr == pytest.approx(2e-3)


@pytest.mark.parametrize("override,names", [
    ("algorithm.type=foo", ["algorithm.type", "grpo", "foo"]),
    ("algorithm.kl.estimator=k9", ["algorithm.kl.estimator", "k3"]),
    ("algorithm.advantage.type=bogus", ["algorithm.advantage.type", "rloo"]),
    ("algorithm.policy_loss.type=bogus", ["algorithm.policy_loss.type", "decoupled_ppo"]),
    ("algorithm.aggregation=mean", ["algorithm.aggregation", "token-mean"]),
    ("kafka.security_protocol=TLS", ["kafka.security_protocol", "SASL_PLAINTEXT"]),
    ("trainer.engine=jax", ["trainer.engine", "deepspeed"]),
    ("explorer.engine.type=sglang", ["explorer.engine.type", "vllm"]),
])
def test_wrong_choice_names_field_and_allowed_values(inline_yaml, override, names):
    with pytest.raises(ConfigError) as info:
        load_config(inline_yaml, [override])
    for name in names:
        assert name in str(info.value)


def test_import_path_escapes_the_choice(inline_yaml):
    cfg = load_config(inline_yaml, ["algorithm.advantage.type=mine", "algorithm.advantage.import_path=pkg.mod:fn"])
    assert cfg.algorithm.advantage.import_path == "pkg.mod:fn"


@pytest.mark.parametrize("override,name", [
    ("trainer.lrr=1e-6", "trainer.lrr"),
    ("bogus=1", "bogus"),
    ("explorer.sampling.temprature=0.5", "explorer.sampling.temprature"),
])
def test_unknown_field_is_rejected_naming_it(inline_yaml, override, name):
    with pytest.raises(ConfigError) as info:
        load_config(inline_yaml, [override])
    assert name in str(info.value)


def test_wrong_type_names_field(inline_yaml):
    with pytest.raises(ConfigError, match=r"trainer\.max_steps"):
        load_config(inline_yaml, ["trainer.max_steps=many"])


def test_missing_required_field(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("namespace: x\n")
    with pytest.raises(ConfigError, match="model"):
        load_config(path)


@pytest.mark.parametrize("override,match", [
    ("trainer.lr", "section.field=value"),
    ("model.path.sub=1", "not a section"),
])
def test_malformed_overrides(inline_yaml, override, match):
    with pytest.raises(ConfigError, match=match):
        load_config(inline_yaml, [override])


def test_top_level_must_be_a_mapping(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(path)


def test_reward_term_needs_a_name(inline_yaml):
    with pytest.raises(ConfigError, match="stream_ops.rewards.0"):
        load_config(inline_yaml, ["stream_ops.rewards=[{weight: 1.0}]"])


def test_exponent_float_in_free_form_params(inline_yaml):
    cfg = load_config(inline_yaml, ["algorithm.advantage.params.eps=1e-6"])
    assert cfg.algorithm.advantage.params["eps"] == pytest.approx(1e-6)
