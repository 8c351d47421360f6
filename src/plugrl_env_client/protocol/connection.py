"""One client connection to a policy server.

A :class:`Connection` is one WebSocket: it reads the metadata first, then offers ``infer`` and ``feedback``. When
the server closes it, the call returns a :class:`Closed` value saying what the client should do (a closed
connection is an ordinary event of a long run, not an exception). What cannot be recovered by reconnecting (a text
frame, a message that breaks the protocol) raises :class:`ProtocolError`.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import time
from typing import Any

import numpy as np
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection

from plugrl_env_client.errors import ProtocolError
from plugrl_env_client.protocol import codec, messages
from plugrl_env_client.protocol.messages import ActionReply, ServerMetadata

logger = logging.getLogger(__name__)


class CloseAction(enum.Enum):
    """What the client does after a close."""

    END = "end"  # the run is over: write outputs, exit 0
    RECONNECT = "reconnect"  # drop chunks in flight, open a new connection, start with an infer


@dataclasses.dataclass(frozen=True)
class Closed:
    action: CloseAction
    code: int | None
    reason: str

    def describe(self) -> str:
        code = "no close frame" if self.code is None else f"code {self.code}"
        return f"{code}, reason {self.reason!r}" if self.reason else code


def classify_close(code: int | None, reason: str, reconnect_on_stop: bool = False) -> Closed:
    """Map a close (code, reason) to what the client must do, per the protocol's close table."""
    ends_run = (code == messages.CLOSE_GOING_AWAY and reason == messages.REASON_STOP) or (
        code == messages.CLOSE_NORMAL and not reason
    )
    if ends_run and not reconnect_on_stop:
        return Closed(CloseAction.END, code, reason)
    return Closed(CloseAction.RECONNECT, code, reason)


@dataclasses.dataclass
class SessionStats:
    infer_calls: int = 0
    actions_received: int = 0
    feedback_calls: int = 0
    infer_wait_s: float = 0.0
    pack_s: float = 0.0
    bytes_sent: int = 0
    bytes_received: int = 0
    reconnects: int = 0


class Connection:
    """One WebSocket to a PlugRL server. Not thread-safe; one rollout loop drives it."""

    def __init__(self, ws: ClientConnection, stats: SessionStats, reconnect_on_stop: bool) -> None:
        self._ws = ws
        self._stats = stats
        self._reconnect_on_stop = reconnect_on_stop
        self.metadata: ServerMetadata | None = None

    def read_metadata(self) -> ServerMetadata | Closed:
        reply = self._recv()
        if isinstance(reply, Closed):
            return reply
        if messages.message_type(reply) != messages.METADATA:
            raise ProtocolError(
                f"the server's first message must be 'metadata', got {messages.message_type(reply)!r}; "
                "is this a PlugRL v1 policy server?"
            )
        self.metadata = messages.parse_metadata(reply)
        return self.metadata

    def infer(self, obs: dict[str, Any], env_indices: np.ndarray, step_ids: np.ndarray, reuse: np.ndarray | None = None) -> ActionReply | Closed:
        """Send one infer and wait for its action chunk."""
        closed = self._send(messages.infer_message(obs, env_indices, step_ids, reuse))
        if closed is not None:
            return closed
        self._stats.infer_calls += 1
        start = time.perf_counter()
        reply = self._recv()
        self._stats.infer_wait_s += time.perf_counter() - start
        if isinstance(reply, Closed):
            return reply
        action = messages.parse_action(reply, np.asarray(env_indices, dtype=np.int64))
        self._stats.actions_received += 1
        return action

    def feedback(self, **fields: Any) -> Closed | None:
        """Send one feedback (no reply). Fields are those of :func:`messages.feedback_message`."""
        closed = self._send(messages.feedback_message(**fields))
        if closed is None:
            self._stats.feedback_calls += 1
        return closed

    def close(self) -> None:
        """Send a normal close (1000) and wait briefly for the server's answer."""
        self._ws.close(code=messages.CLOSE_NORMAL)

    def _send(self, msg: dict[str, Any]) -> Closed | None:
        start = time.perf_counter()
        frame = codec.packb(msg)
        self._stats.pack_s += time.perf_counter() - start
        try:
            self._ws.send(frame)
        except ConnectionClosed as exc:
            return self._closed(exc)
        self._stats.bytes_sent += len(frame)
        return None

    def _recv(self) -> Any:
        try:
            frame = self._ws.recv()
        except ConnectionClosed as exc:
            return self._closed(exc)
        if isinstance(frame, str):
            raise ProtocolError(f"the server sent a text frame instead of a binary msgpack frame: {frame[:2000]!r}")
        self._stats.bytes_received += len(frame)
        return codec.unpackb(frame)

    def _closed(self, exc: ConnectionClosed) -> Closed:
        frame = exc.rcvd
        closed = classify_close(frame.code if frame else None, frame.reason if frame else "", self._reconnect_on_stop)
        logger.info("connection closed by the server (%s)", closed.describe())
        return closed
