"""Both transports (websockets, picows) against real loopback servers: bytes, closes, refusals, timeouts, drops.

Every client kind is run against both server kinds of :func:`transport.serve` where the behaviour is the
transport's own, and against a bare websockets server where a test needs a peer that misbehaves on purpose
(drops the socket, refuses the handshake, fragments a message, sends text).
"""

from __future__ import annotations

import importlib.util
import os
import platform
import resource
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from waiting import wait_until
from websockets.sync.server import serve as ws_serve

from plugrl_env_client.errors import ConfigError, ProtocolError
from plugrl_env_client.protocol import codec, transport
from plugrl_env_client.protocol.transport import (
    CertificateNotVerified,
    ConnectFailed,
    HandshakeRefused,
    InvalidServerURL,
    ServerTransport,
    TransportClosed,
)

_NO_PICOWS = pytest.mark.skipif(importlib.util.find_spec("picows") is None, reason="needs the fast extra (picows)")
KINDS = ["websockets", pytest.param("picows", marks=_NO_PICOWS)]
PAIRS = [pytest.param(c, s, marks=_NO_PICOWS) if "picows" in (c, s) else (c, s)
         for c in ("websockets", "picows") for s in ("websockets", "picows")]


class Served:
    """A :func:`transport.serve` server in a thread; records what each handler saw."""

    def __init__(self, handler: Callable[[ServerTransport], None], kind: str, **kwargs: Any) -> None:
        self.errors: list[BaseException] = []
        self.seen: list[Any] = []

        def guarded(conn: ServerTransport) -> None:
            try:
                handler(conn)
            except TransportClosed as exc:
                self.seen.append(exc)
            except BaseException as exc:  # surfaced by the test
                self.errors.append(exc)

        self.server = transport.serve(guarded, "127.0.0.1", 0, kind=kind, **kwargs)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"ws://127.0.0.1:{self.server.address[1]}"

    def stop(self) -> None:
        self.server.shutdown()
        self.thread.join(timeout=10)


@pytest.fixture
def served() -> Iterator[Callable[..., Served]]:
    made: list[Served] = []

    def start(handler: Callable[[ServerTransport], None], kind: str, **kwargs: Any) -> Served:
        s = Served(handler, kind, **kwargs)
        made.append(s)
        return s

    yield start
    for s in made:
        s.stop()


@pytest.fixture
def bare() -> Iterator[Callable[..., str]]:
    """A bare websockets server running ``handler(ws)``; returns its URL."""
    made = []

    def start(handler: Callable[[Any], None], **kwargs: Any) -> str:
        kwargs.setdefault("compression", None)
        kwargs.setdefault("max_size", None)
        server = ws_serve(handler, "127.0.0.1", 0, **kwargs)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        made.append((server, thread))
        return f"ws://127.0.0.1:{server.socket.getsockname()[1]}"

    yield start
    for server, thread in made:
        server.shutdown()
        thread.join(timeout=10)


def echo(conn: ServerTransport) -> None:
    while True:
        conn.send(conn.recv())


# ------------------------------------------------------------------------------------------------ bytes


@pytest.mark.parametrize("client_kind, server_kind", PAIRS)
def test_round_trips_keep_every_byte(served, client_kind, server_kind):
    s = served(echo, server_kind)
    rng = np.random.default_rng(0)
    big = rng.integers(0, 256, 5 * 2**20 + 3, dtype=np.uint8)
    conn = transport.connect(s.url, kind=client_kind)
    try:
        for payload in [b"x", b"", bytes(range(256)) * 100, big.tobytes()]:
            conn.send(payload)
            assert bytes(conn.recv(timeout=20)) == payload
        # Buffers that are not bytes travel the same (a memoryview of a reused buffer, as the codec's encoder
        # lends out), and the caller may overwrite the buffer as soon as send returns.
        for size in (100, 3 * 2**20):
            buffer = bytearray(rng.integers(0, 256, size, dtype=np.uint8).tobytes())
            expected = bytes(buffer)
            with memoryview(buffer) as view:
                conn.send(view)
            buffer[:] = bytes(size)
            assert bytes(conn.recv(timeout=20)) == expected
    finally:
        conn.close()
    assert not s.errors


