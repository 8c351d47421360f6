"""The reference policy server.

It speaks PlugRL v1 exactly as a training server does, validates every client message strictly (a violation
closes the connection with ``plugrl-server-resync`` and a log line saying what was wrong), answers infers from a
:class:`~plugrl_env_client.server.policies.Policy`, and counts finished episodes from ``info["episode"]``. With
``max_episodes`` it ends the run (``plugrl-server-stop``) once that many episodes were reported.

One thread per connection (websockets' sync server); episode counters are shared under a lock.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import Any

import numpy as np
from websockets.exceptions import ConnectionClosed
from websockets.sync.server import Server, ServerConnection, serve

from plugrl_env_client.errors import ProtocolError
from plugrl_env_client.protocol import codec, messages
from plugrl_env_client.server.policies import Policy
from plugrl_env_client.version import __version__

logger = logging.getLogger(__name__)

LOG_PERIOD_S = 5.0


@dataclasses.dataclass
class EpisodeLog:
    """Running totals of the episodes clients reported."""

    episodes: int = 0
    return_sum: float = 0.0
    length_sum: int = 0
    successes: int = 0

    def add(self, episode: Any) -> int:
        """Count the finished rows of one ``info["episode"]`` map; returns how many there were."""
        if not isinstance(episode, dict):
            return 0
        mask = np.asarray(episode.get("mask", np.ones(len(np.atleast_1d(episode.get("r", []))), bool)), dtype=bool)
        rows = int(mask.sum())
        self.episodes += rows
        self.return_sum += float(np.asarray(episode.get("r", np.zeros(mask.shape)), dtype=np.float64)[mask].sum())
        self.length_sum += int(np.asarray(episode.get("l", np.zeros(mask.shape)), dtype=np.int64)[mask].sum())
        self.successes += int(np.asarray(episode.get("s", np.zeros(mask.shape)), dtype=bool)[mask].sum())
        return rows

    def line(self) -> str:
        n = max(self.episodes, 1)
        return (
            f"episodes={self.episodes} mean_return={self.return_sum / n:.3f} "
            f"mean_length={self.length_sum / n:.1f} success_rate={self.successes / n:.3f}"
        )


class _Violation(Exception):
    """A client broke the protocol; the connection is resynced."""


class PolicyServer:
    """Serve ``policy`` on ``ws://host:port`` until :meth:`shutdown` (or ``max_episodes`` were reported)."""

    def __init__(self, policy: Policy, host: str = "127.0.0.1", port: int = 8000, max_episodes: int | None = None,
                 reuse_feedback_obs: bool = True) -> None:
        self.policy = policy
        self.reuse_feedback_obs = reuse_feedback_obs
        self.max_episodes = max_episodes
        self.log = EpisodeLog()
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self._clients: set[ServerConnection] = set()
        self._last_log = -LOG_PERIOD_S
        self._server: Server = serve(self._handle, host, port, compression=None, max_size=None)
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._server.socket.getsockname()[1])

    @property
    def url(self) -> str:
        host = self._server.socket.getsockname()[0]
        return f"ws://{host}:{self.port}"

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

    # ------------------------------------------------------------------------------------------ one connection

    def _handle(self, ws: ServerConnection) -> None:
        peer = ws.remote_address
        logger.info("client connected: %s", peer)
        with self._lock:
            self._clients.add(ws)
        try:
            ws.send(codec.packb(messages.metadata_message(self.metadata())))
            self._serve_connection(ws)
        except _Violation as exc:
            logger.warning("protocol violation by %s, closing with %s: %s", peer, messages.REASON_RESYNC, exc)
            ws.close(messages.CLOSE_GOING_AWAY, messages.REASON_RESYNC)
        except ConnectionClosed:
            logger.info("client disconnected: %s", peer)
        except Exception:  # a bug in a policy or here: the client reconnects, the traceback is logged
            logger.exception("internal error while serving %s", peer)
            ws.close(messages.CLOSE_INTERNAL, messages.REASON_INTERNAL)
        finally:
            with self._lock:
                self._clients.discard(ws)

    def _serve_connection(self, ws: ServerConnection) -> None:
        outstanding: set[int] = set()  # envs that received a chunk and owe us its feedback
        held: dict[int, dict[str, Any]] = {}  # env -> its observation row from the last feedback (reuse)
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
                actions = self.policy.act(obs, len(request.env_indices))
                ws.send(codec.packb(messages.action_message(request.env_indices, actions)))
                outstanding.update(request.env_indices.tolist())
                expect = messages.FEEDBACK
            else:
                feedback = _parse(messages.parse_feedback, msg)
                if len(feedback.env_indices) > 1:  # one row needs no splitting (as the training server does it)
                    _check_info(feedback.info, len(feedback.env_indices), "info")
                unknown = set(feedback.env_indices.tolist()) - outstanding
                if unknown:
                    raise _Violation(f"feedback for envs {sorted(unknown)} that have no chunk on this connection")
                outstanding.difference_update(feedback.env_indices.tolist())
                _hold_rows(held, feedback)
                if self._record(feedback.info.get("episode")):
                    ws.close(messages.CLOSE_GOING_AWAY, messages.REASON_STOP)
                    return
                expect = messages.INFER

    def _with_reused_rows(self, request: messages.InferRequest, held: dict[int, dict[str, Any]]) -> dict[str, Any]:
        """The full observation batch of an infer, reused rows taken from the held feedback rows."""
        if request.reuse is None or not request.reuse.any():
            return request.obs
        if not self.reuse_feedback_obs:
            raise _Violation("infer carries 'reuse' but this server did not offer reuse-feedback-obs")
        envs = request.env_indices.tolist()
        missing = [e for e, r in zip(envs, request.reuse.tolist()) if r and e not in held]
        if missing:
            raise _Violation(f"infer reuses rows of envs {missing} whose last feedback on this connection "
                             "did not leave an observation to reuse (none yet, or the episode ended)")
        sent = iter(range(int((~request.reuse).sum())))
        rows = [held[e] if r else _row(request.obs, next(sent)) for e, r in zip(envs, request.reuse.tolist())]
        return _stack_rows(rows)

    def _receive(self, ws: ServerConnection) -> Any:
        frame = ws.recv()
        if isinstance(frame, str):
            raise _Violation("text frame received; PlugRL sends binary msgpack frames only")
        return _parse(codec.unpackb, frame)

    def _record(self, episode: Any) -> bool:
        """Count reported episodes; True when the run is over."""
        with self._lock:
            if self.log.add(episode) and time.monotonic() - self._last_log >= LOG_PERIOD_S:
                self._last_log = time.monotonic()
                logger.info("%s", self.log.line())
            if self.max_episodes is not None and self.log.episodes >= self.max_episodes and not self.stopping.is_set():
                logger.info("reached %d episodes (%s); ending the run (%s)", self.max_episodes, self.log.line(),
                            messages.REASON_STOP)
                self.stopping.set()
            return self.stopping.is_set()


def _check_info(info: dict[str, Any], m: int, path: str) -> None:
    """Info must split per env: str keys, and every leaf an array whose leading dim is the feedback's m."""
    for key, value in info.items():
        if not isinstance(key, str):
            raise _Violation(f"feedback {path} has a non-str key {key!r}; use str keys only")
        if isinstance(value, dict):
            _check_info(value, m, f"{path}[{key!r}]")
        elif not (isinstance(value, np.ndarray) and value.ndim >= 1 and value.shape[0] == m):
            got = f"shape {list(value.shape)}" if isinstance(value, np.ndarray) else type(value).__name__
            raise _Violation(f"feedback {path}[{key!r}] must be an array with leading dim {m} (one row per env), got {got}")


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


def _hold_rows(held: dict[int, dict[str, Any]], feedback: messages.FeedbackMessage) -> None:
    done = feedback.terminated | feedback.truncated
    for i, env in enumerate(feedback.env_indices.tolist()):
        if done[i]:
            held.pop(env, None)
        else:
            held[env] = _row(feedback.obs, i)


def _parse(parser: Any, value: Any) -> Any:
    try:
        return parser(value)
    except ProtocolError as exc:
        raise _Violation(str(exc)) from None
