"""The rollout's handle on its server: one connection at a time, worked by the rollout's own thread.

A :class:`Session` gets its connections from a :class:`~plugrl_env_client.protocol.dialing.Dialer`, then carries
the exchange: ``infer`` (or its halves ``send_infer`` / ``receive_actions``, for a pipelined rollout) and
``feedback``, in the order :class:`~plugrl_env_client.protocol.exchange.Exchange` keeps (a call out of it raises a
named :class:`~plugrl_env_client.protocol.exchange.ExchangeMisuse`). A :class:`Wire` builds and parses one wire
protocol's messages; one :class:`~plugrl_env_client.protocol.frame_packer.FramePacker` packs them for the
session's life.

Whatever ends a connection surfaces as :class:`~plugrl_env_client.protocol.exchange.ConnectionLost` from the call
that finds it; the caller reconnects or ends the run, in one place. A feedback that finds the connection gone raises
nothing: the next ``send_infer`` does. Every wait is bounded or announced: a late reply is warned about after
:func:`~plugrl_env_client.protocol.dialing.warning_period` seconds and then every twice that, and given up at
``infer_timeout`` (close ``1001 Infer timeout``); a reply that answers no infer closes with the resync close, as it
would otherwise be taken for the next chunk.

With an ``image_codec``, a connection whose server offers :data:`~plugrl_env_client.protocol.images.FEATURE`
carries cameras encoded per env row; the run's first stream says once which codec travels and which camera stays
raw.
"""

from __future__ import annotations

import datetime
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

import numpy as np

from plugrl_env_client.errors import ConfigError, ProtocolError
from plugrl_env_client.protocol import codec, images, messages
from plugrl_env_client.protocol.codec import Timed
from plugrl_env_client.protocol.dialing import Dialer, SessionConfig, plugrl_metadata, seconds, warning_period
from plugrl_env_client.protocol.exchange import (
    AlreadyAwaitingReply,
    CloseAction,
    Closed,
    ConnectionLost,
    Exchange,
    NoFeedbackDue,
    NoReplyAwaited,
    NotConnected,
    classify_close,
)
from plugrl_env_client.protocol.frame_packer import FramePacker
from plugrl_env_client.protocol.messages import ActionReply, Feedback, InferRequest, ObservationLike, ServerMetadata
from plugrl_env_client.timing import Timing
from plugrl_env_client.websocket.client import WebSocketClient, wait_any
from plugrl_env_client.websocket.common import WebSocketClosed

if TYPE_CHECKING:
    from plugrl_env_client.websocket.keepalive import Keepalive

logger = logging.getLogger(__name__)

__all__ = ["PLUGRL", "PlugrlWire", "Session", "Wire"]

INFER_TIMEOUT_REASON = "Infer timeout"


class Wire(Protocol):
    """What travels on a :class:`Session`'s connection: the messages of one wire protocol, built and parsed. The
    session keeps everything else (dialing, the exchange's order, waits that end, closes)."""

    server_kind: str
    """What the server is, in messages ("a PlugRL v1 policy server")."""
    feedback: bool
    """Whether a feedback message answers each reply (PlugRL); without, a reply leaves the exchange idle."""

    def metadata(self, msg: Any) -> ServerMetadata:
        """The server's first message, checked (a ProtocolError when it is not this protocol's metadata)."""

    def infer(self, request: InferRequest[Any], image_codec: str, quality: int) -> Any:
        """The message of an infer."""

    def reply(self, msg: Any, asked: np.ndarray) -> ActionReply:
        """The reply to the infer for ``asked``, checked."""

    def unexpected(self, msg: Any) -> str:
        """What a message that answers no infer is, in words ("an action")."""

    def text_frame(self, text: str) -> ProtocolError:
        """The error for a text frame from the server."""

    def close_error(self, code: int | None, reason: str) -> ProtocolError | None:
        """The error a close ends the run with instead of a reconnect (None: the close table decides)."""


