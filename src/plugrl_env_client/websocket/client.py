"""A WebSocket client on which the caller's own thread does all the socket work.

websockets' Sans-I/O :class:`~websockets.client.ClientProtocol` (public API) makes and checks the opening handshake;
after it, :class:`WebSocketClient` reads and writes the frames itself. Nothing runs in the background: bytes are
read when the owner asks for a message (:meth:`~WebSocketClient.recv`, ``timeout=0`` only looks) or services the
socket (:meth:`~WebSocketClient.service`, between env calls), and pings are answered then; during one long env call
a :class:`~plugrl_env_client.websocket.keepalive.Keepalive` does it. A rollout's thread so pays for exactly the
frames it reads, when it reads them, where a reader thread would take the GIL while envs step.
:meth:`~WebSocketClient.fileno` and :func:`wait_any` let a pipelined loop wait on several connections at once.

Everything goes out through one write loop (non-blocking sends of memoryviews, no copies): data frames arrive
framed and masked by the caller (:meth:`~WebSocketClient.send_frame`, which can hold a frame to write it with the
next one), pongs and closes by :func:`control_frame`.
Incoming frames are checked as RFC 6455 asks of a client; a frame that breaks the rules fails the connection (close
1002, or 1007 for a close reason that is not UTF-8), and a server's close is echoed and the TCP connection ended.
Failures are the errors of :mod:`~plugrl_env_client.websocket.common`. One thread owns a client; the keepalive
touches it only while the owner is inside a call it guards.
"""

from __future__ import annotations

import collections
import logging
import os
import select
import socket
import ssl
import struct
import time
from collections.abc import Iterable, Mapping
from typing import Any, NoReturn

from websockets.client import ClientProtocol
from websockets.exceptions import InvalidStatus, InvalidURI
from websockets.exceptions import ProtocolError as FrameError
from websockets.frames import Close, apply_mask
from websockets.http11 import USER_AGENT
from websockets.protocol import State
from websockets.uri import parse_uri

from plugrl_env_client.websocket.common import (
    CertificateNotVerified,
    ConnectFailed,
    Data,
    HandshakeRefused,
    InvalidServerURL,
    WebSocketClosed,
    retain_freed_memory,
)

logger = logging.getLogger(__name__)

__all__ = ["WebSocketClient", "connect", "control_frame", "frame_header", "wait_any"]

RECV_BUFSIZE = 1 << 20
"""Bytes asked of the socket per read: a multi-MB frame takes a handful of reads, not one per 64 KiB; a small reply
still costs one read."""
JOIN_MAX = 1 << 16
"""The most bytes a held frame and the next one take to go out joined in one write (larger ones go out one after
the other: their system calls cost little next to their bytes)."""
SEND_STALL_S = 60.0
"""A send that moves no byte for this long fails the connection (a peer that stopped reading): the frame is half
written and the connection cannot be used any more. Progress restarts the clock, so slow links are fine."""
_WAKE_BLOCKED = (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError)
_HAS_POLL = hasattr(select, "poll")

Received = bytes | bytearray | str
"""A message: bytes-like for a binary message (one buffer, not copied again), str for a text message."""

_CONT, _TEXT, _BINARY, _CLOSE, _PING, _PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA
_DATA_OPCODES = frozenset((_CONT, _TEXT, _BINARY))
_CONTROL_OPCODES = frozenset((_CLOSE, _PING, _PONG))
_PROTOCOL_ERROR, _INVALID_DATA = 1002, 1007
MAX_HANDSHAKE_BYTES = 1 << 16
"""The most bytes of HTTP the opening handshake's response may take before the client gives up on it."""


def frame_header(length: int, opcode: int = _BINARY) -> bytes:
    """The first bytes of a masked, final frame (binary unless ``opcode`` says otherwise) of ``length`` payload
    bytes (without the key), with the shortest length encoding."""
    first = 0x80 | opcode  # FIN set, no RSV bits (no extension); the second byte's top bit says "masked"
    if length < 126:
        return struct.pack("!BB", first, 0x80 | length)
    if length < 1 << 16:
        return struct.pack("!BBH", first, 0x80 | 126, length)
    return struct.pack("!BBQ", first, 0x80 | 127, length)


