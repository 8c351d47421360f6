"""One client connection to a policy server.

A :class:`Connection` is one WebSocket (a :class:`~plugrl_env_client.protocol.transport.Transport`): it reads the metadata first, then offers ``infer`` and ``feedback``. When
the server closes it, the call raises :class:`ConnectionLost` carrying the close and what the client should do
about it: a closed connection is an ordinary event of a long run, handled in one place by the caller (reconnect, or
end the run). What cannot be recovered by reconnecting (a text frame, a message that breaks the protocol) raises
:class:`ProtocolError`.

``feedback`` has no reply, so whether the server got one is unknowable until the next exchange. A feedback that
cannot be sent because the connection is already gone is therefore not an error of its own: the connection
remembers the close and the next ``infer`` raises it, exactly as if the server had closed right after receiving
the feedback. The caller's episodes continue either way.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import time
from typing import Any

import numpy as np

from plugrl_env_client.errors import ProtocolError
from plugrl_env_client.protocol import codec, messages
from plugrl_env_client.protocol.messages import ActionReply, ObservationLike, ServerMetadata
from plugrl_env_client.protocol.transport import Transport, TransportClosed
from plugrl_env_client.timing import Timing

logger = logging.getLogger(__name__)


class CloseAction(enum.Enum):
    """What the client does after a close."""

    END = "end"  # the run is over: write outputs, exit 0
    RECONNECT = "reconnect"  # drop chunks in flight, open a new connection, start with an infer


@dataclasses.dataclass(frozen=True)
class Closed:
    """A close as the client saw it: code (None without a close frame), reason, and what to do next."""

    action: CloseAction
    code: int | None
    reason: str

    def describe(self) -> str:
        code = "no close frame" if self.code is None else f"code {self.code}"
        return f"{code}, reason {self.reason!r}" if self.reason else code


class ConnectionLost(Exception):
    """The connection is closed (by the server, the network, or a local stop); ``close`` says what to do next."""

    def __init__(self, close: Closed) -> None:
        super().__init__(close.describe())
        self.close = close


def classify_close(code: int | None, reason: str, reconnect_on_stop: bool = False) -> Closed:
    """Map a close (code, reason) to what the client must do, per the protocol's close table."""
    ends_run = (code == messages.CLOSE_GOING_AWAY and reason == messages.REASON_STOP) or (
        code == messages.CLOSE_NORMAL and not reason
    )
    if ends_run and not reconnect_on_stop:
        return Closed(CloseAction.END, code, reason)
    return Closed(CloseAction.RECONNECT, code, reason)


