"""The role commands: what `streamrft explore|evaluate|serve|score|join|train|replay|feed` run. `streamrft
run` starts its roles with these (`launch.roles`: forked, `main(args)`, or `python -m
streamrft.launch.commands ARGS`); the `streamrft` command (`cli.py`) adds their parsers to its own.
Heavy modules are imported by each command, not here.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path


def config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="run config YAML")
    p.add_argument("overrides", nargs="*", help="dotted overrides, e.g. trainer.lr=1e-6")


def role_config(args):
    """The config of a role started alone: its overrides applied, the embedded stack's endpoints
    resolved, the prepared data and model paths filled in."""
    from streamrft.config import load_config
    from streamrft.infra.stack import resolve_clients
    from streamrft.launch.prepare import prepare

    cfg = load_config(args.config, args.overrides)
    if cfg.stack.embedded:
        # a role started alone joins the embedded stack recorded under the data dir
        cfg.kafka, cfg.s3 = resolve_clients(cfg.stack, cfg.kafka, cfg.s3)
    # resolves the prepared data/model paths; builds them only if `streamrft prepare` did not
    return prepare(cfg)


def _logging() -> None:
    import logging

    from streamrft.launch.quiet import quiet_libraries

    quiet_libraries()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")


def cmd_feed(args) -> int:
    from streamrft.producers.feeder import feed_tasks

    cfg = role_config(args)
    n = feed_tasks(cfg, args.file, args.epochs)
    print(f"fed {n} tasks to {cfg.namespace}.tasks")
    return 0


def cmd_explore(args) -> int:
    _logging()
    from streamrft.producers.explorer import run_explorer

    return run_explorer(role_config(args), args.index)


def cmd_evaluate(args) -> int:
    _logging()
    from streamrft.producers.evaluator import run_evaluator

    return run_evaluator(role_config(args))


def cmd_serve(args) -> int:
    _logging()
    from streamrft.producers.gateway import serve

    if getattr(args, "mode", None):
        args.overrides = [*args.overrides, f"gateway.mode={args.mode}"]
    return serve(role_config(args))


def cmd_train(args) -> int:
    _logging()
    from streamrft.config import OFFLINE_TYPES

    cfg = role_config(args)
    if cfg.algorithm.type in OFFLINE_TYPES:
        from streamrft.consumers.offline import run_offline

        return run_offline(cfg, publish=args.publish)
    from streamrft.consumers.trainer import relaunch_under_torchrun, run_trainer

    code = relaunch_under_torchrun(cfg, ["train", args.config, *args.overrides])
    return run_trainer(cfg) if code is None else code


def cmd_replay(args) -> int:
    if args.feedback is not None:
        return _replay_feedback(args)
    args.overrides = [*args.overrides, f"trainer.replay.namespace={args.source}",
                      f"trainer.replay.from_offset={args.from_offset}"]
    for flag in ("from_timestamp_ms", "to_offset", "to_timestamp_ms"):
        if getattr(args, flag) is not None:
            args.overrides.append(f"trainer.replay.{flag}={getattr(args, flag)}")
    if args.range:
        ranges = {}
        for r in args.range:
            m = re.fullmatch(r"(\d+):(\d+)-(\d+)", r)
            if m is None:
                raise SystemExit(f"--range {r!r}: expected PARTITION:START-END (offsets, END exclusive)")
            ranges[int(m[1])] = [int(m[2]), int(m[3])]
        args.overrides.append("trainer.replay.partitions={" + ", ".join(f"{p}: {v}" for p, v in ranges.items()) + "}")
    if args.rollouts is not None:
        args.overrides.append(f"trainer.replay.rollouts_team={args.rollouts}")
    return cmd_train(args)


def _replay_feedback(args) -> int:
    """`replay --feedback TEAM`: DPO pairs or KTO labels from the source's ratings, then offline training."""
    _logging()
    from streamrft.config import load_config
    from streamrft.consumers.feedback_data import build_feedback_dataset
    from streamrft.infra.stack import resolve_clients

    cfg = load_config(args.config, args.overrides)
    if cfg.algorithm.type not in ("dpo", "kto"):
        raise SystemExit(f"replay --feedback: algorithm.type={cfg.algorithm.type!r}; allowed: 'dpo' (pairs from "
                         f"preferences and ratings), 'kto' (ratings as desirable or not)")
    cfg.kafka, cfg.s3 = resolve_clients(cfg.stack, cfg.kafka, cfg.s3)
    path = Path(cfg.output_dir) / f"feedback-{cfg.algorithm.type}.jsonl"
    counts = build_feedback_dataset(cfg, args.source, args.feedback, path, cfg.algorithm.type, args.feedback_threshold,
                                    args.from_timestamp_ms, args.to_timestamp_ms)
    print(f"replay --feedback {args.feedback}: {counts.get('rows', 0)} {cfg.algorithm.type} rows from "
          f"{counts.get('ratings', 0)} ratings of {args.source} ({counts}) -> {path}", flush=True)
    if not counts.get("rows"):
        raise SystemExit("replay --feedback: no rows to train on")
    args.overrides = [*args.overrides, f"data.train={path}"]
    return cmd_train(args)


