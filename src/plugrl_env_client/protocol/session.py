"""The rollout's handle on the server: the current connection, reopened with backoff when the server asks.

A :class:`Session` connects (waiting, once said, for a server that is not up yet), hands ``infer`` and
``feedback`` to the current :class:`~plugrl_env_client.protocol.connection.Connection`, and reconnects with
exponential backoff and jitter after a close that calls for it. A close surfaces as
:class:`~plugrl_env_client.protocol.connection.ConnectionLost` from ``open``, ``infer`` or ``reconnect``; the
caller decides, in one place, whether to reconnect or end. Counters go into the caller's
:class:`~plugrl_env_client.timing.Timing`.
Handshake answers that no retry can fix (a 4xx status other than 408/429, a TLS certificate that does not verify,
a malformed URL) are errors that say so. The WebSocket library is the config's ``transport`` (see
:mod:`~plugrl_env_client.protocol.transport`).
"""

from __future__ import annotations

import dataclasses
import logging
import random
import time
from collections.abc import Callable
from typing import Any, Literal

import numpy as np

from plugrl_env_client.errors import ConfigError
from plugrl_env_client.protocol import messages, transport
from plugrl_env_client.protocol.connection import CloseAction, Closed, Connection, ConnectionLost
from plugrl_env_client.protocol.messages import ActionReply, ObservationLike, ServerMetadata
from plugrl_env_client.timing import Timing

logger = logging.getLogger(__name__)

STOPPED_LOCALLY = Closed(CloseAction.END, None, "the run was stopped locally")
RETRYABLE_STATUS = (408, 429)  # request timeout, too many requests: worth another try
STEADY_CONNECTION_S = 1.0  # a connection that lived this long and completed an exchange resets the backoff


