"""The WebSocket servers under the reference policy server: every connection is a coroutine on one event loop.

Why one loop and no thread per connection: a thread per connection (websockets' threading server runs two or three
per connection, its handler's, the reader's and the keepalive's) made a storm of connections that open and drop cost
hundreds of threads, and threads stayed alive as long as their sockets did. On one loop a connection costs a task and
its buffers, whatever it does; a slow policy still delays only its own connection, because waiting
(``latency_ms``) is an ``await``, not a sleep.

What bounds a connection that never gets anywhere:

* ``open_timeout``: a connection whose opening handshake is not done by then is dropped (a bare TCP connect, half an
  HTTP request);
* keepalive: a ping every ``ping_interval`` seconds; a peer that has not answered within ``ping_timeout`` is
  closed, so a socket held open by a peer that never reads (half a frame, then nothing) ends too. A client that
  stays quiet but answers pings (one resetting heavy simulators before its first infer) is served whenever it is
  ready: there is no first-message timeout;
* ``max_connections``: beyond that many open connections, a handshake is refused with HTTP 503 (which clients
  retry), so a storm cannot make the server hold more than that many.

Given an ``api_key``, a handshake whose ``Authorization`` header is not ``Api-Key <key>`` is refused with HTTP 401
(PlugRL SPEC 1), by both libraries alike; the header is compared in constant time (:func:`authorized`), and the key
is never logged nor sent back. Each refused handshake is a warning naming the peer's address (picows does not
tell it before the handshake is answered: its line says so) and what was wrong (:func:`why_refused`), never the
key a client sent.

Two libraries, the same bytes on the wire (no compression, no size limit): websockets' asyncio server, or picows
(extra ``fast``, imported only when chosen; a C frame parser that decodes straight from its read buffer). The server
runs its loop in a daemon thread of its own; :class:`Listener` is what the policy server sees of it.
"""

from __future__ import annotations

import abc
import asyncio
import collections
import concurrent.futures
import dataclasses
import functools
import hmac
import http
import logging
import threading
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, ClassVar, TypeVar

from websockets.asyncio.server import Server as WsServer
from websockets.asyncio.server import ServerConnection as WsConnection
from websockets.asyncio.server import serve as ws_serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from plugrl_env_client.errors import ConfigError
from plugrl_env_client.websocket.common import WebSocketClosed, retain_freed_memory

logger = logging.getLogger(__name__)

SERVER_KINDS = ("websockets", "picows")
MAX_FRAME_SIZE = 1 << 62
"""picows refuses frames above its ``max_frame_size`` (10 MiB by default); PlugRL frames have no size limit."""
CLOSE_NO_STATUS = 1005
"""The code a close frame without a payload stands for (RFC 6455 7.1.5)."""
TOO_MANY = "the server is at its limit of {} connections; try again later\n"
UNAUTHORIZED = "this server needs an API key: send the header 'Authorization: Api-Key <key>' (the client's --api-key)\n"
AUTH_HEADER = "Authorization"
AUTH_SCHEME = "Api-Key"


def authorized(api_key: str | None, headers: Sequence[str]) -> bool:
    """Whether a handshake's ``Authorization`` header values admit it: always without a key; with one, only when
    one of them is ``Api-Key <key>`` (a client may also send another scheme, e.g. Basic from a URL's user info),
    each compared in constant time (as bytes, so a header that is not ASCII is just a mismatch)."""
    if api_key is None:
        return True
    expected = f"{AUTH_SCHEME} {api_key}".encode()
    matches = [hmac.compare_digest(expected, str(h).encode("utf-8", "surrogateescape")) for h in headers]
    return any(matches)


def why_refused(headers: Sequence[str]) -> str:
    """What a refused handshake's ``Authorization`` header values lacked, for the log line (never their value)."""
    if not headers:
        return "no Authorization header"
    if not any(str(h).startswith(f"{AUTH_SCHEME} ") for h in headers):
        return f"an Authorization header without the {AUTH_SCHEME} scheme"
    return "an API key that is not this server's"


def log_refused(peer: Any, headers: Sequence[str]) -> None:
    logger.warning("refused the WebSocket handshake of %s with HTTP 401: %s", peer, why_refused(headers))


_T = TypeVar("_T")


