"""An in-memory policy server behind the rollout's narrow session interface, for unit tests of the loop.

The rollout knows its server only through ``ServerSession`` (``rollout/interfaces.py``): open, reconnect, infer,
send_infer / receive_actions / awaiting / wait, feedback, close. :class:`FakeSession` implements exactly that, with no socket and no
bytes, so a test drives a real :class:`~plugrl_env_client.rollout.group.EnvGroup` (or a pipelined ``Rollout`` of
several) in microseconds per step and sees everything the loop did:

* every message a connection got (:class:`Infer`, :class:`Feedback`), with the observation rows as sent and, for
  an infer with ``reuse``, every row as a server rebuilds it from the env's last feedback (``Infer.seen``);
* the protocol's rules per connection, checked as each message arrives (a broken rule raises
  :class:`ProtocolViolation` inside the loop, where the stack shows who broke it): at most one infer outstanding;
  strictly ``infer action feedback``; every feedback followed by an infer before the next one; a fresh connection
  starts with an infer; feedback only for chunks delivered on this connection, with their step ids; ``reuse`` only
  when offered and only for envs whose last feedback here did not end their episode; env indices unique and
  ascending;
* a scripted server: chunks of a chosen horizon from a policy (by default values that encode the infer's number
  and the chunk step, ``call * 100 + t``, so an env's echo of its action says which chunk and step it applied),
  replies that come in only after some polls, or once the loop waits for them (so pipelined groups interleave
  deterministically), closes at chosen
  points (``ConnectionLost``, as the real session raises them), metadata with or without ``reuse-feedback-obs``.

Also here: :class:`MemorySink` (the run's writer) and :class:`MemoryBudget` (the episode budget), in memory.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from plugrl_env_client.envs.base_env import Observation
from plugrl_env_client.protocol import messages
from plugrl_env_client.protocol.exchange import CloseAction, Closed, ConnectionLost
from plugrl_env_client.protocol.messages import (
    CLOSE_GOING_AWAY,
    FEATURE_REUSE_FEEDBACK_OBS,
    REASON_RESYNC,
    REASON_STOP,
    ActionReply,
    InferRequest,
    ServerMetadata,
)
from plugrl_env_client.rollout.settings import LoopSettings

RESYNC = Closed(CloseAction.RECONNECT, CLOSE_GOING_AWAY, REASON_RESYNC)
"""The server starts the connection over (the client reconnects)."""
STOP = Closed(CloseAction.END, CLOSE_GOING_AWAY, REASON_STOP)
"""The server's run is over (the client ends its run)."""
DROPPED = Closed(CloseAction.RECONNECT, None, "")
"""The socket went away without a close frame."""
REUSE = (FEATURE_REUSE_FEEDBACK_OBS,)


class ProtocolViolation(AssertionError):
    """The client broke a rule of the protocol on one connection (raised where it happened)."""


Timeline = list[tuple[str, Any, Any]]
"""(what, who, detail) in the order things happened: the server's messages and the scripted envs' calls share one,
so a test can see e.g. that a feedback went out before its env was reset, or that groups interleaved."""


def concat_obs(rows: Sequence[Observation]) -> Observation:
    """Observation batches one after the other (rows of one layout)."""
    out = Observation.__new__(Observation)
    first = rows[0]
    out.images = {k: np.concatenate([r.images[k] for r in rows]) for k in first.images}
    out.states = {k: np.concatenate([r.states[k] for r in rows]) for k in first.states}
    out.text = np.concatenate([r.text for r in rows])
    return out


def _copy_info(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _copy_info(v) for k, v in value.items()}
    return np.array(value, copy=True) if isinstance(value, np.ndarray) else value


def _ids(values: Any, what: str) -> np.ndarray:
    arr = np.asarray(values)
    if arr.ndim != 1 or arr.dtype.kind not in "iu":
        raise ProtocolViolation(f"{what} must be a 1-d integer array, got {arr.dtype} {arr.shape}")
    return arr.astype(np.int64)


