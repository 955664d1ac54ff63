"""Before a run starts: synthetic data, the model (built here or imported from `model.source`), warm-up
stages. Idempotent.

Returns the config the roles will run with: `data.train/eval` pointing at the generated files and
`model.path` at the last stage's output (the RL loop's version 0). `streamrft prepare` and
`streamrft run` keep the stages in `<output_dir>/prepared/`, by a hash of what each is built from
(`stage_key`): a run reuses what `prepare` or an earlier run built.
"""
from __future__ import annotations

import json
from pathlib import Path

from streamrft.config import RunConfig, StageConfig


PREPARED = "prepared"
"""The folder under `output_dir` where `streamrft prepare` and `streamrft run` keep warm-up stages."""
_SPEC_KEYS = ("task", "train_size", "eval_size", "seed")
EVAL_SEED_OFFSET = 10_000
"""An environment's eval tasks are drawn with seed + this: other draws than its train tasks."""


def _synthetic_rows(spec: dict, split: str, n: int, folder: Path) -> list[dict]:
    """`n` tasks of `spec["task"]`: the reverse demo, arithmetic for an instruct model
    (`addition`), pictures for a vision-language model (`images`: `producers/image_tasks.py`,
    each written to `folder/images/`), or a shipped environment's (`envs.TASKS`), called with the
    spec's other keys (e.g. `high: 8` for guess_number, `kinds: [count, digit]` for images)."""
    from streamrft.producers import arithmetic_tasks
    from streamrft.producers.envs import TASKS
    from streamrft.producers.synthetic import make_demo_tasks

    task, seed = spec.get("task", "reverse"), spec.get("seed", 0)
    params = {k: v for k, v in spec.items() if k not in _SPEC_KEYS}
    if task == "reverse":
        return make_demo_tasks(n, seed=seed, split=split, **params)
    if task == "addition":
        return arithmetic_tasks.make_tasks(n, seed=seed, split=split, **params)
    if task == "images":
        from streamrft.producers.image_tasks import make_image_tasks

        rows = make_image_tasks(n, folder / "images", seed=seed, split=split, **params)
        return [{**r, "image": f"images/{r['image']}"} for r in rows]  # a path relative to the task file
    if task not in TASKS:
        raise ValueError(f"data.synthetic.task={task!r} is not one of {['reverse', 'addition', 'images', *sorted(TASKS)]}")
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
            write_jsonl(_synthetic_rows(spec, split, size, path.parent), path)
        setattr(cfg.data, attr, str(path))


def prepare_model(cfg: RunConfig) -> None:
    """`model.path` holds a model: imported once from `model.source` (a GGUF converted, ~25 s for SmolLM2)
    or built from `model.build`."""
    from streamrft.consumers.offline import ensure_model

    ensure_model(cfg)


def _stage_pairs(stage: StageConfig, cfg: RunConfig) -> list[tuple]:
    """A stage's (prompt, completion) pairs: a JSONL `path`; with `judge: {template}`, the reversal
    judge's lessons (`producers.judge_data`); for the synthetic `images` task, (question, answer,
    [picture]) of `data.size` fresh training pictures (`producers/image_tasks.py`, drawn with
    `data.seed`, never an eval one), `decoy_frac` of them answered with their kind's decoy
    (`image_tasks.decoy_answers`); or the synthetic task's warm-up pairs (`complete_frac` of them
    with the full answer, the rest with only its first letter)."""
    from streamrft.producers.synthetic import make_warmup_pairs

    data = stage.data
    if "path" in data:
        rows = [json.loads(line) for line in Path(data["path"]).read_text().splitlines() if line.strip()]
        return [(r["prompt"], r["completion"]) for r in rows]
    spec = {**(cfg.data.synthetic or {}), **data.get("synthetic", {})}
    if spec.get("task") == "images":
        from streamrft.producers.image_tasks import decoy_answers, draw_tasks

        params = {k: tuple(v) if k == "kinds" else v for k, v in spec.items() if k in ("kinds", "size")}
        drawn = list(draw_tasks(data.get("size", 500), seed=data.get("seed", 0), split="train", **params))
        rows = decoy_answers([row for row, _, _ in drawn], data.get("decoy_frac", 0.0), seed=data.get("seed", 0))
        return [(row["prompt"], row["answer"], [im]) for row, (_, im, _) in zip(rows, drawn)]
    lens = {k: spec[k] for k in ("min_len", "max_len") if k in spec}
    if "judge" in data:
        from streamrft.producers.judge_data import JUDGE_TEMPLATE, make_judge_pairs

        return make_judge_pairs(data.get("size", 500), seed=data.get("seed", 0),
                                template=(data["judge"] or {}).get("template", JUDGE_TEMPLATE), **lens)
    return make_warmup_pairs(data.get("size", 500), seed=data.get("seed", 0),
                             complete_frac=data.get("complete_frac", 1.0), **lens)