@pytest.mark.parametrize("kind", KINDS)
def test_many_frames_in_a_row_arrive_in_order(served, kind):
    got: list[bytes] = []
    done = threading.Event()

    def collect(conn):
        while len(got) < 40:
            got.append(bytes(conn.recv()))
        done.set()
        conn.recv()

    s = served(collect, kind)
    conn = transport.connect(s.url, kind=kind)
    frames = [bytes([i]) * (i * 50_000 + 1) for i in range(40)]  # up to 2 MB, sent without waiting
    for frame in frames:
        conn.send(frame)
    assert done.wait(30)
    conn.close()
    assert got == frames


@pytest.mark.parametrize("kind", KINDS)
def test_server_parse_hook_decodes_and_its_errors_come_out_of_recv(served, kind):
    """``serve(parse=codec.unpackb)``: recv returns decoded messages; a broken frame raises from recv and the
    connection goes on."""
    results: list[Any] = []

    def handler(conn):
        for _ in range(3):
            try:
                results.append(conn.recv())
            except ProtocolError as exc:
                results.append(exc)
            conn.send(b"ok")

    s = served(handler, kind, parse=codec.unpackb)
    conn = transport.connect(s.url, kind=kind)
    try:
        conn.send(codec.packb({"a": np.arange(5)}))
        conn.recv(timeout=10)
        conn.send(b"\xc1not msgpack")
        conn.recv(timeout=10)
        conn.send(codec.packb({"b": "text"}))
        conn.recv(timeout=10)
    finally:
        conn.close()
    assert np.array_equal(results[0]["a"], np.arange(5))
    assert isinstance(results[1], ProtocolError) and "not a valid msgpack message" in str(results[1])
    assert results[2] == {"b": "text"}


@pytest.mark.parametrize("kind", KINDS)
def test_text_and_fragmented_messages(bare, kind):
    def handler(ws):
        ws.send("hello")
        ws.send([b"ab", b"cd", b"ef"])  # one message in three frames
        ws.recv()

    conn = transport.connect(bare(handler), kind=kind)
    try:
        assert conn.recv(timeout=10) == "hello"
        assert bytes(conn.recv(timeout=10)) == b"abcdef"
    finally:
        conn.close()


# ------------------------------------------------------------------------------------------------ closes


@pytest.mark.parametrize("client_kind, server_kind", PAIRS)
@pytest.mark.parametrize("code, reason", [(1001, "plugrl-server-stop"), (1011, "Internal server error."),
                                          (4000, "über")])
def test_server_close_code_and_reason_reach_the_client(served, client_kind, server_kind, code, reason):
    def handler(conn):
        conn.recv()
        conn.close(code, reason)

    s = served(handler, server_kind)
    conn = transport.connect(s.url, kind=client_kind)
    conn.send(b"bye")
    with pytest.raises(TransportClosed) as info:
        conn.recv(timeout=10)
    assert (info.value.code, info.value.reason) == (code, reason)
    with pytest.raises(TransportClosed) as again:  # it stays closed, and says so the same way
        conn.send(b"more")
        conn.recv(timeout=10)
    assert again.value.code == code
    conn.close()


@pytest.mark.parametrize("client_kind, server_kind", PAIRS)
def test_client_close_reaches_the_server(served, client_kind, server_kind):
    s = served(lambda conn: conn.recv(), server_kind)
    conn = transport.connect(s.url, kind=client_kind)
    conn.close(1000)
    conn.close(1000)  # a second close is a no-op
    wait_until(lambda: s.seen, 10, "close seen by the server")
    assert [(e.code, e.reason) for e in s.seen] == [(1000, "")]