@dataclasses.dataclass(frozen=True)
class ServeLimits:
    """How long a connection may take to get anywhere, and how many there may be (see the module docstring)."""

    open_timeout: float = 10.0
    """Seconds for the opening handshake (the client's own handshake timeout is 10 s too)."""
    ping_interval: float = 20.0
    """Seconds between keepalive pings (PlugRL servers keep websockets' default of 20 s)."""
    ping_timeout: float = 20.0
    """Seconds a peer has to answer a ping before it is closed."""
    close_timeout: float = 2.0
    """Seconds a closing connection waits for the peer's close frame before it drops the socket."""
    max_connections: int = 1024
    """Open connections beyond which handshakes are refused with HTTP 503."""

    def __post_init__(self) -> None:
        for name in ("open_timeout", "ping_interval", "ping_timeout", "close_timeout"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0 seconds, got {getattr(self, name)}")
        if self.max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {self.max_connections}")


class Connection(abc.ABC):
    """One client's connection, used only from the server's loop (by the connection's own coroutine, and by the
    server closing it)."""

    kind: ClassVar[str]

    @property
    @abc.abstractmethod
    def remote_address(self) -> Any:
        """The client's socket address (for log lines); None once the socket is gone."""

    @abc.abstractmethod
    def header(self, name: str) -> str | None:
        """A header of the client's opening handshake (case-insensitive), or None."""

    @abc.abstractmethod
    async def recv(self) -> Any:
        """The next message: ``parse(frame)`` for a binary one (see :func:`serve`; what ``parse`` raises comes out
        of here), a str for a text one. Raises :class:`WebSocketClosed` once the connection is closed."""

    @abc.abstractmethod
    async def send(self, data: bytes) -> None:
        """Send one binary message. Raises :class:`WebSocketClosed` when the connection is closed."""

    @abc.abstractmethod
    async def send_text(self, text: str) -> None:
        """Send one text message (openpi's servers send a traceback so). Raises :class:`WebSocketClosed` when the
        connection is closed."""

    @abc.abstractmethod
    async def close(self, code: int = 1000, reason: str = "") -> None:
        """Send a close frame and wait (up to the close timeout) for the peer's; a no-op on a closed connection."""


Handler = Callable[[Connection], Awaitable[None]]


class Listener(abc.ABC):
    """A listening server: its loop runs in a daemon thread, every connection's handler is a task on it."""

    def __init__(self, handler: Handler, parse: Callable[[Any], Any] | None, limits: ServeLimits,
                 api_key: str | None = None) -> None:
        self._handler = handler
        self._parse = parse
        self.limits = limits
        self._api_key = api_key
        self.loop: asyncio.AbstractEventLoop  # made by the loop's own thread, see _run
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="plugrl-policy-server-loop", daemon=True)
        self._ready = threading.Event()
        self._thread.start()
        try:
            self._ready.wait()
            self.run(self._start())
        except BaseException:  # Ctrl-C while starting included: nothing keeps running
            self._stop_loop()
            raise

    def _run(self) -> None:
        # The loop is built here, not in the caller's thread: Python delivers signals to the main thread only, so a
        # Ctrl-C can never land inside the loop's constructor and leave a half-built loop behind.
        self.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._ready.set)
        self.loop.run_forever()

    def run(self, coro: Coroutine[Any, Any, _T], timeout: float | None = None) -> _T:
        """Run ``coro`` on the loop from another thread and wait for its result."""
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"no answer from the server's loop within {timeout:g} s") from None

    @abc.abstractmethod
    async def _start(self) -> None:
        """Bind and start accepting (raises OSError when the address cannot be bound)."""

    @abc.abstractmethod
    async def _stop(self) -> None:
        """Stop accepting, close every open connection with 1001 and wait for the handlers to end."""

    @property
    @abc.abstractmethod
    def address(self) -> tuple[str, int]:
        """(host, port) the server is bound to (the port is the real one when 0 was asked for)."""

    @property
    @abc.abstractmethod
    def connections(self) -> int:
        """Connections open now (past the handshake)."""

    def in_loop(self) -> bool:
        return threading.current_thread() is self._thread

    def serve_forever(self) -> None:
        """Block until :meth:`shutdown`."""
        self._stopped.wait()

    def shutdown(self) -> None:
        """Stop accepting and close every connection still open with 1001 (going away, no reason): a server that
        has more to say closes its connections itself first. Not from the loop's own thread."""
        if self._stopped.is_set():
            return
        try:
            self.run(self._stop(), timeout=self.limits.close_timeout + 10)
        except TimeoutError:
            logger.warning("the server's connections did not all close within %g s; stopping anyway",
                           self.limits.close_timeout + 10)
        finally:
            self._stopped.set()
            self._stop_loop()

    def _stop_loop(self) -> None:
        if not self._ready.wait(timeout=5) or self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)
        if not self._thread.is_alive():
            self.loop.close()


