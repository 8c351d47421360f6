"""The WebSocket under the reference server, the errors every WebSocket of the package raises, and the allocator.

Server side: a :class:`ServerTransport` is what the reference server needs from one accepted WebSocket and no more:
:meth:`~Transport.send` one binary message, :meth:`~Transport.recv` the next message (or a
:class:`TimeoutError`), :meth:`~Transport.close` with a code, and who the client is. :func:`serve` runs
``handler(transport)`` in a thread per connection over one of two libraries, with the same bytes on the wire (no
extensions, no compression, one frame per message, no size limit):

* ``websockets`` (the default, always installed): its threading server, tuned for large frames (see
  :data:`RECV_BUFSIZE`).
* ``picows`` (extra ``fast``, imported only when chosen): a C frame parser under an asyncio loop that runs in a
  thread of its own. It reads into one reused buffer and unmasks in place, which is what makes multi-MB frames
  cheap, and can decode each message straight from that buffer (``serve(..., parse=...)``).

Client side: every PlugRL connection the client opens is a
:class:`~plugrl_env_client.protocol.ws_client.WebSocketClient` (websockets' Sans-I/O protocol, driven by the
rollout's own thread). It raises the errors below too, so callers handle them once: a closed connection is
:class:`TransportClosed` (with the close code and reason the peer sent, or ``None`` when the socket dropped without
a close frame); opening one fails with :class:`HandshakeRefused` (an HTTP status), :class:`CertificateNotVerified`,
:class:`InvalidServerURL`, or :class:`ConnectFailed` (nobody answered, or the handshake broke: worth another try).

Large frames and the allocator: a process that sends or receives multi-MB messages allocates and frees
multi-MB buffers for each one. glibc hands such blocks back to the kernel as soon as they are freed, so the next
message page-faults all its memory in again: on a 2-core machine that was 1434 faults and 2.3 ms to frame one
3 MB message, against 0.1 ms once freed memory stays in the process, and it dominated every WebSocket path
measured. :func:`retain_freed_memory` (called by the client's ``connect`` and by :func:`serve`) raises glibc's
thresholds so that freed blocks are reused.
"""

from __future__ import annotations

import abc
import asyncio
import concurrent.futures
import ctypes
import functools
import logging
import queue
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, ClassVar, TypeVar

from websockets.exceptions import ConnectionClosed
from websockets.sync.server import Server, ServerConnection
from websockets.sync.server import serve as ws_serve

from plugrl_env_client.errors import ConfigError

logger = logging.getLogger(__name__)

__all__ = [
    "TRANSPORTS",
    "CertificateNotVerified",
    "ConnectFailed",
    "HandshakeRefused",
    "InvalidServerURL",
    "ServerTransport",
    "Transport",
    "TransportClosed",
    "TransportError",
    "TransportServer",
        "retain_freed_memory",
    "serve",
]

TRANSPORTS = ("websockets", "picows")
"""The WebSocket libraries :func:`serve` knows."""
RECV_BUFSIZE = 1 << 20
"""Bytes websockets asks the socket for per read (its default is 64 KiB). A 3 MB frame then takes a handful of
reads instead of ~50, each of which costs a trip through websockets' Python-level protocol machinery."""
MAX_FRAME_SIZE = 1 << 62
"""picows refuses frames above its ``max_frame_size`` (10 MiB by default); PlugRL frames have no size limit."""
POST_MAX = 1 << 20
"""picows sends run in the loop's thread. A message up to this size is copied and handed over without waiting
(cheaper than a round trip between threads); a larger one is masked straight from the caller's buffer while the
caller waits (cheaper than the copy)."""
SHUTDOWN_WAIT_S = 2.0
"""How long a picows server shutting down waits for its clients to answer the close."""
CLOSE_NO_STATUS = 1005
"""The code a close frame without a payload stands for (RFC 6455 7.1.5), as websockets reports it."""

Data = bytes | bytearray | memoryview
"""One binary message: anything that exports a contiguous byte buffer."""
Message = bytes | str
"""A received message: bytes for a binary frame, str for a text frame (which PlugRL peers treat as an error)."""

# ------------------------------------------------------------------------------------------------------ errors


class TransportError(Exception):
    """Base of the transport's errors; the protocol layer turns each into what it means for a run."""


class TransportClosed(TransportError):
    """The connection is closed. ``code``/``reason`` are those of the close frame the peer sent; ``code`` is None
    when the connection ended without one (the socket dropped)."""

    def __init__(self, code: int | None, reason: str = "") -> None:
        super().__init__("connection closed without a close frame" if code is None
                         else f"connection closed with code {code}" + (f", reason {reason!r}" if reason else ""))
        self.code = code
        self.reason = reason