class PlugrlWire:
    """PlugRL v1's messages (:mod:`~plugrl_env_client.protocol.messages`)."""

    server_kind = "a PlugRL v1 policy server"
    feedback = True

    def metadata(self, msg: Any) -> ServerMetadata:
        return plugrl_metadata(msg)

    def infer(self, request: InferRequest[Any], image_codec: str, quality: int) -> Any:
        return request.message(messages.wire_observation(request.obs, image_codec, quality))

    def reply(self, msg: Any, asked: np.ndarray) -> ActionReply:
        return messages.parse_action(msg, asked)

    def unexpected(self, msg: Any) -> str:
        kind = messages.message_type(msg)
        return "an action" if kind == messages.ACTION else f"a {kind!r} message"

    def text_frame(self, text: str) -> ProtocolError:
        return ProtocolError(f"the server sent a text frame instead of a binary msgpack frame: {text[:2000]!r}")

    def close_error(self, code: int | None, reason: str) -> ProtocolError | None:
        return None


PLUGRL: Wire = PlugrlWire()


class Session:
    """The rollout's handle on the server (see the module docstring). Not thread-safe: one rollout thread drives
    it; a :class:`~plugrl_env_client.websocket.keepalive.Keepalive`, when given, services its socket during long
    env calls."""

    def __init__(self, config: SessionConfig, should_stop: Callable[[], bool] = lambda: False,
                 timing: Timing | None = None, keepalive: Keepalive | None = None, wire: Wire = PLUGRL,
                 times_waits: bool = True) -> None:
        if config.infer_timeout is not None and not config.infer_timeout > 0:
            raise ConfigError(f"{config.word('infer_timeout')} must be a positive number of seconds, got "
                              f"{config.infer_timeout}")
        images.check_choice(config.image_codec, config.image_quality, config.word)
        self.config = config
        self.wire = wire
        self._times_waits = times_waits  # False: a caller that waits on several sessions at once times its waits
        self.timing = timing if timing is not None else Timing()
        self.metadata: ServerMetadata | None = None
        self.state = Exchange.IDLE
        """Where the exchange on the current connection stands (idle after an open)."""
        self._keepalive = keepalive
        self._warn_s = warning_period()
        self._dialer = Dialer(config, self.timing, self._warn_s, should_stop, wire.metadata, wire.server_kind)
        self._packer = FramePacker()  # one frame buffer for the session's life, across reconnects
        self._client: WebSocketClient | None = None
        self._image_codec = "none"  # the codec of the current connection: image_codec when its server offers it
        self._speaks = config.stream in (None, (0, 0))  # the run's first stream says what holds for every stream
        self._said_codec: str | None = None  # the codec the session said it uses (said again only when it changes)
        self._said_raw: set[str] = set()  # cameras said to travel raw
        self._lost: Closed | None = None  # a feedback found the connection gone: the next infer raises it
        self._asked: np.ndarray | None = None  # env_indices of the infer in flight (None: none is)
        self._sent_at = 0.0  # perf_counter() when it went out (for timing.infer_wait_s)
        self._sent_wall = 0.0  # time.time() when it went out (for the warnings)
        self._asked_since = 0.0  # monotonic() when it went out
        self._next_check = float("inf")  # monotonic() of its next warning, or of its infer_timeout

    # ------------------------------------------------------------------------------ the exchange

    @property
    def awaiting(self) -> bool:
        """An infer of this session is on the wire and its reply has not been taken."""
        return self.state is Exchange.AWAITING_REPLY

    def infer(self, request: InferRequest[Any]) -> ActionReply:
        """Send one infer and wait for its action chunk (raises :class:`ConnectionLost` when closed)."""
        self.send_infer(request)
        reply = self.receive_actions(None)
        assert reply is not None  # no timeout: a reply or an exception
        return reply

    def send_infer(self, request: InferRequest[Any]) -> None:
        """Send one infer without waiting for its reply (:meth:`receive_actions` collects it), so the caller can
        step other envs meanwhile. One infer is outstanding at most: the protocol answers them in order."""
        if self._lost is not None:
            raise ConnectionLost(self._lost)
        self.state.check_infer()
        client = self._client
        if client is None:
            raise NotConnected("the session has no connection: call open() first")
        timing = self.timing
        try:
            early = client.recv(0)  # nothing may wait here: every reply answered the infer before it
            if early is not None:
                self._answers_no_infer(early)
            start = time.perf_counter()
            message = self.wire.infer(request, self._image_codec, self.config.image_quality)
            if self._image_codec != "none" and self._speaks:
                self._say_raw_cameras(message["data"]["images"])
            frame = self._packer.pack(message)
            self._sent_at = sent = time.perf_counter()
            timing.pack_s += sent - start
            timing.infer_obs_pack_s += sent - start
            client.send_frame(frame)
        except WebSocketClosed as exc:
            raise ConnectionLost(self._closed(exc)) from None
        timing.infer_calls += 1
        timing.infer_rows += len(request.env_indices)
        timing.bytes_sent += frame.nbytes
        self._asked = np.asarray(request.env_indices, dtype=np.int64)
        self.state = Exchange.AWAITING_REPLY
        self._sent_wall = time.time()
        self._asked_since = now = time.monotonic()
        limit = self.config.infer_timeout
        self._next_check = now + (self._warn_s if limit is None else min(self._warn_s, limit))

    def receive_actions(self, timeout: float | None = None) -> ActionReply | None:
        """The action chunk answering the infer on the wire; None when it has not arrived within ``timeout``
        seconds (0: only look; None: wait for it). Raises :class:`ConnectionLost` when the connection closes, or
        when the reply is ``infer_timeout`` late."""
        asked = self._asked
        if asked is None:
            raise NoReplyAwaited("no infer is waiting for its reply: send_infer() first")
        client = self._client
        assert client is not None  # an infer is on the wire: on this connection
        try:
            if timeout == 0:  # the pipelined poll: one poll(2), and a clock reading only when nothing came
                frame = client.recv(0)
                if frame is None and time.monotonic() >= self._next_check:
                    self._overdue()
            else:
                frame = self._wait_for_reply(client, timeout)
        except WebSocketClosed as exc:
            raise ConnectionLost(self._closed(exc)) from None
        if frame is None:
            return None
        self._asked, self.state = None, (Exchange.FEEDBACK_DUE if self.wire.feedback else Exchange.IDLE)
        reply = self.wire.reply(self._decode(frame), asked)
        timing = self.timing
        if self._times_waits:
            timing.infer_wait_s += time.perf_counter() - self._sent_at
        timing.actions_received += 1
        if reply.server_infer_s is not None:
            timing.server_infer_s += reply.server_infer_s
            timing.server_timed_replies += 1
        return reply

    @property
    def connected(self) -> bool:
        """The session has a connection (opened, and not lost since)."""
        return self._client is not None

    def wait(self, peers: Sequence[Session] = (), timeout: float | None = None) -> None:
        """Block until the reply to this session's infer or to one of ``peers``' is in, or one of them is due for
        a warning or its ``infer_timeout``, or ``timeout`` s passed (the caller then polls each with
        ``receive_actions(0)``). A pipelined rollout waits here when no env group can step: on every connection at
        once, whichever answers first."""
        waiting = [s for s in (self, *peers) if s.state is Exchange.AWAITING_REPLY and s._client is not None]
        if waiting:
            due = min(s._next_check for s in waiting)
            if timeout is not None:
                due = min(due, time.monotonic() + timeout)
            wait_any([s._client for s in waiting if s._client is not None],
                               max(0.0, due - time.monotonic()))

    def feedback(self, feedback: Feedback[ObservationLike], infer_follows: bool = False) -> None:
        """Send one feedback (no reply). A connection found closed is reported by the next :meth:`send_infer`.

        ``infer_follows``: the caller sends an infer right after this (a pipelined rollout, whose other groups step
        meanwhile): the feedback goes out with the infer, in one write (before the close, if none comes; when the
        keepalive takes the socket over, if an env call in between runs long)."""
        if self._lost is not None:
            return
        if not self.wire.feedback:
            raise NoFeedbackDue(f"{self.wire.server_kind} takes no feedback")
        if self.state is not Exchange.FEEDBACK_DUE:
            raise (AlreadyAwaitingReply("a feedback while an infer waits for its reply: receive_actions() first")
                   if self.state is Exchange.AWAITING_REPLY else
                   NoFeedbackDue("a feedback that answers no reply: send_infer() and receive_actions() first"))
        client = self._client
        assert client is not None  # feedback is due: on this connection
        timing = self.timing
        start = time.perf_counter()
        wire = messages.wire_observation(feedback.obs, self._image_codec, self.config.image_quality)
        obs, info = Timed(wire), Timed(feedback.info)
        message = feedback.message(obs, info)
        built = time.perf_counter()
        frame = self._packer.pack(message)
        packed = time.perf_counter()
        timing.feedback_obs_pack_s += built - start + obs.seconds
        timing.feedback_info_pack_s += info.seconds
        timing.pack_s += packed - built
        try:
            client.send_frame(frame, infer_follows)
        except WebSocketClosed as exc:
            self._lost = self._closed(exc)
            return
        finally:
            timing.feedback_s += time.perf_counter() - start
        self.state = Exchange.IDLE
        timing.feedback_calls += 1
        timing.bytes_sent += frame.nbytes

    def _decode(self, frame: Any) -> Any:
        if isinstance(frame, str):
            raise self.wire.text_frame(frame)
        self.timing.bytes_received += len(frame)
        return codec.unpackb(frame)

    def _closed(self, exc: WebSocketClosed) -> Closed:
        error = self.wire.close_error(exc.code, exc.reason)
        if error is not None:
            self._drop()
            raise error
        closed = classify_close(exc.code, exc.reason, self.config.reconnect_on_server_stop)
        logger.info("connection closed by the server (%s)", closed.describe())
        self._drop()
        return closed

    # ------------------------------------------------------------------------------ waits that end

    def _wait_for_reply(self, client: WebSocketClient, timeout: float | None) -> Any:
        """Wait for the reply, up to ``timeout`` s (None: until it comes), saying so when it is late."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            until = self._next_check if deadline is None else min(deadline, self._next_check)
            frame = client.recv(max(0.0, until - time.monotonic()))
            if frame is not None:
                return frame
            now = time.monotonic()
            if now >= self._next_check:
                self._overdue()
            if deadline is not None and now >= deadline:
                return None

    def _overdue(self) -> None:
        """The reply is due for a warning, or past ``infer_timeout`` (then the connection is given up)."""
        assert self._asked is not None
        now = time.monotonic()
        waited = now - self._asked_since
        sent = datetime.datetime.fromtimestamp(self._sent_wall).strftime("%H:%M:%S")
        n = len(self._asked)
        limit = self.config.infer_timeout
        if limit is not None and waited >= limit:
            why = (f"no reply from the server to the infer for {n} envs sent at {sent} within "
                   f"{self.config.word('infer_timeout')} {limit:g} s")
            logger.warning("%s; closing the connection and reconnecting", why)
            self._give_up(Closed(CloseAction.RECONNECT, messages.CLOSE_GOING_AWAY, INFER_TIMEOUT_REASON, why))
        logger.warning("no reply from the server for %s s to the infer for %d envs sent at %s%s", seconds(waited), n,
                       sent, "" if limit is None else f" ({self.config.word('infer_timeout')} {limit:g} s)")
        self._next_check = now + 2 * self._warn_s if limit is None else min(now + 2 * self._warn_s,
                                                                            self._asked_since + limit)

    def _answers_no_infer(self, frame: Any) -> NoReturn:
        """A message came while no infer waited for one: what it is, and the resync that starts over."""
        what = self.wire.unexpected(self._decode(frame))
        why = f"the server sent {what} that answers no infer (a reply after a feedback, or a second reply to one infer)"
        logger.warning("%s; closing the connection (%d %s) and reconnecting", why, messages.CLOSE_GOING_AWAY,
                       messages.REASON_RESYNC)
        self._give_up(Closed(CloseAction.RECONNECT, messages.CLOSE_GOING_AWAY, messages.REASON_RESYNC, why))

    def _give_up(self, closed: Closed) -> NoReturn:
        """Close the connection ourselves with ``closed``'s code and reason, and raise it."""
        client = self._client
        self._drop()
        if client is not None:
            client.close(closed.code or messages.CLOSE_NORMAL, closed.reason)
        raise ConnectionLost(closed)

    # ------------------------------------------------------------------------------ opening and closing

    def open(self) -> ServerMetadata:
        """First connection: wait for the server (up to ``connect_timeout``, if set) and read its metadata."""
        return self._attach(*self._dialer.open())

    def reconnect(self, closed: Closed) -> ServerMetadata:
        """Open a fresh connection after ``closed``; the caller has dropped every chunk in flight."""
        self._dialer.count_reconnect(closed)
        self.close()
        return self._attach(*self._dialer.reopen())

    def close(self) -> None:
        """Close the current connection (1000, waiting briefly for the server's answer); a no-op without one."""
        client = self._client
        self._drop()
        if client is not None:
            client.close(messages.CLOSE_NORMAL)

    def _attach(self, client: WebSocketClient, meta: ServerMetadata) -> ServerMetadata:
        """A fresh connection becomes the session's: the exchange starts over, idle."""
        self._client, self._lost, self._asked, self.state = client, None, None, Exchange.IDLE
        if self._keepalive is not None:
            self._keepalive.add(client)
        self.metadata = meta
        self._image_codec = self._codec_for(meta)
        return meta

    def _codec_for(self, meta: ServerMetadata) -> str:
        """The image codec of a connection to a server that said ``meta``: image_codec when the server offers the
        images feature, else none (raw arrays). The run's first stream says which, on its first connection and
        whenever a reconnect changes it: a line in the log when the server took the codec, a warning naming what it
        offers when it did not."""
        asked = self.config.image_codec
        used = asked if asked == "none" or meta.supports(images.FEATURE) else "none"
        if asked != "none" and self._speaks and used != self._said_codec:
            self._said_codec = used
            if used == asked:
                logger.info("image codec %s: the server offers %s, so camera images travel %s-encoded per env row",
                            asked, images.FEATURE, asked)
            else:
                offered = ", ".join(meta.features) or "none"
                logger.warning("%s %s: the server does not offer %s (its features: %s); sending raw image arrays",
                               self.config.word("image_codec"), asked, images.FEATURE, offered)
        return used

    def _say_raw_cameras(self, cameras: dict[str, Any]) -> None:
        """Say once per camera that travels raw although a codec is in use, and why (a codec's limit)."""
        for name, value in cameras.items():
            if isinstance(value, np.ndarray) and name not in self._said_raw:
                self._said_raw.add(name)
                why = images.refusal(value.shape, value.dtype, self._image_codec)
                logger.warning("%s %s: camera %r (%s %s) travels raw: %s", self.config.word("image_codec"),
                               self._image_codec, name,
                               value.dtype, list(value.shape), why)

    def _drop(self) -> None:
        """Forget the current connection (its socket is closed, or about to be) and the infer in flight on it."""
        client, self._client = self._client, None
        self._asked, self.state = None, Exchange.IDLE
        if client is not None and self._keepalive is not None:
            self._keepalive.discard(client)

