"""A loopback TCP proxy that behaves like a real network link: limited bandwidth and a round-trip delay.

``bench/link.py`` puts it between the client and the reference server, and the tests run the client through it, so
what a slow or distant server costs is measured on one machine. It works in user space (no ``tc`` or namespaces, no
root) and is deterministic: a byte's delivery time depends only on when it was read and on the bytes before it.

Each direction is one link that every proxied connection shares, as connections share a real network path:
a queue drained at ``rate_mbytes`` (a token bucket holding at most one read of tokens: a chunk leaves once the
link has carried the chunks before it, of any connection, taking ``len / rate`` seconds) followed by a one-way
delay of ``rtt_ms / 2``. So two connections at once (a client's pipelined env groups) get the rate between them,
not each. Two threads per direction: a reader
that stamps each chunk with its delivery time and a writer that hands it on at that time. At most
:data:`QUEUE_CHUNKS` chunks wait per direction, so a fast sender is held back by TCP as it would be by a real link,
and memory stays bounded.

Every wait is bounded, and everything ends by itself: a connection's threads end once both sides have closed (a
close is passed on after the bytes before it), and :meth:`LinkProxy.close` (or leaving the ``with`` block) closes
the listener and every connection, then joins the threads with a timeout.

Usage::

    with LinkProxy(upstream_port, rate_mbytes=25, rtt_ms=2) as proxy:
        ...  # connect to ws://127.0.0.1:{proxy.port}
"""

from __future__ import annotations

import contextlib
import queue
import socket
import threading
import time
from dataclasses import dataclass

CHUNK = 64 * 1024
"""Bytes read at once; also the granularity of the rate limit (a chunk at 25 MB/s is 2.6 ms of link time)."""
QUEUE_CHUNKS = 64
"""Chunks that may wait per direction (4 MB): beyond it the reader stops reading and TCP holds the sender back."""
POLL_S = 0.1
"""How often a waiting thread looks whether the proxy is closing."""
JOIN_S = 5.0
"""How long :meth:`LinkProxy.close` waits for each thread."""


@dataclass(frozen=True)
class Link:
    """One direction's shape: bytes per second (``None``: unlimited) and the one-way delay in seconds."""

    rate_bytes_s: float | None
    one_way_s: float

    def transit_s(self, nbytes: int) -> float:
        """Time the link takes to carry ``nbytes``, delay excluded."""
        return 0.0 if self.rate_bytes_s is None else nbytes / self.rate_bytes_s


class _Wire:
    """One direction of the link, shared by every connection: when it has carried every chunk read so far."""

    def __init__(self, link: Link) -> None:
        self.link = link
        self.free_at = 0.0
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> float:
        """When a chunk of ``nbytes`` read now has crossed the link (after the chunks before it), delay excluded."""
        with self._lock:
            self.free_at = max(time.monotonic(), self.free_at) + self.link.transit_s(nbytes)
            return self.free_at


class _Direction:
    """One direction of one proxied connection: ``src`` -> the shared ``wire`` -> ``dst``."""

    def __init__(self, src: socket.socket, dst: socket.socket, wire: _Wire, closing: threading.Event) -> None:
        self.src, self.dst, self.wire, self.link, self.closing = src, dst, wire, wire.link, closing
        self.chunks: queue.Queue[tuple[float, bytes]] = queue.Queue(maxsize=QUEUE_CHUNKS)
        self.threads = [threading.Thread(target=self._read, daemon=True, name="link-read"),
                        threading.Thread(target=self._write, daemon=True, name="link-write")]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def _put(self, item: tuple[float, bytes]) -> bool:
        while not self.closing.is_set():
            try:
                self.chunks.put(item, timeout=POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def _read(self) -> None:
        while not self.closing.is_set():
            try:
                data = self.src.recv(CHUNK)
            except OSError:
                data = b""
            if not data:  # the sender closed: pass the close on after the bytes before it
                self._put((self.wire.take(0) + self.link.one_way_s, b""))
                return
            if not self._put((self.wire.take(len(data)) + self.link.one_way_s, data)):
                return

    def _write(self) -> None:
        while not self.closing.is_set():
            try:
                deliver_at, data = self.chunks.get(timeout=POLL_S)
            except queue.Empty:
                continue
            # Bounded: a delivery time is at most the queue's link time plus the delay ahead of now.
            while (wait := deliver_at - time.monotonic()) > 0 and not self.closing.is_set():
                time.sleep(min(wait, POLL_S))
            if not data:
                with contextlib.suppress(OSError):
                    self.dst.shutdown(socket.SHUT_WR)
                return
            try:
                self.dst.sendall(data)
            except OSError:  # the receiver is gone: nothing more can be delivered this way
                with contextlib.suppress(OSError):
                    self.src.shutdown(socket.SHUT_RD)
                return


class LinkProxy:
    """Listens on 127.0.0.1 (a free port: :attr:`port`) and forwards each connection to ``upstream_host:
    upstream_port`` through a link of ``rate_mbytes`` MB/s (10^6 bytes; ``None``: unlimited) each way and a round
    trip of ``rtt_ms`` milliseconds (half of it each way)."""

    def __init__(self, upstream_port: int, rate_mbytes: float | None = None, rtt_ms: float = 0.0,
                 upstream_host: str = "127.0.0.1", connect_timeout_s: float = 10.0) -> None:
        if rate_mbytes is not None and not rate_mbytes > 0:
            raise ValueError(f"rate_mbytes must be > 0 (or None for no limit), got {rate_mbytes}")
        if not rtt_ms >= 0:
            raise ValueError(f"rtt_ms must be >= 0, got {rtt_ms}")
        self.upstream = (upstream_host, upstream_port)
        self.link = Link(None if rate_mbytes is None else rate_mbytes * 1e6, rtt_ms / 2000.0)
        self._up, self._down = _Wire(self.link), _Wire(self.link)  # client -> server, server -> client
        self.connect_timeout_s = connect_timeout_s
        self.closing = threading.Event()
        self._sockets: list[socket.socket] = []
        self._directions: list[_Direction] = []
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(POLL_S)
        self.port: int = self._listener.getsockname()[1]
        self._acceptor = threading.Thread(target=self._accept, daemon=True, name="link-accept")
        self._acceptor.start()

    def __enter__(self) -> LinkProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def connections(self) -> int:
        """Connections proxied so far."""
        with self._lock:
            return len(self._directions) // 2

    def _accept(self) -> None:
        while not self.closing.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:  # the listener was closed
                return
            try:
                server = socket.create_connection(self.upstream, timeout=self.connect_timeout_s)
            except OSError:
                client.close()  # the upstream is not there: the client sees its connection closed, as it would
                continue
            client.settimeout(None)
            server.settimeout(None)
            for sock in (client, server):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            pair = [_Direction(client, server, self._up, self.closing), _Direction(server, client, self._down, self.closing)]
            with self._lock:
                self._sockets += [client, server]
                self._directions += pair
            for direction in pair:
                direction.start()

    def close(self) -> None:
        """Close the listener and every proxied connection; wait (bounded) for the threads to end."""
        self.closing.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            sockets, directions = list(self._sockets), list(self._directions)
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        self._acceptor.join(JOIN_S)
        for direction in directions:
            for thread in direction.threads:
                thread.join(JOIN_S)

    def threads_alive(self) -> int:
        """Threads of this proxy still running (0 once :meth:`close` returned)."""
        with self._lock:
            threads = [t for d in self._directions for t in d.threads]
        return sum(t.is_alive() for t in [self._acceptor, *threads])