class Connection:
    """One WebSocket to a PlugRL server. Not thread-safe; one rollout loop drives it.

    Counters and times go into ``timing`` (shared with the rollout that owns this connection).
    """

    def __init__(self, transport: Transport, timing: Timing, reconnect_on_stop: bool) -> None:
        self._transport = transport
        self._encoder = codec.Encoder()  # one frame buffer for the connection's life: no fresh memory per message
        self._timing = timing
        self._reconnect_on_stop = reconnect_on_stop
        self._lost: Closed | None = None  # set when a feedback found the connection gone
        self._asked: np.ndarray | None = None  # env_indices of the infer waiting for its reply
        self._sent_at = 0.0
        self.metadata: ServerMetadata | None = None

    def read_metadata(self) -> ServerMetadata:
        reply = self._recv()
        if messages.message_type(reply) != messages.METADATA:
            raise ProtocolError(
                f"the server's first message must be 'metadata', got {messages.message_type(reply)!r}; "
                "is this a PlugRL v1 policy server?"
            )
        self.metadata = messages.parse_metadata(reply)
        return self.metadata

    def infer(self, obs: ObservationLike, env_indices: np.ndarray, step_ids: np.ndarray,
              reuse: np.ndarray | None = None) -> ActionReply:
        """Send one infer and wait for its action chunk (raises :class:`ConnectionLost` when closed)."""
        self.send_infer(obs, env_indices, step_ids, reuse)
        reply = self.receive_actions(None)
        assert reply is not None  # no timeout: a reply or an exception
        return reply

    def send_infer(self, obs: ObservationLike, env_indices: np.ndarray, step_ids: np.ndarray,
                   reuse: np.ndarray | None = None) -> None:
        """Send one infer without waiting for its reply (:meth:`receive_actions` collects it), so the caller can
        step other envs meanwhile. One infer is outstanding at most: the protocol answers them in order."""
        if self._lost is not None:
            raise ConnectionLost(self._lost)
        if self._asked is not None:
            raise RuntimeError("an infer is already waiting for its reply: receive_actions() first")
        start = time.perf_counter()
        wire = messages.wire_observation(obs)
        with self._pack(messages.infer_message(wire, env_indices, step_ids, reuse), _payload_bytes(wire)) as frame:
            sent = time.perf_counter()
            self._timing.infer_obs_pack_s += sent - start
            self._send(frame)
        self._timing.infer_calls += 1
        self._asked = np.asarray(env_indices, dtype=np.int64)
        self._sent_at = sent

    def receive_actions(self, timeout: float | None = None) -> ActionReply | None:
        """The action chunk answering the infer on the wire; None when it has not arrived within ``timeout``
        seconds (0: only look; None: wait for it). Raises :class:`ConnectionLost` when the connection closes."""
        if self._asked is None:
            raise RuntimeError("no infer is waiting for its reply: send_infer() first")
        reply = self._recv(timeout)
        if reply is _NOTHING:
            return None
        asked, self._asked = self._asked, None
        action = messages.parse_action(reply, asked)
        self._timing.infer_wait_s += time.perf_counter() - self._sent_at
        self._timing.actions_received += 1
        return action

    def feedback(self, env_indices: np.ndarray, step_ids: np.ndarray, obs: ObservationLike, rewards: np.ndarray,
                 terminated: np.ndarray, truncated: np.ndarray, info: dict[str, Any]) -> None:
        """Send one feedback (no reply). A connection found closed is reported by the next :meth:`infer`."""
        if self._lost is not None:
            return
        start = time.perf_counter()
        try:
            wire = messages.wire_observation(obs)
            wired = time.perf_counter()
            msg = messages.feedback_message(env_indices, step_ids, wire, rewards, terminated, truncated, info)
            packing = time.perf_counter()
            frame, parts = self._encoder.encode_timed(msg, _FEEDBACK_PARTS, _payload_bytes(wire))
            self._timing.pack_s += time.perf_counter() - packing
            self._timing.feedback_obs_pack_s += wired - start + parts["obs"]
            self._timing.feedback_info_pack_s += parts["info"]
            with frame:
                self._send(frame)
        except ConnectionLost as lost:
            self._lost = lost.close
            return
        finally:
            self._timing.feedback_s += time.perf_counter() - start
        self._timing.feedback_calls += 1

    def close(self) -> None:
        """Send a normal close (1000) and wait briefly for the server's answer."""
        self._transport.close(messages.CLOSE_NORMAL)

    def _pack(self, msg: dict[str, Any], size_hint: int) -> memoryview:
        """The message's frame, lent from the connection's encoder: release it (``with``) before the next one."""
        start = time.perf_counter()
        frame = self._encoder.encode(msg, size_hint)
        self._timing.pack_s += time.perf_counter() - start
        return frame

    def _send(self, frame: memoryview) -> None:
        try:
            self._transport.send(frame)
        except TransportClosed as exc:
            raise ConnectionLost(self._closed(exc)) from None
        self._timing.bytes_sent += frame.nbytes

    def _recv(self, timeout: float | None = None) -> Any:
        try:
            frame = self._transport.recv(timeout)
        except TimeoutError:
            return _NOTHING
        except TransportClosed as exc:
            raise ConnectionLost(self._closed(exc)) from None
        if isinstance(frame, str):
            raise ProtocolError(f"the server sent a text frame instead of a binary msgpack frame: {frame[:2000]!r}")
        self._timing.bytes_received += len(frame)
        return codec.unpackb(frame)

    def _closed(self, exc: TransportClosed) -> Closed:
        closed = classify_close(exc.code, exc.reason, self._reconnect_on_stop)
        logger.info("connection closed by the server (%s)", closed.describe())
        return closed


_FEEDBACK_PARTS: dict[tuple[str, ...], str] = {("data", "obs"): "obs", ("data", "info"): "info"}
"""The parts of a feedback whose encoding is timed (Timing.feedback_obs_pack_s and feedback_info_pack_s)."""

_NOTHING = object()
"""What :meth:`Connection._recv` returns when no message arrived within its timeout."""


def _payload_bytes(wire: dict[str, Any]) -> int:
    """Bytes of an observation's arrays (images, states, text): the bulk of its frame, so the encoder's buffer size."""
    return sum(int(a.nbytes) for key in ("images", "states") for a in wire[key].values()) + int(wire["text"].nbytes)