@dataclasses.dataclass(frozen=True)
class Infer:
    """One infer a connection got."""

    env_indices: np.ndarray
    step_ids: np.ndarray
    obs: Observation
    """The rows as sent: every env's, or with ``reuse`` only the fresh ones (in env_indices order)."""
    reuse: np.ndarray | None
    seen: Observation
    """Every env's row, reused ones rebuilt from the env's last feedback on the connection (what a policy gets)."""
    call: int
    """Infers the server got before this one, over every connection (the default policy encodes it)."""
    session: int
    connection: int
    kind = "infer"


@dataclasses.dataclass(frozen=True)
class Feedback:
    """One feedback a connection got."""

    env_indices: np.ndarray
    step_ids: np.ndarray
    obs: Observation
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    info: dict[str, Any]
    session: int
    connection: int
    kind = "feedback"


Message = Infer | Feedback
Policy = Callable[[Infer], np.ndarray]
"""An infer -> its chunk, time-major ``[H, n, *action_shape]``."""


def encoded_chunks(horizon: int, action_shape: tuple[int, ...] = (1,)) -> Policy:
    """Chunks of ``horizon`` steps whose every value is ``call * 100 + t``: which infer, which chunk step."""

    def policy(infer: Infer) -> np.ndarray:
        n = len(infer.env_indices)
        t = np.arange(horizon, dtype=np.float64).reshape(horizon, 1, *([1] * len(action_shape)))
        return np.broadcast_to(infer.call * 100.0 + t, (horizon, n, *action_shape)).copy()

    return policy


def decode_action(value: float) -> tuple[int, int]:
    """(call, chunk step) of an action of :func:`encoded_chunks`."""
    call, t = divmod(int(round(value)), 100)
    return call, t


CloseRule = Callable[["FakeConnection", "Message | ActionReply"], Closed | None]
"""Asked after each message a connection got, and after each reply it sent: the close the server follows it with,
or None to go on."""


def close_after(messages: int, closed: Closed = RESYNC, session: int = 0, connection: int = 0,
                after_reply: bool = False) -> CloseRule:
    """Close connection ``connection`` of session ``session`` right after its ``messages``-th message: an infer
    then gets no reply (the client's receive raises), after a feedback the client's next infer raises. With
    ``after_reply``, right after the reply to that message (an infer) instead: the client steps with the chunk,
    its feedback is lost (as over a socket), and its next infer raises."""

    def rule(conn: FakeConnection, msg: Message | ActionReply) -> Closed | None:
        if ((conn.session, conn.index) == (session, connection) and len(conn.received) == messages
                and isinstance(msg, ActionReply) == after_reply):
            return closed
        return None

    return rule


def stop_after_feedbacks(count: int) -> CloseRule:
    """End the run (``plugrl-server-stop``) once the server got ``count`` feedbacks, over every connection."""

    def rule(conn: FakeConnection, msg: Message | ActionReply) -> Closed | None:
        if isinstance(msg, Feedback) and conn.server.feedback_count >= count:
            return STOP
        return None

    return rule