def serve(handler: Handler, host: str, port: int, kind: str = "websockets", parse: Callable[[Any], Any] | None = None,
          limits: ServeLimits | None = None, api_key: str | None = None) -> Listener:
    """Listen on ``host:port`` (0: a free port) and run ``await handler(connection)`` for every connection, on the
    listener's loop. Raises OSError when the address cannot be bound.

    With ``parse``, a connection's ``recv`` returns ``parse(frame)`` for a binary message (picows hands it a view
    of its read buffer, so ``parse`` must copy what it keeps; msgpack's unpacking does). With ``api_key``, only
    handshakes that carry it (``Authorization: Api-Key <key>``) get a connection; the others get HTTP 401.
    """
    if kind not in SERVER_KINDS:
        raise ConfigError(f"unknown server transport {kind!r}; choose one of {', '.join(SERVER_KINDS)}")
    retain_freed_memory()
    limits = limits or ServeLimits()
    if kind == "picows":
        return _PicowsListener(handler, host, port, parse, limits, api_key)
    return _WebsocketsListener(handler, host, port, parse, limits, api_key)


# ------------------------------------------------------------------------------------------------------ websockets

_WS_LOGGER = logging.getLogger(__name__ + ".websockets")
# websockets logs every connection's opening and closing at INFO; the policy server says what matters itself.
_WS_LOGGER.setLevel(logging.WARNING)


class _WebsocketsConnection(Connection):
    kind = "websockets"

    def __init__(self, ws: WsConnection, parse: Callable[[Any], Any] | None) -> None:
        self._ws = ws
        self._parse = parse

    @property
    def remote_address(self) -> Any:
        return self._ws.remote_address  # the transport's cached peer name: no system call that could fail

    def header(self, name: str) -> str | None:
        request = self._ws.request
        return None if request is None else request.headers.get(name)

    async def recv(self) -> Any:
        try:
            message = await self._ws.recv()
        except ConnectionClosed as exc:
            raise _closed(exc) from None
        if self._parse is None or isinstance(message, str):
            return message
        return self._parse(message)

    async def send(self, data: bytes) -> None:
        try:
            await self._ws.send(data)
        except ConnectionClosed as exc:
            raise _closed(exc) from None

    async def send_text(self, text: str) -> None:
        await self.send(text)  # type: ignore[arg-type]  # websockets sends a str as a text frame

    async def close(self, code: int = 1000, reason: str = "") -> None:
        await self._ws.close(code, reason)


def _closed(exc: ConnectionClosed) -> WebSocketClosed:
    frame = exc.rcvd
    return WebSocketClosed(None, "") if frame is None else WebSocketClosed(frame.code, frame.reason)


class _WebsocketsListener(Listener):
    def __init__(self, handler: Handler, host: str, port: int, parse: Callable[[Any], Any] | None,
                 limits: ServeLimits, api_key: str | None) -> None:
        self._host, self._port = host, port
        self._server: WsServer | None = None
        super().__init__(handler, parse, limits, api_key)

    async def _start(self) -> None:
        limits = self.limits

        async def handle(ws: WsConnection) -> None:
            await self._handler(_WebsocketsConnection(ws, self._parse))

        def admit(ws: WsConnection, request: Request) -> Response | None:
            assert self._server is not None
            if not authorized(self._api_key, request.headers.get_all(AUTH_HEADER)):
                log_refused(ws.remote_address, request.headers.get_all(AUTH_HEADER))
                refused = ws.respond(http.HTTPStatus.UNAUTHORIZED, UNAUTHORIZED)
                refused.headers["WWW-Authenticate"] = AUTH_SCHEME
                return refused
            if len(self._server.connections) >= limits.max_connections:
                return ws.respond(http.HTTPStatus.SERVICE_UNAVAILABLE, TOO_MANY.format(limits.max_connections))
            return None

        self._server = await ws_serve(
            handle, self._host, self._port, compression=None, max_size=None, process_request=admit,
            open_timeout=limits.open_timeout, ping_interval=limits.ping_interval, ping_timeout=limits.ping_timeout,
            close_timeout=limits.close_timeout, logger=_WS_LOGGER)

    async def _stop(self) -> None:
        assert self._server is not None
        self._server.close()  # closes every connection with 1001 and waits for the handlers
        await self._server.wait_closed()

    @property
    def address(self) -> tuple[str, int]:
        assert self._server is not None
        host, port = self._server.sockets[0].getsockname()[:2]
        return str(host), int(port)

    @property
    def connections(self) -> int:
        return 0 if self._server is None else len(self._server.connections)