@pytest.mark.parametrize("kind", KINDS)
def test_a_server_that_drops_the_socket_is_a_close_without_code(bare, kind):
    def handler(ws):
        ws.recv()
        ws.socket.shutdown(socket.SHUT_RDWR)  # no close frame

    conn = transport.connect(bare(handler), kind=kind)
    conn.send(b"x")
    with pytest.raises(TransportClosed) as info:
        conn.recv(timeout=10)
    assert info.value.code is None and "without a close frame" in str(info.value)
    conn.close()


@pytest.mark.parametrize("kind", KINDS)
def test_a_client_that_drops_the_socket_is_a_close_without_code_on_the_server(served, kind):
    s = served(lambda conn: conn.recv(), kind)
    raw = socket.create_connection(("127.0.0.1", int(s.url.rsplit(":", 1)[1])))
    raw.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
    assert raw.recv(4096).startswith(b"HTTP/1.1 101")
    raw.close()
    wait_until(lambda: s.seen, 10, "close seen by the server")
    assert [e.code for e in s.seen] == [None]


@pytest.mark.parametrize("kind", KINDS)
def test_server_side_knows_its_client(served, kind):
    seen = {}

    def handler(conn):
        seen["header"] = conn.header("x-plugrl-test")
        seen["missing"] = conn.header("x-not-sent")
        seen["peer"] = conn.remote_address
        conn.send(b"hi")
        conn.recv()

    s = served(handler, kind)
    conn = transport.connect(s.url, {"X-PlugRL-Test": "3.1"}, kind=kind)
    assert conn.recv(timeout=10) == b"hi"
    conn.close()
    assert seen["header"] == "3.1" and seen["missing"] is None and seen["peer"][0] == "127.0.0.1"


# ------------------------------------------------------------------------------------------------ opening


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("status", [403, 404, 429, 503])
def test_handshake_refused_with_a_status(bare, kind, status):
    url = bare(lambda ws: None, process_request=lambda conn, req: conn.respond(status, "no\n"))
    with pytest.raises(HandshakeRefused) as info:
        transport.connect(url, kind=kind)
    assert info.value.status == status


@pytest.mark.parametrize("kind", KINDS)
def test_nobody_listening_is_a_connect_failure(kind):
    with socket.socket() as bound:  # bound but never listening: the port stays ours and every connect is refused
        bound.bind(("127.0.0.1", 0))
        with pytest.raises(ConnectFailed):
            transport.connect(f"ws://127.0.0.1:{bound.getsockname()[1]}", kind=kind, open_timeout=5)


@pytest.mark.parametrize("kind", KINDS)
def test_a_server_that_never_answers_the_handshake_times_out(kind):
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts (backlog) but never speaks
        start = time.monotonic()
        with pytest.raises(ConnectFailed):
            transport.connect(f"ws://127.0.0.1:{silent.getsockname()[1]}", kind=kind, open_timeout=0.5)
        assert time.monotonic() - start < 10


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("url", ["ws://[::1", "ws://127.0.0.1:99999", "http://127.0.0.1:8000", "ws://h/#frag"])
def test_malformed_urls(kind, url):
    with pytest.raises(InvalidServerURL):
        transport.connect(url, kind=kind)


def test_unknown_kind_is_a_config_error():
    with pytest.raises(ConfigError, match="unknown transport 'carrier-pigeon'; choose one of websockets, picows"):
        transport.connect("ws://127.0.0.1:1", kind="carrier-pigeon")
    with pytest.raises(ConfigError, match="unknown transport"):
        transport.serve(echo, "127.0.0.1", 0, kind="carrier-pigeon")