def cmd_score(args) -> int:
    _logging()
    from streamrft.stream_ops.cli_entry import cmd_score as score

    return score(args)


def cmd_join(args) -> int:
    _logging()
    from streamrft.config import load_config
    from streamrft.infra.stack import resolve_clients
    from streamrft.stream_ops.feedback.joiner import run_joiner

    cfg = load_config(args.config, args.overrides)
    cfg.kafka, cfg.s3 = resolve_clients(cfg.stack, cfg.kafka, cfg.s3)
    return run_joiner(cfg)


def add_role_parsers(sub) -> None:
    """The role commands' parsers, on `sub` (an `add_subparsers` result)."""
    p = sub.add_parser("feed", help="publish a dataset file's rows as tasks on the run's tasks topic")
    config_args(p)
    p.add_argument("--file", default=None, help="JSONL/Parquet of tasks (default: data.train)")
    p.add_argument("--epochs", type=int, default=1)
    p.set_defaults(fn=cmd_feed)
    p = sub.add_parser("explore", help="run one explorer")
    config_args(p)
    p.add_argument("--index", type=int, default=0, help="this explorer's index (its task shard)")
    p.set_defaults(fn=cmd_explore)
    p = sub.add_parser("evaluate", help="run the evaluator: held-out eval of the run's weight versions as they come")
    config_args(p)
    p.set_defaults(fn=cmd_evaluate)
    p = sub.add_parser("serve", help="run the rollout gateway: an OpenAI-compatible endpoint for other teams' agents")
    config_args(p)
    p.add_argument("--mode", choices=["train", "serve"], default=None,
                   help="serve: to users, recording no episode; each call's completions wait for their ratings "
                        "(gateway.mode)")
    p.set_defaults(fn=cmd_serve)
    p = sub.add_parser("replay", help="train on a range of another run's retained experiences (or rollouts) topic")
    config_args(p)
    p.add_argument("--source", required=True, help="namespace of the run whose experiences are replayed")
    p.add_argument("--from-offset", type=int, default=0)
    p.add_argument("--from-timestamp-ms", type=int, default=None)
    p.add_argument("--to-offset", type=int, default=None, help="stop every partition before this offset")
    p.add_argument("--to-timestamp-ms", type=int, default=None, help="stop before the first record at/after this time")
    p.add_argument("--range", action="append", default=[], metavar="P:START-END",
                   help="only partition P's offsets [START, END); repeat for more partitions (others skipped)")
    p.add_argument("--rollouts", metavar="TEAM", default=None,
                   help="replay <source>.rollouts.TEAM, scored again with this config's rewards")
    p.add_argument("--feedback", metavar="TEAM", default=None,
                   help="train offline (algorithm.type dpo or kto) on <source>.feedback.TEAM's ratings of the "
                        "source's rollouts: DPO pairs from preferences and ratings, or KTO labels")
    p.add_argument("--feedback-threshold", type=float, default=0.5,
                   help="--feedback with kto: an answer is desirable when its mean rating is at least this")
    p.add_argument("--publish", action="store_true", help=argparse.SUPPRESS)
    p.set_defaults(fn=cmd_replay)
    p = sub.add_parser("score", help="run one stream-ops worker (validate, score, advantages)")
    config_args(p)
    p.set_defaults(fn=cmd_score)
    p = sub.add_parser("join", help="run the feedback join: parked groups meet their ratings (a `feedback` term)")
    config_args(p)
    p.set_defaults(fn=cmd_join)
    p = sub.add_parser("train", help="run the trainer (online RL, or offline sft/dpo/kto)")
    config_args(p)
    p.add_argument("--publish", action="store_true", help="offline: publish the result as weight version <steps>")
    p.set_defaults(fn=cmd_train)


def dispatch(parser: argparse.ArgumentParser, argv: list[str] | None) -> int:
    """Parse `argv` and run the chosen command; a bad config exits 2 with its message."""
    from streamrft.config import ConfigError

    args = parser.parse_args(argv)
    try:
        return args.fn(args) or 0
    except ConfigError as e:
        print(f"streamrft: {e}", file=sys.stderr)
        return 2


def main(argv: list[str] | None = None) -> int:
    """One role command (a forked role's entry point)."""
    parser = argparse.ArgumentParser(prog="streamrft", description="A streamrft role.")
    add_role_parsers(parser.add_subparsers(dest="command", required=True))
    return dispatch(parser, argv)


if __name__ == "__main__":
    sys.exit(main())
