"""A fault-injecting TCP proxy, for tests and benchmarks of roles on a bad network.

`FaultProxy(target)` listens on 127.0.0.1 and forwards every connection to `target` ("host:port"),
byte for byte, from a thread of its own (asyncio). Faults, switched on and off while it runs, for
connections open at that moment and for new ones:

- `slow(latency_s, jitter_s, bandwidth_bps)`: each chunk of bytes arrives `latency_s` (+- a seeded
  uniform `jitter_s`) after it was sent, in order, and each direction of a connection carries at
  most `bandwidth_bps` bytes a second;
- `reset()`: every open connection is closed with a TCP reset, both sides (once; new ones work);
- `half_open()`: connections stay open and new ones are accepted, but no byte passes either way
  (a peer that died without closing, a NAT that lost its entry, a black hole): a client notices
  only through its own timeouts;
- `partition()`: every open connection is reset and new ones are refused (the port stops
  listening), as when a host is cut off and its peers reject it;
- `heal()`: all of the above off.

toxiproxy does this as a server of its own; it is not installable here. Kafka clients find the
broker through its advertised address, so a proxy in front of Tansu must be the address it
advertises (`EmbeddedStack.tansu_advertised_port`); an S3 client needs only its endpoint.
"""
from __future__ import annotations

import asyncio
import random
import socket
import struct
import threading
import time
from dataclasses import dataclass

CHUNK = 64 << 10


@dataclass
class Faults:
    latency_s: float = 0.0
    jitter_s: float = 0.0
    bandwidth_bps: float | None = None
    half_open: bool = False
    partitioned: bool = False


class FaultProxy:
    def __init__(self, target: str, port: int = 0, seed: int = 0):
        host, target_port = target.rsplit(":", 1)
        self.target = (host, int(target_port))
        self.faults = Faults()
        self.rng = random.Random(seed)
        self.connections = 0  # accepted so far
        self.bytes = 0  # forwarded so far, both directions
        self._open: set[asyncio.Transport] = set()
        self._server: asyncio.base_events.Server | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"faultproxy-{target}", daemon=True)
        self._thread.start()
        self.port = self._call(self._listen(port))

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    # ---- faults (called from any thread) ----

    def slow(self, latency_s: float = 0.0, jitter_s: float = 0.0, bandwidth_bps: float | None = None) -> None:
        self.faults.latency_s, self.faults.jitter_s, self.faults.bandwidth_bps = latency_s, jitter_s, bandwidth_bps

    def reset(self) -> None:
        self._call(self._reset_all())

    def half_open(self) -> None:
        self.faults.half_open = True

    def partition(self) -> None:
        self.faults.partitioned = True
        self._call(self._stop_listening())
        self._call(self._reset_all())

    def heal(self) -> None:
        self.faults.half_open = False
        self.slow()
        if self.faults.partitioned:
            self.faults.partitioned = False
            self._call(self._listen(self.port))

    def close(self) -> None:
        if self._loop.is_closed():
            return
        self._call(self._stop_listening())
        self._call(self._reset_all())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    # ---- the proxy ----

    def _call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(30)

    async def _listen(self, port: int) -> int:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", port, reuse_address=True)
        return self._server.sockets[0].getsockname()[1]

    async def _stop_listening(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None

    async def _reset_all(self) -> None:
        for transport in list(self._open):
            _abort(transport)
        self._open.clear()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._open.add(writer.transport)
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            _abort(writer.transport)
            self._open.discard(writer.transport)
            return
        self._open.add(up_writer.transport)
        pumps = [asyncio.ensure_future(self._pump(reader, up_writer)),
                 asyncio.ensure_future(self._pump(up_reader, writer))]
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for p in pumps:
                p.cancel()
            for w in (writer, up_writer):
                self._open.discard(w.transport)
                w.transport.close()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Copy one direction, each chunk delivered at its time, in order, at most at the bandwidth."""
        queue: asyncio.Queue = asyncio.Queue()

        async def deliver() -> None:
            while True:
                due, data = await queue.get()
                if data is None:
                    writer.write_eof() if writer.can_write_eof() else writer.close()
                    return
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                if self.faults.half_open or self.faults.partitioned:
                    continue  # swallowed: nothing reaches the other side
                writer.write(data)
                await writer.drain()
                self.bytes += len(data)
                if self.faults.bandwidth_bps:
                    await asyncio.sleep(len(data) / self.faults.bandwidth_bps)

        sender = asyncio.ensure_future(deliver())
        last_due = 0.0
        try:
            while True:
                data = await reader.read(CHUNK)
                f = self.faults
                delay = f.latency_s + (self.rng.uniform(-f.jitter_s, f.jitter_s) if f.jitter_s else 0.0)
                last_due = max(last_due, time.monotonic() + max(0.0, delay))
                await queue.put((last_due, data or None))
                if not data:
                    break
            await sender
        except (ConnectionError, OSError):
            pass
        finally:
            sender.cancel()


def _abort(transport: asyncio.BaseTransport) -> None:
    """Close with a TCP reset (SO_LINGER 0), not a FIN: the peer sees ECONNRESET."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    transport.abort()