class FakeConnection:
    """One connection of a session: what it got, and the protocol state the checks follow."""

    def __init__(self, server: FakeServer, session: int, index: int, metadata: ServerMetadata) -> None:
        self.server, self.session, self.index, self.metadata = server, session, index, metadata
        self.received: list[Message] = []
        self.replies: list[ActionReply] = []
        self.closed: Closed | None = None  # by the server
        self.closed_by_client = False
        self.lost: list[Feedback] = []  # feedbacks sent after the server closed: they never arrived
        self._outstanding: Infer | None = None
        self._polls_left = 0
        self._next = "infer"  # what the protocol lets come next: "infer", "feedback" (after an action) or "reply"
        self._chunks: dict[int, int] = {}  # env -> step id of the chunk it holds from this connection
        self._held: dict[int, Observation] = {}  # env -> its row of its last feedback, when that did not end it

    @property
    def infers(self) -> list[Infer]:
        return [m for m in self.received if isinstance(m, Infer)]

    @property
    def feedbacks(self) -> list[Feedback]:
        return [m for m in self.received if isinstance(m, Feedback)]

    @property
    def kinds(self) -> list[str]:
        return [m.kind for m in self.received]

    def _violation(self, what: str) -> ProtocolViolation:
        return ProtocolViolation(f"session {self.session} connection {self.index}, message {len(self.received)}: "
                                 f"{what} (so far: {' '.join(self.kinds) or 'nothing'})")

    def _check_open(self) -> None:
        if self.closed_by_client:
            raise self._violation("used after the client closed it")

    # ------------------------------------------------------------------------------------------ the messages

    def take_infer(self, request: InferRequest[Observation]) -> None:
        obs, env_indices, step_ids, reuse = request.obs, request.env_indices, request.step_ids, request.reuse
        self._check_open()
        if self.closed is not None:
            raise ConnectionLost(self.closed)
        if self._next == "reply":
            raise self._violation("an infer while another one waits for its reply")
        if self._next == "feedback":
            raise self._violation("two infers without a feedback between them")
        ids, steps = _ids(env_indices, "env_indices"), _ids(step_ids, "step_ids")
        if ids.size == 0:
            raise self._violation("an infer for no env")
        if len(steps) != len(ids):
            raise self._violation(f"{len(steps)} step_ids for {len(ids)} env_indices")
        if len(set(ids.tolist())) != len(ids) or ids.tolist() != sorted(ids.tolist()):
            raise self._violation(f"env_indices {ids.tolist()} are not unique and ascending")
        holding = sorted(set(ids.tolist()) & set(self._chunks))
        if holding:
            raise self._violation(f"envs {holding} ask for actions while they hold a chunk of this connection")
        seen = obs.copy()
        if reuse is not None:
            reuse = np.asarray(reuse)
            if not self.metadata.supports(FEATURE_REUSE_FEEDBACK_OBS):
                raise self._violation("'reuse' on a connection whose server does not offer reuse-feedback-obs")
            if reuse.dtype != bool or reuse.shape != ids.shape:
                raise self._violation(f"'reuse' must be one bool per env, got {reuse.dtype} {reuse.shape}")
            unheld = [int(e) for e in ids[reuse] if int(e) not in self._held]
            if unheld:
                raise self._violation(f"envs {unheld} marked reused, but this connection holds no row for them")
            seen = self._rebuild(ids, reuse, seen)
        elif seen.batch_size != len(ids):
            raise self._violation(f"an infer with {seen.batch_size} rows for {len(ids)} envs")
        infer = Infer(ids, steps, obs.copy(), None if reuse is None else reuse.copy(), seen,
                      self.server.infer_count, self.session, self.index)
        self.server.infer_count += 1
        self._receive(infer)
        self._outstanding = infer
        self._next = "reply"
        delay = self.server.delay
        self._polls_left = delay(infer) if callable(delay) else int(delay)

    def _rebuild(self, ids: np.ndarray, reuse: np.ndarray, fresh: Observation) -> Observation:
        if fresh.batch_size != int((~reuse).sum()):
            raise self._violation(f"an infer with {fresh.batch_size} fresh rows for {int((~reuse).sum())} unreused "
                                  "envs")
        rows, k = [], 0
        for env, reused in zip(ids.tolist(), reuse.tolist()):
            if reused:
                rows.append(self._held[env])
            else:
                rows.append(fresh.select([k]))
                k += 1
        return concat_obs(rows)

    @property
    def waiting(self) -> bool:
        """An infer waits for its reply."""
        return self._next == "reply"

    @property
    def asked_at(self) -> int:
        """The infer count (over every connection) of the infer waiting for its reply."""
        assert self._outstanding is not None
        return self._outstanding.call

    def release(self) -> None:
        """The reply to the infer waiting comes at the next poll."""
        self._polls_left = 0

    def give_reply(self, timeout: float | None) -> ActionReply | None:
        self._check_open()
        if self._next != "reply":
            raise self._violation("receive_actions() with no infer waiting for its reply")
        if self.closed is not None:
            raise ConnectionLost(self.closed)
        if timeout is not None and self._polls_left > 0:
            self._polls_left -= 1
            return None
        infer = self._outstanding
        assert infer is not None
        actions = np.asarray(self.server.policy(infer))
        if actions.ndim < 2 or actions.shape[1] != len(infer.env_indices):
            raise AssertionError(f"the test's policy made a chunk of shape {actions.shape} for "
                                 f"{len(infer.env_indices)} envs; chunks are [H, n, *action_shape]")
        reply = ActionReply(env_ids=infer.env_indices.copy(), actions=actions)
        self.replies.append(reply)
        self._outstanding = None
        self._next = "feedback"
        for env, step in zip(infer.env_indices.tolist(), infer.step_ids.tolist()):
            self._chunks[env] = step
            self._held.pop(env, None)  # what it held was the row this infer used
        self.server.timeline.append(("reply", (self.session, self.index), reply))
        self._close_if_scripted(reply)
        return reply

    def take_feedback(self, sent: messages.Feedback[Observation]) -> None:
        env_indices, step_ids, obs, info = sent.env_indices, sent.step_ids, sent.obs, sent.info
        rewards, terminated, truncated = sent.rewards, sent.terminated, sent.truncated
        self._check_open()
        if self.closed is not None:  # as over a socket: it never arrives, and the next infer learns of the close
            self.lost.append(Feedback(_ids(env_indices, "env_indices"), _ids(step_ids, "step_ids"), obs.copy(),
                                      np.array(rewards), np.array(terminated), np.array(truncated), _copy_info(info),
                                      self.session, self.index))
            return
        if self._next == "reply":
            raise self._violation("a feedback while an infer waits for its reply")
        if self._next == "infer":
            raise self._violation("a feedback that follows no action (two feedbacks without an infer between, or "
                                  "a feedback first on a fresh connection)")
        ids, steps = _ids(env_indices, "env_indices"), _ids(step_ids, "step_ids")
        m = len(ids)
        if m == 0:
            raise self._violation("a feedback for no env")
        if len(set(ids.tolist())) != m or ids.tolist() != sorted(ids.tolist()):
            raise self._violation(f"feedback env_indices {ids.tolist()} are not unique and ascending")
        foreign = [e for e in ids.tolist() if e not in self._chunks]
        if foreign:
            raise self._violation(f"a feedback for envs {foreign}, which hold no chunk of this connection")
        expected = [self._chunks[e] for e in ids.tolist()]
        if steps.tolist() != expected:
            raise self._violation(f"feedback step_ids {steps.tolist()} are not those of the chunks' infers {expected}")
        rewards, terminated, truncated = np.asarray(rewards), np.asarray(terminated), np.asarray(truncated)
        for name, arr, kind in (("rewards", rewards, "f"), ("terminated", terminated, "b"),
                                ("truncated", truncated, "b")):
            if arr.shape != (m,) or arr.dtype.kind != kind:
                raise self._violation(f"feedback {name} must be [{m}] of kind {kind!r}, got {arr.dtype} {arr.shape}")
        if obs.batch_size != m:
            raise self._violation(f"a feedback with {obs.batch_size} observation rows for {m} envs")
        feedback = Feedback(ids, steps, obs.copy(), rewards.copy(), terminated.copy(), truncated.copy(),
                            _copy_info(info), self.session, self.index)
        for j, env in enumerate(ids.tolist()):
            del self._chunks[env]
            if terminated[j] or truncated[j]:
                self._held.pop(env, None)
            else:
                self._held[env] = feedback.obs.select([j])
        self.server.feedback_count += 1
        self._next = "infer"
        self._receive(feedback)

    def _receive(self, msg: Message) -> None:
        self.received.append(msg)
        self.server.timeline.append((msg.kind, (self.session, self.index), msg))
        self._close_if_scripted(msg)

    def _close_if_scripted(self, event: Message | ActionReply) -> None:
        for rule in self.server.closes:
            closed = rule(self, event)
            if closed is not None:
                self.closed = closed
                self.server.timeline.append(("close", (self.session, self.index), closed))
                return


