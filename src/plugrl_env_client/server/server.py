"""The reference policy server.

It speaks PlugRL v1 exactly as a training server does, validates every client message strictly (a violation
closes the connection with ``plugrl-server-resync`` and a log line saying what was wrong), answers infers from a
:class:`~plugrl_env_client.server.policies.Policy`, and counts finished episodes from ``info["episode"]``. With
``max_episodes`` it ends the run (``plugrl-server-stop``) once that many episodes were reported.

Success rates count only episodes the server can tell were judged. A client sends ``info["episode"]["s"]`` for
every finished episode, and for an env with no success rule that flag is simply False: on the wire, "no rule" and
"failed" look the same. So a connection's False flags count as failures only once its feedback shows that its env
has a rule (see :class:`SuccessJudging`); until then the log says ``success_rate=n/a`` rather than 0.

The policy sees each connection through ``policy.for_connection()``: every infer of it (with the env indices),
every feedback, and its end, so a learner can tell the envs of every connection apart. A policy that cannot serve
the client's env at all (a :class:`~plugrl_env_client.errors.ConfigError`, e.g. ARS for an env without state
arrays) ends the run: the error is logged, every client is closed with ``plugrl-server-stop``, and
:attr:`PolicyServer.failure` holds the message (``plugrl-run-policy-server`` then exits with it).

One thread per connection, whichever WebSocket library accepted it (``transport``: websockets' threading server,
or picows with its loop in a thread of its own, see :mod:`~plugrl_env_client.protocol.transport`); episode
counters are shared under a lock. ``latency_ms`` holds each action back that long, as a model's inference would:
it blocks the connection's own thread only, so other clients are served meanwhile and the client's next frames
are already being received.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import Any

import numpy as np

from plugrl_env_client.errors import ConfigError, ProtocolError
from plugrl_env_client.protocol import codec, messages
from plugrl_env_client.protocol.transport import ServerTransport, TransportClosed, TransportServer, serve
from plugrl_env_client.records import EpisodeStats
from plugrl_env_client.server.policies import Policy
from plugrl_env_client.version import __version__

logger = logging.getLogger(__name__)

LOG_PERIOD_S = 5.0


SUCCESS_INFO_KEYS = ("success", "is_step_success")
"""Per-env step flags a client forwards in feedback ``info`` only for an env that judges success: this client
forwards the env's own ``info["success"]``, PlugRL's client sends ``info["is_step_success"]``."""


@dataclasses.dataclass
class SuccessJudging:
    """Whether the env behind one connection has a success rule, as far as its feedback has shown.

    A feedback shows it when an episode reports ``s`` True (only a rule makes a success), or when its ``info``
    carries a per-env success flag (:data:`SUCCESS_INFO_KEYS`). Before that, episodes whose ``s`` is False are
    ``pending``: not counted in the success rate, since the env may have no rule at all. Once the rule shows, they
    count as the failures they were. A reconnect starts over: a new connection may carry another env.
    """

    known: bool = False
    pending: int = 0


class EpisodeLog:
    """Running totals of the episodes clients reported in ``info["episode"]`` (thread-safe)."""

    def __init__(self) -> None:
        self.stats = EpisodeStats()
        self._lock = threading.Lock()

    @property
    def episodes(self) -> int:
        return self.stats.count

    def add(self, episode: Any, judging: SuccessJudging, shows_rule: bool = False) -> int:
        """Count the finished rows of one ``info["episode"]`` map from the connection ``judging`` belongs to
        (``l`` may be any integer type; extra keys such as PlugRL's ``mean_success_rate`` are ignored); returns
        how many there were.

        ``shows_rule``: the feedback's ``info`` showed that the env judges success. A row's ``s`` counts in the
        success rate once the connection's env is known to have a rule (see :class:`SuccessJudging`); a map
        without ``s`` says nothing about success.
        """
        rows: np.ndarray = np.zeros(0, np.intp)
        judged = None
        if isinstance(episode, dict) and "r" in episode:
            returns = np.atleast_1d(np.asarray(episode["r"], dtype=np.float64))
            mask = np.asarray(episode.get("mask", np.ones(returns.shape, bool)), dtype=bool).reshape(-1)
            lengths = np.atleast_1d(np.asarray(episode.get("l", np.zeros(returns.shape)), dtype=np.int64))
            success = episode.get("s")
            judged = None if success is None else np.atleast_1d(np.asarray(success, dtype=bool))
            rows = np.flatnonzero(mask)
        if not rows.size and (judging.known or not shows_rule):
            return 0  # most feedbacks: no episode ended, nothing new about the rule (no lock taken)
        with self._lock:
            if not judging.known and (shows_rule or (judged is not None and bool(judged[rows].any()))):
                judging.known = True
                self.stats.judge_later(judging.pending)
                judging.pending = 0
            for i in rows:
                flag = None if judged is None or not judging.known else bool(judged[i])
                self.stats.add(float(returns[i]), int(lengths[i]), flag)
            if judged is not None and not judging.known:
                judging.pending += int(rows.size)
        return int(rows.size)

    def line(self) -> str:
        """One log line: episodes, mean return and length, and the success rate over the episodes known to be
        judged (``n/a`` when none is; how many were, when not all)."""
        with self._lock:
            means = self.stats.all_episodes()
            count, judged = self.stats.count, self.stats.success_judged

        def fmt(value: float | None, spec: str) -> str:
            return "n/a" if value is None else format(value, spec)

        rate = fmt(means["mean_success_rate"], ".3f")
        if 0 < judged < count:
            rate += f" (over the {judged} episodes with a success rule)"
        return (f"episodes={count} mean_return={fmt(means['mean_return'], '.3f')} "
                f"mean_length={fmt(means['mean_length'], '.1f')} success_rate={rate}")


class _Violation(Exception):
    """A client broke the protocol; the connection is resynced."""


class PolicyServer:
    """Serve ``policy`` on ``ws://host:port`` until :meth:`shutdown` (or ``max_episodes`` were reported).

    ``transport`` is the WebSocket library (websockets or picows); ``latency_ms`` delays each action (simulated
    inference time).
    """

    def __init__(self, policy: Policy, host: str = "127.0.0.1", port: int = 8000, max_episodes: int | None = None,
                 reuse_feedback_obs: bool = True, seed: int | None = None, transport: str = "websockets",
                 latency_ms: float = 0.0) -> None:
        if not 0.0 <= latency_ms < float("inf"):
            raise ValueError(f"--policy.latency-ms must be a finite number >= 0, got {latency_ms}")
        self.policy = policy
        self.latency_s = latency_ms / 1000.0
        self.seed = seed if seed is not None else int(np.random.SeedSequence().entropy % (1 << 63))  # type: ignore[operator]
        self._streams: dict[tuple[int, int], int] = {}  # connections seen per client stream
        self.reuse_feedback_obs = reuse_feedback_obs
        self.max_episodes = max_episodes
        self.log = EpisodeLog()
        self.stopping = threading.Event()
        self.failed = threading.Event()
        self.failure: str | None = None
        """Why the policy could not serve a client's env (the run was ended), or None."""
        self._lock = threading.Lock()
        self._clients: set[ServerTransport] = set()
        self._last_log = -LOG_PERIOD_S
        # Frames are decoded by the transport (picows decodes straight from its read buffer: one copy less).
        self._server: TransportServer = serve(self._handle, host, port, kind=transport, parse=codec.unpackb)
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self._server.address[1]

    @property
    def url(self) -> str:
        return f"ws://{self._server.address[0]}:{self.port}"

    def metadata(self) -> dict[str, Any]:
        return {"protocol_version": messages.PROTOCOL_VERSION, "server": "plugrl-env-client-reference",
                "server_version": __version__, **self.policy.metadata(),
                "features": [messages.FEATURE_REUSE_FEEDBACK_OBS] if self.reuse_feedback_obs else []}

    def serve_forever(self) -> None:
        self._server.serve_forever()

    def start(self) -> PolicyServer:
        """Serve in a daemon thread (embedded use and tests)."""
        self._thread = threading.Thread(target=self.serve_forever, name="plugrl-policy-server", daemon=True)
        self._thread.start()
        return self

    def shutdown(self) -> None:
        """Close every client with ``Server shutdown`` (they reconnect when a server comes back), then stop."""
        with self._lock:
            clients = list(self._clients)
        for ws in clients:
            ws.close(messages.CLOSE_GOING_AWAY, messages.REASON_SHUTDOWN)
        self._server.shutdown()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.policy.close()

    # ------------------------------------------------------------------------------------------ one connection

    def _handle(self, ws: ServerTransport) -> None:
        peer = ws.remote_address
        logger.info("client connected: %s", peer)
        with self._lock:
            self._clients.add(ws)
        policy: Policy | None = None
        try:
            ws.send(codec.packb(messages.metadata_message(self.metadata())))
            policy = self._policy_for(ws).for_connection()
            self._serve_connection(ws, policy)
        except ConfigError as exc:  # the policy cannot serve this env at all: no reconnect can help
            self._fail(exc)
        except _Violation as exc:
            logger.warning("protocol violation by %s, closing with %s: %s", peer, messages.REASON_RESYNC, exc)
            ws.close(messages.CLOSE_GOING_AWAY, messages.REASON_RESYNC)
        except TransportClosed as exc:
            if exc.code is None:  # not an error of ours or theirs; PlugRL SPEC 7.5 asks clients for a close frame
                logger.info("client disconnected: %s (note: it dropped the socket without a close frame)", peer)
            else:
                logger.info("client disconnected: %s", peer)
        except Exception:  # a bug in a policy or here: the client reconnects, the traceback is logged
            logger.exception("internal error while serving %s", peer)
            ws.close(messages.CLOSE_INTERNAL, messages.REASON_INTERNAL)
        finally:
            if policy is not None:
                policy.disconnect()
            with self._lock:
                self._clients.discard(ws)

    def _fail(self, exc: ConfigError) -> None:
        """End the run because the policy cannot serve a client's env: say why, once, and close every client."""
        with self._lock:
            first = self.failure is None
            if first:
                self.failure = str(exc)
            clients = list(self._clients)
        if first:
            logger.error("the %s policy cannot serve this env, so the run ends: %s", self.policy.metadata()["policy"],
                         exc)
        self.stopping.set()
        for ws in clients:
            ws.close(messages.CLOSE_GOING_AWAY, messages.REASON_STOP)
        self.failed.set()

    def _policy_for(self, ws: ServerTransport) -> Policy:
        """The policy of one connection: a client that names its stream (process, env group) in the handshake
        gets a generator of its own, seeded from the server's seed, the stream and how often it connected, so the
        same client run gets the same actions whatever other streams do."""
        raw = ws.header(messages.STREAM_HEADER)
        try:
            process, group = (int(part) for part in str(raw).split("."))
        except ValueError:
            return self.policy  # no header (or another client's idea of one): the shared generator
        with self._lock:
            nth = self._streams.get((process, group), 0)
            self._streams[(process, group)] = nth + 1
        return self.policy.for_stream(np.random.SeedSequence([self.seed, process, group, nth]))

    def _serve_connection(self, ws: ServerTransport, policy: Policy) -> None:
        outstanding: set[int] = set()  # envs that received a chunk and owe us its feedback
        seen: set[int] = set()  # envs that received a chunk on this connection: they have step state
        warned_stateless = False
        held: dict[int, HeldRow] = {}  # env -> its observation row in the last feedback (reuse)
        judging = SuccessJudging()
        expect = messages.INFER
        while True:
            msg = self._receive(ws)
            if self.stopping.is_set():  # the run is over: whatever the client sent, it learns so now
                ws.close(messages.CLOSE_GOING_AWAY, messages.REASON_STOP)
                return
            kind = _parse(messages.message_type, msg)
            if kind != expect:
                raise _Violation(f"expected a {expect!r} message, got {kind!r}")
            if kind == messages.INFER:
                request = _parse(messages.parse_infer, msg)
                stale = outstanding.intersection(request.env_indices.tolist())
                if stale:
                    raise _Violation(f"infer for envs {sorted(stale)} whose previous chunk got no feedback yet")
                obs = self._with_reused_rows(request, held)
                actions = policy.infer(obs, request.env_indices, request.step_ids)
                if self.latency_s:
                    time.sleep(self.latency_s)
                ws.send(codec.packb(messages.action_message(request.env_indices, actions)))
                outstanding.update(request.env_indices.tolist())
                seen.update(request.env_indices.tolist())
                expect = messages.FEEDBACK
            else:
                feedback = _parse(messages.parse_feedback, msg)
                _check_info(feedback.info, len(feedback.env_indices))
                envs = feedback.env_indices.tolist()
                stateless = [e for e in envs if e not in seen]
                if stateless and not warned_stateless:  # PlugRL SPEC 7.6: say so (once per connection)
                    warned_stateless = True
                    logger.warning("feedback from %s for envs %s that have no step state on this connection (no "
                                   "chunk was sent to them here): the connection was replaced mid-run; those rows "
                                   "are ignored", ws.remote_address, stateless)
                repeated = sorted(set(envs) - outstanding - set(stateless))
                if repeated:
                    raise _Violation(f"feedback for envs {repeated} whose chunk already got its feedback")
                outstanding.difference_update(envs)
                _hold_rows(held, feedback, skip=set(stateless))
                policy.feedback(feedback)
                episode = _episode_rows(feedback.info.get("episode"), envs, set(stateless))
                shows_rule = not judging.known and _shows_success_rule(feedback.info, len(envs))
                if self._record(episode, judging, shows_rule):
                    ws.close(messages.CLOSE_GOING_AWAY, messages.REASON_STOP)
                    return
                expect = messages.INFER

    def _with_reused_rows(self, request: messages.InferRequest, held: dict[int, HeldRow]) -> dict[str, Any]:
        """The full observation batch of an infer, reused rows taken from the held feedback rows.

        When every row is reused and they are one run of a single feedback, in order (a chunk's feedback, then
        the infer for the same envs), the batch is that feedback's arrays sliced: no copy of the images.
        """
        if request.reuse is None or not request.reuse.any():
            return request.obs
        if not self.reuse_feedback_obs:
            raise _Violation("infer carries 'reuse' but this server did not offer reuse-feedback-obs")
        envs = request.env_indices.tolist()
        missing = [e for e, r in zip(envs, request.reuse.tolist()) if r and e not in held]
        if missing:
            raise _Violation(f"infer reuses rows of envs {missing} whose last feedback on this connection "
                             "did not leave an observation to reuse (none yet, or the episode ended)")
        if request.reuse.all():
            block = _run_of_one_batch([held[e] for e in envs])
            if block is not None:
                return block
        sent = iter(range(int((~request.reuse).sum())))
        rows = [_row(*held[e]) if r else _row(request.obs, next(sent)) for e, r in zip(envs, request.reuse.tolist())]
        return _stack_rows(rows)

    def _receive(self, ws: ServerTransport) -> Any:
        try:
            msg = ws.recv()  # decoded by codec.unpackb (see __init__)
        except ProtocolError as exc:
            raise _Violation(str(exc)) from None
        if isinstance(msg, str):
            raise _Violation("text frame received; PlugRL sends binary msgpack frames only")
        return msg

    def _record(self, episode: Any, judging: SuccessJudging, shows_rule: bool) -> bool:
        """Count reported episodes; True when the run is over."""
        added = self.log.add(episode, judging, shows_rule)
        with self._lock:
            if added and time.monotonic() - self._last_log >= LOG_PERIOD_S:
                self._last_log = time.monotonic()
                logger.info("%s", self.log.line())
            if self.max_episodes is not None and self.log.episodes >= self.max_episodes and not self.stopping.is_set():
                logger.info("reached %d episodes (%s); ending the run (%s)", self.max_episodes, self.log.line(),
                            messages.REASON_STOP)
                self.stopping.set()
            return self.stopping.is_set()


EPISODE_FIELDS = ("r", "l", "s", "mask")


def _check_info(info: dict[str, Any], m: int) -> None:
    """What a server needs to split a feedback's info per env, as PlugRL's server splits it.

    Arrays with leading dim ``m`` are sliced per env; any other value is passed through to every env unchanged
    (PlugRL SPEC 5.4), e.g. the plain float ``mean_success_rate`` PlugRL's client puts in ``info["episode"]``.
    What breaks the exchange is refused: a non-str key, an ``info["episode"]`` field (r, l, s, mask) that is an
    array of another length than ``m``, and, for ``m > 1``, a non-empty info with no array of leading dim ``m``
    anywhere (nothing says how to split it; PlugRL's server refuses it too).
    """
    _check_keys(info, "info")
    episode = info.get("episode")
    if isinstance(episode, dict):
        for key in EPISODE_FIELDS:
            value = episode.get(key)
            if isinstance(value, np.ndarray) and (value.ndim == 0 or value.shape[0] != m):
                raise _Violation(f"feedback info['episode'][{key!r}] has shape {list(value.shape)}; it needs one "
                                 f"row per env of the feedback ({m})")
    if m > 1 and info and not _has_rows(info, m):
        raise _Violation(f"feedback info {messages.short_repr(info, 200)} cannot be split per env: for {m} envs it "
                         f"needs arrays with leading dim {m}")


def _check_keys(info: dict[str, Any], path: str) -> None:
    for key, value in info.items():
        if not isinstance(key, str):
            raise _Violation(f"feedback {path} has a non-str key {key!r}; use str keys only")
        if isinstance(value, dict):
            _check_keys(value, f"{path}[{key!r}]")


def _has_rows(info: dict[str, Any], m: int) -> bool:
    return any(_has_rows(v, m) if isinstance(v, dict) else isinstance(v, np.ndarray) and v.ndim >= 1 and v.shape[0] == m
               for v in info.values())


def _shows_success_rule(info: dict[str, Any], m: int) -> bool:
    """Whether a feedback's ``info`` carries a per-env success flag (:data:`SUCCESS_INFO_KEYS`): its env judges
    success, so the ``s`` of its episodes is a verdict, not a default."""
    return any(isinstance(v := info.get(key), np.ndarray) and v.ndim == 1 and v.shape[0] == m
               for key in SUCCESS_INFO_KEYS)


def _episode_rows(episode: Any, envs: list[int], skip: set[int]) -> Any:
    """``info["episode"]`` without the rows of ``skip`` envs (their transitions are ignored)."""
    if not skip or not isinstance(episode, dict):
        return episode
    keep = np.array([e not in skip for e in envs])
    return {k: (v[keep] if isinstance(v, np.ndarray) and v.ndim >= 1 and v.shape[0] == len(envs) else v)
            for k, v in episode.items()}


def _row(obs: dict[str, Any], i: int) -> dict[str, Any]:
    text = obs["text"]
    return {
        "images": {k: v[i] for k, v in obs["images"].items()},
        "states": {k: v[i] for k, v in obs["states"].items()},
        "text": None if text is None else str(text[i]),
    }


def _stack_rows(rows: list[dict[str, Any]]) -> dict[str, Any]:
    first = rows[0]
    try:
        return {
            "images": {k: np.stack([r["images"][k] for r in rows]) for k in first["images"]},
            "states": {k: np.stack([r["states"][k] for r in rows]) for k in first["states"]},
            "text": np.array([r["text"] or "" for r in rows]),
        }
    except (KeyError, ValueError) as exc:
        raise _Violation(f"reused and sent observation rows do not fit together: {exc}") from None


HeldRow = tuple[dict[str, Any], int]
"""An env's held observation: (the feedback's observation batch, the env's row in it)."""


def _run_of_one_batch(rows: list[HeldRow]) -> dict[str, Any] | None:
    """``rows`` as slices of their batch when they are consecutive rows of one batch, in order; else None."""
    batch, first = rows[0]
    if any(b is not batch or i != first + k for k, (b, i) in enumerate(rows)):
        return None
    stop, text = first + len(rows), batch["text"]
    return {
        "images": {k: v[first:stop] for k, v in batch["images"].items()},
        "states": {k: v[first:stop] for k, v in batch["states"].items()},
        "text": np.array([("" if text is None else str(text[i])) or "" for i in range(first, stop)]),
    }


def _hold_rows(held: dict[int, HeldRow], feedback: messages.FeedbackMessage, skip: set[int]) -> None:
    done = feedback.terminated | feedback.truncated
    for i, env in enumerate(feedback.env_indices.tolist()):
        if env in skip:
            continue
        if done[i]:
            held.pop(env, None)
        else:
            held[env] = (feedback.obs, i)


def _parse(parser: Any, value: Any) -> Any:
    try:
        return parser(value)
    except ProtocolError as exc:
        raise _Violation(str(exc)) from None
