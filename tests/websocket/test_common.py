"""What the package's WebSockets share, over real loopback sockets: the client (:func:`ws_client.connect`) against
the reference server's transport on both libraries (websockets, picows) moves every byte, and both ends report
closes and drops as the same :class:`WebSocketClosed`; the server side knows its client and parses with its hook;
the allocator setting keeps multi-MB buffers in the process.

The client's own behaviour against peers that misbehave on purpose (handshake refusals, TLS, fragments, pings) is
tests/protocol/test_ws_client.py's; the server transport's limits (storms, handshake timeouts, keepalive) are
tests/server/test_ws_server.py's.
"""

from __future__ import annotations

import importlib.util
import platform
import resource
import socket
import sys
import threading
from typing import Any

import numpy as np
import pytest
from waiting import wait_until
from ws_servers import binary_frame, echo_async

from plugrl_env_client.errors import ConfigError, ProtocolError
from plugrl_env_client.protocol import codec
from plugrl_env_client.server import ws_server
from plugrl_env_client.websocket import client as ws_client
from plugrl_env_client.websocket import common as ws_common
from plugrl_env_client.websocket.common import WebSocketClosed

_NO_PICOWS = pytest.mark.skipif(importlib.util.find_spec("picows") is None, reason="needs the fast extra (picows)")
KINDS = ["websockets", pytest.param("picows", marks=_NO_PICOWS)]


async def recv_one(conn: Any) -> None:
    """Wait for one message: a close or a drop ends up in ``seen``."""
    await conn.recv()


# ------------------------------------------------------------------------------------------------ bytes


@pytest.mark.parametrize("server_kind", KINDS)
def test_round_trips_keep_every_byte(served, server_kind):
    s = served(echo_async, server_kind)
    rng = np.random.default_rng(0)
    big = rng.integers(0, 256, 5 * 2**20 + 3, dtype=np.uint8)
    conn = ws_client.connect(s.url)
    try:
        for payload in [b"x", b"", bytes(range(256)) * 100, big.tobytes()]:
            conn.send_frame(binary_frame(payload))
            assert bytes(conn.recv(timeout=20)) == payload
        # Buffers that are not bytes travel the same (a memoryview of a reused buffer, as the codec's encoder
        # lends out), and the caller may overwrite the buffer as soon as send returns.
        for size in (100, 3 * 2**20):
            buffer = bytearray(rng.integers(0, 256, size, dtype=np.uint8).tobytes())
            expected = bytes(buffer)
            with memoryview(buffer) as view:
                conn.send_frame(binary_frame(view))
            buffer[:] = bytes(size)
            assert bytes(conn.recv(timeout=20)) == expected
    finally:
        conn.close()
    assert not s.errors


@pytest.mark.parametrize("kind", KINDS)
def test_many_frames_in_a_row_arrive_in_order(served, kind):
    got: list[bytes] = []
    done = threading.Event()

    async def collect(conn):
        while len(got) < 40:
            got.append(bytes(await conn.recv()))
        done.set()
        await conn.recv()

    s = served(collect, kind)
    conn = ws_client.connect(s.url)
    frames = [bytes([i]) * (i * 50_000 + 1) for i in range(40)]  # up to 2 MB, sent without waiting
    for frame in frames:
        conn.send_frame(binary_frame(frame))
    assert done.wait(30)
    conn.close()
    assert got == frames


@pytest.mark.parametrize("kind", KINDS)
def test_server_parse_hook_decodes_and_its_errors_come_out_of_recv(served, kind):
    """``serve(parse=codec.unpackb)``: recv returns decoded messages; a broken frame raises from recv and the
    connection goes on."""
    results: list[Any] = []

    async def handler(conn):
        for _ in range(3):
            try:
                results.append(await conn.recv())
            except ProtocolError as exc:
                results.append(exc)
            await conn.send(b"ok")

    s = served(handler, kind, parse=codec.unpackb)
    conn = ws_client.connect(s.url)
    try:
        conn.send_frame(binary_frame(codec.packb({"a": np.arange(5)})))
        conn.recv(timeout=10)
        conn.send_frame(binary_frame(b"\xc1not msgpack"))
        conn.recv(timeout=10)
        conn.send_frame(binary_frame(codec.packb({"b": "text"})))
        conn.recv(timeout=10)
    finally:
        conn.close()
    assert np.array_equal(results[0]["a"], np.arange(5))
    assert isinstance(results[1], ProtocolError) and "not a valid msgpack message" in str(results[1])
    assert results[2] == {"b": "text"}


# ------------------------------------------------------------------------------------------------ closes