class FakeSession:
    """A group's server session in memory (a ``ServerSession``): its connections, one after the other."""

    def __init__(self, server: FakeServer, index: int) -> None:
        self.server, self.index = server, index
        self.connections: list[FakeConnection] = []
        self.reconnects: list[Closed] = []  # the closes the client reconnected after
        self.closed = False
        self._failed_opens = 0

    @property
    def current(self) -> FakeConnection:
        if not self.connections:
            raise ProtocolViolation(f"session {self.index}: used before open()")
        conn = self.connections[-1]
        if self.closed:
            raise ProtocolViolation(f"session {self.index}: used after close()")
        return conn

    def _connect(self) -> ServerMetadata:
        if self._failed_opens < self.server.failed_opens:
            self._failed_opens += 1
            raise ConnectionLost(DROPPED)
        data = self.server.metadata_for(self.index, len(self.connections))
        meta = messages.parse_metadata(messages.metadata_message(dict(data)))  # what a client reads of it
        self.connections.append(FakeConnection(self.server, self.index, len(self.connections), meta))
        self.server.timeline.append(("open", (self.index, len(self.connections) - 1), meta))
        return meta

    # ------------------------------------------------------------------------------------------ ServerSession

    def open(self) -> ServerMetadata:
        if self.connections:
            raise ProtocolViolation(f"session {self.index}: open() twice (reconnect() opens the later ones)")
        return self._connect()

    def reconnect(self, closed: Closed) -> ServerMetadata:
        if self.connections:
            conn = self.connections[-1]
            if conn.closed is not None and closed != conn.closed:
                raise ProtocolViolation(f"session {self.index}: reconnect({closed}) after the server closed with "
                                        f"{conn.closed}")
            conn.closed_by_client = True
        self.reconnects.append(closed)
        return self._connect()

    def infer(self, request: InferRequest[Observation]) -> ActionReply:
        self.send_infer(request)
        reply = self.receive_actions(None)
        assert reply is not None
        return reply

    def send_infer(self, request: InferRequest[Observation]) -> None:
        self.current.take_infer(request)

    def receive_actions(self, timeout: float | None = None) -> ActionReply | None:
        return self.current.give_reply(timeout)

    @property
    def awaiting(self) -> bool:
        return bool(self.connections) and not self.closed and self.connections[-1].waiting

    def wait(self, peers: Sequence[FakeSession] = ()) -> None:
        """As a blocking receive would: the reply asked for first (over these sessions) comes in now."""
        waiting = [s.connections[-1] for s in (self, *peers) if s.awaiting]
        if waiting:
            min(waiting, key=lambda conn: conn.asked_at).release()

    def feedback(self, feedback: messages.Feedback[Observation], infer_follows: bool = False) -> None:
        conn = self.current
        conn.take_feedback(feedback)
        if infer_follows:  # the client says this group's infer comes next: a test holds it to that
            self.server.timeline.append(("infer follows", (self.index, conn.index), None))

    def close(self) -> None:
        if self.connections and not self.closed:
            self.connections[-1].closed_by_client = True
        self.closed = True