class HandshakeRefused(TransportError):
    """The server answered the opening handshake with an HTTP status other than 101."""

    def __init__(self, status: int, detail: str = "") -> None:
        super().__init__(detail or f"server rejected WebSocket connection: HTTP {status}")
        self.status = status


class CertificateNotVerified(TransportError):
    """The server's TLS certificate did not verify against the trust store."""

    def __init__(self, verify_message: str) -> None:
        super().__init__(verify_message)
        self.verify_message = verify_message


class InvalidServerURL(TransportError):
    """The URL cannot name a WebSocket server (wrong scheme, bad port, malformed host, ...)."""


class ConnectFailed(TransportError):
    """Nobody answered, the connection timed out, or the handshake broke off: another try may work."""


# ------------------------------------------------------------------------------------------------------ interface


class Transport(abc.ABC):
    """One open WebSocket. ``send`` and ``recv`` may be used from two threads at once (one each); ``close`` from
    any thread."""

    kind: ClassVar[str]

    @abc.abstractmethod
    def send(self, data: Data) -> None:
        """Send ``data`` as one binary message. The buffer is no longer needed when this returns (the caller may
        reuse it). Raises :class:`TransportClosed` when the connection is closed."""

    @abc.abstractmethod
    def recv(self, timeout: float | None = None) -> Message:
        """The next message (bytes for binary, str for text). Raises :class:`TransportClosed` when the connection
        is closed and :class:`TimeoutError` after ``timeout`` seconds without a message."""

    @abc.abstractmethod
    def close(self, code: int = 1000, reason: str = "") -> None:
        """Send a close frame and wait (briefly) for the peer's answer; a no-op on a closed connection."""


class ServerTransport(Transport):
    """The server's end of a connection: a :class:`Transport` that also knows its client."""

    @property
    @abc.abstractmethod
    def remote_address(self) -> Any:
        """The client's socket address (for log lines)."""

    @abc.abstractmethod
    def header(self, name: str) -> str | None:
        """A header of the client's opening handshake (case-insensitive), or None."""


class TransportServer(abc.ABC):
    """A listening WebSocket server that runs ``handler(transport)`` in a thread per connection."""

    @property
    @abc.abstractmethod
    def address(self) -> tuple[str, int]:
        """(host, port) the server is bound to (the port is the real one when 0 was asked for)."""

    @abc.abstractmethod
    def serve_forever(self) -> None:
        """Block until :meth:`shutdown`."""

    @abc.abstractmethod
    def shutdown(self) -> None:
        """Stop accepting, and close every connection still open with 1001 (going away, no reason): a server
        that has more to say closes its connections itself first."""


Handler = Callable[[ServerTransport], None]


def serve(handler: Handler, host: str, port: int, kind: str = "websockets",
          parse: Callable[[Data], Any] | None = None) -> TransportServer:
    """Listen on ``host:port`` (0: a free port) and run ``handler`` for every connection, in a thread of its own.
    Raises OSError when the address cannot be bound.

    With ``parse``, the connections' ``recv`` returns ``parse(frame)`` for a binary message (a text message stays
    a str), and an exception ``parse`` raises comes out of that ``recv``. picows then parses straight from its
    read buffer instead of copying each message out of it first (``parse`` must not keep the buffer it is given:
    msgpack's unpacking copies what it keeps).
    """
    _check_kind(kind)
    retain_freed_memory()
    if kind == "picows":
        return _PicowsServer(handler, host, port, parse)
    return _WebsocketsServer(handler, host, port, parse)


def _check_kind(kind: str) -> None:
    if kind not in TRANSPORTS:
        raise ConfigError(f"unknown transport {kind!r}; choose one of {', '.join(TRANSPORTS)}")


@functools.cache
def retain_freed_memory() -> bool:
    """Let glibc keep freed blocks of up to 32 MiB (and up to 256 MiB of free memory at the heap's top) in the
    process instead of returning them to the kernel at once; True when it applied.

    Why: see the module docstring (every large message otherwise page-faults its buffers in again). The cost is
    that a process that once held big messages keeps that much memory mapped. Applied once per process; a no-op
    where the C library has no ``mallopt`` (macOS, Windows) or refuses the values.
    """
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError, TypeError):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # glibc's malloc.h
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(m_mmap_threshold, 32 << 20)) and bool(mallopt(m_trim_threshold, 256 << 20))


# ------------------------------------------------------------------------------------------------------ websockets


