"""One typed config tree for every role, loaded from YAML and overridden by dotted flags.

`load_config("run.yaml", ["trainer.lr=1e-6"])` returns a validated `RunConfig`; a wrong value
raises `ConfigError` naming the field and, for choices, the allowed values. Names of algorithm
parts live here as plain tuples so validating a config never imports torch; a test checks they
match the registries in `streamrft.engine.algorithms`.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

ALGORITHM_TYPES = ("grpo", "dr_grpo", "ppo", "rloo", "reinforce_pp", "gspo", "cispo", "opd", "sft", "dpo", "kto")
ADVANTAGE_TYPES = ("grpo", "dr_grpo", "rloo", "reinforce_pp", "gae", "opmd", "opd")
POLICY_LOSS_TYPES = ("ppo", "pg", "gspo", "cispo", "decoupled_ppo", "sft")
KL_ESTIMATOR_TYPES = ("k1", "k2", "k3", "low_var_kl")
AGGREGATION_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
OFFLINE_TYPES = ("sft", "dpo", "kto")


class _Loader(yaml.SafeLoader):
    """YAML 1.2 floats: PyYAML (YAML 1.1) reads `1e-6` as a string, wrong wherever the type is Any."""


_Loader.add_implicit_resolver("tag:yaml.org,2002:float", re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+$"),
                              list("-+0123456789."))


class ConfigError(ValueError):
    """A config value is wrong; the message names the field and what is allowed."""


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


def _choice(value: str | None, allowed: tuple[str, ...], field: str) -> str | None:
    if value is not None and value not in allowed:
        raise ValueError(f"{field}={value!r} is not one of {list(allowed)}")
    return value


class KafkaConfig(Section):
    bootstrap: str = "127.0.0.1:9092"
    """host:port list of the brokers."""
    security_protocol: Literal["PLAINTEXT", "SASL_PLAINTEXT", "SASL_SSL", "SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"] | None = None
    """SASL mechanism for an external cluster (teams authenticate with SCRAM)."""
    username: str | None = None
    password: str | None = None
    session_timeout_ms: int = 6000
    """Kept short: the embedded broker holds every JoinGroup reply for half of it."""
    heartbeat_interval_ms: int = 1000
    partitions: int = 4
    """Partitions of the run's rollouts and experiences topics (the unit of stream-ops scaling)."""
    replication_factor: int = 1
    retention_ms: int = -1
    """-1 keeps every record forever: the durable, replayable log of every trajectory."""
    extra: dict[str, Any] = Field(default_factory=dict)
    """Extra librdkafka properties passed through to every client."""


class S3Config(Section):
    endpoint: str = "127.0.0.1:8333"
    """host:port of the S3 (MinIO API) endpoint."""
    access_key: str = "streamrft"
    secret_key: str = "streamrft"
    secure: bool = False
    region: str = "us-east-1"
    bucket: str = "weights"
    """Bucket holding weight versions."""


class StackConfig(Section):
    embedded: bool = True
    """Start the embedded broker + S3 server (`streamrft up`); false = use `kafka`/`s3` as given."""
    data_dir: str = ".streamrft/stack"
    host: str = "127.0.0.1"
    kafka_port: int = 9092
    s3_port: int = 8333
    weed_port_base: int = 19400
    """First of the internal SeaweedFS ports (master, volume, filer and their gRPC ports)."""


class TinyModelSpec(Section):
    """A small Qwen2 built locally when `model.path` does not exist yet (demos and tests), with a
    char-level tokenizer over the synthetic task's alphabet."""

    hidden_size: int = 128
    layers: int = 2
    heads: int = 4
    kv_heads: int | None = None
    intermediate_size: int | None = None
    max_positions: int = 128
    seed: int = 0


class ModelConfig(Section):
    name: str = "policy"
    """Name of the model in the weight store and on the weights topic."""
    path: str
    """Local Hugging Face directory (never a hub id)."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    build: TinyModelSpec | None = None


class DataConfig(Section):
    train: str | None = None
    """JSONL or Parquet file of tasks (prompt/answer), or of pairs for offline training."""
    eval: str | None = None
    source: Literal["file", "topic"] = "file"
    """Explorers read tasks from `train` (file) or from the run's tasks topic (topic)."""
    prompt_key: str = "prompt"
    answer_key: str = "answer"
    shuffle: bool = True
    seed: int = 0
    synthetic: dict[str, Any] | None = None
    """Generate the demo task's data into `train`/`eval` when they are missing."""


