"""openpi's wire protocol, and the session that speaks it for a batch of envs.

openpi's policy server (``openpi_server.WebsocketPolicyServer``) sends one msgpack map of metadata when a client
connects; then it answers each request, one env's observation as a msgpack map (arrays in the ``__ndarray__``
convention of :mod:`~plugrl_env_client.protocol.codec`), with a map whose ``actions`` is an ``(H, D)`` chunk, and
``server_timing`` (``infer_ms``). There is no feedback, no env id and no reset message. When its policy raises, it
sends the traceback as a text frame and closes with 1011.

:class:`OpenpiWire` is that protocol for one :class:`~plugrl_env_client.protocol.session.Session` (dialing, waits
that end, timeouts and closes are the session's, as for PlugRL). :class:`OpenpiSession` gives the rollout the same
interface as a PlugRL session for a whole env batch: an infer for ``n`` envs goes out as one request per env over
its connections (one request in flight on each; an env waits for a free connection when there are fewer), spread
over the servers named, and its reply is the envs' chunks stacked time-major, as a PlugRL server sends them. A
feedback sends nothing. Each request's keys come from a :class:`~plugrl_env_client.protocol.openpi_keys.KeyMap`.

A traceback frame or a 1011 close ends the run with a :class:`~plugrl_env_client.errors.ProtocolError` naming the
traceback's last line (the whole traceback goes to the log); a reply without ``actions`` likewise. Other closes
are handled as for PlugRL: the rollout drops its chunks in flight and the session reconnects.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from plugrl_env_client.errors import ProtocolError
from plugrl_env_client.protocol import messages
from plugrl_env_client.protocol.dialing import SessionConfig
from plugrl_env_client.protocol.exchange import (
    AlreadyAwaitingReply,
    Closed,
    ConnectionLost,
    Exchange,
    NoFeedbackDue,
    NoReplyAwaited,
)
from plugrl_env_client.protocol.messages import ActionReply, Feedback, InferRequest, ObservationLike, ServerMetadata
from plugrl_env_client.protocol.openpi_keys import KeyMap
from plugrl_env_client.protocol.session import Session
from plugrl_env_client.timing import Stopwatch, Timing

if TYPE_CHECKING:
    from plugrl_env_client.websocket.keepalive import Keepalive

logger = logging.getLogger(__name__)

__all__ = ["OpenpiChoices", "OpenpiSession", "OpenpiWire"]


class OpenpiChoices(Protocol):
    """What an :class:`OpenpiSession` reads of the run's openpi choices (the app layer's openpi section)."""

    @property
    def preset(self) -> str: ...
    @property
    def key(self) -> tuple[str, ...]: ...
    @property
    def image_size(self) -> int: ...
    @property
    def connections(self) -> int | None: ...


class OpenpiWire:
    """openpi's messages on one connection (see the module docstring)."""

    server_kind = "an openpi policy server"
    feedback = False

    def __init__(self) -> None:
        self.last_traceback = ""
        """The last line of the last traceback the server sent ("" before one)."""

    def metadata(self, msg: Any) -> ServerMetadata:
        if not isinstance(msg, dict):
            raise ProtocolError(f"the server's first message must be a map of metadata (openpi's protocol), got "
                                f"{type(msg).__name__}")
        if msg.get("message_type") == messages.METADATA and "data" in msg:
            raise ProtocolError("the server speaks PlugRL v1 (its first message is PlugRL's metadata), not openpi's "
                                "protocol")
        parsed = messages.parse_metadata({"message_type": messages.METADATA, "data": msg})
        return dataclasses.replace(parsed, features=())  # openpi has no optional features

    def infer(self, request: InferRequest[Any], image_codec: str, quality: int) -> Any:
        return request.obs

    def reply(self, msg: Any, asked: np.ndarray) -> ActionReply:
        if not isinstance(msg, dict) or "actions" not in msg:
            keys = sorted(map(str, msg)) if isinstance(msg, dict) else type(msg).__name__
            raise ProtocolError(f"the openpi server's reply has no 'actions' (it holds {keys}); its policy must "
                                "return a map with an (H, D) 'actions' array")
        actions = msg["actions"]
        if isinstance(actions, list):
            actions = np.asarray(actions)
        if not isinstance(actions, np.ndarray) or actions.ndim == 0:
            got = f"shape {list(actions.shape)}" if isinstance(actions, np.ndarray) else type(actions).__name__
            raise ProtocolError(f"the openpi server's 'actions' must be an (H, D) array, got {got}")
        if actions.shape[0] == 0:
            raise ProtocolError("the openpi server's 'actions' has horizon 0; a chunk needs at least one step")
        timing = msg.get("server_timing")
        infer_ms = timing.get("infer_ms") if isinstance(timing, dict) else None
        seconds = (float(infer_ms) / 1000.0 if isinstance(infer_ms, (int, float)) and not isinstance(infer_ms, bool)
                   and np.isfinite(infer_ms) and infer_ms >= 0 else None)
        return ActionReply(asked, actions[:, None], seconds)

    def unexpected(self, msg: Any) -> str:
        return "a reply"

    def text_frame(self, text: str) -> ProtocolError:
        lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
        self.last_traceback = lines[-1] if lines else ""
        logger.error("the openpi server sent a traceback:\n%s", text)
        return ProtocolError(f"the openpi server failed while answering; its traceback ends: {self.last_traceback!r} "
                             "(the whole traceback is in the run's log)")

    def close_error(self, code: int | None, reason: str) -> ProtocolError | None:
        if code != messages.CLOSE_INTERNAL:
            return None
        why = f" ({reason})" if reason else ""
        ends = f"; its last traceback ends: {self.last_traceback!r}" if self.last_traceback else ""
        return ProtocolError(f"the openpi server closed the connection with 1011, an internal error{why}{ends}")


