"""The fault-injecting TCP proxy, in front of a real echo server: bytes pass unchanged, and each
fault does to a client what it does on a real network."""
import socket
import threading
import time

import pytest

from streamrft.infra.faultproxy import FaultProxy


@pytest.fixture
def echo():
    server = socket.create_server(("127.0.0.1", 0))
    conns: list[socket.socket] = []

    def serve(conn: socket.socket) -> None:
        with conn:
            try:
                while data := conn.recv(65536):
                    conn.sendall(data)
            except OSError:  # the proxy reset it
                pass

    def accept() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            conns.append(conn)
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    yield f"127.0.0.1:{server.getsockname()[1]}"
    server.close()
    for c in conns:
        try:
            c.close()
        except OSError:
            pass


@pytest.fixture
def proxy(echo):
    p = FaultProxy(echo, seed=1)
    yield p
    p.close()


def _client(proxy: FaultProxy, timeout: float = 5.0) -> socket.socket:
    return socket.create_connection(("127.0.0.1", proxy.port), timeout=timeout)


def _roundtrip(sock: socket.socket, payload: bytes) -> bytes:
    sock.sendall(payload)
    got = b""
    while len(got) < len(payload):
        chunk = sock.recv(65536)
        if not chunk:
            break
        got += chunk
    return got


def test_bytes_pass_unchanged(proxy):
    payload = bytes(range(256)) * 4096  # 1 MiB
    with _client(proxy) as c:
        assert _roundtrip(c, payload) == payload
    # the proxy counts a chunk after forwarding it: the client may hold the last one before it is counted
    deadline = time.monotonic() + 5
    while proxy.bytes < 2 * len(payload) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert proxy.connections == 1 and proxy.bytes >= 2 * len(payload)


def test_latency_and_bandwidth_slow_each_direction(proxy):
    with _client(proxy) as c:
        proxy.slow(latency_s=0.3, jitter_s=0.05)
        t0 = time.monotonic()
        assert _roundtrip(c, b"ping") == b"ping"
        assert time.monotonic() - t0 >= 2 * 0.25  # there and back, each at least latency - jitter
        proxy.slow(bandwidth_bps=200_000)
        t0 = time.monotonic()
        payload = b"x" * 200_000
        assert _roundtrip(c, payload) == payload
        assert time.monotonic() - t0 >= 0.9  # 200 kB at 200 kB/s, the first chunk's time aside
        proxy.heal()
        assert _roundtrip(c, b"fast") == b"fast"


def test_reset_closes_open_connections_with_a_reset_and_new_ones_work(proxy):
    c = _client(proxy)
    assert _roundtrip(c, b"a") == b"a"
    proxy.reset()
    with pytest.raises((ConnectionResetError, BrokenPipeError)):
        for _ in range(50):  # the reset may come back on the send or on the read
            c.sendall(b"b")
            if not c.recv(10):
                raise ConnectionResetError("closed")
            time.sleep(0.05)
    c.close()
    with _client(proxy) as fresh:
        assert _roundtrip(fresh, b"c") == b"c"


def test_half_open_connections_never_answer_until_healed(proxy):
    with _client(proxy, timeout=1.0) as c:
        assert _roundtrip(c, b"a") == b"a"
        proxy.half_open()
        with pytest.raises(socket.timeout):
            _roundtrip(c, b"b")  # sent fine, never answered
        with _client(proxy, timeout=1.0) as new:  # accepted, then silent
            with pytest.raises(socket.timeout):
                _roundtrip(new, b"c")
    proxy.heal()
    with _client(proxy) as fresh:
        assert _roundtrip(fresh, b"d") == b"d"


def test_partition_resets_and_refuses_until_healed(proxy):
    c = _client(proxy)
    assert _roundtrip(c, b"a") == b"a"
    proxy.partition()
    with pytest.raises(ConnectionRefusedError):
        _client(proxy)
    with pytest.raises((ConnectionResetError, BrokenPipeError, socket.timeout)):
        c.sendall(b"b")
        if not c.recv(10):
            raise ConnectionResetError("closed")
    c.close()
    proxy.heal()
    with _client(proxy) as fresh:
        assert _roundtrip(fresh, b"c") == b"c"