class FakeServer:
    """The scripted server every session of a test talks to.

    ``horizon``: steps of the default policy's chunks (and the metadata's ``action_horizon``). ``policy``: infer ->
    chunk, instead of :func:`encoded_chunks`. ``features``: the metadata's features (:data:`REUSE` offers
    reuse-feedback-obs). ``metadata``: the whole metadata instead (a dict, or ``(session, connection) -> dict``).
    ``delay``: polls (``receive_actions`` with a timeout) an infer's reply stays out, or ``infer -> polls``; a
    blocking receive always gets it. ``closes``: rules asked after each message (:func:`close_after`,
    :func:`stop_after_feedbacks`). ``failed_opens``: connection attempts per session that fail first.
    """

    def __init__(self, horizon: int = 4, policy: Policy | None = None, features: Sequence[str] = (),
                 metadata: Mapping[str, Any] | Callable[[int, int], Mapping[str, Any]] | None = None,
                 delay: int | Callable[[Infer], int] = 0, closes: Sequence[CloseRule] = (), failed_opens: int = 0,
                 action_shape: tuple[int, ...] = (1,), timeline: Timeline | None = None) -> None:
        self.horizon = horizon
        self.policy = policy if policy is not None else encoded_chunks(horizon, action_shape)
        self.features = tuple(features)
        self._metadata = metadata
        self.delay = delay
        self.closes = list(closes)
        self.failed_opens = failed_opens
        self.timeline: Timeline = timeline if timeline is not None else []
        self.sessions: list[FakeSession] = []
        self.infer_count = 0
        self.feedback_count = 0

    def session(self) -> FakeSession:
        """A new client stream (one per env group)."""
        session = FakeSession(self, len(self.sessions))
        self.sessions.append(session)
        return session

    def metadata_for(self, session: int, connection: int) -> Mapping[str, Any]:
        if callable(self._metadata):
            return self._metadata(session, connection)
        if self._metadata is not None:
            return self._metadata
        return {"protocol_version": 1, "server": "fake", "action_horizon": self.horizon,
                "features": list(self.features)}

    @property
    def connections(self) -> list[FakeConnection]:
        return [c for s in self.sessions for c in s.connections]

    @property
    def infers(self) -> list[Infer]:
        return [m for c in self.connections for m in c.infers]

    @property
    def feedbacks(self) -> list[Feedback]:
        return [m for c in self.connections for m in c.feedbacks]


