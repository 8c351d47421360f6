"""WebSocket servers for a test: on 127.0.0.1 and a free port, running the test's handler for every connection,
recording how each handler ended, and stopped when the test ends (also when it fails).

Two servers, because tests need two things of them:

* :func:`bare`: websockets' threading server, ``handler(ws)`` in a thread per connection with all of websockets'
  API, so that a handler can misbehave on purpose (fragments, pings, dropped sockets, any close code) and a test can
  set ``ping_interval``/``ping_timeout``;
* :func:`served`: the reference server's own transport (:func:`plugrl_env_client.server.ws_server.serve`) on either
  library, ``await handler(conn)`` on its loop: what the client meets in a real run.

Both fixtures are registered in tests/conftest.py.
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
from websockets.frames import Frame, Opcode


class Running:
    """One server of a test. ``seen`` holds the close that ended each handler (the exception, whose ``code`` is
    None when the socket dropped without a close frame); ``errors`` anything else a handler raised."""

    def __init__(self, url: str, stop: Callable[[], None]) -> None:
        self.url = url
        self.seen: list[Any] = []
        self.errors: list[BaseException] = []
        self._stop = stop
        self._stopped = False

    def stop(self) -> None:
        """Stop accepting and close what is still open (1001); a second call is a no-op."""
        if not self._stopped:
            self._stopped = True
            self._stop()


class Servers:
    """Every server one test started; :meth:`stop_all` ends them."""

    def __init__(self) -> None:
        self.running: list[Running] = []

    def threaded(self, handler: Callable[[Any], None], **kwargs: Any) -> Running:
        """websockets' threading server (``kwargs`` go to its ``serve``; no compression and no size limit unless
        given). A close ends up in ``seen``; other errors in ``errors``, and are raised on, so that websockets
        closes with 1011 as it would for any handler."""
        from websockets.exceptions import ConnectionClosed
        from websockets.sync.server import serve

        def guarded(ws: Any) -> None:
            try:
                handler(ws)
            except ConnectionClosed as exc:
                running.seen.append(exc.rcvd)
            except BaseException as exc:
                running.errors.append(exc)
                raise

        kwargs.setdefault("compression", None)
        kwargs.setdefault("max_size", None)
        server = serve(guarded, "127.0.0.1", 0, **kwargs)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()

        def stop() -> None:
            server.shutdown()
            thread.join(timeout=10)

        running = Running(f"ws://127.0.0.1:{server.socket.getsockname()[1]}", stop)
        self.running.append(running)
        return running

    def reference(self, handler: Callable[[Any], Awaitable[None]], kind: str, **kwargs: Any) -> Running:
        """The reference server's transport of library ``kind`` (``kwargs`` go to its ``serve``: ``parse``,
        ``limits``). A :class:`~plugrl_env_client.websocket.common.WebSocketClosed` ends up in ``seen``, other
        errors in ``errors`` (the connection then closes normally: the test says what it expected)."""
        from plugrl_env_client.server import ws_server
        from plugrl_env_client.websocket.common import WebSocketClosed

        async def guarded(conn: ws_server.Connection) -> None:
            try:
                await handler(conn)
            except WebSocketClosed as exc:
                running.seen.append(exc)
            except BaseException as exc:  # surfaced by the test
                running.errors.append(exc)

        listener = ws_server.serve(guarded, "127.0.0.1", 0, kind=kind, **kwargs)
        running = Running(f"ws://127.0.0.1:{listener.address[1]}", listener.shutdown)
        self.running.append(running)
        return running

    def stop_all(self) -> None:
        for running in self.running:
            running.stop()


def binary_frame(payload: bytes | bytearray | memoryview) -> bytes:
    """``payload`` as one masked client frame, framed by websockets itself (for a client's ``send_frame``)."""
    return Frame(Opcode.BINARY, bytes(payload)).serialize(mask=True)


def echo(ws: Any) -> None:
    """A threaded server's handler that sends every message back."""
    for message in ws:
        ws.send(message)


async def echo_async(conn: Any) -> None:
    """A reference-transport handler that sends every message back (until the close, in ``seen``)."""
    while True:
        await conn.send(await conn.recv())


@pytest.fixture
def bare() -> Iterator[Callable[..., str]]:
    """``bare(handler, **kwargs)``: a threaded websockets server (see :meth:`Servers.threaded`); returns its URL."""
    servers = Servers()
    yield lambda handler, **kwargs: servers.threaded(handler, **kwargs).url
    servers.stop_all()


@pytest.fixture
def served() -> Iterator[Callable[..., Running]]:
    """``served(handler, kind, **kwargs)``: the reference server's transport (see :meth:`Servers.reference`)."""
    servers = Servers()
    yield servers.reference
    servers.stop_all()
