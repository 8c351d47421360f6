"""The one-thread WebSocket client over real loopback sockets: websockets' own server (which misbehaves on purpose
where a test needs it: fragments, drops, refuses, pings) and the project's reference policy server."""

from __future__ import annotations

import contextlib
import os
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from websockets.frames import Frame, Opcode
from ws_servers import binary_frame, echo

from plugrl_env_client.envs.base_env import Observation
from plugrl_env_client.protocol import codec, messages
from plugrl_env_client.protocol.dialing import SessionConfig
from plugrl_env_client.protocol.exchange import ConnectionLost
from plugrl_env_client.protocol.frame_packer import FramePacker
from plugrl_env_client.protocol.session import Session
from plugrl_env_client.server.policies import PolicyConfig, make_policy
from plugrl_env_client.server.server import PolicyServer
from plugrl_env_client.websocket import client as ws_client
from plugrl_env_client.websocket.common import (
    CertificateNotVerified,
    ConnectFailed,
    HandshakeRefused,
    InvalidServerURL,
    WebSocketClosed,
)


@pytest.fixture
def reference() -> Iterator[PolicyServer]:
    server = PolicyServer(make_policy(PolicyConfig(action_dim=2, action_horizon=4, seed=0)), port=0).start()
    yield server
    server.shutdown()


# ------------------------------------------------------------------------------------------------ opening


def test_handshake_sends_the_callers_headers(bare):
    seen: dict[str, Any] = {}

    def handler(ws):
        seen.update(ws.request.headers.raw_items())
        ws.send(b"hello")  # sent right after the 101: may arrive in the same read as the handshake answer
        ws.recv()

    client = ws_client.connect(bare(handler), {"Authorization": "Api-Key s3cret", messages.STREAM_HEADER: "3.1"})
    try:
        assert client.recv(timeout=10) == b"hello"
        client.send_frame(binary_frame(b"done"))
    finally:
        client.close()
    assert seen["Authorization"] == "Api-Key s3cret" and seen[messages.STREAM_HEADER] == "3.1"
    assert "websockets" in seen["User-Agent"]


@pytest.mark.parametrize("status", [401, 403, 404, 429, 500, 503])
def test_an_http_refusal_is_handshake_refused_with_its_status(bare, status):
    url = bare(lambda ws: None, process_request=lambda conn, req: conn.respond(status, "no\n"))
    with pytest.raises(HandshakeRefused) as info:
        ws_client.connect(url, open_timeout=10)
    assert info.value.status == status


def test_a_server_that_never_answers_the_handshake_is_a_connect_failure_within_the_open_timeout():
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts (backlog) but never speaks
        start = time.monotonic()
        with pytest.raises(ConnectFailed, match="did not answer the WebSocket handshake within 0.5 s"):
            ws_client.connect(f"ws://127.0.0.1:{silent.getsockname()[1]}", open_timeout=0.5)
        assert time.monotonic() - start < 0.5 + 2  # the open timeout, plus scheduling on a loaded machine


def test_nobody_listening_is_a_connect_failure():
    with socket.socket() as bound:  # bound but never listening: the port stays ours and every connect is refused
        bound.bind(("127.0.0.1", 0))
        with pytest.raises(ConnectFailed):
            ws_client.connect(f"ws://127.0.0.1:{bound.getsockname()[1]}", open_timeout=5)


def test_a_server_that_hangs_up_during_the_handshake_is_a_connect_failure():
    with socket.create_server(("127.0.0.1", 0)) as listener:
        def hang_up():
            conn, _ = listener.accept()
            conn.recv(4096)
            conn.close()

        thread = threading.Thread(target=hang_up)
        thread.start()
        with pytest.raises(ConnectFailed, match="handshake failed"):
            ws_client.connect(f"ws://127.0.0.1:{listener.getsockname()[1]}", open_timeout=10)
        thread.join(timeout=10)