def control_frame(opcode: int, payload: bytes) -> bytes:
    """A whole masked control frame (a pong, a close: at most 125 payload bytes) with a key of its own: they are
    rare, so they take no key from a packer's pool."""
    key = os.urandom(4)
    return frame_header(len(payload), opcode) + key + apply_mask(payload, key)


class WebSocketClient:
    """One client WebSocket over a socket this object owns, past its opening handshake (see the module docstring).
    Open one with :func:`connect`."""

    def __init__(self, sock: socket.socket, close_timeout: float = 2.0) -> None:
        self._sock = sock
        self._fd = sock.fileno()
        self._tls = isinstance(sock, ssl.SSLSocket)
        self._close_timeout = close_timeout
        self._buffer = bytearray()  # bytes read and not yet part of a whole frame
        self._messages: collections.deque[Received] = collections.deque()
        self._parts: list[bytes] | None = None  # a fragmented message being assembled
        self._text = False
        self._closed: WebSocketClosed | None = None  # set once nothing more can be read
        self._close_sent = False
        self._held: Data | None = None  # a frame sent with more=True, written with the next one
        self._released = False  # the socket is gone
        self.lent = False
        """True while a :class:`~plugrl_env_client.websocket.keepalive.Keepalive` services this client for its owner
        (who then must not use it: the owner is inside the call the keepalive guards)."""
        if _HAS_POLL:
            self._readable = select.poll()
            self._readable.register(self._fd, select.POLLIN)
            self._writable = select.poll()
            self._writable.register(self._fd, select.POLLOUT)

    # ------------------------------------------------------------------------------------------ what callers use

    def fileno(self) -> int:
        """The socket's file descriptor, for ``selectors``/``select`` (see :func:`wait_any`; check
        :attr:`has_message` first: a message may already be parsed, or TLS may hold decrypted bytes)."""
        return self._fd

    @property
    def has_message(self) -> bool:
        """Whether :meth:`recv` would return (or raise) without waiting for the network."""
        return bool(self._messages) or self._closed is not None or self.tls_pending()

    @property
    def closed(self) -> bool:
        """Whether the connection is closed for reading (messages received before the close may still wait)."""
        return self._closed is not None

    def send_frame(self, frame: Data, more: bool = False) -> None:
        """Send a whole masked client frame built by a
        :class:`~plugrl_env_client.protocol.frame_packer.FramePacker` (header, key and masked payload).

        ``more``: the caller sends another frame right after this one, so this one is held and goes out with it,
        in one system call when the two are small (:data:`JOIN_MAX`), or before a close. One frame is held at
        most, and not for long: should the owner's next frame be late (a long env call in between), the keepalive
        writes the held one when it takes the socket over."""
        if self.lent:  # (the checks inline on the common path: a frame or two per env step)
            self._check_owner()
        if self._closed is not None or self._close_sent:
            raise self._closed if self._closed is not None else WebSocketClosed(None)
        held = self._held
        if held is not None:
            self._held = None
            if more or memoryview(held).nbytes + memoryview(frame).nbytes > JOIN_MAX:
                self._write(held)
            else:
                frame = b"".join((held, frame))
        if more:
            self._held = frame
        else:
            self._write(frame)

    def recv(self, timeout: float | None = None) -> Received | None:
        """The next message, or None when none arrived within ``timeout`` seconds (0: only look at what is
        there; None: wait for one). Answers the server's pings on the way. Raises :class:`WebSocketClosed` once
        the connection is closed and every message received before the close was returned."""
        if self.lent:
            self._check_owner()
        messages = self._messages
        if messages:
            return messages.popleft()
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self._closed is not None:
                if messages:
                    return messages.popleft()
                raise self._closed
            if self._tls and self.tls_pending():
                ready = True
            elif deadline is None:
                ready = self._wait(self._readable if _HAS_POLL else None, None)
            else:
                ready = self._wait(self._readable if _HAS_POLL else None, max(0.0, deadline - time.monotonic()))
            if ready:
                self._pump()
                if messages:
                    return messages.popleft()
            elif deadline is not None and time.monotonic() >= deadline:
                return None

    def service(self) -> bool:
        """Read what the socket holds without waiting: queue its messages, answer its pings, note a close.
        Returns :attr:`has_message`. Never raises for a closed connection (the next :meth:`recv` or
        :meth:`send` does): a loop calls this between env calls and handles closes in one place."""
        self._check_owner()
        return self._pump()

    def close(self, code: int = 1000, reason: str = "") -> None:
        """Send a close frame, wait (up to the close timeout) for the server's answer, and end the TCP
        connection. A no-op on a released connection; messages not yet read are dropped."""
        if self._released:
            return
        self._check_owner()
        try:
            if self._closed is None and not self._close_sent:
                held, self._held = self._held, None
                if held is not None:  # sent before the close, as the caller asked
                    self._write(held)
                self._close_sent = True
                self._write(control_frame(_CLOSE, Close(code, reason).serialize()))
            deadline = time.monotonic() + self._close_timeout
            while not self._released:  # until the server's close came (then _end releases)
                left = deadline - time.monotonic()
                if left <= 0 or not self._wait(self._readable if _HAS_POLL else None, left):
                    break
                self._take_in()
        except WebSocketClosed:
            pass  # the socket broke while closing: nothing left to say
        finally:
            self._release()
            if self._closed is None:
                self._closed = WebSocketClosed(None)

    def tls_pending(self) -> bool:
        """Whether TLS holds decrypted bytes not read yet (a select on the socket does not see them)."""
        return self._tls and not self._released and self._sock.pending() > 0  # type: ignore[attr-defined]

    # ------------------------------------------------------------------------------------------ reading

    def _pump(self) -> bool:
        """Read once without waiting (TLS: every decrypted record at hand), handle its frames."""
        if self._closed is None:
            self._take_in()
        return self.has_message

    def _take_in(self) -> None:
        try:
            data = self._read()
            if data is None:
                return
            if data:
                self._buffer += data
                self._frames()
            else:
                self._end(WebSocketClosed(None))  # the stream ended (after a close frame, or without one)
        except WebSocketClosed:
            pass  # a pong or a close's echo could not be written: _closed says so, the next recv or send raises
        except BaseException:
            self._abandon()  # an interrupt while reading or handling frames: the stream's place is lost
            raise

    def _read(self) -> bytes | None:
        """One non-blocking read: its bytes, b"" at the end of the stream, None when the socket had nothing."""
        if self._released:
            return None
        try:
            data = self._sock.recv(RECV_BUFSIZE)
            if self._tls:
                while data and self.tls_pending():  # records already decrypted: take them in the same pass
                    data += self._sock.recv(RECV_BUFSIZE)
        except _WAKE_BLOCKED:
            return None
        except OSError:  # reset by the peer, or the like: the end of the stream
            return b""
        return data

    def _frames(self) -> None:
        """Handle every whole frame in the buffer; keep the bytes of a frame not complete yet. A header is checked
        as soon as it is in, so a broken frame fails the connection before its payload is waited for."""
        buf = self._buffer
        pos, end = 0, len(buf)
        try:
            while self._closed is None and end - pos >= 2:
                first, second = buf[pos], buf[pos + 1]
                length, at = second & 0x7F, pos + 2
                if length >= 126:
                    size = 2 if length == 126 else 8
                    if end - at < size:
                        break
                    length = int.from_bytes(buf[at:at + size], "big")
                    at += size
                opcode, fin = first & 0x0F, bool(first & 0x80)
                broken = _broken_header(first, second, opcode, fin, length)
                if broken:
                    self._fail(_PROTOCOL_ERROR, broken)
                    break
                if end - at < length:
                    break
                with memoryview(buf) as view:
                    payload = bytes(view[at:at + length])
                pos = at + length
                self._frame(opcode, fin, payload)
        finally:
            del buf[:pos]

    def _frame(self, opcode: int, fin: bool, payload: bytes) -> None:
        if opcode == _BINARY or opcode == _TEXT:
            if self._parts is not None:
                self._fail(_PROTOCOL_ERROR, "a data frame inside a fragmented message")
            elif fin:
                self._message(payload, opcode == _TEXT)
            else:
                self._parts, self._text = [payload], opcode == _TEXT
        elif opcode == _CONT:
            if self._parts is None:
                self._fail(_PROTOCOL_ERROR, "a continuation frame outside a fragmented message")
                return
            self._parts.append(payload)
            if fin:
                whole, self._parts = b"".join(self._parts), None
                self._message(whole, self._text)
        elif opcode == _PING:
            if not self._close_sent:
                self._write(control_frame(_PONG, payload))
        elif opcode == _CLOSE:
            self._server_closed(payload)
        # _PONG: nothing to do

    def _message(self, payload: bytes, text: bool) -> None:
        # A text message is handed out as str (bad UTF-8 replaced): PlugRL sends none, and the session refuses one
        # in its own words.
        self._messages.append(payload.decode("utf-8", "replace") if text else payload)

    def _server_closed(self, payload: bytes) -> None:
        """A close frame from the server: echo it (unless ours went first) and end the connection."""
        try:
            close = Close.parse(payload)
        except UnicodeDecodeError:
            self._fail(_INVALID_DATA, "a close reason that is not UTF-8")
            return
        except FrameError as exc:  # too short, or a code no endpoint may send
            self._fail(_PROTOCOL_ERROR, f"a bad close frame ({exc})")
            return
        self._closed = WebSocketClosed(int(close.code), close.reason)
        try:
            if not self._close_sent:
                self._close_sent = True
                self._write(control_frame(_CLOSE, payload))
        finally:
            # Whatever could still come is not read, and the close (or its echo) is written: end the TCP connection
            # now. Waiting for the server's end first, as a client may, needs someone to read the socket, and here
            # nobody does until the owner's next call, while the server waits for us.
            self._release()

    def _fail(self, code: int, why: str) -> None:
        """The server broke the protocol: say why in a close frame and end the connection (no close came from it:
        the connection ends without a code, as for a dropped socket)."""
        logger.info("the server sent %s; closing the connection (%d)", why, code)
        try:
            if not self._close_sent:
                self._close_sent = True
                self._write(control_frame(_CLOSE, Close(code, why).serialize()))
        finally:
            self._end(WebSocketClosed(None))

    # ------------------------------------------------------------------------------------------ writing

    def _check_owner(self) -> None:
        if self.lent:
            raise RuntimeError("this connection is serviced by its keepalive while the owner is inside a guarded "
                               "call: use it after the call returns")

    def _write_held(self) -> None:
        """Write the frame ``send_frame(more=True)`` held, if any; never raises (a broken socket is the
        connection's close, which the owner's next recv or send raises). For the keepalive, at its takeover."""
        held, self._held = self._held, None
        if held is not None and self._closed is None and not self._close_sent:
            try:
                self._write(held)
            except WebSocketClosed:
                pass

    def _write(self, data: Data) -> None:
        """The one write loop: everything sent goes through here, whole, in order."""
        if self._released:
            raise self._closed if self._closed is not None else WebSocketClosed(None)
        view = memoryview(data)
        if view.itemsize != 1 or view.ndim != 1:
            view = view.cast("B")
        sock = self._sock
        stall_until = 0.0
        total = view.nbytes
        try:
            while view.nbytes:
                wait_for_read = False
                try:
                    sent = sock.send(view)
                except ssl.SSLWantReadError:
                    sent, wait_for_read = 0, True
                except _WAKE_BLOCKED:
                    sent = 0
                except OSError as exc:
                    self._broken(f"the connection broke while sending ({exc})")
                if sent:
                    view = view[sent:]
                    stall_until = 0.0
                    continue
                now = time.monotonic()
                if not stall_until:
                    stall_until = now + SEND_STALL_S
                elif now >= stall_until:
                    self._broken(f"a send made no progress for {SEND_STALL_S:g} s (the server stopped reading)")
                if _HAS_POLL:
                    self._wait(self._readable if wait_for_read else self._writable, stall_until - now)
                else:
                    self._wait_select(wait_for_read, stall_until - now)
        except BaseException:
            if 0 < view.nbytes < total and not self._released:  # interrupted between two parts of a frame
                self._abandon()
            raise

    def _end(self, closed: WebSocketClosed) -> None:
        """Nothing more is read or written: the first reason given stays the connection's."""
        if self._closed is None:
            self._closed = closed
        self._release()

    def _abandon(self) -> None:
        """End the connection without a close handshake: an interrupt or error left the stream unusable (a frame's
        place in the buffer lost, or a frame sent in part), so nothing more is read or written on it."""
        self._end(WebSocketClosed(None))

    def _broken(self, why: str) -> NoReturn:
        logger.info("%s", why)
        self._end(WebSocketClosed(None))
        raise self._closed if self._closed is not None else WebSocketClosed(None)

    # ------------------------------------------------------------------------------------------ waiting

    def _wait(self, poller: Any, timeout: float | None) -> bool:
        """Wait until the socket is ready (readable unless ``poller`` says otherwise), up to ``timeout`` s."""
        if self._released:
            return False
        if not _HAS_POLL:
            return self._wait_select(True, timeout)
        ms = -1 if timeout is None else timeout * 1000.0
        return bool(poller.poll(ms))

    def _wait_select(self, for_read: bool, timeout: float | None) -> bool:
        fds = [self._fd]
        ready = select.select(fds, [], [], timeout) if for_read else select.select([], fds, [], timeout)
        return bool(ready[0] or ready[1])

    def _release(self) -> None:
        if self._released:
            return
        self._released = True
        self._held = None
        try:
            self._sock.shutdown(socket.SHUT_WR)  # a FIN after what was written, not a reset
        except OSError:
            pass
        if _HAS_POLL:
            self._readable.unregister(self._fd)
            self._writable.unregister(self._fd)
        try:
            self._sock.close()
        except OSError:
            pass


