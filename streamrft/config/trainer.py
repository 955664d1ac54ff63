"""The algorithm and the trainer: parts, KL, DeepSpeed, replay, weight sync, checkpoints."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from streamrft.config.base import (_FINITE, ADVANTAGE_TYPES, AGGREGATION_MODES, ALGORITHM_TYPES, KL_ESTIMATOR_TYPES,
                                   POLICY_LOSS_TYPES, Section, _choice)


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
    """Train offline by replaying a retained topic (another run's durable log), whole or a range of
    it. Not `replay_buffer`, which is prioritised reuse of recent groups inside an online run."""

    namespace: str
    """The namespace of the run whose `<namespace>.experiences` (or rollouts) topic is replayed."""
    from_offset: int = Field(0, ge=0)
    """Start every partition at this offset..."""
    from_timestamp_ms: int | None = Field(None, ge=0)
    """...or at the first record at or after this time (epoch ms), when set."""
    to_offset: int | None = Field(None, ge=0)
    """Stop every partition before this offset (exclusive); None: the log's end at start-up."""
    to_timestamp_ms: int | None = Field(None, ge=0)
    """...or before the first record at or after this time (epoch ms), when set."""
    partitions: dict[int, tuple[int, int]] | None = None
    """Per-partition ranges {partition: [start, end)} (offsets); partitions not named are skipped.
    Overrides the from/to fields."""
    rollouts_team: str | None = None
    """Replay `<namespace>.rollouts.<team>` instead of the experiences topic: every group is scored
    again with this config's rewards (`stream_ops.scoring.build_scorer`, in-process) before training;
    one the scorer filters (zero variance) is skipped, one it fails on is a dead letter."""

    @model_validator(mode="after")
    def _range(self) -> "ReplayConfig":
        if self.to_offset is not None and self.to_offset < self.from_offset:
            raise ValueError(f"trainer.replay.to_offset={self.to_offset} is below from_offset={self.from_offset}")
        if (self.to_timestamp_ms is not None and self.from_timestamp_ms is not None
                and self.to_timestamp_ms < self.from_timestamp_ms):
            raise ValueError("trainer.replay.to_timestamp_ms is below from_timestamp_ms")
        for p, (start, end) in (self.partitions or {}).items():
            if p < 0 or start < 0 or end < start:
                raise ValueError(f"trainer.replay.partitions[{p}]=[{start}, {end}): need partition >= 0 and "
                                 "0 <= start <= end")
        return self


class ReplayBufferConfig(Section):
    """Prioritised experience replay inside this run (`consumers/replay_buffer.py`): deliberate,
    counted reuse of recently trained groups. Not `replay`, which re-reads another run's log."""

    capacity: int = Field(64, ge=1)
    """Groups kept at most (first in, first out)."""
    replay_groups: int = Field(2, ge=1)
    """Groups drawn from the buffer per step, on top of the `batch_groups` fresh ones (fresh intake
    per version stays what explorers' admission control expects)."""
    alpha: float = Field(0.6, ge=0, **_FINITE)
    """P(i) ~ priority_i^alpha; 0 = uniform."""
    beta: float = Field(0.4, ge=0, le=1)
    """Importance-weight exponent at step 0: weights (N P(i))^-beta / max."""
    beta_final: float = Field(1.0, ge=0, le=1)
    beta_anneal_steps: int = Field(0, ge=0)
    """Steps over which beta goes linearly to `beta_final`; 0 = `beta` throughout."""
    max_reuse: int = Field(2, ge=1)
    """Replays of one group at most (its fresh use not counted)."""
    max_staleness: int = Field(4, ge=0)
    """A group whose oldest trajectory's version is older than trainer version - this leaves."""
    priority: Literal["abs_advantage", "reward_std", "td_error"] = "abs_advantage"
    """Mean |advantage| (stream ops'), the rewards' std, or the mean |token advantage| the trainer
    computed on the group's last use (with a GAE critic: TD errors; refreshed on every use)."""
    import_path: str | None = None
    """A user's `pkg.module:fn(ExperienceGroup) -> float` instead of `priority`."""
    epsilon: float = Field(1e-3, gt=0, **_FINITE)
    """Added to every priority, so a group of priority 0 may still be drawn."""


class SftMixConfig(Section):
    """Mix expert demonstrations into every RL step (`consumers/sft_mix.py`): CHORD (Zhang et al.
    2025, as Trinity-RFT's `mix_chord`): loss = (1 - mu) * RL loss + mu * SFT loss on the expert rows,
    mu warmed up linearly to `mu_peak` then cosine-decayed to `mu_valley`."""

    path: str
    """JSONL/Parquet of prompt/completion (or chat) rows, as offline SFT reads (`consumers/offline_data.py`)."""
    rows_per_step: int = Field(4, ge=1)
    """Expert rows per step, taken in file order, wrapping around (a restart takes the same rows)."""
    mu_peak: float = Field(0.1, ge=0, le=1)
    mu_valley: float = Field(0.1, ge=0, le=1)
    mu_warmup_steps: int = Field(0, ge=0)
    mu_decay_steps: int = Field(0, ge=0)
    phi: bool = True
    """CHORD-phi: weight each expert token's -log p by p (1 - p) (detached), so tokens the policy is
    already sure of, or far from, pull less; False: plain SFT."""


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
    """Max gradient norm; 0 = no clipping."""
    warmup_steps: int = Field(0, ge=0)
    """Optimiser updates of linear learning-rate warm-up: update k (from 0) takes
    `lr * min(1, (k + 1) / warmup_steps)`; 0 = `lr` from the first. Adam's first updates move every
    weight by about `lr` whatever the gradient's size (its variance estimate holds one or two
    gradients), so a warm-up keeps the first versions close to the base policy. Counted from the
    optimiser's own step count, so a resumed run goes on where it stopped."""
    max_update_kl: float | None = Field(None, gt=0, **_FINITE)
    """A trust region on each step (TRPO's line search, for one step): after the step's updates, the
    KL from the batch-start policy to the new one, estimated on the batch's sampled tokens (k3), is
    at most this. A step that moved further is scaled back along its direction, `w0 + a (w1 - w0)`
    with `a` from the KL's quadratic growth, measured again, at most 4 times; then it is undone.
    Adam's moments keep the step's gradient. Costs one forward of the batch before the step and one
    after (and one per scale-back) and a copy of the trained weights. Torch engine only. None: off."""
    freeze_vision_tower: bool = False
    """A vision-language model's vision encoder is not trained (its projector is): no gradients, no
    optimiser state and no saved activations for it, 14 B a parameter less under mixed-precision
    Adam (verl's `freeze_vision_tower`). Also in warm-up stages. Refused for a text model."""
    gradient_checkpointing: bool = False
    """Keep only each decoder layer's input for backward and recompute the layer there: activation
    memory per token falls from every layer's saved tensors to one layer's plus the inputs, for
    one more forward per backward (`model.gradient_checkpointing_enable`, non-reentrant; what
    verl's `enable_gradient_checkpointing` and TRL's `gradient_checkpointing` do). Measured by
    `benchmarks/trainer_activation_memory.py --checkpointing`."""
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
    (the samples come from another run's versions), stop at the range's or topic's end."""
    replay_buffer: ReplayBufferConfig | None = None
    """Prioritised experience replay of this run's recent groups (not `replay`)."""
    sft_mix: SftMixConfig | None = None
    """Expert demonstrations mixed into every step under CHORD's schedule (torch engine)."""

    @model_validator(mode="after")
    def _mixing(self) -> "TrainerConfig":
        if self.sft_mix is not None and self.engine != "torch":
            raise ValueError("trainer.sft_mix needs trainer.engine='torch' (got 'deepspeed')")
        return self