# ------------------------------------------------------------------------------------------------------ picows

_PICOWS_LOGGER = logging.getLogger(__name__ + ".picows")
# picows logs each connection and disconnection at INFO; the policy server already says so.
_PICOWS_LOGGER.setLevel(logging.WARNING)


@functools.cache
def _picows() -> Any:
    try:
        import picows
    except ImportError:
        raise ConfigError("--transport picows needs the picows package: pip install 'plugrl-env-client[fast]' "
                          "(or use --transport websockets)") from None
    return picows


class _Failed:
    """A message whose parsing failed: the ``recv`` that would have returned it raises ``error``."""

    def __init__(self, error: Exception) -> None:
        self.error = error


class _PicowsConnection(Connection):
    """A picows connection: the listener (called by picows on the loop) queues whole messages here; sends and
    closes are plain calls on the loop, with picows' flow control for large sends."""

    kind = "picows"

    def __init__(self, loop: asyncio.AbstractEventLoop, request: Any, parse: Callable[[Any], Any] | None,
                 close_timeout: float) -> None:
        picows = _picows()
        self._loop = loop
        self._request = request
        self._parse = parse
        self._close_timeout = close_timeout
        self._binary, self._text_type = picows.WSMsgType.BINARY, picows.WSMsgType.TEXT
        self._continuation, self._close_type = picows.WSMsgType.CONTINUATION, picows.WSMsgType.CLOSE
        self.transport: Any = None
        self.peer: Any = None
        self._messages: collections.deque[Any] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None
        self._writable = asyncio.Event()
        self._writable.set()
        self.gone = asyncio.Event()
        self._close_code: int | None = None
        self._close_reason = ""
        self._parts: list[bytes] = []
        self._text = False

    # --------------------------------------------------------------------------------- called by the listener

    def connected(self, transport: Any) -> None:
        self.transport = transport
        self.peer = transport.underlying_transport.get_extra_info("peername")

    def frame(self, frame: Any) -> None:
        kind = frame.msg_type
        if kind is self._binary or kind is self._text_type or kind is self._continuation:
            if kind is not self._continuation:
                self._text = kind is self._text_type
                self._parts.clear()
            whole = frame.fin and not self._parts
            if whole and not self._text and self._parse is not None:
                self._put(self._parsed(frame.get_payload_as_memoryview()))  # no copy out of the read buffer
                return
            if whole:
                payload = frame.get_payload_as_bytes()
            else:  # a fragmented message (PlugRL peers send none, but the protocol allows it): assemble it
                self._parts.append(frame.get_payload_as_bytes())
                if not frame.fin:
                    return
                payload, self._parts = b"".join(self._parts), []
            if self._text:
                self._put(payload.decode("utf-8", "replace"))
            else:
                self._put(payload if self._parse is None else self._parsed(payload))
        elif kind is self._close_type:
            payload = frame.get_payload_as_bytes()
            self._close_code = int.from_bytes(payload[:2], "big") if len(payload) >= 2 else CLOSE_NO_STATUS
            self._close_reason = payload[2:].decode("utf-8", "replace")
            if not self.transport.is_close_frame_sent:  # the peer started the closing handshake: answer it
                echo = self._close_code if self._close_code != CLOSE_NO_STATUS else 1000
                self.transport.send_close(echo, payload[2:])
            self.transport.disconnect()

    def disconnected(self) -> None:
        self.gone.set()
        self._writable.set()  # a sender waiting for the socket to drain finds the connection gone
        self._wake()

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    def _parsed(self, payload: Any) -> Any:
        assert self._parse is not None
        try:
            return self._parse(payload)
        except Exception as exc:  # raised by the recv that would have returned it
            return _Failed(exc)

    def _put(self, item: Any) -> None:
        self._messages.append(item)
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    # --------------------------------------------------------------------------------- Connection

    @property
    def remote_address(self) -> Any:
        return self.peer

    def header(self, name: str) -> str | None:
        value = self._request.headers.get(name)
        return None if value is None else str(value)

    async def recv(self) -> Any:
        while not self._messages:
            if self.gone.is_set():
                raise WebSocketClosed(self._close_code, self._close_reason)
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        item = self._messages.popleft()
        if isinstance(item, _Failed):
            raise item.error
        return item

    async def send(self, data: bytes) -> None:
        if not self._writable.is_set():
            await self._writable.wait()  # the socket is behind: let it drain before queueing more
        transport = self.transport
        if self.gone.is_set() or transport.is_close_frame_sent:
            raise WebSocketClosed(self._close_code, self._close_reason)
        transport.send(self._binary, data)

    async def send_text(self, text: str) -> None:
        if self.gone.is_set() or self.transport.is_close_frame_sent:
            raise WebSocketClosed(self._close_code, self._close_reason)
        self.transport.send(self._text_type, text.encode("utf-8"))

    async def close(self, code: int = 1000, reason: str = "") -> None:
        transport = self.transport
        if self.gone.is_set():
            return
        if not transport.is_close_frame_sent:
            transport.send_close(code, reason.encode())
        try:
            await asyncio.wait_for(self.gone.wait(), self._close_timeout)
        except asyncio.TimeoutError:
            transport.disconnect(False)


