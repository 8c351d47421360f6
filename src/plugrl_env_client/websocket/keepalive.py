"""Answering the server's pings while the owner's thread is inside one long call.

A :class:`~plugrl_env_client.websocket.client.WebSocketClient` reads its socket only when its owner asks, which
is between env calls. An env call that takes longer than the server's ping interval plus its ping timeout (an env's
construction, a slow reset, a long step) would leave a ping unanswered and the server would close the connection.
PlugRL promises (SPEC C2) that pings are answered while envs step, so the owner brackets each env call::

    keepalive = Keepalive(clients)
    with keepalive:             # entering: three attribute writes and a clock reading
        env.step(actions)       # past grace_s, the keepalive's thread services the clients
    # leaving: the socket is the owner's again before this line runs

The handover, in one rule: **a client is used by exactly one thread at a time, and the ``held`` mark decides which.**

* ``__enter__`` records that the owner is in call number *k* since *t* (plain attribute writes, no lock). It wakes
  nobody: a call that returns within ``grace_s`` (every ordinary step) never involves the other thread.
* The keepalive's thread sleeps until *t + grace_s*. If call *k* is still running then, it takes the clients over
  under the lock (``held``; each client's ``lent`` flag makes a stray use by the owner an error, not a race) and
  services them: it waits on their sockets and on a wake-up socket, reads, answers pings, queues the messages for
  the owner, notes a close. It sends no data frame of its own: the one frame the owner may have held for the
  next (``send_frame(more=True)``: a pipelined feedback waiting for its infer) goes out when it takes over, so it
  waits at most ``grace_s``; every other frame the owner sent was written whole before the call began.
* ``__exit__`` records that the call is over, then looks whether the thread holds the clients; the thread marks
  them held, then looks whether the call is still on (and backs off if not), so one of the two always sees the
  other (Python's threads see each other's writes in order). If the clients are held, ``__exit__`` wakes the thread
  through the wake-up socket and waits, under the lock, until the thread has given them back (the thread finishes
  the read it is in, which never waits on the network). So when ``__exit__`` returns, the owner may use the clients,
  and the thread has stopped touching them.

Many short calls in a row need no thread either, but they need someone to read: a loop that steps through a long
chunk reads nothing from the server for many steps. So ``__exit__`` also services the clients itself, on the owner's
thread, when the call began ``grace_s`` or more after the last time they were serviced: the longest a ping waits
for its pong is then about ``grace_s`` plus one call, and an ordinary step pays one clock comparison for it.

The thread is created at the first ``__enter__`` and lives until :meth:`close` (a daemon thread, so it never holds
the process up). Between long calls it wakes about once per ``grace_s`` to look at the clock.
"""

from __future__ import annotations

import logging
import selectors
import socket
import threading
import time
from collections.abc import Iterable
from types import TracebackType

from plugrl_env_client.websocket.client import WebSocketClient

logger = logging.getLogger(__name__)

__all__ = ["GRACE_S", "Keepalive"]

GRACE_S = 0.25
"""How long a call runs before the keepalive takes the sockets over, so the longest a pong waits: far below any
server's ping timeout (websockets' default: 20 s; SPEC C2's test: 0.5 s), and far above an ordinary env step, so
a step never pays for it. A takeover costs about a hundred microseconds against a call of 250 ms or more."""


