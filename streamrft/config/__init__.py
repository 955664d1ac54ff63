"""One typed config tree for every role, loaded from YAML and overridden by dotted flags.

`load_config("run.yaml", ["trainer.lr=1e-6"])` returns a validated `RunConfig`; a wrong value
raises `ConfigError` naming the field by its dotted path and the allowed values or range
(`trainer.sync_interval: must be >= 1 (got 0)`). Every number has its real range here, so a value
that would crash or hang a role later is refused at load. Names of algorithm parts and rewards
live here as plain tuples so validating a config never imports torch; tests check they match the
registries in `streamrft.engine.algorithms` and `streamrft.stream_ops.rewards`.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, get_args

import yaml
from pydantic import Field, ValidationError, model_validator
from pydantic.fields import FieldInfo

from streamrft.config.base import (_FINITE, ADVANTAGE_TYPES, AGGREGATION_MODES, ALGORITHM_TYPES, CLEANING_OP_TYPES,
                                   ENV_TYPES, KL_ESTIMATOR_TYPES, OFFLINE_TYPES, POLICY_LOSS_TYPES, REWARD_NAMES,
                                   TASK_SELECTOR_TYPES, WORKFLOW_TYPES, ConfigError, Section, _Loader)
from streamrft.config.explorer import (DataConfig, DifficultyParams, EngineConfig, EnvConfig, ExplorerConfig,
                                       GatewayConfig, GatewayTeam, LatencyConfig, SamplingConfig, TaskSelectorConfig)
from streamrft.config.model import LORA_TARGETS, PACKAGED_MODELS, PYPI_SOURCE, LoraSpec, ModelConfig, TinyModelSpec
from streamrft.config.monitor import LOGGER_BACKENDS, DashboardConfig, MonitorConfig, PrometheusConfig
from streamrft.config.stack import KafkaConfig, RestartConfig, S3Config, StackConfig
from streamrft.config.stream_ops import RewardTerm, StreamOpsConfig
from streamrft.config.trainer import (AlgorithmConfig, DeepSpeedConfig, KLConfig, PartConfig, ReplayBufferConfig,
                                      ReplayConfig, SftMixConfig, TrainerConfig, WeightSyncConfig)

__all__ = ["ADVANTAGE_TYPES", "AGGREGATION_MODES", "ALGORITHM_TYPES", "ENV_TYPES", "KL_ESTIMATOR_TYPES", "LOGGER_BACKENDS", "LORA_TARGETS",
           "CLEANING_OP_TYPES", "OFFLINE_TYPES", "PACKAGED_MODELS", "POLICY_LOSS_TYPES", "PYPI_SOURCE", "REWARD_NAMES",
           "TASK_SELECTOR_TYPES", "WORKFLOW_TYPES",
           "AlgorithmConfig", "ConfigError", "DashboardConfig", "DataConfig", "DeepSpeedConfig", "DifficultyParams", "EngineConfig", "EnvConfig", "EvalConfig",
           "ExplorerConfig", "GatewayConfig", "GatewayTeam", "KLConfig", "KafkaConfig", "LatencyConfig", "LoraSpec", "ModelConfig", "MonitorConfig",
           "PartConfig", "PrometheusConfig", "ReplayBufferConfig", "ReplayConfig", "RestartConfig", "RewardTerm", "RunConfig", "S3Config",
           "SamplingConfig", "Section", "SftMixConfig", "StackConfig", "StageConfig", "StreamOpsConfig",
           "TaskSelectorConfig", "TinyModelSpec", "TrainerConfig", "WeightSyncConfig",
           "apply_overrides", "dump_config", "load_config", "parse_config"]


class EvalConfig(Section):
    every_versions: int = Field(5, ge=0)
    """Evaluate the reward on `data.eval` every this many versions (0 = start and end only)."""
    max_tasks: int = Field(100, ge=1)
    temperature: float = Field(0.0, ge=0, le=2, **_FINITE)
    """0 = greedy: one completion or episode per task. Above 0: `samples` of each task drawn at this
    temperature, the eval reward their mean. A policy trained at temperature 1 can gain on what it
    samples while its greedy choice on a task flips, so a sampled eval follows the trained objective."""
    samples: int = Field(1, ge=1, le=64)
    """Completions or episodes per eval task (more than 1 needs `temperature` > 0)."""
    seed: int = Field(0, ge=0)
    """The sampled eval's seed, the same at every version: two versions' evals differ by their
    policies, not by their draws."""
    runner: Literal["evaluator", "explorer"] = "evaluator"
    """Who evaluates during the run: `evaluator`, a role of its own with its own rollout engine
    (`streamrft evaluate`; it skips versions rather than fall behind, and never pauses an explorer),
    or `explorer`, the explorer holding slot 0, between its generations (no engine of its own: for
    a GPU with no room for one). `gateway.evaluate` has the gateway evaluate instead (no evaluator)."""
    schedule: Literal["when_free", "fixed"] = "when_free"
    """How the evaluator role picks versions. `when_free`: the newest version, once it is
    `every_versions` past the last one evaluated (a slow eval skips versions, never falls behind).
    `fixed`: every version divisible by `every_versions`, in order, none skipped (a slow eval falls
    behind; when the run ends it evaluates what is queued for up to `drain_s`): two runs, say
    asynchronous and synchronous, are then compared at the same versions."""
    drain_s: float = Field(15.0, ge=0, le=600, **_FINITE)
    """`schedule: fixed`: how long the evaluator goes on with queued versions once told to stop
    (`streamrft run` waits 20 s for its roles, then kills them)."""
    rewards: list[RewardTerm] | None = Field(None, min_length=1)
    """The terms that score the held-out eval; None: `stream_ops.rewards`. Needed when those hold a
    `feedback` term: nobody rates eval episodes (e.g. `[{name: reverse}]`, the rule the raters follow)."""
    nice: int = Field(10, ge=0, le=19)
    """The evaluator role's CPU niceness (`os.nice`, 0 = as every role): on shared cores its evals
    take the cycles the loop leaves, so they never slow the explorers or the trainer; a starved
    evaluator skips versions instead of falling behind (`producers/evaluator.py`)."""

    @model_validator(mode="after")
    def _samples(self) -> "EvalConfig":
        if self.samples > 1 and self.temperature == 0:
            raise ValueError(f"eval.samples={self.samples} needs eval.temperature > 0 (got 0: greedy decoding "
                             f"gives the same completion every time)")
        return self


class StageConfig(Section):
    """A stage before the RL loop, e.g. an SFT warm-up on `data`."""

    type: Literal["sft"] = "sft"
    steps: int = Field(100, ge=1)
    batch_size: int = Field(16, ge=1)
    lr: float = Field(1e-3, gt=0, **_FINITE)
    warmup_steps: int = Field(0, ge=0)
    """Steps of linear learning-rate warm-up from 0 to `lr`."""
    schedule: Literal["constant", "cosine"] = "constant"
    """After the warm-up: `lr` throughout, or a cosine decay to `min_lr_ratio` * `lr` at the last step."""
    min_lr_ratio: float = Field(0.1, ge=0, le=1)
    max_grad_norm: float | None = Field(None, gt=0, **_FINITE)
    """Clip the gradient's global norm to this; None = no clipping."""
    weight_decay: float = Field(0.0, ge=0, **_FINITE)
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
    monitor: MonitorConfig = Field(default_factory=MonitorConfig)
    stages: list[StageConfig] = Field(default_factory=list)
    max_wall_s: float | None = Field(None, gt=0, **_FINITE)
    """`streamrft run` stops the loop after this many seconds of it (None = at trainer.max_steps),
    counted from when its roles start: preparing the data and model, the warm-up `stages` and the
    start eval come before and are not counted (the final line's `wall_s` counts everything)."""
    restarts: RestartConfig = Field(default_factory=RestartConfig)
    fork_roles: bool = False
    """`streamrft run` forks its roles from a server that imported torch and transformers once
    (`launch/roles.py`), instead of starting a fresh interpreter for each (`python -m streamrft.cli
    ROLE`, the default): the roles start seconds sooner on few cores. The CPU demo turns it on."""

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
    def _task_selector(self) -> "RunConfig":
        sel = self.explorer.task_selector
        if self.data.source == "topic" and (sel.import_path or sel.type != "sequential"):
            raise ValueError(f"explorer.task_selector: {sel.import_path or sel.type!r} needs data.source='file' "
                             f"(got 'topic': tasks on the topic are taken once each, in order); allowed with a "
                             f"topic: 'sequential'")
        return self

    @model_validator(mode="after")
    def _eval_rewards(self) -> "RunConfig":
        terms = self.eval.rewards or []
        if self.stream_ops.feedback() is not None and (not terms or any(t.feedback() for t in terms)):
            raise ValueError("eval.rewards: stream_ops.rewards holds a feedback term, which nobody gives eval "
                             "episodes; set eval.rewards to terms that score them (e.g. [{name: reverse}]), "
                             "without feedback")
        return self

    @model_validator(mode="after")
    def _serve_mode(self) -> "RunConfig":
        if self.gateway.mode == "serve" and self.stream_ops.feedback() is None:
            raise ValueError("gateway.mode='serve' publishes users' completions to wait for their ratings: it "
                             "needs a `feedback` term in stream_ops.rewards (docs/feedback.md)")
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
        if t.max_update_kl is not None and t.engine != "torch":
            raise ValueError(f"trainer.max_update_kl needs trainer.engine='torch' (got {t.engine!r}): scaling a step "
                             "back needs the whole weights in one process")
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
    """Apply `a.b.c=value` flags (value parsed as YAML) onto a raw config dict. A number after a
    list names one of its items (`stages.0.steps=50`, `stream_ops.rewards.1.weight=0.2`)."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like section.field=value")
        key, value = item.split("=", 1)
        node: Any = raw
        parts = key.split(".")
        for depth, p in enumerate(parts):
            last = depth == len(parts) - 1
            where = ".".join(parts[:depth]) or "the config"
            if isinstance(node, list):
                if not p.isdigit() or int(p) >= len(node):
                    raise ConfigError(f"override {key!r}: {where} is a list of {len(node)} items; name one by its "
                                      f"index 0-{len(node) - 1} (got {p!r})")
                p = int(p)
            elif not isinstance(node, dict):
                raise ConfigError(f"override {key!r}: {where} is not a section")
            if last:
                node[p] = yaml.load(value, Loader=_Loader)
            else:
                node = node.setdefault(p, {}) if isinstance(node, dict) else node[p]
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


INPUT_PATHS = (("data", "train"), ("data", "eval"), ("model", "path"), ("model", "source"),
               ("trainer", "sft_mix", "path"))
"""Fields naming files the run reads (besides each stage's `data.path`). Written relative, each is
looked for from the working directory first, then next to the config file (`resolve_inputs`)."""


def _next_to(value: Any, folder: Path) -> Any:
    if not isinstance(value, str) or not value or Path(value).is_absolute() or ":" in value.split("/")[0]:
        return value  # absolute, empty or a source like `pypi:...`
    if Path(value).exists():
        return value  # there from the working directory: as before
    there = folder / value
    return str(there.resolve()) if there.exists() else value  # nowhere yet: built or generated here


def resolve_inputs(raw: dict, folder: Path) -> dict:
    """A relative input path that is not there from the working directory but is there next to the
    config file becomes that file's absolute path, so `streamrft run my_project/run.yaml` finds
    `my_project/tasks.jsonl` written as `tasks.jsonl`. Outputs (`output_dir`, `stack.data_dir`)
    stay relative to the working directory, and so does an input found nowhere (a synthetic task
    file or a tiny model is then generated there)."""
    for keys in INPUT_PATHS:
        node = raw
        for k in keys[:-1]:
            node = node.get(k) if isinstance(node, dict) else None
        if isinstance(node, dict) and keys[-1] in node:
            node[keys[-1]] = _next_to(node[keys[-1]], folder)
    for stage in raw.get("stages") or []:
        data = stage.get("data") if isinstance(stage, dict) else None
        if isinstance(data, dict) and "path" in data:
            data["path"] = _next_to(data["path"], folder)
    return raw


def load_config(path: str | Path, overrides: list[str] | None = None) -> RunConfig:
    """The config at `path` (its input files resolved by `resolve_inputs`), then `overrides`,
    whose paths are taken as given (relative to the working directory)."""
    raw = yaml.load(Path(path).read_text(), Loader=_Loader) or {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping")
    return parse_config(apply_overrides(resolve_inputs(raw, Path(path).resolve().parent), overrides or []))


def dump_config(cfg: RunConfig) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