class _TunedServerConnection(ServerConnection):
    recv_bufsize = RECV_BUFSIZE


class _WebsocketsTransport(ServerTransport):
    """A websockets threading server connection behind the :class:`Transport` interface."""

    kind = "websockets"

    def __init__(self, ws: ServerConnection, parse: Callable[[Data], Any] | None = None) -> None:
        self._ws = ws
        self._parse = parse

    def send(self, data: Data) -> None:
        try:
            self._ws.send(data)
        except ConnectionClosed as exc:
            raise _closed(exc) from None

    def recv(self, timeout: float | None = None) -> Any:
        try:
            message = self._ws.recv(timeout)
        except ConnectionClosed as exc:
            raise _closed(exc) from None
        if self._parse is None or isinstance(message, str):
            return message
        return self._parse(message)

    def close(self, code: int = 1000, reason: str = "") -> None:
        self._ws.close(code, reason)

    @property
    def remote_address(self) -> Any:
        return self._ws.remote_address

    def header(self, name: str) -> str | None:
        request = self._ws.request
        return None if request is None else request.headers.get(name)


def _closed(exc: ConnectionClosed) -> TransportClosed:
    frame = exc.rcvd
    return TransportClosed(None, "") if frame is None else TransportClosed(frame.code, frame.reason)


class _WebsocketsServer(TransportServer):
    def __init__(self, handler: Handler, host: str, port: int, parse: Callable[[Data], Any] | None) -> None:
        self._server: Server = ws_serve(lambda ws: handler(_WebsocketsTransport(ws, parse)), host, port,
                                        compression=None, max_size=None, create_connection=_TunedServerConnection)

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._server.socket.getsockname()[:2]
        return str(host), int(port)

    def serve_forever(self) -> None:
        self._server.serve_forever()

    def shutdown(self) -> None:
        self._server.shutdown()


# ------------------------------------------------------------------------------------------------------ picows

_T = TypeVar("_T")
_END = object()  # put in an inbox when its connection is gone


class _Failed:
    """A message whose parsing failed in the loop's thread: its ``recv`` raises ``error``."""

    def __init__(self, error: Exception) -> None:
        self.error = error


_PICOWS_LOGGER = logging.getLogger(__name__ + ".picows")
# picows logs each connection and disconnection at INFO; the reference server and the session already say so.
_PICOWS_LOGGER.setLevel(logging.WARNING)


@functools.cache
def _picows() -> Any:
    try:
        import picows
    except ImportError:
        raise ConfigError("--transport picows needs the picows package: pip install 'plugrl-env-client[fast]' "
                          "(or use --transport websockets)") from None
    return picows


class _LoopThread:
    """An asyncio event loop running in a daemon thread; other threads hand it work and wait for the result.

    picows transports may only be used from their loop's thread, and the loop must keep running while the
    caller's thread is busy (stepping envs) so that pings are answered and the socket keeps draining.
    """

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        self._ready.wait()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._ready.set)
        self.loop.run_forever()

    def in_loop(self) -> bool:
        return threading.current_thread() is self._thread

    def run(self, coro: Coroutine[Any, Any, _T], timeout: float | None = None) -> _T:
        """Run ``coro`` on the loop and wait for its result."""
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"no answer within {timeout:g} s") from None

    def call(self, fn: Callable[..., _T], *args: Any) -> _T:
        """Call ``fn(*args)`` in the loop's thread and wait for it: cheaper than a coroutine (one wakeup)."""
        if self.in_loop():
            return fn(*args)
        done: queue.SimpleQueue[tuple[bool, Any]] = queue.SimpleQueue()

        def run() -> None:
            try:
                done.put((True, fn(*args)))
            except BaseException as exc:  # handed to the waiting thread, which raises it
                done.put((False, exc))

        self.loop.call_soon_threadsafe(run)  # RuntimeError once the loop is closed
        while True:
            try:
                ok, value = done.get(timeout=1.0)
                break
            except queue.Empty:
                if not self._thread.is_alive():  # stopped before it got to our call
                    raise RuntimeError("the event loop stopped") from None
        if not ok:
            raise value
        return value

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        if not self.in_loop():
            self._thread.join(timeout=5)
            if not self._thread.is_alive():
                self.loop.close()