# ---------------------------------------------------------------------------------------------- the run's world


def loop_settings(**overrides: Any) -> LoopSettings:
    """The loop's settings of an in-memory run: env ``Scripted-v0``, process 0, no seed, no limits, no progress
    lines; ``overrides`` set any field."""
    values: dict[str, Any] = dict(env_id="Scripted-v0", process_id=0, seed=None, max_episode_steps=None,
                                  replan_steps=None, success_threshold=None, progress_period_s=3600.0)
    values.update(overrides)
    return LoopSettings(**values)


class MemorySink:
    """The run's writer, in memory (a ``ResultSink``)."""

    def __init__(self) -> None:
        self.episodes: list[Any] = []
        self.progress_reports: list[tuple[int, Any, Any]] = []
        self.artifacts: dict[str, bytes] = {}

    def episode(self, record: Any) -> None:
        self.episodes.append(record)

    def progress(self, process_id: int, status: Any, timing: Any) -> None:
        self.progress_reports.append((process_id, status, timing))

    def artifact(self, process_id: int, relpath: str, data: bytes, append: bool = False) -> None:
        self.artifacts[relpath] = (self.artifacts.get(relpath, b"") if append else b"") + data


class MemoryBudget:
    """The episode budget of one process, in memory (a ``Budget``): ``target`` episodes, or None for no limit.

    A rollout asks it on every loop iteration and counts every env step with it, so it also stops a broken
    rollout that would never end: past ``max_env_steps`` steps, or ``max_checks`` questions, it raises."""

    def __init__(self, target: int | None = None, max_env_steps: int = 5_000, max_checks: int = 50_000) -> None:
        self.target = target
        self.stop = threading.Event()
        self.claimed = 0
        self.env_steps = 0
        self.max_env_steps, self.max_checks = max_env_steps, max_checks
        self._checks = 0

    def claim(self, process_id: int = 0) -> bool:
        if self.target is not None and self.claimed >= self.target:
            return False
        self.claimed += 1
        return True

    def exhausted(self, process_id: int = 0) -> bool:
        return self.target is not None and self.claimed >= self.target

    def finished(self, process_id: int = 0) -> bool:
        self._checks += 1
        if self._checks > self.max_checks:
            raise AssertionError(f"a runaway rollout: asked whether it is finished {self._checks} times")
        return self.exhausted(process_id) or self.stop.is_set()

    def add_env_steps(self, count: int) -> None:
        self.env_steps += count
        if self.env_steps > self.max_env_steps:
            raise AssertionError(f"a runaway rollout: {self.env_steps} env steps and not done")