@pytest.mark.parametrize("url", ["ws://[::1", "ws://127.0.0.1:99999", "http://127.0.0.1:8000", "ws://h/#frag"])
def test_malformed_urls(url):
    with pytest.raises(InvalidServerURL):
        ws_client.connect(url)


def test_wss_with_a_trusted_certificate(bare, tls, monkeypatch):
    cert, context = tls
    url = bare(echo, ssl=context).replace("ws://", "wss://")
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    client = ws_client.connect(url)
    try:
        for n in (0, 126, 70_000, 3 << 20):  # the big one spans many TLS records
            payload = os.urandom(n)
            client.send_frame(binary_frame(payload))
            assert bytes(client.recv(timeout=20)) == payload
    finally:
        client.close()


def test_wss_with_an_untrusted_certificate(bare, tls, monkeypatch):
    _, context = tls
    url = bare(lambda ws: None, ssl=context).replace("ws://", "wss://")
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    with pytest.raises(CertificateNotVerified) as info:
        ws_client.connect(url)
    assert "certificate" in info.value.verify_message


# ------------------------------------------------------------------------------------------------ bytes


@pytest.mark.parametrize("n", [0, 1, 125, 126, 65535, 65536, 5 << 20])
def test_binary_messages_of_every_length_encoding_keep_every_byte(bare, n):
    """0-125 B (7-bit length), 126-65535 B (16-bit), 65536 B and up (64-bit); 5 MiB takes several reads."""
    client = ws_client.connect(bare(echo))
    try:
        payload = os.urandom(n)
        client.send_frame(binary_frame(payload))
        assert bytes(client.recv(timeout=20)) == payload
        client.send_frame(binary_frame(memoryview(payload)[n // 2:]))  # any contiguous buffer, a view included
        assert bytes(client.recv(timeout=20)) == payload[n // 2:]
    finally:
        client.close()


def test_many_messages_in_one_read_come_out_one_by_one_in_order(bare):
    def handler(ws):
        ws.recv()
        for i in range(50):
            ws.send(i.to_bytes(2, "big"))
        ws.recv()

    client = ws_client.connect(bare(handler))
    try:
        client.send_frame(binary_frame(b"go"))
        assert [int.from_bytes(client.recv(timeout=10), "big") for _ in range(50)] == list(range(50))
        client.send_frame(binary_frame(b"done"))
    finally:
        client.close()


def test_fragmented_and_text_messages_from_the_server(bare):
    def handler(ws):
        ws.send([b"ab", b"cd", b"ef"])  # one binary message in three frames (continuations)
        ws.send(["hel", "lo"])  # one text message in two frames
        ws.send(os.urandom(1) * (3 << 20))
        ws.send([b"x" * (1 << 20), b"y" * (2 << 20)])  # multi-MB fragments
        ws.recv()

    client = ws_client.connect(bare(handler))
    try:
        assert bytes(client.recv(timeout=10)) == b"abcdef"
        assert client.recv(timeout=10) == "hello"
        assert len(client.recv(timeout=10)) == 3 << 20
        assert bytes(client.recv(timeout=10)) == b"x" * (1 << 20) + b"y" * (2 << 20)
        client.send_frame(binary_frame(b"done"))
    finally:
        client.close()


def test_frames_from_the_packer_reach_the_server_as_the_codecs_bytes(bare):
    got: list[bytes] = []

    def handler(ws):
        for frame in ws:
            got.append(frame)
            ws.send(b"ok")

    client = ws_client.connect(bare(handler))
    images = np.arange(16 * 64 * 64 * 3, dtype=np.uint8).reshape(16, 64, 64, 3)
    msg = {"small": np.arange(3), "images": {"cam": images}, "text": "über"}
    try:
        for compiled in (True, False):  # both routes to the frame
            client.send_frame(FramePacker(compiled).pack(msg))
            assert client.recv(timeout=10) == b"ok"
    finally:
        client.close()
    assert got == [codec.packb(msg)] * 2


def _reader(read: Callable[[socket.socket], bytes]) -> tuple[str, threading.Thread, list[bytes]]:
    """A one-connection server that answers the opening handshake, then keeps what each ``read`` of the socket
    returns until the client's side ends."""
    got: list[bytes] = []

    def answer(accept: bytes) -> bytes:
        return (b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                b"Sec-WebSocket-Accept: " + accept + b"\r\n\r\n")

    def keep(conn: socket.socket) -> None:
        try:
            got.extend(iter(lambda: read(conn), b""))
        finally:
            listener.close()

    url, thread, listener = _raw_server(answer, after=keep)
    return url, thread, got


def test_a_frame_sent_with_more_goes_out_with_the_next_one_in_one_write():
    url, thread, got = _reader(lambda conn: conn.recv(1 << 16))
    client = ws_client.connect(url, open_timeout=10, close_timeout=0.2)
    first, second = binary_frame(b"feedback" * 100), binary_frame(b"infer")
    client.send_frame(first, more=True)
    client.send_frame(second)
    client.close()
    thread.join(timeout=10)
    assert not thread.is_alive()
    assert got[0] == first + second, "both frames in the first read: one write"
    assert b"".join(got).startswith(first + second) and len(b"".join(got)) > len(first + second)  # then the close


def test_a_held_frame_goes_out_before_the_close_and_large_ones_one_after_the_other():
    url, thread, got = _reader(lambda conn: conn.recv(1 << 22))
    client = ws_client.connect(url, open_timeout=10, close_timeout=0.2)
    big, small = binary_frame(bytes(ws_client.JOIN_MAX)), binary_frame(b"next")
    client.send_frame(big, more=True)
    client.send_frame(small, more=True)  # the big one is written now, this one held
    client.close(4000, "bye")
    thread.join(timeout=10)
    stream = b"".join(got)
    assert stream.startswith(big + small), "in order, the held one before the close"
    assert stream[len(big) + len(small)] == 0x88, "then the close frame"


# ------------------------------------------------------------------------------------------------ polling


def test_recv_with_timeout_zero_returns_nothing_yet_without_raising(bare):
    client = ws_client.connect(bare(echo))
    try:
        assert client.recv(timeout=0) is None
        assert client.service() is False
        start = time.monotonic()
        assert client.recv(timeout=0.2) is None
        assert time.monotonic() - start >= 0.2
        client.send_frame(binary_frame(b"back"))
        assert client.recv(timeout=10) == b"back"
    finally:
        client.close()


def test_service_reads_what_arrived_and_recv_zero_then_hands_it_out(bare):
    sent = threading.Event()

    def handler(ws):
        ws.recv()
        ws.send(b"reply")
        sent.set()
        ws.recv()

    client = ws_client.connect(bare(handler))
    try:
        client.send_frame(binary_frame(b"ask"))
        assert sent.wait(10)
        assert select.select([client], [], [], 10)[0] == [client]  # the reply is in the socket, not read yet
        assert client.service() is True and client.has_message
        assert client.recv(timeout=0) == b"reply"
        client.send_frame(binary_frame(b"done"))
    finally:
        client.close()


def test_wait_any_returns_the_connections_with_a_message(bare):
    release = threading.Event()

    def handler(ws):
        name = ws.recv()
        if name == b"slow":
            release.wait(10)
        ws.send(name)
        ws.recv()

    url = bare(handler)
    fast, slow = ws_client.connect(url), ws_client.connect(url)
    try:
        assert ws_client.wait_any([fast, slow], timeout=0) == []
        slow.send_frame(binary_frame(b"slow"))
        fast.send_frame(binary_frame(b"fast"))
        assert ws_client.wait_any([fast, slow], timeout=10) == [fast]
        assert fast.recv(timeout=0) == b"fast"
        release.set()
        assert ws_client.wait_any([fast, slow], timeout=10) == [slow]
        assert slow.recv(timeout=0) == b"slow"
    finally:
        for client in (fast, slow):
            client.send_frame(binary_frame(b"done"))
            client.close()


ECHO_SERVER = """
import sys, threading
from websockets.sync.server import serve
def echo(ws):
    for message in ws:
        ws.send(message)
server = serve(echo, "127.0.0.1", 0, compression=None, max_size=None)
threading.Thread(target=server.serve_forever, daemon=True).start()
print(server.socket.getsockname()[1], flush=True)
sys.stdin.read()  # ends with the test (or when the test process dies and the pipe closes)
"""


def test_no_thread_reads_the_socket_but_the_callers():
    """The server is another process, so every thread of this one is the client's: there is none but ours."""
    server = subprocess.Popen([sys.executable, "-c", ECHO_SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        before = set(threading.enumerate())
        client = ws_client.connect(f"ws://127.0.0.1:{port}")
        for n in (10, 1 << 20):
            client.send_frame(binary_frame(b"x" * n))
            assert len(client.recv(timeout=10)) == n
            assert client.recv(timeout=0) is None
        assert set(threading.enumerate()) - before == set()  # (threads of earlier tests may end meanwhile)
        client.close()
    finally:
        server.communicate("", timeout=10)


@pytest.mark.parametrize("raw, code, words", [
    (bytes([0x82, 0x82]) + b"\x01\x02\x03\x04" + b"ab", 1002, "a masked frame"),
    (bytes([0xC2, 2]) + b"ab", 1002, "reserved bits"),
    (bytes([0x83, 0]), 1002, "unknown opcode 0x3"),
    (bytes([0x80, 1]) + b"a", 1002, "a continuation frame outside a fragmented message"),
    (bytes([0x02, 1]) + b"a" + bytes([0x82, 1]) + b"b", 1002, "a data frame inside a fragmented message"),
    (bytes([0x89, 126, 0, 126]) + b"x" * 126, 1002, "a fragmented or long control frame"),
    (bytes([0x09, 0]), 1002, "a fragmented or long control frame"),
    (bytes([0x82, 127]) + (1 << 63).to_bytes(8, "big"), 1002, "longer than 2**63 - 1 bytes"),
    (bytes([0x88, 2]) + (999).to_bytes(2, "big"), 1002, "a bad close frame"),
    (bytes([0x88, 1, 3]), 1002, "a bad close frame"),
    (bytes([0x88, 4]) + (1000).to_bytes(2, "big") + b"\xff\xfe", 1007, "a close reason that is not UTF-8"),
], ids=["masked", "rsv", "opcode", "stray-continuation", "data-in-fragments", "long-ping", "fragmented-ping",
        "length-msb", "close-code", "close-too-short", "close-reason-not-utf8"])
def test_a_frame_that_breaks_the_protocol_fails_the_connection_after_the_messages_before_it(bare, caplog, raw, code,
                                                                                            words):
    """RFC 6455's checks of a client on what a server sends: the server gets a close with 1002 (1007: a close reason
    that is not UTF-8),
    the caller a WebSocketClosed without a code once the messages before the bad frame are out, and the log says
    what the server sent."""
    seen: list[Any] = []

    def handler(ws):
        ws.recv()
        ws.socket.sendall(bytes([0x82, 2]) + b"ok" + raw)
        try:
            ws.recv(timeout=10)
        except Exception as exc:
            seen.append(getattr(getattr(exc, "rcvd", None), "code", type(exc).__name__))

    client = ws_client.connect(bare(handler))
    client.send_frame(binary_frame(b"go"))
    with caplog.at_level("INFO", logger=ws_client.__name__):
        assert client.recv(timeout=10) == b"ok"
        with pytest.raises(WebSocketClosed) as info:
            client.recv(timeout=10)
    assert info.value.code is None
    assert words in caplog.text
    client.close()
    deadline = time.monotonic() + 10
    while not seen and time.monotonic() < deadline:
        time.sleep(0.01)
    assert seen == [code]


def test_text_that_is_not_utf8_comes_out_with_replacement_characters(bare):
    """PlugRL servers send no text; one that does gets its text handed out (the session refuses it in its words)."""
    def handler(ws):
        ws.recv()
        ws.socket.sendall(bytes([0x81, 4]) + b"ok\xff\xfe")
        ws.recv()

    client = ws_client.connect(bare(handler))
    try:
        client.send_frame(binary_frame(b"go"))
        assert client.recv(timeout=10) == "ok\ufffd\ufffd"
    finally:
        client.close()


def _raw_server(answer: Callable[[bytes], bytes], after: Callable[[socket.socket], Any] | None = None
                ) -> tuple[str, threading.Thread, socket.socket]:
    """A one-connection TCP server that reads the opening handshake's request and writes ``answer(accept key)``,
    then waits for the client's next bytes (its close, or the end of the connection), or hands the socket to
    ``after``."""
    import base64
    import hashlib

    listener = socket.create_server(("127.0.0.1", 0))

    def serve_once() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.settimeout(20)
            request = b""
            while b"\r\n\r\n" not in request:
                request += conn.recv(4096)
            key = next(line.split(b":", 1)[1].strip() for line in request.split(b"\r\n")
                       if line.lower().startswith(b"sec-websocket-key:"))
            conn.sendall(answer(base64.b64encode(hashlib.sha1(key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest())))
            with contextlib.suppress(OSError):
                if after is None:
                    conn.recv(4096)
                else:
                    after(conn)

    thread = threading.Thread(target=serve_once, daemon=True)
    thread.start()
    return f"ws://127.0.0.1:{listener.getsockname()[1]}", thread, listener


def test_frames_that_come_in_the_same_read_as_the_handshakes_answer_are_messages():
    """A server may send its first message right behind its 101: those bytes are frames, not HTTP."""
    url, thread, listener = _raw_server(lambda accept: (
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: "
        + accept + b"\r\n\r\n" + bytes([0x82, 5]) + b"first" + bytes([0x82, 6]) + b"second"))
    try:
        client = ws_client.connect(url, open_timeout=10, close_timeout=1)
        assert client.recv(timeout=10) == b"first" and client.recv(timeout=10) == b"second"
        client.close()
        thread.join(timeout=10)
        assert not thread.is_alive()
    finally:
        listener.close()


def test_an_answer_to_the_handshake_without_an_end_is_a_connect_failure():
    url, thread, listener = _raw_server(lambda accept: b"HTTP/1.1 101 Switching Protocols\r\n" + b"X-Pad: "
                                        + b"x" * (ws_client.MAX_HANDSHAKE_BYTES + 10))
    try:
        with pytest.raises(ConnectFailed, match="no end of its head"):
            ws_client.connect(url, open_timeout=10)
        thread.join(timeout=10)
        assert not thread.is_alive()
    finally:
        listener.close()


# ------------------------------------------------------------------------------------------------ pings, closes


def test_server_pings_are_answered_while_the_client_waits_or_services(bare):
    pongs: list[bool] = []
    done = threading.Event()

    def handler(ws):
        ws.recv()
        pongs.extend(ws.ping().wait(10) for _ in range(3))  # the client is inside recv(): it answers
        ws.send(b"pinged")
        ws.recv()
        pongs.append(ws.ping().wait(10))  # the client calls service() in a loop: it answers
        done.set()
        ws.recv()

    client = ws_client.connect(bare(handler, ping_interval=None))
    try:
        client.send_frame(binary_frame(b"start"))
        assert client.recv(timeout=30) == b"pinged"
        client.send_frame(binary_frame(b"next"))
        deadline = time.monotonic() + 30
        while not done.is_set() and time.monotonic() < deadline:
            client.service()
            client.recv(timeout=0.01)
        client.send_frame(binary_frame(b"done"))
    finally:
        client.close()
    assert pongs == [True, True, True, True]


@pytest.mark.parametrize("code, reason", [(1000, ""), (1001, "plugrl-server-stop"), (1011, "Internal server error."),
                                          (4000, "über")])
def test_a_close_comes_out_as_transport_closed_with_its_code_and_reason_after_the_messages_before_it(bare, code, reason):
    def handler(ws):
        ws.recv()
        ws.send(b"last words")
        ws.close(code, reason)

    client = ws_client.connect(bare(handler))
    client.send_frame(binary_frame(b"bye"))
    assert client.recv(timeout=10) == b"last words"
    with pytest.raises(WebSocketClosed) as info:
        client.recv(timeout=10)
    assert (info.value.code, info.value.reason) == (code, reason)
    with pytest.raises(WebSocketClosed) as again:  # it stays closed, and says so the same way
        client.send_frame(binary_frame(b"more"))
    assert again.value.code == code
    assert client.closed and client.has_message  # recv would raise at once
    client.close()
    client.close()  # a no-op


def test_a_dropped_socket_is_transport_closed_without_a_code(bare):
    def handler(ws):
        ws.recv()
        ws.socket.shutdown(socket.SHUT_RDWR)  # no close frame

    client = ws_client.connect(bare(handler))
    client.send_frame(binary_frame(b"x"))
    with pytest.raises(WebSocketClosed) as info:
        client.recv(timeout=10)
    assert info.value.code is None and "without a close frame" in str(info.value)
    client.close()


def test_the_clients_close_reaches_the_server_with_its_code(bare):
    seen: list[tuple[Any, Any]] = []
    closed = threading.Event()

    def handler(ws):
        try:
            ws.recv()
        except Exception:
            seen.append((ws.close_code, ws.close_reason))
            closed.set()

    client = ws_client.connect(bare(handler))
    client.close(4001, "done here")
    assert closed.wait(10)
    assert seen == [(4001, "done here")]
    with pytest.raises(WebSocketClosed):
        client.send_frame(binary_frame(b"after close"))


def test_an_interrupt_while_a_frame_is_handled_abandons_the_connection_and_close_does_not_wait(bare):
    """A signal's exception raised while the client handles a frame leaves the buffer's place unknown (the frame
    may or may not count as read): the connection is abandoned, and closing afterwards neither reads nor waits."""
    release = threading.Event()

    def handler(ws):
        ws.recv()
        frame = Frame(Opcode.BINARY, b"y" * 1000).serialize(mask=False)
        ws.socket.sendall(frame[:5])  # half a header: the client keeps it until the rest comes
        release.wait(10)
        ws.socket.sendall(frame[5:])
        ws.recv()

    client = ws_client.connect(bare(handler))
    client.send_frame(binary_frame(b"x"))
    assert client.recv(timeout=0.5) is None  # half a frame is no message
    handled = client._frame

    def interrupted(opcode: int, fin: bool, payload: bytes) -> None:
        assert payload == b"y" * 1000  # the frame was put together from both reads
        handled(opcode, fin, payload)
        raise KeyboardInterrupt  # as a signal handler raising inside the handling would

    client._frame = interrupted  # type: ignore[method-assign]
    release.set()
    with pytest.raises(KeyboardInterrupt):
        client.recv(timeout=10)
    started = time.monotonic()
    client.close()  # no close handshake on a stream whose place is lost
    assert time.monotonic() - started < 1.0
    assert client.recv(timeout=0) == b"y" * 1000  # it was whole before the interrupt: it is handed out
    with pytest.raises(WebSocketClosed):
        client.recv(timeout=0)
    with pytest.raises(WebSocketClosed):
        client.send_frame(binary_frame(b"after"))


class _CutShort:
    """The client's real socket, whose sends take part of what they are given (as a full send buffer does) until the
    ``interrupt_at``-th, which raises KeyboardInterrupt (a signal arriving between two parts of one frame)."""

    def __init__(self, sock: socket.socket, interrupt_at: int) -> None:
        self._sock, self._calls, self._interrupt_at = sock, 0, interrupt_at

    def send(self, data: Any) -> int:
        self._calls += 1
        if self._calls == self._interrupt_at:
            raise KeyboardInterrupt
        return self._sock.send(memoryview(data)[:1000])

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


def test_an_interrupt_in_the_middle_of_a_frame_abandons_the_connection_instead_of_closing_after_half_a_frame(bare):
    """Interrupted after part of a frame went out: no close frame may follow it (the server would read it as the
    rest of the cut frame), so the connection is abandoned and the server sees the stream end."""
    done = threading.Event()
    seen: list[Any] = []

    def handler(ws):
        try:
            seen.append(ws.recv(timeout=10))
        except Exception as exc:
            seen.append(type(exc).__name__)
        done.set()

    client = ws_client.connect(bare(handler))
    client._sock = _CutShort(client._sock, interrupt_at=3)  # type: ignore[assignment]
    with pytest.raises(KeyboardInterrupt):
        client.send_frame(binary_frame(b"z" * 100_000))  # 2,000 bytes out, then the interrupt
    started = time.monotonic()
    client.close()  # at once: no close handshake after half a frame
    assert time.monotonic() - started < 1.0
    with pytest.raises(WebSocketClosed):
        client.send_frame(binary_frame(b"after"))
    assert done.wait(20)
    assert seen == ["ConnectionClosedError"], seen  # the server sees the stream end, never a whole or fake message


# ------------------------------------------------------------------------------------------------ reference server


def test_the_reference_server_over_the_client_directly(reference):
    client = ws_client.connect(reference.url, {messages.STREAM_HEADER: "3.1"})
    packer = FramePacker()
    try:
        meta = messages.parse_metadata(codec.unpackb(client.recv(timeout=10)))
        assert meta.action_horizon == 4
        ids = np.arange(2, dtype=np.int64)
        obs = {"images": {"cam": np.zeros((2, 96, 96, 3), np.uint8)}, "states": {"x": np.zeros((2, 3))},
               "text": np.array(["", ""])}
        message = messages.InferRequest(obs, ids, np.zeros(2, np.int64)).message()
        client.send_frame(packer.pack(message))
        reply = messages.parse_action(codec.unpackb(client.recv(timeout=10)), ids)
        assert reply.actions.shape == (4, 2, 2)
    finally:
        client.close()
    assert reference._streams == {(3, 1): 1}  # the stream header reached the server


@pytest.mark.slow
def test_a_session_runs_over_the_client_against_the_reference_server(reference):
    """Lockstep infers, a pipelined poll (nothing yet: None, nothing raised), feedback, and the server's shutdown
    as the close the session reports."""
    session = Session(SessionConfig(url=reference.url, stream=(0, 0)))
    meta = session.open()
    assert meta.action_horizon == 4
    ids, steps = np.arange(3, dtype=np.int64), np.zeros(3, np.int64)
    obs = Observation(states={"x": np.zeros((3, 2))}, text="a")
    reply = session.infer(messages.InferRequest(obs, ids, steps))
    assert reply.actions.shape == (4, 3, 2)
    session.feedback(messages.Feedback(ids, steps, obs, np.zeros(3, np.float32), np.zeros(3, bool), np.zeros(3, bool), {}))
    session.send_infer(messages.InferRequest(obs, ids, steps))
    assert session.awaiting
    deadline = time.monotonic() + 10
    got = None
    while got is None and time.monotonic() < deadline:
        got = session.receive_actions(0)
    assert got is not None and got.actions.shape == (4, 3, 2) and not session.awaiting
    session.feedback(messages.Feedback(ids, steps, obs, np.zeros(3, np.float32), np.zeros(3, bool), np.zeros(3, bool), {}))
    reference.shutdown()
    with pytest.raises(ConnectionLost) as info:
        session.infer(messages.InferRequest(obs, ids, steps))
    assert (info.value.close.code, info.value.close.reason) == (1001, messages.REASON_SHUTDOWN)
    session.close()