class _Inbox:
    """What a picows listener (running in the loop's thread) hands to the threads using the connection: whole
    messages, the close the peer sent, whether writing may go on, and whether the connection is gone."""

    def __init__(self) -> None:
        self.messages: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.writable = threading.Event()
        self.writable.set()
        self.gone = threading.Event()
        self.close_code: int | None = None
        self.close_reason = ""
        self.on_connected: Callable[[Any], None] | None = None  # the server starts the connection's thread here
        self.parse: Callable[[Data], Any] | None = None  # see serve()
        self._parts: list[bytes] = []
        self._text = False

    def closed(self) -> TransportClosed:
        return TransportClosed(self.close_code, self.close_reason)

    def frame(self, transport: Any, frame: Any) -> None:
        picows = _picows()
        kind = frame.msg_type
        if kind is picows.WSMsgType.BINARY or kind is picows.WSMsgType.TEXT or kind is picows.WSMsgType.CONTINUATION:
            if kind is not picows.WSMsgType.CONTINUATION:
                self._text = kind is picows.WSMsgType.TEXT
                self._parts.clear()
            whole = frame.fin and not self._parts
            if whole and not self._text and self.parse is not None:
                self.messages.put(self._parsed(frame.get_payload_as_memoryview()))  # no copy out of the buffer
                return
            if whole:
                payload = frame.get_payload_as_bytes()
            else:  # a fragmented message (PlugRL peers send none, but the protocol allows it): assemble it
                self._parts.append(frame.get_payload_as_bytes())
                if not frame.fin:
                    return
                payload, self._parts = b"".join(self._parts), []
            if self._text:
                self.messages.put(payload.decode("utf-8", "replace"))
            else:
                self.messages.put(payload if self.parse is None else self._parsed(payload))
        elif kind is picows.WSMsgType.CLOSE:
            payload = frame.get_payload_as_bytes()
            self.close_code = int.from_bytes(payload[:2], "big") if len(payload) >= 2 else CLOSE_NO_STATUS
            self.close_reason = payload[2:].decode("utf-8", "replace")
            if not transport.is_close_frame_sent:  # the peer started the closing handshake: answer it
                echo = self.close_code if self.close_code != CLOSE_NO_STATUS else 1000
                transport.send_close(echo, payload[2:])
            transport.disconnect()

    def _parsed(self, payload: Data) -> Any:
        assert self.parse is not None
        try:
            return self.parse(payload)
        except Exception as exc:  # raised by the recv that would have returned it
            return _Failed(exc)

    def disconnected(self) -> None:
        self.gone.set()
        self.writable.set()  # wake a sender waiting for the socket to drain: it finds the connection gone
        self.messages.put(_END)


@functools.cache
def _listener_type() -> type:
    """The picows listener class (defined on first use: picows is imported only when chosen)."""
    picows = _picows()

    class Listener(picows.WSListener):  # type: ignore[name-defined]
        def __init__(self, inbox: _Inbox) -> None:
            super().__init__()
            self.inbox = inbox

        def on_ws_connected(self, transport: Any) -> None:
            if self.inbox.on_connected is not None:
                self.inbox.on_connected(transport)

        def on_ws_frame(self, transport: Any, frame: Any) -> None:
            self.inbox.frame(transport, frame)

        def on_ws_disconnected(self, transport: Any) -> None:
            self.inbox.disconnected()

        def pause_writing(self) -> None:
            self.inbox.writable.clear()

        def resume_writing(self) -> None:
            self.inbox.writable.set()

    return Listener