@pytest.mark.parametrize("server_kind", KINDS)
@pytest.mark.parametrize("code, reason", [(1001, "plugrl-server-stop"), (1011, "Internal server error."),
                                          (4000, "über")])
def test_server_close_code_and_reason_reach_the_client(served, server_kind, code, reason):
    async def handler(conn):
        await conn.recv()
        await conn.close(code, reason)

    s = served(handler, server_kind)
    conn = ws_client.connect(s.url)
    conn.send_frame(binary_frame(b"bye"))
    with pytest.raises(WebSocketClosed) as info:
        conn.recv(timeout=10)
    assert (info.value.code, info.value.reason) == (code, reason)
    with pytest.raises(WebSocketClosed) as again:  # it stays closed, and says so the same way
        conn.send_frame(binary_frame(b"more"))
        conn.recv(timeout=10)
    assert again.value.code == code
    conn.close()


@pytest.mark.parametrize("server_kind", KINDS)
def test_client_close_reaches_the_server(served, server_kind):
    s = served(recv_one, server_kind)
    conn = ws_client.connect(s.url)
    conn.close(1000)
    conn.close(1000)  # a second close is a no-op
    wait_until(lambda: s.seen, 10, "close seen by the server")
    assert [(e.code, e.reason) for e in s.seen] == [(1000, "")]


@pytest.mark.parametrize("kind", KINDS)
def test_a_client_that_drops_the_socket_is_a_close_without_code_on_the_server(served, kind):
    s = served(recv_one, kind)
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

    async def handler(conn):
        seen["header"] = conn.header("x-plugrl-test")
        seen["missing"] = conn.header("x-not-sent")
        seen["peer"] = conn.remote_address
        await conn.send(b"hi")
        await conn.recv()

    s = served(handler, kind)
    conn = ws_client.connect(s.url, {"X-PlugRL-Test": "3.1"})
    assert conn.recv(timeout=10) == b"hi"
    conn.close()
    assert seen["header"] == "3.1" and seen["missing"] is None and seen["peer"][0] == "127.0.0.1"


# ------------------------------------------------------------------------------------------------ opening


def test_unknown_kind_is_a_config_error():
    with pytest.raises(ConfigError,
                       match="unknown server transport 'carrier-pigeon'; choose one of websockets, picows"):
        ws_server.serve(echo_async, "127.0.0.1", 0, kind="carrier-pigeon")


def test_missing_picows_is_a_config_error_that_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "picows", None)  # import picows now raises ImportError
    ws_server._picows.cache_clear()
    try:
        with pytest.raises(ConfigError, match=r"needs the picows package: pip install 'plugrl-env-client\[fast\]'"):
            ws_server.serve(echo_async, "127.0.0.1", 0, kind="picows")
    finally:
        ws_server._picows.cache_clear()


# ------------------------------------------------------------------------------------------------ timing


@pytest.mark.parametrize("server_kind", KINDS)
def test_recv_timeout_leaves_the_connection_usable(served, server_kind):
    s = served(echo_async, server_kind)
    conn = ws_client.connect(s.url)
    try:
        assert conn.recv(timeout=0.2) is None
        conn.send_frame(binary_frame(b"still here"))
        assert conn.recv(timeout=10) == b"still here"
    finally:
        conn.close()


# ------------------------------------------------------------------------------------------------ allocator


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the setting is glibc's")
def test_freed_multi_mb_buffers_stay_in_the_process():
    """Once applied, allocating three 8 MiB buffers and freeing them, again and again, faults their pages in only
    the first time (glibc's own adaptive threshold keeps one such buffer, not three: without the setting every
    round costs ~6000 page faults)."""
    assert ws_common.retain_freed_memory() is True
    rounds, pages = 20, (8 << 20) // 4096
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(rounds):
        buffers = [bytearray(8 << 20) for _ in range(3)]
        for buffer in buffers:
            buffer[::4096] = b"x" * pages  # touch every page
        del buffers, buffer
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    assert faults < rounds * 3 * pages / 4, f"{faults} page faults for {rounds} rounds of 3 x {pages} pages"


@pytest.mark.slow
@pytest.mark.parametrize("server_kind", KINDS)
def test_server_shutdown_closes_open_connections_as_going_away(served, server_kind):
    s = served(echo_async, server_kind)
    conn = ws_client.connect(s.url)
    conn.send_frame(binary_frame(b"x"))
    assert conn.recv(timeout=10) == b"x"
    s.stop()
    with pytest.raises(WebSocketClosed) as info:
        conn.recv(timeout=10)
    assert info.value.code == 1001
    conn.close()
