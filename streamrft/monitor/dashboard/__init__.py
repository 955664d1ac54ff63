"""`streamrft dashboard CONFIG [CONFIG ...]`: a live page of a run, read from its topics
(docs/dashboard.md); with more than one config, the others' rewards and evals overlaid on it.

`Dashboard(cfg).start()` serves it from a background thread (what `streamrft run` does) and
returns its URL; `serve(cfg)` blocks (the CLI). Port 0 takes a free port: the URL names the real
one. Pieces: `reader.py` (topics -> state, groups read back by offset), `state.py` (aggregation,
downsampling), `feed.py` (what each open page is sent), `trajectories.py` (the viewer), `app.py`
(routes), `static/` (the page; `static/vendor/` is filled by scripts/install.sh).
"""
from __future__ import annotations

import logging
import socket
import threading
import time

from streamrft.config import RunConfig

log = logging.getLogger(__name__)


class Dashboard:
    def __init__(self, cfg: RunConfig, namespace: str | None = None, host: str | None = None,
                 port: int | None = None, compare: list[RunConfig] = ()):
        from streamrft.monitor.dashboard.app import Stats
        from streamrft.monitor.dashboard.reader import GroupFetcher, RunReader
        from streamrft.monitor.dashboard.state import RunState

        if namespace:  # the run's weights in S3 (the tokenizer's fallback) are under its namespace too
            cfg = cfg.model_copy(update={"namespace": namespace})
        d = cfg.monitor.dashboard
        self.cfg, self.host = cfg, host or d.host
        self.state = RunState(cfg.namespace)
        self.reader = RunReader(cfg.kafka, self.state)
        self.others = [RunReader(c.kafka, RunState(c.namespace)) for c in compare]  # runs overlaid
        self.fetcher = GroupFetcher(cfg.kafka)
        self.stats = Stats()
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
        from streamrft.monitor.dashboard.trajectories import ids_text, load_decoder

        while not stop.is_set():
            try:
                self._decode = load_decoder(self.cfg.model.path, WeightStore(self.cfg.s3), self.cfg.weights_key)
            except Exception as e:  # an unreadable tokenizer, S3 away: ids for now, try again
                log.warning("dashboard: tokenizer not loaded (%s); showing token ids", e)
            if self._decode is not None and self._decode is not ids_text:
                with self.state.lock:  # open pages hear of it and ask for text
                    self.state.tokenizer = True
                    self.state.revision += 1
            if self._decode is not None or stop.wait(10.0):
                return

    def _server(self):
        import uvicorn

        from streamrft.infra.media import MediaStore
        from streamrft.monitor.dashboard.app import create_app

        app = create_app([self.state, *(r.state for r in self.others)], lambda: self._decode, self.fetcher,
                         stats=self.stats, media=MediaStore.for_run(self.cfg))
        config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2, lifespan="off")
        return uvicorn.Server(config)

    def start(self) -> str:
        """Read the topics and serve the page from background threads; returns the URL."""
        for r in (self.reader, *self.others):
            r.start()
        self.server = self._server()
        for name, target in (("dashboard-tokenizer", lambda: self._load_decoder(self.reader.stop_event)),
                             ("dashboard-http", lambda: self.server.run(sockets=[self.sock]))):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self.threads.append(t)
        return self.url

    def serve_forever(self) -> None:
        """Serve in this thread until Ctrl-C or SIGTERM (uvicorn's own handlers)."""
        for r in (self.reader, *self.others):
            r.start()
        threading.Thread(target=self._load_decoder, args=(self.reader.stop_event,), name="dashboard-tokenizer",
                         daemon=True).start()
        self.server = self._server()
        try:
            self.server.run(sockets=[self.sock])
        finally:
            for r in (self.reader, *self.others):
                r.stop()
            self.fetcher.close()

    def settle(self, timeout: float = 10.0) -> bool:
        """Once the run's final record is on the metrics topic: wait until this dashboard has read
        it and every open page has been sent it, at most `timeout` s. True if they all have."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.state.lock:
                target = self.state.revision if self.state.finished is not None else None
            if target is not None and all(f.revision is not None and f.revision[0] >= target
                                          for f in list(self.stats.feeds)):
                return True
            time.sleep(0.2)
        return False

    def stop(self) -> None:
        self.reader.stop_event.set()  # the tokenizer thread waits on it too
        self.stats.closing = True  # the live streams end within a push, before the server's grace runs out
        if self.server is not None:
            self.server.should_exit = True
        for t in self.threads:
            t.join(timeout=5)
        for r in (self.reader, *self.others):
            r.stop()
        self.fetcher.close()
        self.sock.close()


def serve(cfg: RunConfig, namespace: str | None = None, host: str | None = None, port: int | None = None,
          compare: list[RunConfig] = ()) -> int:
    dash = Dashboard(cfg, namespace, host, port, compare)
    runs = ", ".join([dash.state.namespace, *(r.state.namespace for r in dash.others)])
    print(f"dashboard: {dash.url} (run {runs}; Ctrl-C to stop)", flush=True)
    dash.serve_forever()
    return 0


__all__ = ["Dashboard", "serve"]