class _PicowsListener(Listener):
    def __init__(self, handler: Handler, host: str, port: int, parse: Callable[[Any], Any] | None,
                 limits: ServeLimits, api_key: str | None) -> None:
        self._host, self._port = host, port
        self._server: Any = None
        self._open: set[_PicowsConnection] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._closing = False
        super().__init__(handler, parse, limits, api_key)

    async def _start(self) -> None:
        picows = _picows()
        limits = self.limits
        listener_type = _listener_type()

        def new_listener(request: Any) -> Any:
            if not authorized(self._api_key, request.headers.getall(AUTH_HEADER, [])):
                log_refused("a client (picows does not give its address)", request.headers.getall(AUTH_HEADER, []))
                return picows.WSUpgradeResponseWithListener(picows.WSUpgradeResponse.create_error_response(
                    http.HTTPStatus.UNAUTHORIZED, UNAUTHORIZED.encode(), {"WWW-Authenticate": AUTH_SCHEME}), None)
            if self._closing or len(self._open) >= limits.max_connections:
                status = http.HTTPStatus.SERVICE_UNAVAILABLE
                body = ("the server is shutting down\n" if self._closing
                        else TOO_MANY.format(limits.max_connections)).encode()
                return picows.WSUpgradeResponseWithListener(
                    picows.WSUpgradeResponse.create_error_response(status, body), None)
            return listener_type(_PicowsConnection(self.loop, request, self._parse, limits.close_timeout), self)

        self._server = await picows.ws_create_server(
            new_listener, self._host, self._port, max_frame_size=MAX_FRAME_SIZE, enable_auto_pong=True,
            websocket_handshake_timeout=limits.open_timeout, enable_auto_ping=True,
            auto_ping_idle_timeout=limits.ping_interval, auto_ping_reply_timeout=limits.ping_timeout,
            logger_name=_PICOWS_LOGGER)

    def started(self, conn: _PicowsConnection) -> None:
        """A connection's handshake is done: run its handler (called by its listener, on the loop)."""
        self._open.add(conn)
        task = self.loop.create_task(self._serve(conn))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, conn: _PicowsConnection) -> None:
        try:
            await self._handler(conn)
        except Exception:  # as websockets' server does: log, and close with "internal error"
            logger.exception("connection handler failed")
            await conn.close(1011)
        finally:
            await conn.close()
            self._open.discard(conn)

    async def _stop(self) -> None:
        self._closing = True
        self._server.close()
        closing = [conn.close(1001) for conn in list(self._open)]  # as websockets' server does: going away
        await asyncio.gather(*closing, return_exceptions=True)
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=self.limits.close_timeout)

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._server.sockets[0].getsockname()[:2]
        return str(host), int(port)

    @property
    def connections(self) -> int:
        return len(self._open)


@functools.cache
def _listener_type() -> type:
    """The picows listener class (defined on first use: picows is imported only when chosen)."""
    picows = _picows()

    class Listener(picows.WSListener):  # type: ignore[name-defined]
        def __init__(self, conn: _PicowsConnection, server: _PicowsListener) -> None:
            super().__init__()
            self.conn, self.server = conn, server

        def on_ws_connected(self, transport: Any) -> None:
            self.conn.connected(transport)
            self.server.started(self.conn)

        def on_ws_frame(self, transport: Any, frame: Any) -> None:
            self.conn.frame(frame)

        def on_ws_disconnected(self, transport: Any) -> None:
            self.conn.disconnected()

        def pause_writing(self) -> None:
            self.conn.pause_writing()

        def resume_writing(self) -> None:
            self.conn.resume_writing()

    return Listener
