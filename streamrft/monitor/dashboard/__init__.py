"""`streamrft dashboard CONFIG`: a live page of one run, read from its topics (docs/dashboard.md).

`Dashboard(cfg).start()` serves it from a background thread (what `streamrft run` does) and
returns its URL; `serve(cfg)` blocks (the CLI). Port 0 takes a free port: the URL names the real
one. Pieces: `reader.py` (topics -> state), `state.py` (aggregation), `trajectories.py` (the
viewer), `app.py` (routes), `static/` (the page; `static/vendor/` is filled by scripts/install.sh).
"""
from __future__ import annotations

import logging
import socket
import threading

from streamrft.config import RunConfig

log = logging.getLogger(__name__)


class Dashboard:
    def __init__(self, cfg: RunConfig, namespace: str | None = None, host: str | None = None,
                 port: int | None = None):
        from streamrft.monitor.dashboard.reader import RunReader
        from streamrft.monitor.dashboard.state import RunState

        if namespace:  # the run's weights in S3 (the tokenizer's fallback) are under its namespace too
            cfg = cfg.model_copy(update={"namespace": namespace})
        d = cfg.monitor.dashboard
        self.cfg, self.host = cfg, host or d.host
        self.state = RunState(cfg.namespace)
        self.reader = RunReader(cfg.kafka, self.state)
        # bound here, before serving: with port 0 the URL must name the port really taken
        self.sock = socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((self.host, d.port if port is None else port))
        self.sock.listen(128)  # a browser opened as soon as the URL is printed waits, not fails
        self.port = self.sock.getsockname()[1]
        self._decode = None
        self.server = None
        self.threads: list[threading.Thread] = []

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/"

    def _load_decoder(self, stop: threading.Event) -> None:
        """In the background (seconds: transformers' import): `model.path`'s tokenizer, else the one
        in S3 beside the run's versions, looked for every 10 s until the first version is there."""
        from streamrft.infra.objectstore import WeightStore
        from streamrft.monitor.dashboard.trajectories import load_decoder

        while not stop.is_set():
            try:
                self._decode = load_decoder(self.cfg.model.path, WeightStore(self.cfg.s3), self.cfg.weights_key)
            except Exception as e:  # an unreadable tokenizer, S3 away: ids for now, try again
                log.warning("dashboard: tokenizer not loaded (%s); showing token ids", e)
            if self._decode is not None or stop.wait(10.0):
                return

    def _server(self):
        import uvicorn

        from streamrft.monitor.dashboard.app import create_app

        app = create_app(self.state, lambda: self._decode)
        config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2, lifespan="off")
        return uvicorn.Server(config)

    def start(self) -> str:
        """Read the topics and serve the page from background threads; returns the URL."""
        self.reader.start()
        self.server = self._server()
        for name, target in (("dashboard-tokenizer", lambda: self._load_decoder(self.reader.stop_event)),
                             ("dashboard-http", lambda: self.server.run(sockets=[self.sock]))):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self.threads.append(t)
        return self.url

    def serve_forever(self) -> None:
        """Serve in this thread until Ctrl-C or SIGTERM (uvicorn's own handlers)."""
        self.reader.start()
        threading.Thread(target=self._load_decoder, args=(self.reader.stop_event,), name="dashboard-tokenizer",
                         daemon=True).start()
        self.server = self._server()
        try:
            self.server.run(sockets=[self.sock])
        finally:
            self.reader.stop()

    def stop(self) -> None:
        self.reader.stop_event.set()  # the tokenizer thread waits on it too
        if self.server is not None:
            self.server.should_exit = True
        for t in self.threads:
            t.join(timeout=5)
        self.reader.stop()
        self.sock.close()


def serve(cfg: RunConfig, namespace: str | None = None, host: str | None = None, port: int | None = None) -> int:
    dash = Dashboard(cfg, namespace, host, port)
    print(f"dashboard: {dash.url} (run {dash.state.namespace}; Ctrl-C to stop)", flush=True)
    dash.serve_forever()
    return 0


__all__ = ["Dashboard", "serve"]