class OpenpiSession:
    """A rollout's server session over openpi's protocol: one :class:`Session` per connection, each with its own
    :class:`OpenpiWire`, connection ``k`` to ``urls[(first + k) % len(urls)]`` where ``first`` is the place of
    ``config.url`` among them. Not thread-safe: one rollout thread drives it."""

    def __init__(self, config: SessionConfig, num_envs: int, should_stop: Callable[[], bool] = lambda: False,
                 timing: Timing | None = None, keepalive: Keepalive | None = None) -> None:
        openpi: OpenpiChoices | None = config.openpi
        self.timing = timing if timing is not None else Timing()
        self.keys = KeyMap.of(openpi.preset, openpi.key, openpi.image_size) if openpi is not None else KeyMap.of("none")
        urls = config.urls or (config.url,)
        first = urls.index(config.url) if config.url in urls else 0
        wanted = openpi.connections if openpi is not None else None
        count = max(1, min(num_envs, wanted or num_envs))
        self.links = [Session(dataclasses.replace(config, url=urls[(first + k) % len(urls)]), should_stop,
                              self.timing, keepalive, wire=OpenpiWire(), times_waits=False) for k in range(count)]
        self.metadata: ServerMetadata | None = None
        self.state = Exchange.IDLE
        self._checked = False  # the key map was checked against an observation
        self._lost: Session | None = None  # the connection whose close was raised last
        self._asked: InferRequest[ObservationLike] | None = None
        self._queue: deque[int] = deque()  # rows of the infer not sent yet (no free connection)
        self._on: dict[int, int] = {}  # connection number -> the row its request asks for
        self._chunks: list[np.ndarray | None] = []
        self._mapping = Stopwatch(self.timing, "infer_obs_pack_s")
        self._sent_at = 0.0  # perf_counter() when the infer's requests went out (its wait is timed here, once)

    # ------------------------------------------------------------------------------ opening and closing

    def open(self) -> ServerMetadata:
        """Open every connection (each waits for its server as a PlugRL session does)."""
        for link in self.links:
            meta = self._call(link, link.open)
            self.metadata = self.metadata or meta
        assert self.metadata is not None
        return self.metadata

    def reconnect(self, closed: Closed) -> ServerMetadata:
        """After ``closed``: the connection that saw it reconnects (counted as one reconnect); the others that
        still wait for a reply to the dropped infer, or never opened, open afresh."""
        lost, self._lost = self._lost, None
        self._forget()
        for link in self.links:
            if link is lost:
                self.metadata = self._call(link, link.reconnect, closed)
            elif link.awaiting or not link.connected:
                link.close()
                self.metadata = self._call(link, link.open)
        assert self.metadata is not None
        return self.metadata

    def close(self) -> None:
        self._forget()
        for link in self.links:
            link.close()

    def _call(self, link: Session, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` of connection ``link``, noting which one it was when it raises a close."""
        try:
            return fn(*args)
        except ConnectionLost:
            self._lost = link
            raise

    def _forget(self) -> None:
        self._asked, self._chunks, self.state = None, [], Exchange.IDLE
        self._queue.clear()
        self._on.clear()

    # ------------------------------------------------------------------------------ the exchange

    @property
    def awaiting(self) -> bool:
        return self.state is Exchange.AWAITING_REPLY

    def infer(self, request: InferRequest[ObservationLike]) -> ActionReply:
        self.send_infer(request)
        reply = self.receive_actions(None)
        assert reply is not None
        return reply

    def send_infer(self, request: InferRequest[ObservationLike]) -> None:
        """One request per env of ``request``, on the free connections; the rest go as connections free up."""
        self.state.check_infer()
        if request.reuse is not None and request.reuse.any():
            raise ProtocolError("openpi's protocol cannot reuse observation rows the server holds")
        if not self._checked:
            self.keys.check(request.obs)
            self._checked = True
        n = len(request.env_indices)
        self._asked, self._chunks, self.state = request, [None] * n, Exchange.AWAITING_REPLY
        self._queue.extend(range(n))
        self._dispatch()
        self._sent_at = time.perf_counter()

    def _dispatch(self) -> None:
        """Send the queued rows on the connections that are free."""
        request = self._asked
        assert request is not None
        for k, link in enumerate(self.links):
            if not self._queue:
                return
            if k in self._on:
                continue
            row = self._queue.popleft()
            with self._mapping:
                obs = self.keys.request(request.obs, row)
            one = InferRequest(obs, np.array([row], np.int64), np.asarray(request.step_ids[row:row + 1], np.int64))
            self._call(link, link.send_infer, one)
            self._on[k] = row

    def receive_actions(self, timeout: float | None = None) -> ActionReply | None:
        """The chunks of every env of the infer, stacked ``[H, n, ...]``, once all are in; None when they are not
        within ``timeout`` s (0: only look; None: wait for them)."""
        if self._asked is None:
            raise NoReplyAwaited("no infer is waiting for its reply: send_infer() first")
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self._collect()
            if not self._on and not self._queue:
                return self._reply()
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return None
            busy = self._busy()
            busy[0].wait(busy[1:], left)

    def _collect(self) -> None:
        """Take the replies that are in, and send queued rows on the connections they free."""
        for k, row in list(self._on.items()):
            link = self.links[k]
            reply = self._call(link, link.receive_actions, 0)
            if reply is not None:
                self._chunks[row] = reply.actions[:, 0]
                del self._on[k]
        if self._queue:
            self._dispatch()

    def _reply(self) -> ActionReply:
        request = self._asked
        assert request is not None
        chunks = [c for c in self._chunks if c is not None]
        shapes = {c.shape for c in chunks}
        if len(shapes) > 1:
            raise ProtocolError(f"the openpi server's chunks for one step's envs differ in shape "
                                f"({', '.join(str(list(s)) for s in sorted(shapes))}); a batch needs one shape")
        self._asked, self._chunks, self.state = None, [], Exchange.FEEDBACK_DUE
        self.timing.infer_wait_s += time.perf_counter() - self._sent_at
        return ActionReply(np.asarray(request.env_indices, np.int64), np.stack(chunks, axis=1))

    def _busy(self) -> list[Session]:
        return [self.links[k] for k in self._on]

    def wait(self, peers: Sequence[OpenpiSession] = ()) -> None:
        """Block until a reply to this session's or one of ``peers``' infers is in (or a warning is due)."""
        busy = [link for session in (self, *peers) for link in session._busy()]
        if busy:
            busy[0].wait(busy[1:])

    def feedback(self, feedback: Feedback[ObservationLike], infer_follows: bool = False) -> None:
        """Nothing travels (openpi's protocol has no feedback); the exchange moves on."""
        if self.state is not Exchange.FEEDBACK_DUE:
            raise (AlreadyAwaitingReply("a feedback while an infer waits for its reply: receive_actions() first")
                   if self.state is Exchange.AWAITING_REPLY else
                   NoFeedbackDue("a feedback that answers no reply: send_infer() and receive_actions() first"))
        self.state = Exchange.IDLE
