"""`streamrft score CONFIG [section.field=value ...]`: run one stream-ops worker until SIGTERM/SIGINT.

`cmd_score(args)` reads `args.config` and `args.overrides` (plus optional `args.worker_id` and
`args.stop_after`) and returns an exit code; the worker runs in a child process, replaced by a fresh
one while the broker is away (`infra/supervise.py`); against the embedded stack it uses the broker recorded
in the stack's data dir. `python -m streamrft.stream_ops.cli_entry CONFIG [overrides]` does the same.
"""
from __future__ import annotations

import os
import socket
import sys


def cmd_score(args) -> int:
    import signal

    # stopped before the faust worker installs its own handlers: nothing is consumed yet, exit clean
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    from streamrft.infra.stack import resolve_clients
    from streamrft.config import dump_config, load_config

    cfg = load_config(args.config, list(getattr(args, "overrides", None) or []))
    kafka, _ = resolve_clients(cfg.stack, cfg.kafka, cfg.s3)
    cfg = cfg.model_copy(update={"kafka": kafka})
    worker_id = getattr(args, "worker_id", None) or f"{socket.gethostname()}-{os.getpid()}"
    shown = cfg.model_copy(update={"kafka": kafka.model_copy(update={"password": kafka.password and "***"})})
    print(f"stream-ops worker {worker_id}, resolved config:\n{dump_config(shown)}", file=sys.stderr)

    from streamrft.infra.supervise import replace_on_outage
    from streamrft.stream_ops.app import run_worker  # late: faust and torch

    # a worker that failed because the broker did not answer is replaced by a fresh one (it redoes
    # what was not committed); this process, the role, lives on through the outage
    return replace_on_outage(lambda: run_worker(cfg, worker_id, stop_after=getattr(args, "stop_after", None)),
                             f"stream-ops worker {worker_id}")


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(prog="python -m streamrft.stream_ops.cli_entry")
    parser.add_argument("config")
    parser.add_argument("overrides", nargs="*")
    parser.add_argument("--worker-id", default=None)
    parser.add_argument("--stop-after", type=float, default=None, help="stop cleanly after this many seconds")
    sys.exit(cmd_score(parser.parse_args()))