def _broken_header(first: int, second: int, opcode: int, fin: bool, length: int) -> str:
    """What is wrong with a frame header from the server, in words ("" when nothing)."""
    if second & 0x80:
        return "a masked frame"
    if first & 0x70:
        return "a frame with reserved bits set (no extension was agreed)"
    if opcode in _DATA_OPCODES:
        return "a frame longer than 2**63 - 1 bytes" if length >> 63 else ""
    if opcode not in _CONTROL_OPCODES:
        return f"a frame of unknown opcode {opcode:#x}"
    if not fin or length > 125:
        return "a fragmented or long control frame"
    return ""


def wait_any(clients: Iterable[WebSocketClient], timeout: float | None = None) -> list[WebSocketClient]:
    """The clients among ``clients`` that have a message (or a close) to hand out, waiting up to ``timeout``
    seconds for the first one (0: only look; None: wait). Reads what arrives on the way: a pipelined loop waits on
    all its connections at once with this."""
    clients = list(clients)
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        ready = [c for c in clients if c.has_message]
        if ready:
            return ready
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        readable = _readable(clients, left)
        for client in readable:
            client.service()
        if not readable and deadline is not None and time.monotonic() >= deadline:
            return []


def _readable(clients: list[WebSocketClient], timeout: float | None) -> list[WebSocketClient]:
    if not _HAS_POLL:
        return select.select(clients, [], [], timeout)[0]
    poller = select.poll()  # no fd limit (select's is 1024)
    by_fd = {}
    for client in clients:
        by_fd[client.fileno()] = client
        poller.register(client.fileno(), select.POLLIN)
    return [by_fd[fd] for fd, _ in poller.poll(-1 if timeout is None else timeout * 1000.0)]