class _PicowsTransport(ServerTransport):
    """A picows connection (client or server side): messages come in through the listener's inbox; sends and
    closes run in the loop's thread (see :data:`POST_MAX` for when ``send`` waits for it; either way the caller's
    buffer is free when ``send`` returns: picows masks it into its own)."""

    kind = "picows"

    def __init__(self, loop: _LoopThread, transport: Any, inbox: _Inbox, close_timeout: float,
                 owns_loop: bool, request: Any = None, peer: Any = None) -> None:
        self._loop = loop
        self._transport = transport
        self._peer = peer
        self._inbox = inbox
        self._close_timeout = close_timeout
        self._owns_loop = owns_loop
        self._request = request
        self._binary = _picows().WSMsgType.BINARY
        self._close_lock = threading.Lock()
        self._closed = False

    def send(self, data: Data) -> None:
        inbox = self._inbox
        if not inbox.writable.is_set():
            inbox.writable.wait()  # the socket is behind: let the loop drain it before queueing more
        if inbox.gone.is_set():
            raise inbox.closed()
        if len(data) <= POST_MAX:
            # Small: hand the loop a copy and go on; a failure shows up at the next recv (the connection is gone).
            try:
                self._loop.loop.call_soon_threadsafe(self._post_in_loop, bytes(data))
            except RuntimeError:  # the loop is closed
                raise inbox.closed() from None
            return
        self._loop.call(self._send_in_loop, data)

    def _post_in_loop(self, data: bytes) -> None:
        transport = self._transport
        if transport.is_disconnected or transport.is_close_frame_sent:
            return
        try:
            transport.send(self._binary, data)
        except Exception:  # the connection broke under it: the next recv reports the close
            logger.debug("posted send failed", exc_info=True)

    def _send_in_loop(self, data: Data) -> None:
        transport = self._transport
        if transport.is_disconnected or transport.is_close_frame_sent:
            raise self._inbox.closed()
        transport.send(self._binary, data)

    def recv(self, timeout: float | None = None) -> Any:
        try:
            item = self._inbox.messages.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"no message within {timeout:g} s") from None
        if item is _END:
            self._inbox.messages.put(_END)  # every later recv learns it too
            raise self._inbox.closed()
        if isinstance(item, _Failed):
            raise item.error
        return item

    def close(self, code: int = 1000, reason: str = "") -> None:
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        try:
            if not self._inbox.gone.is_set():
                self._loop.call(self._close_in_loop, code, reason.encode())
                if not self._inbox.gone.wait(self._close_timeout):
                    self._loop.call(self._transport.disconnect, False)
                    self._inbox.gone.wait(self._close_timeout)
        except RuntimeError:  # the loop is already closed (the server shut down): nothing left to close
            pass
        finally:
            if self._owns_loop:
                self._loop.stop()

    def _close_in_loop(self, code: int, reason: bytes) -> None:
        if not self._transport.is_disconnected and not self._transport.is_close_frame_sent:
            self._transport.send_close(code, reason)

    @property
    def remote_address(self) -> Any:
        return self._peer

    def header(self, name: str) -> str | None:
        if self._request is None:
            return None
        value = self._request.headers.get(name)
        return None if value is None else str(value)

    def drop(self) -> None:
        """End the connection at once (no close frame); used by a server shutting down."""
        try:
            self._loop.call(self._transport.disconnect, False)
        except RuntimeError:
            pass
        self._inbox.disconnected()


class _PicowsServer(TransportServer):
    """A picows server: its loop runs in a daemon thread; each connection's handler runs in a thread of its own
    (the reference server's handlers block, e.g. on simulated inference latency)."""

    def __init__(self, handler: Handler, host: str, port: int, parse: Callable[[Data], Any] | None) -> None:
        picows = _picows()
        listener_type = _listener_type()
        self._handler = handler
        self._loop = _LoopThread("plugrl-picows-server")
        self._connections: set[_PicowsTransport] = set()
        self._lock = threading.Lock()
        self._stopped = threading.Event()

        def new_listener(request: Any) -> Any:
            inbox = _Inbox()
            inbox.parse = parse
            inbox.on_connected = lambda transport: self._start(transport, inbox, request)
            return listener_type(inbox)

        try:
            self._server = self._loop.run(picows.ws_create_server(
                new_listener, host, port, max_frame_size=MAX_FRAME_SIZE, enable_auto_pong=True,
                websocket_handshake_timeout=10, logger_name=_PICOWS_LOGGER))
        except BaseException:
            self._loop.stop()
            raise

    def _start(self, transport: Any, inbox: _Inbox, request: Any) -> None:
        peer = transport.underlying_transport.get_extra_info("peername")  # loop thread only, as every transport call
        conn = _PicowsTransport(self._loop, transport, inbox, close_timeout=10.0, owns_loop=False, request=request,
                                peer=peer)
        with self._lock:
            self._connections.add(conn)
        threading.Thread(target=self._serve, args=(conn,), name="plugrl-picows-connection", daemon=True).start()

    def _serve(self, conn: _PicowsTransport) -> None:
        try:
            self._handler(conn)
        except Exception:  # as websockets' server does: log, and close with "internal error"
            logger.exception("connection handler failed")
            conn.close(1011)
        finally:
            conn.close()
            with self._lock:
                self._connections.discard(conn)

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._server.sockets[0].getsockname()[:2]
        return str(host), int(port)

    def serve_forever(self) -> None:
        self._stopped.wait()

    def shutdown(self) -> None:
        if self._stopped.is_set():
            return
        self._loop.call(self._server.close)
        with self._lock:
            connections = list(self._connections)
        for conn in connections:  # as websockets' server does: going away, then a short wait for the answers
            try:
                self._loop.call(conn._close_in_loop, 1001, b"")
            except RuntimeError:
                pass
        deadline = time.monotonic() + SHUTDOWN_WAIT_S
        for conn in connections:
            conn._inbox.gone.wait(max(0.0, deadline - time.monotonic()))
            conn.drop()
        self._stopped.set()
        self._loop.stop()
