"""Tasks and explorers: data, the rollout engine, sampling, workflows and environments; the gateway."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from streamrft.config.base import _FINITE, _PORT, ENV_TYPES, TASK_SELECTOR_TYPES, WORKFLOW_TYPES, Section, _choice


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
    (`benchmarks/cpu_train_step.py`), and ~2x slower on a CPU without bfloat16 kernels, where the
    transformers engine keeps float32 and warns (`engine/precision.py`); behaviour log-probs then differ from the trainer's float32
    recomputation by bf16 rounding (the importance ratio absorbs it; `trainer.autocast` narrows it)."""
    gpu_memory_utilization: float = Field(0.5, gt=0, le=1)
    """vLLM only: the share of the GPU's total memory it may take (weights, activations, CUDA graphs,
    KV cache); vLLM refuses to start while less than that is free."""
    kv_cache_gib: float | None = Field(None, gt=0, **_FINITE)
    """vLLM only: the KV cache's size, fixed (`kv_cache_memory_bytes`). None: what
    `gpu_memory_utilization` leaves after weights, activations and CUDA graphs, as vLLM measures
    them from the whole GPU's free memory, which other processes starting on the same GPU disturb:
    set it when explorers share a GPU with each other or the trainer (examples/gsm8k_gpu.yaml)."""
    max_model_len: int | None = Field(None, ge=16)
    """vLLM only: prompt + completion tokens a sequence may hold (None: the model's own maximum). The
    fixed KV cache must hold at least one such sequence."""
    max_images: int | None = Field(None, ge=0, le=16)
    """vLLM only, a vision-language model: images a prompt may show (`limit_mm_per_prompt`); vLLM
    sizes its encoder's memory profile by it. None: vLLM's default."""


class SamplingConfig(Section):
    temperature: float = Field(1.0, ge=0, **_FINITE)
    """0 = greedy."""
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=0)
    """0 = no top-k truncation."""
    max_new_tokens: int = Field(32, ge=1)
    seed: int | None = Field(None, ge=0)
    """None: unseeded. An int: each group's samples come from random streams of their own, seeded
    by (seed, task id, how many times this explorer took that task before), episode and turn, so
    the same weights give the same tokens whatever the scheduling (lockstep or one by one) and
    whatever else shares the engine's calls (`SamplingParams.seeds`). A custom workflow gets the
    seeds in `params.seeds`, one per task."""


class LatencyConfig(Section):
    """A seeded delay added to every environment step (`producers/envs/latency.py`): a realistic slow
    tool (a sandbox, a web or database call, a simulator) made of any environment, its game unchanged."""

    dist: Literal["lognormal"] = "lognormal"
    median_s: float = Field(0.5, gt=0, **_FINITE)
    p99_s: float = Field(5.0, gt=0, **_FINITE)
    seed: int = Field(0, ge=0)
    """Each environment draws from `Random(seed, episode number)`: a run's delays repeat."""

    @model_validator(mode="after")
    def _spread(self) -> "LatencyConfig":
        if self.p99_s < self.median_s:
            raise ValueError(f"p99_s={self.p99_s} is below median_s={self.median_s}")
        return self


class EnvConfig(Section):
    """The environment of the multi-turn workflows: a fresh `cls(**params)` per episode."""

    type: str | None = None
    """A name in `streamrft.producers.envs.ENVIRONMENTS`."""
    import_path: str | None = None
    """`pkg.module:Class` for your own environment; wins over `type`."""
    params: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments of the environment's constructor (e.g. `{high: 16, max_guesses: 5}`)."""
    step_timeout_s: float = Field(60.0, gt=0, **_FINITE)
    """Episodes scheduled one by one (`explorer.scheduling: per_episode`): a `reset`, `step` or
    `close` that takes longer ends its episode with finish_reason `env_timeout`."""
    latency: LatencyConfig | None = None
    """Add a seeded delay to every step: `{dist: lognormal, median_s, p99_s, seed}`."""

    @model_validator(mode="after")
    def _named(self) -> "EnvConfig":
        if self.import_path:
            return self
        if self.type is None:
            raise ValueError("an environment needs `type` or `import_path`")
        _choice(self.type, ENV_TYPES, "type")
        return self


class DifficultyParams(Section):
    """`explorer.task_selector.params` of the `difficulty` selector (`producers/task_selection.py`)."""

    min_attempts: int = Field(16, ge=1)
    """Episodes of a task scored (within `window`) before it may be skipped as always or never solved."""
    pass_threshold: float | None = Field(1.0, **_FINITE)
    """An episode passes when its total reward is >= this (1.0: full credit). None: its reward,
    clipped to [0, 1], is its success (partial credit counts; solved = 1, failed = 0)."""
    window: int = Field(64, ge=1)
    """The newest episodes of each task that count: older outcomes are forgotten, so a task the
    policy outgrows (or grows into) moves between skipped and learnable."""
    skip_weight: float = Field(0.01, ge=0, le=0.25, **_FINITE)
    """Sampling weight kept by a skipped task (a learnable one has p(1-p), at most 0.25): above 0 it
    is revisited now and then, so its pass rate stays current. 0: never, while others remain."""

    @model_validator(mode="after")
    def _window(self) -> "DifficultyParams":
        if self.min_attempts > self.window:
            raise ValueError(f"min_attempts={self.min_attempts} is more than window={self.window}: no task could "
                             f"ever be skipped")
        return self


