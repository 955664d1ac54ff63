"""Helpers of the gateway tests (not a test module): a real gateway: the tiny char model (or SmolLM2), the shared embedded stack, uvicorn
on a free port in a thread of the test process, and the official `openai` client pointed at it."""
from __future__ import annotations

import socket
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from streamrft.config import load_config
from streamrft.producers.gateway.teams import digest
from tests_helpers import stack_overrides

ROOT = Path(__file__).resolve().parents[1]
KEYS = {"agents": "sk-agents-test", "lab": "sk-lab-test"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Served:
    url: str
    cfg: object
    gw: object
    engine: object

    def client(self, team: str = "agents", **kw):
        from openai import OpenAI

        return OpenAI(base_url=self.url + "/v1", api_key=KEYS[team], max_retries=0, **kw)


def gateway_config(stack, out: Path, namespace: str, extra: list[str] = (), model_path: Path | None = None):
    """The gateway's run config on `stack`: the tiny char model built under `out`, or the model already
    at `model_path` (e.g. the converted SmolLM2: no `model.build`, nothing built or imported)."""
    from streamrft.launch.prepare import prepare

    teams = ", ".join(f"{{name: {t}, key_sha256: {digest(k)}}}" for t, k in KEYS.items())
    model = [] if model_path is None else [f"model.path={model_path}", "model.build=null"]
    cfg = load_config(ROOT / "examples" / "cpu_demo.yaml", [
        *stack_overrides(stack, out), *model, f"namespace={namespace}", "stages=[]",
        "data.synthetic={task: reverse, train_size: 50, eval_size: 8, min_len: 3, max_len: 5, seed: 0}",
        "explorer.num_explorers=0", "gateway.enabled=true", f"gateway.teams=[{teams}]", f"gateway.port={free_port()}",
        "explorer.group_size=2", "explorer.max_total_tokens=64", "explorer.sampling.max_new_tokens=8",
        "trainer.batch_groups=2", "trainer.max_staleness=1", *extra])
    return prepare(cfg)


@contextmanager
def serving(cfg) -> Iterator[Served]:
    import uvicorn

    from streamrft.producers.gateway import build_gateway

    app, gw = build_gateway(cfg)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=cfg.gateway.port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the gateway did not start"
        time.sleep(0.05)
    try:
        yield Served(f"http://127.0.0.1:{cfg.gateway.port}", cfg, gw, gw.worker.engine)
    finally:
        server.should_exit = True
        thread.join(60)
