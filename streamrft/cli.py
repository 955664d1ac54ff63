"""The `streamrft` command. Thin: parse arguments and config first, import heavy modules late.

`streamrft --help`, `up`, `down`, `status` and `schema` never import torch.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from streamrft.infra.stack import embedded_stack, resolve_clients
from streamrft.launch.commands import add_role_parsers, dispatch, config_args as _config_args


def _stack_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data-dir", default=None, help="where the embedded stack keeps data, logs and PIDs "
                   "(default: the config's stack.data_dir, else .streamrft/stack)")
    p.add_argument("--config", default=None, help="a run config; its kafka/s3/stack sections are used")
    p.add_argument("--kafka-port", type=int, default=None)
    p.add_argument("--s3-port", type=int, default=None)
    p.add_argument("--weed-port-base", type=int, default=None, help="first of SeaweedFS's internal ports")


def _endpoints(args):
    """(StackConfig, KafkaConfig, S3Config) from --config and the flags; flags win."""
    from streamrft.config import KafkaConfig, S3Config, StackConfig, load_config

    if args.config:
        cfg = load_config(args.config, getattr(args, "overrides", []))
        stack, kafka, s3 = cfg.stack, cfg.kafka, cfg.s3
    else:
        stack, kafka, s3 = StackConfig(), KafkaConfig(), S3Config()
    for flag, attr in (("data_dir", "data_dir"), ("kafka_port", "kafka_port"), ("s3_port", "s3_port"),
                       ("weed_port_base", "weed_port_base")):
        if getattr(args, flag, None) is not None:
            setattr(stack, attr, getattr(args, flag))
    return stack, kafka, s3


def cmd_up(args) -> int:
    stack, kafka, s3 = _endpoints(args)
    if not stack.embedded:
        print("config says stack.embedded: false — nothing to start; roles use the external "
              f"kafka {kafka.bootstrap} and s3 {s3.endpoint}")
        return 0
    es = embedded_stack(stack, s3)
    before = es.running()
    state = es.up()
    already = before and all(before.values())
    print(("stack already running" if already else "stack up") + f" (data dir {es.data_dir})")
    print(f"kafka {state.kafka}")
    print(f"s3    http://{state.s3}  buckets: {', '.join(state.buckets)}")
    print(filer_store_line(es, stack.filer_store))
    for name, p in state.procs.items():
        print(f"pid   {name}={p.pid}  log {p.log}")
    return 0


def filer_store_line(es, asked: str) -> str:
    """What `up` says of the data dir's metadata store: which one, and whether it is not the asked one."""
    store = es.filer_store_in_use()
    line = f"store {store} (SeaweedFS metadata, fixed when the data dir was made)"
    if store == "leveldb2":
        line += ("\n      note: leveldb2 slows a run as it ages (0.63x the early rate after an hour, "
                 "docs/broker-growth.md); a data dir made anew uses sqlite")
    elif store != asked:
        line += f"; stack.filer_store: {asked} applies to a new data dir only"
    return line


def cmd_down(args) -> int:
    stack, _, s3 = _endpoints(args)
    es = embedded_stack(stack, s3)
    stopped = es.down()
    print(f"stopped: {', '.join(stopped)}" if stopped else f"nothing running under {es.data_dir}")
    return 0


def cmd_status(args) -> int:
    from streamrft.infra import status

    stack, kafka, s3 = _endpoints(args)
    running = embedded_stack(stack, s3).running() if stack.embedded else {}
    kafka, s3 = resolve_clients(stack, kafka, s3)
    if stack.embedded:
        procs = ", ".join(f"{k}={'up' if v else 'DOWN'}" for k, v in running.items()) or "not started"
        print(f"embedded stack ({stack.data_dir}): {procs}")
    buckets = [s3.bucket, "tansu"] if stack.embedded else [s3.bucket]
    st = status.collect(kafka, s3, buckets, topic_prefix=f"{args.namespace}." if args.namespace else "",
                        namespace=args.namespace)
    print(status.render(st))
    return 0 if st.kafka_ok and st.s3_ok else 1


def cmd_schema(args) -> int:
    from streamrft.schemas import MESSAGES, json_schema

    if args.name:
        try:
            print(json.dumps(json_schema(args.name), indent=2))
        except ValueError as e:
            print(f"streamrft: {e}", file=sys.stderr)
            return 2
    else:
        print(json.dumps({name: json_schema(name) for name in MESSAGES}, indent=2))
    return 0