def _stage_demonstrations(stage: StageConfig, cfg: RunConfig):
    """A stage with `data.demos` (player weights, e.g. `{bisect: 0.1, linear: 0.9}`): a function
    of the tokenizer giving `data.size` episodes of the explorer's environment played by its
    scripted players (`envs.env_players`: a shipped environment's, or your own's `PLAYERS`), laid
    out token for token as the multi-turn workflows lay out the model's episodes. Their tasks: a
    shipped environment's generator (as `data.synthetic` draws them, fresh ones), or for your own
    environment `data.size` rows of `data.train`, drawn with `data.seed`."""
    import random

    from streamrft.producers.envs import PLAYERS, TASKS, env_factory, env_players
    from streamrft.producers.tasks import load_task_file
    from streamrft.producers.workflows.demonstrations import mixture
    from streamrft.producers.workflows.episodes import TurnLimits
    from streamrft.schemas import Task

    ex, data = cfg.explorer, stage.data
    if ex.env is None:
        raise ValueError("stage data.demos plays explorer.env's scripted players: explorer.env is not set")
    players = env_players(ex.env.type, ex.env.import_path)
    if not players and ex.env.import_path:
        raise ValueError(f"stage data.demos needs the environment's scripted players: explorer.env.import_path "
                         f"{ex.env.import_path!r} has no PLAYERS dict (on its class or in its module: "
                         "{name: player(task, env, turns) -> action text})")
    if not players:
        raise ValueError(f"stage data.demos needs explorer.env.type in {sorted(PLAYERS)} (its scripted players), or "
                         f"your own environment (explorer.env.import_path) with a PLAYERS dict; got {ex.env.type!r}")
    size, seed = data.get("size", 500), data.get("seed", 0)
    if ex.env.import_path:
        if not cfg.data.train:
            raise ValueError("stage data.demos with your own environment plays data.train's tasks: data.train is not set")
        pool = load_task_file(cfg.data.train, cfg.data.prompt_key, cfg.data.answer_key)
        rng = random.Random(seed)
        tasks = [rng.choice(pool) for _ in range(size)]
    else:
        kind = ex.env.type
        spec = cfg.data.synthetic or {}
        params = {k: v for k, v in spec.items() if k not in _SPEC_KEYS} if spec.get("task") == kind else {}
        tasks = [Task(task_id=r["task_id"], prompt=r["prompt"], answer=r["answer"])
                 for r in TASKS[kind](size, seed=seed, **params)]
    env = env_factory(ex.env.type, ex.env.import_path, ex.env.params)
    limits = TurnLimits(ex.max_turns, ex.max_total_tokens)

    def sequences(tokenizer) -> list[tuple[list[int], list[int]]]:
        demos = mixture(tokenizer, tasks, env, players, dict(data["demos"]), seed=seed, limits=limits,
                        chat=ex.chat_template)
        return [(d.ids, d.loss_mask) for d in demos]

    return sequences


def _fingerprint(path: Path) -> str:
    """What identifies a model directory or a data file here: names, sizes and modification times,
    and config.json's text (a model rebuilt in place changes them)."""
    import hashlib

    h = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path] if path.exists() else []
    for f in files:
        st = f.stat()
        h.update(f"{f.relative_to(path) if path.is_dir() else f.name}:{st.st_size}:{st.st_mtime_ns};".encode())
    if (path / "config.json").exists():
        h.update((path / "config.json").read_bytes())
    return h.hexdigest()