def test_missing_picows_is_a_config_error_that_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "picows", None)  # import picows now raises ImportError
    transport._picows.cache_clear()
    try:
        with pytest.raises(ConfigError, match=r"needs the picows package: pip install 'plugrl-env-client\[fast\]'"):
            transport.connect("ws://127.0.0.1:1", kind="picows")
        with pytest.raises(ConfigError, match="needs the picows package"):
            transport.serve(echo, "127.0.0.1", 0, kind="picows")
    finally:
        transport._picows.cache_clear()


# ------------------------------------------------------------------------------------------------ timing


@pytest.mark.parametrize("client_kind, server_kind", PAIRS)
def test_recv_timeout_leaves_the_connection_usable(served, client_kind, server_kind):
    s = served(echo, server_kind)
    conn = transport.connect(s.url, kind=client_kind)
    try:
        with pytest.raises(TimeoutError):
            conn.recv(timeout=0.2)
        conn.send(b"still here")
        assert conn.recv(timeout=10) == b"still here"
    finally:
        conn.close()


@pytest.mark.parametrize("kind", KINDS)
def test_server_pings_are_answered_while_the_client_is_busy(bare, kind):
    """While the client's thread is busy elsewhere (no recv for a while), the server's pings are still answered:
    every ping the server sends gets its pong, however loaded the machine (10 s each)."""
    pongs: list[bool] = []
    busy = threading.Event()

    def handler(ws):
        ws.recv()  # the client is connected and now stays away from recv until `busy` is set
        pongs.extend(ws.ping().wait(10) for _ in range(3))
        busy.set()
        ws.send(b"alive")

    conn = transport.connect(bare(handler, ping_interval=None), kind=kind)
    conn.send(b"x")
    assert busy.wait(60), "the pings were not answered in time"
    assert conn.recv(timeout=10) == b"alive"
    conn.close()
    assert pongs == [True, True, True]


# ------------------------------------------------------------------------------------------------ TLS


@pytest.mark.parametrize("kind", KINDS)
def test_wss_with_a_trusted_certificate(bare, tls, monkeypatch, kind):
    cert, context = tls
    url = bare(lambda ws: ws.send(ws.recv()), ssl=context).replace("ws://", "wss://")
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    conn = transport.connect(url, kind=kind)
    try:
        payload = os.urandom(2 * 2**20)
        conn.send(payload)
        assert bytes(conn.recv(timeout=20)) == payload
    finally:
        conn.close()


@pytest.mark.parametrize("kind", KINDS)
def test_wss_with_an_untrusted_certificate(bare, tls, monkeypatch, kind):
    _, context = tls
    url = bare(lambda ws: None, ssl=context).replace("ws://", "wss://")
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    with pytest.raises(CertificateNotVerified) as info:
        transport.connect(url, kind=kind)
    assert "certificate" in info.value.verify_message


# ------------------------------------------------------------------------------------------------ allocator


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the setting is glibc's")
def test_freed_multi_mb_buffers_stay_in_the_process():
    """Once applied, allocating three 8 MiB buffers and freeing them, again and again, faults their pages in only
    the first time (glibc's own adaptive threshold keeps one such buffer, not three: without the setting every
    round costs ~6000 page faults)."""
    assert transport.retain_freed_memory() is True
    rounds, pages = 20, (8 << 20) // 4096
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(rounds):
        buffers = [bytearray(8 << 20) for _ in range(3)]
        for buffer in buffers:
            buffer[::4096] = b"x" * pages  # touch every page
        del buffers, buffer
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    assert faults < rounds * 3 * pages / 4, f"{faults} page faults for {rounds} rounds of 3 x {pages} pages"


@pytest.mark.parametrize("client_kind, server_kind", PAIRS)
def test_server_shutdown_closes_open_connections_as_going_away(served, client_kind, server_kind):
    s = served(echo, server_kind)
    conn = transport.connect(s.url, kind=client_kind)
    conn.send(b"x")
    assert conn.recv(timeout=10) == b"x"
    s.stop()
    with pytest.raises(TransportClosed) as info:
        conn.recv(timeout=10)
    assert info.value.code == 1001
    conn.close()