def cmd_roundtrip(args) -> int:
    from streamrft.infra.roundtrip import roundtrip

    stack, kafka, s3 = _endpoints(args)
    return roundtrip(stack, kafka, s3, keep_up=args.keep_up)


def cmd_prepare(args) -> int:
    from streamrft.config import load_config
    from pathlib import Path

    from streamrft.launch.prepare import PREPARED, prepare
    from streamrft.launch.quiet import quiet_libraries

    quiet_libraries()  # the SFT stages' own bars stay
    cfg = load_config(args.config, args.overrides)
    cfg = prepare(cfg, cache=Path(cfg.output_dir) / PREPARED)  # the stages `streamrft run` reuses
    print(f"prepared: model {cfg.model.path}; train {cfg.data.train}; eval {cfg.data.eval}")
    return 0


def cmd_export(args) -> int:
    """A run's weight version (`--version`, default the newest in S3) or a trainer checkpoint
    (`--checkpoint`) as a plain Hugging Face directory (config, tokenizer, chat template,
    safetensors) that `from_pretrained` loads; a LoRA adapter merged into its base, or with
    `--no-merge-lora` a peft adapter directory. A version takes its base files from S3 when its
    manifest names them, else from `model.path`; a checkpoint from `model.path`. With the embedded
    stack, it is started for a version's export (and stopped again) when it is not running.
    Arguments that name nothing to export exit with 2, as argparse's own errors do."""
    from streamrft.config import load_config

    cfg = load_config(args.config, args.overrides)
    if args.checkpoint is not None:
        return _export_checkpoint(cfg, args)
    from streamrft.engine.weights import export_version
    from streamrft.infra.objectstore import WeightStore

    es = embedded_stack(cfg.stack, cfg.s3) if cfg.stack.embedded else None
    started = es is not None and not any(es.running().values())
    if es is not None:
        es.up()
    try:
        _, s3 = resolve_clients(cfg.stack, cfg.kafka, cfg.s3)
        store = WeightStore(s3)
        versions = store.list_versions(cfg.weights_key)
        if not versions:
            print(f"streamrft: no version of {cfg.weights_key} in s3://{s3.bucket} to export: is this the run's "
                  "config? (a trainer checkpoint exports with --checkpoint DIR)", file=sys.stderr)
            return 2
        version = versions[-1] if args.version is None else args.version
        if version not in versions:
            print(f"streamrft: no version {version} of {cfg.weights_key} in s3://{s3.bucket} (there: {versions})",
                  file=sys.stderr)
            return 2
        try:
            out = export_version(store, cfg.weights_key, version, cfg.model.path, args.out,
                                 merge_lora=args.merge_lora)
        except FileNotFoundError as e:  # no base in S3 and no base directory
            print(f"streamrft: {e}", file=sys.stderr)
            return 1
        print(f"exported {cfg.weights_key} v{version} to {out}")
        return 0
    finally:
        if started:
            es.down()


def _export_checkpoint(cfg, args) -> int:
    """`--checkpoint DIR`: a `v<N>` checkpoint, or a trainer's checkpoint directory (its newest
    complete checkpoint, as a restarted trainer would pick it)."""
    from streamrft.consumers import checkpoint
    from streamrft.engine.weights import export_checkpoint

    ckpt = Path(args.checkpoint)
    if not (ckpt / checkpoint.STATE).is_file():
        found = checkpoint.latest(ckpt)
        if found is None:
            print(f"streamrft: {ckpt} is no trainer checkpoint: neither a v<N> directory with {checkpoint.STATE} nor "
                  "a checkpoint directory holding one", file=sys.stderr)
            return 2
        ckpt = found[0]
    try:
        out = export_checkpoint(ckpt, cfg.model.path, args.out, cfg.model.lora, merge_lora=args.merge_lora)
    except (FileNotFoundError, ValueError) as e:  # no base directory, or a config that does not fit
        print(f"streamrft: {e}", file=sys.stderr)
        return 1
    print(f"exported checkpoint {ckpt} to {out}")
    return 0