class TaskSelectorConfig(Section):
    """Which of its tasks an explorer generates next (`streamrft.producers.task_selection`)."""

    type: str = "sequential"
    """`sequential`: the file in order (shuffled each epoch by `data.shuffle`); `random`: uniform
    draws, seeded; `difficulty`: favours tasks solved about half the time, from the per-task pass
    rates every explorer reads from `<ns>.task-stats`."""
    import_path: str | None = None
    """`pkg.module:factory` for your own selector, called as `factory(seed=..., **params)`; wins over `type`."""
    params: dict[str, Any] = Field(default_factory=dict)
    """The selector's settings: for `difficulty` the fields of `DifficultyParams`; for yours, its keyword arguments."""

    @field_validator("type")
    @classmethod
    def _type(cls, v: str) -> str:
        return _choice(v, TASK_SELECTOR_TYPES, "type")

    @model_validator(mode="after")
    def _params(self) -> "TaskSelectorConfig":
        if self.import_path:
            return self
        if self.type == "difficulty":
            try:
                DifficultyParams.model_validate(self.params)
            except ValidationError as e:
                err = e.errors()[0]
                where = ".".join(["params", *(str(p) for p in err["loc"])])
                bounds = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}
                msg = " and ".join(f"must be {bounds[k]} {v}" for k, v in (err.get("ctx") or {}).items() if k in bounds)
                msg = msg or err["msg"].removeprefix("Value error, ")
                got = f"got {err['input']!r}; " if err["loc"] else ""
                raise ValueError(f"{where}: {msg} ({got}difficulty params: {list(DifficultyParams.model_fields)})") from None
        elif self.params:
            raise ValueError(f"params: the {self.type!r} selector takes none (got {sorted(self.params)})")
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
    scheduling: Literal["lockstep", "per_episode"] = "lockstep"
    """`lockstep` reserves, generates and publishes a batch of `tasks_per_batch` tasks at a time;
    multi-turn, it plays the batch's episodes turn by turn together, stepping each environment in
    turn (a slow step stalls the batch; a group goes out when the batch ends). `per_episode` keeps up
    to `max_concurrent_episodes` episodes (single-turn: samples) in flight, each advancing when its
    environment has answered, the engine batching whatever prompts are ready, decides admission
    ahead of need and publishes a group as soon as its episodes have ended, beside the engine
    (`producers/episode_loop.py`, `producers/workflows/scheduler.py`)."""
    max_concurrent_episodes: int = Field(64, ge=1)
    """`per_episode`: episodes in flight at most (whole groups: at least `group_size`)."""
    env_threads: int = Field(16, ge=1)
    """`per_episode`: threads that run a synchronous environment's `reset`/`step`/`close` (an `async def`
    one runs on the explorer's event loop)."""
    min_episodes_per_group: int | None = Field(None, ge=1)
    """Episodes of a group that must end normally for the group to be published without those its
    environment ended (`env_error`, `env_timeout`: never trained); else it is dropped and counted.
    None: half the group, at least 1."""
    swap: Literal["between_turns", "between_batches"] = "between_turns"
    """`per_episode`: new weights are loaded between two engine calls, so an episode's turns may
    come from different versions (each turn's is recorded; staleness counts from the oldest), or
    only once every episode in flight has ended (admission pauses meanwhile)."""
    publish_order: Literal["admitted", "finished"] = "finished"
    """`per_episode`: `finished` publishes a group as soon as its episodes have ended; `admitted`
    publishes finished groups in the order this explorer admitted them, a group waiting for older
    open ones at most `publish_wait_s`, so groups whose tasks end in fewer tool steps do not fill
    the trainer's batches ahead of the slow ones (`producers/release_order.py`, docs/asynchrony.md)."""
    publish_wait_s: float = Field(30.0, ge=0, le=600)
    """`publish_order: admitted`: the longest a finished group waits for older ones."""
    task_selector: TaskSelectorConfig = Field(default_factory=TaskSelectorConfig)
    """Which task next: `{type: sequential | random | difficulty, params}` or `{import_path, params}`
    (docs/curriculum.md). Tasks from a file only: with `data.source: topic`, tasks come in topic order."""

    @field_validator("workflow")
    @classmethod
    def _workflow(cls, v: str) -> str:
        return _choice(v, WORKFLOW_TYPES, "workflow")

    @model_validator(mode="after")
    def _env(self) -> "ExplorerConfig":
        if self.workflow_import_path is None and self.workflow != "single_turn" and self.env is None:
            raise ValueError(f"workflow={self.workflow!r} needs an environment: set explorer.env")
        if self.scheduling == "per_episode":
            if self.workflow_import_path is not None:
                raise ValueError("scheduling='per_episode' schedules the shipped workflows ['single_turn', "
                                 "'multi_turn', 'step_wise'], not a workflow_import_path: use scheduling='lockstep'")
            if self.max_concurrent_episodes < self.group_size:
                raise ValueError(f"max_concurrent_episodes={self.max_concurrent_episodes} is less than group_size="
                                 f"{self.group_size}: a group's episodes start together")
        if self.min_episodes_per_group is not None and self.min_episodes_per_group > self.group_size:
            raise ValueError(f"min_episodes_per_group={self.min_episodes_per_group} is more than group_size="
                             f"{self.group_size}")
        return self


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
    mode: Literal["train", "serve"] = "train"
    """`train`: agents' episodes are recorded for training (docs/gateway.md). `serve`: the policy is
    served to users, no training episode is recorded, and each call's completions are published as
    a group to wait for its users' ratings (`POST /v1/feedback {completion_id, rating}`): needs a
    `feedback` reward term; a completion no one rates times out (docs/feedback.md)."""
    label_overlap: int = Field(1, ge=1, le=10)
    """The labelling page (`GET /label`, a run with a `feedback` term): how many raters are shown
    each answer (more than 1 to measure their agreement)."""
    label_lease_s: float = Field(300.0, gt=0, le=86400, **_FINITE)
    """How long an answer shown to one rater is held for them before another may get it."""
