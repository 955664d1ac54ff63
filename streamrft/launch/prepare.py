"""Before a run starts: synthetic data, a locally built model, warm-up stages. Idempotent.

Returns the config the roles will run with: `data.train/eval` pointing at the generated files and
`model.path` at the last stage's output (the RL loop's version 0).
"""
from __future__ import annotations

import json
from pathlib import Path

from streamrft.config import RunConfig, StageConfig


def _synthetic_rows(spec: dict, split: str, n: int) -> list[dict]:
    from streamrft.producers.synthetic import make_demo_tasks

    task = spec.get("task", "reverse")
    if task != "reverse":
        raise ValueError(f"data.synthetic.task={task!r} is not one of ['reverse']")
    lens = {k: spec[k] for k in ("min_len", "max_len", "letters") if k in spec}
    return make_demo_tasks(n, seed=spec.get("seed", 0), split=split, **lens)


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
    from streamrft.consumers.offline import ensure_model

    ensure_model(cfg)


def _stage_pairs(stage: StageConfig, cfg: RunConfig) -> list[tuple[str, str]]:
    """A stage's (prompt, completion) pairs: a JSONL `path`, or the synthetic task's warm-up pairs
    (`complete_frac` of them with the full answer, the rest with only its first letter)."""
    from streamrft.producers.synthetic import make_warmup_pairs

    data = stage.data
    if "path" in data:
        rows = [json.loads(line) for line in Path(data["path"]).read_text().splitlines() if line.strip()]
        return [(r["prompt"], r["completion"]) for r in rows]
    spec = {**(cfg.data.synthetic or {}), **data.get("synthetic", {})}
    lens = {k: spec[k] for k in ("min_len", "max_len") if k in spec}
    return make_warmup_pairs(data.get("size", 500), seed=data.get("seed", 0),
                             complete_frac=data.get("complete_frac", 1.0), **lens)


def run_stages(cfg: RunConfig, out: Path) -> None:
    from streamrft.consumers.offline import sft_stage

    for i, stage in enumerate(cfg.stages):
        dest = out / f"stage-{i}-{stage.type}"
        if not (dest / "config.json").exists():
            print(f"stage {i} ({stage.type}): {stage.steps} steps ...", flush=True)
            sft_stage(cfg.model.path, str(dest), stage, _stage_pairs(stage, cfg), seed=cfg.trainer.seed)
        cfg.model.path = str(dest)


def prepare(cfg: RunConfig) -> RunConfig:
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    prepare_data(cfg, out)
    prepare_model(cfg)
    run_stages(cfg, out)
    # absolute paths: the roles may run with another working directory (faust does)
    cfg.model.path = str(Path(cfg.model.path).resolve())
    cfg.data.train = cfg.data.train and str(Path(cfg.data.train).resolve())
    cfg.data.eval = cfg.data.eval and str(Path(cfg.data.eval).resolve())
    return cfg