# ------------------------------------------------------------------------------------------------ opening


def connect(url: str, headers: Mapping[str, str] | None = None, open_timeout: float = 10.0,
            close_timeout: float = 2.0) -> WebSocketClient:
    """Open a WebSocket to ``url`` (ws:// or wss://, verified against the system trust store, ``SSL_CERT_FILE``
    honoured), sending ``headers`` in the opening handshake (each in place of one the URL implies, such as Basic
    authorization from ``ws://user:pass@host``); the TCP connect, the TLS handshake and the HTTP
    upgrade together take at most ``open_timeout`` seconds. Raises the opening errors of
    :mod:`~plugrl_env_client.websocket.common`."""
    try:
        uri = parse_uri(url)
    except (InvalidURI, ValueError) as exc:
        raise InvalidServerURL(str(exc)) from None
    retain_freed_memory()
    deadline = time.monotonic() + open_timeout
    sock = _open_socket(uri.host, uri.port, uri.secure, deadline, open_timeout)
    try:
        protocol = ClientProtocol(uri, max_size=None)
        request = protocol.connect()
        for name, value in (headers or {}).items():  # given headers win: an API key over a URL's user info
            if name in request.headers:
                del request.headers[name]
            request.headers[name] = value
        request.headers.setdefault("User-Agent", USER_AGENT)
        protocol.send_request(request)
        client = WebSocketClient(sock, close_timeout)
        for data in protocol.data_to_send():
            client._write(data)
        _read_handshake(client, protocol, deadline, open_timeout)
    except WebSocketClosed:
        sock.close()
        raise ConnectFailed("the connection broke during the WebSocket handshake") from None
    except BaseException:
        sock.close()
        raise
    return client