@dataclasses.dataclass(frozen=True)
class ConnectionConfig:
    """How the client connects to its server, and what it does when the server goes away."""

    # The user's choices: on the command line they are flags without a section prefix (--connect-timeout).

    api_key: str | None = None
    """Sent as 'Authorization: Api-Key <key>'. Default: $PLUGRL_API_KEY if set."""
    reconnect_on_server_stop: bool = False
    """After the server ends a run, wait for its next run instead of exiting."""
    max_reconnects: int | None = None
    """Give up after this many reconnects. Default: keep reconnecting while the server comes back."""
    connect_timeout: float | None = None
    """Seconds to wait for the first connection. Default: wait until a server is up."""
    reconnect_timeout: float | None = None
    """Seconds to wait for the server to come back after a lost connection. Default: wait until it does."""
    reuse_feedback_obs: bool = True
    """When the server offers reuse-feedback-obs, do not upload an observation the server already holds."""
    transport: Literal["websockets", "picows"] = "websockets"
    """The WebSocket implementation: websockets, or picows (extra fast; the same bytes, faster for large frames)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class SessionConfig(ConnectionConfig):
    """One connection's settings: the user's :class:`ConnectionConfig` and where and as whom it connects."""

    url: str
    backoff_initial_s: float = 0.1
    backoff_max_s: float = 5.0
    server_command: str = "plugrl-run-policy-server --port <port>"
    """How to start a server that fits the env (said when none answers)."""
    local_flag: str = "--local-policy random"
    """The flag that uses the embedded server instead."""
    stream: tuple[int, int] | None = None
    """(process id, env group) of this connection, sent as the STREAM_HEADER handshake header: servers that know it
    (the reference server) give each stream its own reproducible random policy; others ignore it."""

    @classmethod
    def of(cls, config: ConnectionConfig, **added: Any) -> SessionConfig:
        """``config``'s choices (every field of :class:`ConnectionConfig`), with ``added`` (``url`` and the hints
        that fit the env, or a resolved ``api_key``)."""
        chosen = {f.name: getattr(config, f.name) for f in dataclasses.fields(ConnectionConfig)}
        return cls(**{**chosen, **added})


class Session:
    """The rollout's handle on the server: the current :class:`Connection`, reopened with backoff when needed."""

    def __init__(self, config: SessionConfig, should_stop: Callable[[], bool] = lambda: False,
                 timing: Timing | None = None) -> None:
        self.config = config
        self.timing = timing if timing is not None else Timing()
        self.connection: Connection | None = None
        self._should_stop = should_stop
        self._rng = random.Random()
        self._failed_reconnects = 0  # reconnects in a row that did not get one exchange done
        self._actions_at_open = 0
        self._opened_at = 0.0

    # ------------------------------------------------------------------------------ what the rollout calls

    @property
    def metadata(self) -> ServerMetadata | None:
        return self.connection.metadata if self.connection is not None else None

    def infer(self, obs: ObservationLike, env_indices: np.ndarray, step_ids: np.ndarray,
              reuse: np.ndarray | None = None) -> ActionReply:
        return self._current().infer(obs, env_indices, step_ids, reuse)

    def send_infer(self, obs: ObservationLike, env_indices: np.ndarray, step_ids: np.ndarray,
                   reuse: np.ndarray | None = None) -> None:
        self._current().send_infer(obs, env_indices, step_ids, reuse)

    def receive_actions(self, timeout: float | None = None) -> ActionReply | None:
        return self._current().receive_actions(timeout)

    def feedback(self, env_indices: np.ndarray, step_ids: np.ndarray, obs: ObservationLike, rewards: np.ndarray,
                 terminated: np.ndarray, truncated: np.ndarray, info: dict[str, Any]) -> None:
        self._current().feedback(env_indices, step_ids, obs, rewards, terminated, truncated, info)

    def _current(self) -> Connection:
        if self.connection is None:
            raise RuntimeError("the session has no connection: call open() first")
        return self.connection

    def open(self) -> ServerMetadata:
        """First connection: wait for the server (up to ``connect_timeout``, if set) and read its metadata."""
        return self._open(self.config.connect_timeout, "--connect-timeout")

    def _open(self, timeout_s: float | None, flag: str) -> ServerMetadata:
        attempt, deadline = 0, None
        if timeout_s is not None:
            deadline = time.monotonic() + timeout_s
        while True:
            if self._should_stop():
                raise ConnectionLost(STOPPED_LOCALLY)
            opened = self._try_connect(attempt)
            if opened is not None:
                self.connection = Connection(opened, self.timing, self.config.reconnect_on_server_stop)
                self._actions_at_open = self.timing.actions_received
                self._opened_at = time.monotonic()
                meta = self.connection.read_metadata()
                logger.info("connected to %s; server metadata: %s", self.config.url,
                            messages.short_repr(meta.raw, 400))
                return meta
            if deadline is not None and time.monotonic() > deadline:
                hint = (f"start one with `{self.config.server_command}` or use `{self.config.local_flag}`"
                        if flag == "--connect-timeout" else "it went away and did not come back")
                raise ConfigError(f"no policy server answered at {self.config.url} within {timeout_s:g} s ({flag}); {hint}")
            attempt += 1
            time.sleep(self._backoff(attempt))

    def reconnect(self, closed: Closed) -> ServerMetadata:
        """Open a fresh connection after ``closed``; the caller has dropped every chunk in flight."""
        limit = self.config.max_reconnects
        if limit is not None and self.timing.reconnects >= limit:
            raise ConfigError(f"the server closed the connection ({closed.describe()}) more than --max-reconnects={limit} times; giving up")
        # Back off further while reconnects keep failing before a single exchange (a server that resyncs at once).
        progressed = (self.timing.actions_received > self._actions_at_open
                      and time.monotonic() - self._opened_at >= STEADY_CONNECTION_S)
        self._failed_reconnects = 1 if progressed else self._failed_reconnects + 1
        self.timing.reconnects += 1
        logger.warning("reconnecting to %s after close (%s)", self.config.url, closed.describe())
        self.close()
        time.sleep(self._backoff(self._failed_reconnects))
        # A restarting server may take a while: wait for it, up to --reconnect-timeout if set.
        return self._open(self.config.reconnect_timeout, "--reconnect-timeout")

    def close(self) -> None:
        if self.connection is not None:
            self.connection.close()
            self.connection = None

    def _backoff(self, attempt: int) -> float:
        base = min(self.config.backoff_max_s, self.config.backoff_initial_s * 2 ** max(attempt - 1, 0))
        return base * (0.5 + self._rng.random() / 2)

    def _try_connect(self, attempt: int) -> transport.Transport | None:
        headers = {"Authorization": f"Api-Key {self.config.api_key}"} if self.config.api_key else {}
        if self.config.stream is not None:
            headers[messages.STREAM_HEADER] = "{}.{}".format(*self.config.stream)
        try:
            return transport.connect(self.config.url, headers, kind=self.config.transport, open_timeout=10,
                                     close_timeout=2)
        except transport.CertificateNotVerified as exc:
            raise ConfigError(
                f"the TLS certificate of {self.config.url} did not verify ({exc.verify_message}); point SSL_CERT_FILE "
                "at the CA that signed it, or use ws:// on a trusted network"
            ) from None
        except transport.InvalidServerURL as exc:
            raise ConfigError(f"invalid server URL {self.config.url!r}: {exc}; use ws://host:port or wss://host:port") from None
        except transport.HandshakeRefused as exc:
            if 400 <= exc.status < 500 and exc.status not in RETRYABLE_STATUS:
                raise ConfigError(
                    f"the server at {self.config.url} refused the WebSocket handshake with HTTP {exc.status}; check the "
                    "URL and --api-key / $PLUGRL_API_KEY"
                ) from None
            self._say_waiting(attempt, exc)
            return None
        except transport.ConnectFailed as exc:
            self._say_waiting(attempt, exc)
            return None

    def _say_waiting(self, attempt: int, exc: BaseException) -> None:
        if attempt == 0:
            logger.warning(
                "waiting for a policy server at %s (%s). Start one with `%s`, or run with `%s` to use the "
                "embedded one.",
                self.config.url,
                exc,
                self.config.server_command,
                self.config.local_flag,
            )
