"""Before a run starts: synthetic data, the model (built here or imported from `model.source`), warm-up
stages. Idempotent.

Returns the config the roles will run with: `data.train/eval` pointing at the generated files and
`model.path` at the last stage's output (the RL loop's version 0).
"""
from __future__ import annotations

import json
from pathlib import Path

from streamrft.config import RunConfig, StageConfig


_SPEC_KEYS = ("task", "train_size", "eval_size", "seed")
EVAL_SEED_OFFSET = 10_000
"""An environment's eval tasks are drawn with seed + this: other draws than its train tasks."""


def _synthetic_rows(spec: dict, split: str, n: int) -> list[dict]:
    """`n` tasks of `spec["task"]`: the reverse demo, arithmetic for an instruct model
    (`addition`), or a shipped environment's (`envs.TASKS`), called with the spec's other keys
    (e.g. `high: 8` for guess_number)."""
    from streamrft.producers import arithmetic_tasks
    from streamrft.producers.envs import TASKS
    from streamrft.producers.synthetic import make_demo_tasks

    task, seed = spec.get("task", "reverse"), spec.get("seed", 0)
    params = {k: v for k, v in spec.items() if k not in _SPEC_KEYS}
    if task == "reverse":
        return make_demo_tasks(n, seed=seed, split=split, **params)
    if task == "addition":
        return arithmetic_tasks.make_tasks(n, seed=seed, split=split, **params)
    if task not in TASKS:
        raise ValueError(f"data.synthetic.task={task!r} is not one of {['reverse', 'addition', *sorted(TASKS)]}")
    return TASKS[task](n, seed=seed + (EVAL_SEED_OFFSET if split == "eval" else 0), **params)


def prepare_data(cfg: RunConfig, out: Path) -> None:
    from streamrft.producers.synthetic import write_jsonl

    spec = cfg.data.synthetic
    if not spec:
        return
    for split, attr, size in (("train", "train", spec.get("train_size", 2000)), ("eval", "eval", spec.get("eval_size", 100))):
        path = Path(getattr(cfg.data, attr) or out / "data" / f"{split}.jsonl")
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            write_jsonl(_synthetic_rows(spec, split, size), path)
        setattr(cfg.data, attr, str(path))


def prepare_model(cfg: RunConfig) -> None:
    """`model.path` holds a model: imported once from `model.source` (a GGUF converted, ~25 s for SmolLM2)
    or built from `model.build`."""
    from streamrft.consumers.offline import ensure_model

    ensure_model(cfg)


def _stage_pairs(stage: StageConfig, cfg: RunConfig) -> list[tuple[str, str]]:
    """A stage's (prompt, completion) pairs: a JSONL `path`; with `judge: {template}`, the reversal
    judge's lessons (`producers.judge_data`); or the synthetic task's warm-up pairs (`complete_frac`
    of them with the full answer, the rest with only its first letter)."""
    from streamrft.producers.synthetic import make_warmup_pairs

    data = stage.data
    if "path" in data:
        rows = [json.loads(line) for line in Path(data["path"]).read_text().splitlines() if line.strip()]
        return [(r["prompt"], r["completion"]) for r in rows]
    spec = {**(cfg.data.synthetic or {}), **data.get("synthetic", {})}
    lens = {k: spec[k] for k in ("min_len", "max_len") if k in spec}
    if "judge" in data:
        from streamrft.producers.judge_data import JUDGE_TEMPLATE, make_judge_pairs

        return make_judge_pairs(data.get("size", 500), seed=data.get("seed", 0),
                                template=(data["judge"] or {}).get("template", JUDGE_TEMPLATE), **lens)
    return make_warmup_pairs(data.get("size", 500), seed=data.get("seed", 0),
                             complete_frac=data.get("complete_frac", 1.0), **lens)


def _stage_demonstrations(stage: StageConfig, cfg: RunConfig):
    """A stage with `data.demos` (player weights, e.g. `{bisect: 0.1, linear: 0.9}`): a function
    of the tokenizer giving `data.size` episodes of the explorer's environment played by scripted
    players (`envs.PLAYERS`), on fresh tasks of the same generator as `data.synthetic`, laid out
    token for token as the multi-turn workflows lay out the model's episodes."""
    from streamrft.producers.envs import PLAYERS, TASKS, env_factory
    from streamrft.producers.workflows.demonstrations import mixture
    from streamrft.producers.workflows.episodes import TurnLimits
    from streamrft.schemas import Task

    ex, data = cfg.explorer, stage.data
    kind = ex.env.type if ex.env is not None and not ex.env.import_path else None
    if kind not in PLAYERS:
        raise ValueError(f"stage data.demos needs explorer.env.type in {sorted(PLAYERS)} (its scripted players), "
                         f"got {kind!r}")
    spec = cfg.data.synthetic or {}
    params = {k: v for k, v in spec.items() if k not in _SPEC_KEYS} if spec.get("task") == kind else {}
    rows = TASKS[kind](data.get("size", 500), seed=data.get("seed", 0), **params)
    tasks = [Task(task_id=r["task_id"], prompt=r["prompt"], answer=r["answer"]) for r in rows]
    env = env_factory(kind, None, ex.env.params)
    limits = TurnLimits(ex.max_turns, ex.max_total_tokens)

    def sequences(tokenizer) -> list[tuple[list[int], list[int]]]:
        demos = mixture(tokenizer, tasks, env, PLAYERS[kind], dict(data["demos"]), seed=data.get("seed", 0),
                        limits=limits, chat=ex.chat_template)
        return [(d.ids, d.loss_mask) for d in demos]

    return sequences


def run_stages(cfg: RunConfig, out: Path, logger=None) -> None:
    """The stages not built yet, each step's loss logged as `stage/<i>/loss` to `logger` (a
    `MetricLogger`), or, when None and a stage has to run, to one of this run's own."""
    from streamrft.consumers.offline import sft_stage

    own = None
    try:
        for i, stage in enumerate(cfg.stages):
            dest = out / f"stage-{i}-{stage.type}"
            if not (dest / "config.json").exists():
                if logger is None:
                    from streamrft.monitor.loggers import MetricLogger

                    logger = own = MetricLogger.for_run(cfg)
                print(f"stage {i} ({stage.type}): {stage.steps} steps ...", flush=True)
                examples = _stage_demonstrations(stage, cfg) if "demos" in stage.data else _stage_pairs(stage, cfg)
                sft_stage(cfg.model.path, str(dest), stage, examples, seed=cfg.trainer.seed, index=i, logger=logger)
            cfg.model.path = str(dest)
    finally:
        if own is not None:
            own.close()


def prepare(cfg: RunConfig, logger=None) -> RunConfig:
    """Data, model and stages for `cfg` (idempotent); the stages log to `logger` (see `run_stages`)."""
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    prepare_data(cfg, out)
    prepare_model(cfg)
    run_stages(cfg, out, logger)
    # absolute paths: the roles may run with another working directory (faust does)
    cfg.model.path = str(Path(cfg.model.path).resolve())
    cfg.data.train = cfg.data.train and str(Path(cfg.data.train).resolve())
    cfg.data.eval = cfg.data.eval and str(Path(cfg.data.eval).resolve())
    return cfg