def cmd_topics(args) -> int:
    """Create the run's topics (idempotent), so roles never race to create them: a deployment runs
    this once before any role starts, with broker auto-creation off."""
    from streamrft.config import load_config
    from streamrft.infra.kafka import ensure_topics, run_topics

    cfg = load_config(args.config, args.overrides)
    kafka, _ = resolve_clients(cfg.stack, cfg.kafka, cfg.s3)
    topics = run_topics(kafka, cfg.namespace, cfg.teams)
    created = set(ensure_topics(kafka, topics))
    for name, spec in topics.items():
        print(f"{'created' if name in created else 'exists '} {name} partitions={spec.num_partitions}")
    return 0


def cmd_run(args) -> int:
    from streamrft.launch.run import run

    return run(args.config, args.overrides)


def cmd_dashboard(args) -> int:
    """The live page of a run: the config names the broker and the tokenizer (`model.path`); for a
    `streamrft run`, pass its resolved `out/<run>/config.yaml` (or `--namespace <run>`)."""
    from streamrft.config import load_config
    from streamrft.monitor.dashboard import serve

    # `streamrft dashboard A.yaml B.yaml [key=value ...]`: the overrides go to A, the run shown in full;
    # B's rewards and evals are overlaid on A's
    others = [a for a in args.overrides if "=" not in a]
    cfg = load_config(args.config, [a for a in args.overrides if "=" in a])
    compare = [load_config(path, []) for path in others]
    for c in (cfg, *compare):
        if c.stack.embedded:
            c.kafka, c.s3 = resolve_clients(c.stack, c.kafka, c.s3)
    return serve(cfg, args.namespace, args.host, args.port, compare)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="streamrft", description="Reinforcement fine-tuning on Kafka and S3.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("up", help="start the embedded Kafka broker and S3 server (idempotent)")
    _stack_args(p)
    p.set_defaults(fn=cmd_up)
    p = sub.add_parser("down", help="stop exactly what `up` started")
    _stack_args(p)
    p.set_defaults(fn=cmd_down)
    p = sub.add_parser("status", help="health, topics and end offsets, consumer lag, buckets")
    _stack_args(p)
    p.add_argument("--namespace", default=None, help="only this run's topics (faster on a busy cluster)")
    p.set_defaults(fn=cmd_status)
    p = sub.add_parser("schema", help="print the JSON Schema of a message (all when no name)")
    p.add_argument("name", nargs="?", help="task, trajectory, rollout_group, experience_group, "
                   "weight_version, metric, dead_letter")
    p.set_defaults(fn=cmd_schema)
    p = sub.add_parser("roundtrip", help="stack up, produce/consume and weight publish/fetch, stack down")
    _stack_args(p)
    p.add_argument("--keep-up", action="store_true", help="leave the stack running afterwards")
    p.set_defaults(fn=cmd_roundtrip)
    p = sub.add_parser("run", help="a whole run: stack, explorers, stream ops, trainer, progress")
    _config_args(p)
    p.set_defaults(fn=cmd_run)
    p = sub.add_parser("prepare", help="build the model, data and warm-up stages a config names (idempotent)")
    _config_args(p)
    p.set_defaults(fn=cmd_prepare)
    p = sub.add_parser("export", help="a weight version or trainer checkpoint as a Hugging Face model directory")
    _config_args(p)
    which = p.add_mutually_exclusive_group()
    which.add_argument("--version", type=int, default=None, help="the version in S3 (default: the newest)")
    which.add_argument("--checkpoint", default=None, metavar="DIR",
                       help="a trainer checkpoint v<N> directory, or the trainer's checkpoint directory (its newest)")
    p.add_argument("--merge-lora", action=argparse.BooleanOptionalAction, default=True,
                   help="merge a LoRA adapter into its base (default), or write the peft adapter directory")
    p.add_argument("--out", required=True, help="the directory to write")
    p.set_defaults(fn=cmd_export)
    p = sub.add_parser("topics", help="create the run's topics if missing (idempotent) and list them")
    _config_args(p)
    p.set_defaults(fn=cmd_topics)
    p = sub.add_parser("dashboard", help="serve the live web page of a run (charts, trajectories, dead letters); "
                       "more configs after the first overlay their runs' rewards and evals")
    _config_args(p)
    p.add_argument("--namespace", default=None, help="the run's namespace (default: the config's; "
                   "`streamrft run` names its runs <namespace>-<date>-<time>)")
    p.add_argument("--host", default=None, help="default: monitor.dashboard.host (127.0.0.1)")
    p.add_argument("--port", type=int, default=None, help="default: monitor.dashboard.port; 0 = a free port")
    p.set_defaults(fn=cmd_dashboard)
    add_role_parsers(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    return dispatch(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