class Keepalive:
    """Services ``clients`` for their owner while the owner is inside a call longer than ``grace_s`` (see the
    module docstring for the handover). Use one per owner thread; ``with`` blocks come from the
    owner only."""

    def __init__(self, clients: Iterable[WebSocketClient] = (), grace_s: float = GRACE_S) -> None:
        self.grace_s = grace_s
        self._clients = list(clients)
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._in_call = False
        self._call = 0  # numbers the owner's calls: a takeover belongs to one call
        self._since = 0.0
        self._held = False
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._wake_r: socket.socket | None = None
        self._wake_w: socket.socket | None = None
        self._next_service = 0.0  # leaving a call services the clients when a call began at or after this time
        self.takeovers = 0
        """How many calls ran long enough for the keepalive to service the clients (for tests and logs)."""

    def add(self, client: WebSocketClient) -> None:
        """Service ``client`` too (a connection just opened); from the owner, outside a call."""
        with self._lock:
            if client not in self._clients:
                self._clients.append(client)

    def discard(self, client: WebSocketClient) -> None:
        """Stop servicing ``client`` (it is being closed); from the owner, outside a call."""
        with self._lock:
            if client in self._clients:
                self._clients.remove(client)

    # ------------------------------------------------------------------------------------------ the owner's side

    def __enter__(self) -> Keepalive:
        """The owner starts a call that may run long: three attribute writes and a clock reading, no lock."""
        self._since = time.monotonic()
        self._call += 1  # written after _since: the thread reads _call first, then _since
        self._in_call = True
        if self._thread is None and not self._stopping:
            self._start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None = None, exc: BaseException | None = None,
                 tb: TracebackType | None = None) -> None:
        """The owner's call returned: once this returns, the clients are the owner's again (and they were
        serviced, if they had not been for ``grace_s``)."""
        self._in_call = False  # written before _held is read; the thread writes _held before it reads _in_call
        if self._held:
            self._take_back()
        if self._since >= self._next_service:
            self._next_service = self._since + self.grace_s
            for client in self._clients:
                client.service()  # reads what came, answers pings; never raises

    def _take_back(self) -> None:
        """Wake the thread servicing the clients and wait until it has given them back."""
        with self._lock:
            if self._held:
                assert self._wake_w is not None
                try:
                    self._wake_w.send(b"\0")
                except OSError:  # cannot happen while the thread runs; the wait below still ends with it
                    pass
                while self._held:
                    self._changed.wait()

    def close(self) -> None:
        """Stop the thread (waits for it); the clients stay open. Call it from the owner, outside a call."""
        with self._lock:
            self._stopping = True
            self._in_call = False
            self._changed.notify_all()
            thread = self._thread
            if self._held and self._wake_w is not None:
                self._wake_w.send(b"\0")
        if thread is not None:
            thread.join(timeout=10)
        for sock in (self._wake_r, self._wake_w):
            if sock is not None:
                sock.close()

    # ------------------------------------------------------------------------------------------ the thread's side

    def _start(self) -> None:
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._thread = threading.Thread(target=self._run, name="plugrl-keepalive", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with self._lock:
            while not self._stopping:
                if not self._in_call:
                    self._changed.wait(self.grace_s)  # entering wakes nobody: look again a grace period later
                    continue
                call = self._call
                due = self._since + self.grace_s - time.monotonic()
                if due > 0:
                    self._changed.wait(due)
                    continue
                # Claim the clients, then look again: the owner leaves a call by clearing _in_call and then reading
                # _held, so either it sees this claim (and waits for the clients back in _take_back) or this sees
                # it gone. The clients are touched only once the claim stands.
                self._held = True
                if not self._in_call or self._call != call:
                    self._held = False
                    self._changed.notify_all()
                    continue
                clients = list(self._clients)
                self.takeovers += 1
                for client in clients:
                    client.lent = True
                self._lock.release()
                try:
                    self._service(clients, call)
                except Exception:  # a bug here must not leave the owner waiting on its way out
                    logger.exception("the keepalive failed while servicing the connection")
                finally:
                    self._lock.acquire()
                    for client in clients:
                        client.lent = False
                    self._held = False
                    self._changed.notify_all()
                # The call that was serviced is over (or the keepalive stops); wait for the next one.

    def _service(self, clients: list[WebSocketClient], call: int) -> None:
        wake = self._wake_r
        assert wake is not None
        while True:
            with self._lock:
                if self._stopping or not self._in_call or self._call != call:
                    break
            live = [c for c in clients if not c.closed]
            for client in live:
                client._write_held()  # a frame the owner held for its next one waits no longer than the grace
                if client.tls_pending():  # decrypted bytes that no select reports
                    client._pump()
            with selectors.DefaultSelector() as selector:  # no fd limit (select's is 1024)
                selector.register(wake, selectors.EVENT_READ)
                for client in live:
                    selector.register(client, selectors.EVENT_READ)
                ready = [key.fileobj for key, _ in selector.select()]
            for fileobj in ready:
                if fileobj is not wake:
                    fileobj._pump()  # type: ignore[union-attr]  # reads, answers pings, queues messages; never raises
        try:
            while wake.recv(64):
                pass
        except BlockingIOError:
            pass
