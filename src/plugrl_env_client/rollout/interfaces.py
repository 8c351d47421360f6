"""What a rollout needs from the world around it, as interfaces: its server session, where its results go, and
who watches its episodes (the recorder). Tests put in-memory fakes behind them; the client puts a WebSocket
session, the run's writer (directly or over a queue) and the episode recorder."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from plugrl_env_client.envs.base_env import Observation
from plugrl_env_client.protocol.exchange import Closed
from plugrl_env_client.protocol.messages import ActionReply, Feedback, InferRequest, ServerMetadata
from plugrl_env_client.records import EpisodeRecord, ProcessResult, ProcessStatus
from plugrl_env_client.timing import Timing

if TYPE_CHECKING:
    from plugrl_env_client.outputs.recording.sinks import AppendableSink


class ServerSession(Protocol):
    """The rollout's server connection (a :class:`~plugrl_env_client.protocol.session.Session` over a WebSocket,
    or an in-memory fake). Every call may raise :class:`~plugrl_env_client.protocol.exchange.ConnectionLost`,
    except :meth:`wait`."""

    def open(self) -> ServerMetadata: ...

    def reconnect(self, closed: Closed) -> ServerMetadata: ...

    def infer(self, request: InferRequest[Observation]) -> ActionReply: ...

    def send_infer(self, request: InferRequest[Observation]) -> None:
        """The first half of ``infer``: send it, and let the caller step other envs until the reply is in."""

    def receive_actions(self, timeout: float | None = None) -> ActionReply | None:
        """The second half: the reply to the infer sent last, or None (nothing raised) if it is not in within
        ``timeout`` s."""

    @property
    def awaiting(self) -> bool:
        """An infer is on the wire and its reply not taken yet: the one place that knows."""

    def wait(self, peers: Sequence[Any] = ()) -> None:
        """Block until the reply to this session's infer or one of ``peers``' (sessions of its kind) is in, or
        one of them needs looking at; then ``receive_actions(0)`` of each says which."""

    def feedback(self, feedback: Feedback[Observation], infer_follows: bool = False) -> None:
        """Send one feedback (no reply); a connection found gone surfaces at the next infer. ``infer_follows``: an
        infer is sent right after, and the feedback may wait to go out with it."""

    def close(self) -> None: ...


class ResultSink(Protocol):
    """Where a rollout process reports: the run's writer, or in a process of its own a stand-in that sends each
    call to the writer as one message. The rollout reports episodes and progress; the process around it, its
    recorder's files and how it ended."""

    def episode(self, record: EpisodeRecord) -> None: ...

    def progress(self, process_id: int, status: ProcessStatus, timing: Timing) -> None: ...

    def result(self, result: ProcessResult) -> None: ...

    def artifacts(self, process_id: int) -> AppendableSink:
        """Where the process's recorder files go (its folder, written whole or appended to)."""


class EpisodeHooks(Protocol):
    """Who watches the episodes as they happen (the recorder). Env ids are the process's; rows index the batch."""

    def on_reset(self, obs: Observation, env_ids: np.ndarray, rows: np.ndarray) -> None: ...

    def on_step(self, obs: Observation, actions: np.ndarray, rewards: np.ndarray, env_ids: np.ndarray) -> None: ...

    def on_episode_end(self, record: EpisodeRecord, info: Mapping[str, Any] | None = None) -> None:
        """The episode of ``record.env_index`` ended; ``info`` is that env's part of its last step's info."""


class NoHooks:
    """The hooks of a rollout that nobody watches (no recorder): each call does nothing, so the loop calls its hooks
    without asking first whether it has any."""

    def on_reset(self, obs: Observation, env_ids: np.ndarray, rows: np.ndarray) -> None:
        pass

    def on_step(self, obs: Observation, actions: np.ndarray, rewards: np.ndarray, env_ids: np.ndarray) -> None:
        pass

    def on_episode_end(self, record: EpisodeRecord, info: Mapping[str, Any] | None = None) -> None:
        pass


NO_HOOKS: EpisodeHooks = NoHooks()