def stage_key(cfg: RunConfig, i: int, base: str) -> str:
    """A hash of everything stage `i` is built from: the model it starts from (`base`: the fingerprint
    of `model.path`, or the previous stage's key), the stage, the data and environment settings its
    examples come from, and the seed. Equal keys build equal models, so a run reuses a stage built
    before (by `streamrft prepare` or an earlier run)."""
    import hashlib

    stage = cfg.stages[i]
    files = [stage.data.get("path"), cfg.data.train if "demos" in stage.data else None]
    ex = cfg.explorer
    what = {"base": base, "stage": stage.model_dump(mode="json"), "synthetic": cfg.data.synthetic,
            "files": {f: _fingerprint(Path(f)) for f in files if f},
            "env": ex.env.model_dump(mode="json") if ex.env is not None else None,
            "limits": [ex.max_turns, ex.max_total_tokens, ex.chat_template], "seed": cfg.trainer.seed}
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:16]


def run_stages(cfg: RunConfig, out: Path, logger=None, cache: Path | None = None) -> None:
    """The stages not built yet, each step's loss logged as `stage/<i>/loss` to `logger` (a
    `MetricLogger`), or, when None and a stage has to run, to one of this run's own.

    With `cache`, stage `i` is built once in `cache/<stage_key>-stage-<i>-<type>` and
    `out/stage-<i>-<type>` links to it: runs of the same config (and `streamrft prepare`) share it."""
    import os
    import shutil

    from streamrft.consumers.offline import sft_stage

    own = None
    base = _fingerprint(Path(cfg.model.path)) if cache is not None and cfg.stages else ""
    try:
        for i, stage in enumerate(cfg.stages):
            dest = out / f"stage-{i}-{stage.type}"
            built = dest
            if cache is not None:
                base = stage_key(cfg, i, base)
                built = cache / f"{base}-stage-{i}-{stage.type}"
            if not (built / "config.json").exists():
                if logger is None:
                    from streamrft.monitor.loggers import MetricLogger

                    logger = own = MetricLogger.for_run(cfg)
                print(f"stage {i} ({stage.type}): {stage.steps} steps ...", flush=True)
                examples = _stage_demonstrations(stage, cfg) if "demos" in stage.data else _stage_pairs(stage, cfg)
                tmp = built.with_name(f".tmp-{os.getpid()}-{built.name}")
                shutil.rmtree(tmp, ignore_errors=True)
                sft_stage(cfg.model.path, str(tmp), stage, examples, seed=cfg.trainer.seed, index=i, logger=logger)
                if (built / "config.json").exists():  # another process built it meanwhile: the same model
                    shutil.rmtree(tmp)
                else:
                    shutil.rmtree(built, ignore_errors=True)  # a crashed build's leftovers
                    os.replace(tmp, built)
            elif built != dest:
                print(f"stage {i} ({stage.type}): reusing {built}", flush=True)
            if built != dest:
                dest.parent.mkdir(parents=True, exist_ok=True)
                if dest.is_symlink():
                    dest.unlink()
                elif dest.exists():  # built here before stages were shared
                    shutil.rmtree(dest)
                dest.symlink_to(built.resolve(), target_is_directory=True)
            cfg.model.path = str(dest)
    finally:
        if own is not None:
            own.close()


def prepare(cfg: RunConfig, logger=None, cache: Path | None = None) -> RunConfig:
    """Data, model and stages for `cfg` (idempotent); the stages log to `logger` and are shared
    through `cache` (see `run_stages`)."""
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    prepare_data(cfg, out)
    prepare_model(cfg)
    run_stages(cfg, out, logger, cache)
    # absolute paths: the roles may run with another working directory (faust does)
    cfg.model.path = str(Path(cfg.model.path).resolve())
    cfg.data.train = cfg.data.train and str(Path(cfg.data.train).resolve())
    cfg.data.eval = cfg.data.eval and str(Path(cfg.data.eval).resolve())
    return cfg