def _open_socket(host: str, port: int, secure: bool, deadline: float, open_timeout: float) -> socket.socket:
    try:
        sock = socket.create_connection((host, port), timeout=open_timeout)
    except OSError as exc:  # refused, unreachable, timed out, name not resolved
        raise ConnectFailed(str(exc) or type(exc).__name__) from None
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if secure:
            sock.settimeout(max(0.001, deadline - time.monotonic()))
            context = ssl.create_default_context()
            sock = context.wrap_socket(sock, server_hostname=host)
        sock.setblocking(False)
        return sock
    except ssl.SSLCertVerificationError as exc:  # before OSError: it is one
        sock.close()
        raise CertificateNotVerified(str(exc.verify_message)) from None
    except OSError as exc:
        sock.close()
        raise ConnectFailed(f"TLS handshake failed: {exc}" if secure else str(exc)) from None


def _read_handshake(client: WebSocketClient, protocol: ClientProtocol, deadline: float, open_timeout: float) -> None:
    """Read until the server's HTTP answer. websockets' protocol is given the answer's head first and nothing after
    it: when that opens the connection (a 101), the frames that came with it stay in the client's buffer, for its own
    reading. Any other answer is not a WebSocket, and the protocol gets everything (a refusal's body included) until
    it says what went wrong."""
    buffer = client._buffer
    refused = False  # the head went to the protocol without opening the connection: it reads the rest
    while True:
        left = deadline - time.monotonic()
        if not client.tls_pending() and (left <= 0 or not client._wait(client._readable if _HAS_POLL else None,
                                                                         left)):
            raise ConnectFailed(f"the server did not answer the WebSocket handshake within {open_timeout:g} s")
        data = client._read()
        if data is None:
            continue
        if not data:
            protocol.receive_eof()
        elif refused:
            protocol.receive_data(data)
        else:
            buffer += data
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(buffer) > MAX_HANDSHAKE_BYTES:
                    raise ConnectFailed(f"the server's answer to the WebSocket handshake has no end of its head "
                                        f"within {MAX_HANDSHAKE_BYTES} bytes")
                continue
            protocol.receive_data(bytes(buffer[:end + 4]))
            del buffer[:end + 4]
            refused = protocol.state is not State.OPEN
            if refused and buffer:
                protocol.receive_data(bytes(buffer))
                buffer.clear()
        events = protocol.events_received()
        if protocol.handshake_exc is not None:
            exc = protocol.handshake_exc
            if isinstance(exc, InvalidStatus):
                raise HandshakeRefused(exc.response.status_code, str(exc)) from None
            raise ConnectFailed(f"the WebSocket handshake failed: {exc}") from None
        if events and protocol.state is State.OPEN:  # the response (101): the connection is open
            try:
                client._frames()  # the frames that came with it
            except WebSocketClosed:
                pass  # a close among them could not be answered: the first recv raises it
            return
        if not data:
            raise ConnectFailed("the connection broke during the WebSocket handshake")