class EngineConfig(Section):
    type: Literal["transformers", "vllm"] = "transformers"
    device: str = "cpu"
    max_batch: int = 64
    gpu_memory_utilization: float = 0.5
    """vLLM only."""


class SamplingConfig(Section):
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 32


class ExplorerConfig(Section):
    num_explorers: int = 2
    team: str = "default"
    group_size: int = 8
    """n: trajectories per task, published together as one RolloutGroup."""
    tasks_per_batch: int = 4
    """Tasks generated in one engine call."""
    workflow: Literal["single_turn"] = "single_turn"
    chat_template: bool = False
    """Render each prompt as a user turn with the tokenizer's chat template (instruct models)."""
    engine: EngineConfig = Field(default_factory=EngineConfig)
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    torch_threads: int = 1
    max_groups: int | None = None
    """Stop after publishing this many groups (None = until the run ends)."""
    admission_wait_s: float = 5.0
    """Waited this long for a new version while the current one is still fresh: start more groups
    anyway (the trainer still needs data, e.g. after zero-variance groups were filtered)."""


class RewardTerm(Section):
    name: str | None = None
    """A reward in `streamrft.stream_ops.rewards.REWARDS`."""
    import_path: str | None = None
    """`pkg.module:function` for your own reward; wins over `name`."""
    weight: float = 1.0
    params: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _named(self) -> "RewardTerm":
        if not self.name and not self.import_path:
            raise ValueError("a reward term needs `name` or `import_path`")
        return self


class StreamOpsConfig(Section):
    rewards: list[RewardTerm] = Field(default_factory=lambda: [RewardTerm(name="exact_match")])
    drop_zero_variance: bool = True
    """Filter groups whose rewards are all equal (no learning signal under group baselines)."""
    priority: Literal["fifo", "reward_std", "abs_advantage"] = "reward_std"
    workers: int = 1


class PartConfig(Section):
    type: str | None = None
    """Registry name; None = the algorithm preset's choice."""
    import_path: str | None = None
    params: dict[str, Any] = Field(default_factory=dict)


class KLConfig(Section):
    estimator: str = "low_var_kl"
    coef: float = 0.0
    """0 disables the reference model entirely."""
    mode: Literal["loss", "reward"] = "loss"

    @field_validator("estimator")
    @classmethod
    def _est(cls, v: str) -> str:
        return _choice(v, KL_ESTIMATOR_TYPES, "algorithm.kl.estimator")


class AlgorithmConfig(Section):
    type: str = "grpo"
    advantage: PartConfig = Field(default_factory=PartConfig)
    policy_loss: PartConfig = Field(default_factory=PartConfig)
    kl: KLConfig = Field(default_factory=KLConfig)
    entropy_coef: float = 0.0
    aggregation: str | None = None
    """Loss aggregation; None = the preset's."""

    @field_validator("type")
    @classmethod
    def _type(cls, v: str) -> str:
        return _choice(v, ALGORITHM_TYPES, "algorithm.type")

    @field_validator("aggregation")
    @classmethod
    def _agg(cls, v: str | None) -> str | None:
        return _choice(v, AGGREGATION_MODES, "algorithm.aggregation")

    @model_validator(mode="after")
    def _parts(self) -> "AlgorithmConfig":
        if self.advantage.import_path is None:
            _choice(self.advantage.type, ADVANTAGE_TYPES, "algorithm.advantage.type")
        if self.policy_loss.import_path is None:
            _choice(self.policy_loss.type, POLICY_LOSS_TYPES, "algorithm.policy_loss.type")
        advantage = self.advantage.type or {"ppo": "gae", "reinforce_pp": "reinforce_pp"}.get(self.type)
        if self.kl.mode == "reward" and self.kl.coef and advantage not in ("gae", "reinforce_pp"):
            raise ValueError("algorithm.kl.mode='reward' needs token-level returns, i.e. an advantage the "
                             f"trainer computes: one of ['gae', 'reinforce_pp'] (got {advantage!r}); "
                             "use kl.mode='loss' with group advantages")
        return self


class DeepSpeedConfig(Section):
    zero_stage: Literal[0, 1, 2, 3] = 2
    num_gpus: int = 1
    """Processes launched by torchrun (CPU: gloo processes)."""
    config: dict[str, Any] = Field(default_factory=dict)
    """Extra DeepSpeed config merged over the generated one."""


class ReplayConfig(Section):
    """Train offline by replaying a retained experiences topic (another run's durable log)."""

    namespace: str
    """The namespace of the run whose `<namespace>.experiences` topic is replayed."""
    from_offset: int = 0
    """Start every partition at this offset..."""
    from_timestamp_ms: int | None = None
    """...or at the first record at or after this time (epoch ms), when set."""


class TrainerConfig(Section):
    engine: Literal["torch", "deepspeed"] = "torch"
    deepspeed: DeepSpeedConfig = Field(default_factory=DeepSpeedConfig)
    batch_groups: int = 4
    """Groups (tasks) per optimiser step."""
    micro_batch_size: int = 16
    """Sequences per forward/backward; the loss is normalised by the whole step's count."""
    lr: float = 1e-5
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    max_steps: int = 100
    sync_interval: int = 1
    """Publish a weight version every this many steps."""
    max_staleness: int = 1
    """Max (trainer version - model_version) of a trained sample; 0 = strictly on-policy."""
    keep_versions: int = 3
    """Weight versions kept in S3 (older ones are garbage-collected)."""
    checkpoint_dir: str | None = None
    """Default: <output_dir>/trainer."""
    torch_threads: int = 1
    seed: int = 0
    replay: ReplayConfig | None = None
    """Replay a retained topic instead of following this run's experiences: no staleness rule
    (the samples come from another run's versions), stop at the topic's end."""


class EvalConfig(Section):
    every_versions: int = 5
    """Evaluate greedy reward on `data.eval` every this many versions (0 = start and end only)."""
    max_tasks: int = 100


class StageConfig(Section):
    """A stage before the RL loop, e.g. an SFT warm-up on `data`."""

    type: Literal["sft"] = "sft"
    steps: int = 100
    batch_size: int = 16
    lr: float = 1e-3
    data: dict[str, Any] = Field(default_factory=dict)
    """Synthetic-data settings or a `path` to a JSONL of prompt/completion pairs."""


class RunConfig(Section):
    namespace: str = "streamrft"
    output_dir: str = "out/run"
    kafka: KafkaConfig = Field(default_factory=KafkaConfig)
    s3: S3Config = Field(default_factory=S3Config)
    stack: StackConfig = Field(default_factory=StackConfig)
    model: ModelConfig
    data: DataConfig = Field(default_factory=DataConfig)
    explorer: ExplorerConfig = Field(default_factory=ExplorerConfig)
    stream_ops: StreamOpsConfig = Field(default_factory=StreamOpsConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    stages: list[StageConfig] = Field(default_factory=list)
    max_wall_s: float | None = None
    """Stop the run after this many seconds (None = at trainer.max_steps)."""

    @property
    def weights_key(self) -> str:
        """Where this run's weight versions live in the bucket: `<namespace>/<model.name>/v<N>/`,
        so runs sharing one S3 store never overwrite each other's versions."""
        return f"{self.namespace}/{self.model.name}"


def apply_overrides(raw: dict, overrides: list[str]) -> dict:
    """Apply `a.b.c=value` flags (value parsed as YAML) onto a raw config dict."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like section.field=value")
        key, value = item.split("=", 1)
        node = raw
        parts = key.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {key!r}: {p!r} is not a section")
        node[parts[-1]] = yaml.load(value, Loader=_Loader)
    return raw


def _format_error(e: ValidationError) -> str:
    lines = []
    for err in e.errors():
        loc = ".".join(str(p) for p in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "literal_error":
            msg = f"{msg} (got {err['input']!r})"
        lines.append(f"{loc}: {msg}")
    return "invalid config:\n  " + "\n  ".join(lines)


def parse_config(raw: dict) -> RunConfig:
    try:
        return RunConfig.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(_format_error(e)) from None


def load_config(path: str | Path, overrides: list[str] | None = None) -> RunConfig:
    raw = yaml.load(Path(path).read_text(), Loader=_Loader) or {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping")
    return parse_config(apply_overrides(raw, overrides or []))


def dump_config(cfg: RunConfig) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
