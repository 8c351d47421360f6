"""Opening a session's connections: dialing with backoff and jitter, the handshake, and the server's metadata.

A :class:`Dialer` opens one connection at a time for one :class:`~plugrl_env_client.protocol.session.Session`
and keeps what reconnecting needs between attempts. ``connect_timeout`` / ``reconnect_timeout`` bound a whole
opening, the metadata read included. What ends an opening is a typed error: :class:`ServerUnreachable`,
:class:`ReconnectsExhausted`, a :class:`~plugrl_env_client.errors.ConfigError` for what no retry fixes (a 4xx
answer other than 408/429, a certificate that does not verify, a malformed URL), or
:class:`~plugrl_env_client.protocol.exchange.ConnectionLost`. Messages name each choice by the config's ``word``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import random
import time
from collections.abc import Callable, Mapping
from typing import Any

from plugrl_env_client.errors import ConfigError, ProtocolError
from plugrl_env_client.protocol import codec, images, messages
from plugrl_env_client.protocol.exchange import CloseAction, Closed, ConnectionLost, classify_close
from plugrl_env_client.protocol.messages import ServerMetadata
from plugrl_env_client.redaction import redact_text, redact_url
from plugrl_env_client.timing import Timing
from plugrl_env_client.websocket import common
from plugrl_env_client.websocket.client import WebSocketClient, connect

logger = logging.getLogger(__name__)

__all__ = ["Dialer", "ReconnectsExhausted", "ServerUnreachable", "SessionConfig", "plugrl_metadata", "warning_period"]

STOPPED_LOCALLY = Closed(CloseAction.END, None, "the run was stopped locally")
RETRYABLE_STATUS = (408, 429)  # request timeout, too many requests: worth another try
STEADY_CONNECTION_S = 1.0  # a connection that lived this long and completed an exchange resets the backoff
OPEN_TIMEOUT_S = 10.0
"""The longest one attempt's TCP connect, TLS and WebSocket handshake may take (less when a deadline is nearer)."""


class ServerUnreachable(ConfigError):
    """No policy server answered at ``url`` within ``timeout_s`` (``knob``, ``connect_timeout`` or
    ``reconnect_timeout``, says which opening: the first, or a
    reconnect)."""

    def __init__(self, url: str, timeout_s: float, knob: str, word: str) -> None:
        super().__init__(f"no policy server answered at {url} within {timeout_s:g} s ({word})")
        self.url, self.timeout_s, self.knob = url, timeout_s, knob

    @property
    def first(self) -> bool:
        """Whether no server answered the run's first connection (not a reconnect)."""
        return self.knob == "connect_timeout"


class ReconnectsExhausted(ConfigError):
    """The connection was lost (``closed``) more than ``max_reconnects`` times (``word``: how the user sets it)."""

    def __init__(self, closed: Closed, limit: int, word: str = "max_reconnects") -> None:
        ended = closed.why if closed.why else f"the server closed the connection ({closed.describe()})"
        super().__init__(f"{ended} more than {word}={limit} times; giving up")
        self.closed, self.limit = closed, limit


WARNING_PERIOD_ENV = "PLUGRL_WAIT_WARNING_S"
DEFAULT_WARNING_PERIOD_S = 30.0


def warning_period() -> float:
    """Seconds a reply (or the metadata) may take before the first warning says so; later warnings come every
    twice that, and so does the reminder of a client waiting for a stopped server's next run. 30 s, unless
    ``$PLUGRL_WAIT_WARNING_S`` sets another (tests use a fraction of a second)."""
    raw = os.environ.get(WARNING_PERIOD_ENV)
    if raw is None:
        return DEFAULT_WARNING_PERIOD_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ConfigError(f"${WARNING_PERIOD_ENV}={raw!r} is not a positive number of seconds")
    return value


@dataclasses.dataclass(frozen=True, kw_only=True)
class SessionConfig:
    """One connection's settings, as plain values: where and as whom it connects, how long it waits, and what it
    does when the server goes away. The app layer builds it from the user's choices, and says in :attr:`words` how
    the user sets each, so that messages name the user's own knob."""

    url: str
    api_key: str | None = None
    """Sent as 'Authorization: Api-Key <key>'."""
    reconnect_on_server_stop: bool = False
    """After the server ends a run, wait for its next run instead of ending."""
    max_reconnects: int | None = None
    """Give up after this many reconnects (None: keep reconnecting while the server comes back)."""
    connect_timeout: float | None = None
    """Seconds to wait for the first connection, the server's metadata included (None: until a server is up)."""
    reconnect_timeout: float | None = None
    """Seconds to wait for the server to come back after a lost connection (None: until it does)."""
    infer_timeout: float | None = None
    """Seconds to wait for a reply to an infer; then the connection is closed and opened again (None: no limit)."""
    image_codec: str = "none"
    """Camera images encoded per env row when the server offers :data:`~plugrl_env_client.protocol.images.FEATURE`
    (none: raw arrays)."""
    image_quality: int = images.DEFAULT_QUALITY
    protocol: str = "plugrl"
    """The wire protocol (:data:`~plugrl_env_client.protocol.protocols.PROTOCOLS`)."""
    backoff_initial_s: float = 0.1
    backoff_max_s: float = 5.0
    waiting_hint: str = ""
    """What the warning that waits for a server ends with: how to start one (the app layer's words)."""
    stream: tuple[int, int] | None = None
    """(process id, env group) of this connection, sent as the STREAM_HEADER handshake header: servers that know it
    (the reference server) give each stream its own reproducible random policy; others ignore it."""
    urls: tuple[str, ...] = ()
    """Every server of the run, ``url`` among them, for a session that spreads its connections over several (the
    openpi session); empty: ``url`` alone."""
    openpi: Any = None
    """The openpi session's choices (:class:`~plugrl_env_client.protocol.openpi.OpenpiChoices`), None otherwise."""
    words: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """How the user sets each choice, by field name (the app layer's words: a flag, an environment variable); a
    choice without words is named by its field."""

    def word(self, field: str) -> str:
        """How a message names the choice ``field``."""
        return self.words.get(field, field)


class Dialer:
    """Opens the connections of one session (see the module docstring); the caller's ``timing`` counts the
    reconnects and tells whether a connection got an exchange done."""

    def __init__(self, config: SessionConfig, timing: Timing, warn_s: float,
                 should_stop: Callable[[], bool] = lambda: False,
                 metadata: Callable[[Any], ServerMetadata] | None = None,
                 server_kind: str = "a PlugRL v1 policy server") -> None:
        self.config = config
        self._parse_metadata = metadata if metadata is not None else plugrl_metadata
        self._server_kind = server_kind
        self.shown_url = redact_url(config.url)  # the URL in messages: without its password
        self._timing = timing
        self._warn_s = warn_s
        self._should_stop = should_stop
        self._rng = random.Random()
        self._failed_reconnects = 0  # reconnects in a row that did not get one exchange done
        self._actions_at_open = 0
        self._opened_at = 0.0
        self._stop_waits_since: float | None = None  # the server ended its run and we wait for its next one
        self._stop_reminder_at = 0.0

    def open(self) -> tuple[WebSocketClient, ServerMetadata]:
        """The first connection: wait for the server (up to ``connect_timeout``, if set) and read its metadata."""
        return self._open(self.config.connect_timeout, "connect_timeout")

    def count_reconnect(self, closed: Closed) -> None:
        """A reconnect after ``closed`` is about to start: count it (raises :class:`ReconnectsExhausted` past
        ``max_reconnects``) and say so."""
        limit = self.config.max_reconnects
        if limit is not None and self._timing.reconnects >= limit:
            raise ReconnectsExhausted(closed, limit, self.config.word("max_reconnects"))
        # Back off further while reconnects keep failing before a single exchange (a server that resyncs at once).
        progressed = (self._timing.actions_received > self._actions_at_open
                      and time.monotonic() - self._opened_at >= STEADY_CONNECTION_S)
        self._failed_reconnects = 1 if progressed else self._failed_reconnects + 1
        self._timing.reconnects += 1
        self._say_reconnecting(closed, progressed)

    def reopen(self) -> tuple[WebSocketClient, ServerMetadata]:
        """A fresh connection after the backoff pause: a restarting server may take a while, so wait for it, up to
        ``reconnect_timeout`` if set."""
        time.sleep(self.backoff(self._failed_reconnects))
        return self._open(self.config.reconnect_timeout, "reconnect_timeout")

    def backoff(self, attempt: int) -> float:
        """Seconds to pause before attempt ``attempt`` (from 1): doubling up to the cap, with jitter."""
        base = min(self.config.backoff_max_s, self.config.backoff_initial_s * 2 ** max(attempt - 1, 0))
        return base * (0.5 + self._rng.random() / 2)

    # ------------------------------------------------------------------------------------------ one opening

    def _open(self, timeout_s: float | None, knob: str) -> tuple[WebSocketClient, ServerMetadata]:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        attempt = 0
        while True:
            if self._should_stop():
                raise ConnectionLost(STOPPED_LOCALLY)
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0 and attempt > 0:
                assert timeout_s is not None
                raise ServerUnreachable(self.shown_url, timeout_s, knob, self.config.word(knob))
            client = self._dial(attempt, OPEN_TIMEOUT_S if left is None else max(0.05, min(OPEN_TIMEOUT_S, left)))
            if client is not None:
                self._actions_at_open = self._timing.actions_received
                self._opened_at = time.monotonic()
                return client, self._metadata(client, deadline, timeout_s, knob)
            attempt += 1
            pause = self.backoff(attempt)
            if deadline is not None:
                pause = max(0.0, min(pause, deadline - time.monotonic()))
            time.sleep(pause)

    def _metadata(self, client: WebSocketClient, deadline: float | None, timeout_s: float | None,
                  knob: str) -> ServerMetadata:
        """The connection's first message, the metadata, read within the deadline."""
        try:
            frame = self._read_first(client, deadline)
        except common.WebSocketClosed as exc:
            closed = classify_close(exc.code, exc.reason, self.config.reconnect_on_server_stop)
            logger.info("connection closed by the server (%s)", closed.describe())
            raise ConnectionLost(closed) from None
        if frame is None:
            client.close(messages.CLOSE_NORMAL)
            raise ConfigError(f"the server at {self.shown_url} accepted the connection but sent no metadata within "
                              f"{timeout_s:g} s ({self.config.word(knob)}); is it {self._server_kind}?")
        try:
            if isinstance(frame, str):
                raise ProtocolError(f"the server sent a text frame instead of a binary msgpack frame: {frame[:2000]!r}")
            self._timing.bytes_received += len(frame)
            meta = self._parse_metadata(codec.unpackb(frame))
        except ProtocolError:
            client.close(messages.CLOSE_NORMAL)
            raise
        logger.info("connected to %s; server metadata: %s", self.shown_url, messages.short_repr(meta.raw, 400))
        return meta

    def _read_first(self, client: WebSocketClient, deadline: float | None) -> Any:
        """The first message, or None when the deadline passed first; a late one is announced."""
        opened = time.monotonic()
        next_warning = opened + self._warn_s
        while True:
            until = next_warning if deadline is None else min(deadline, next_warning)
            frame = client.recv(max(0.0, until - time.monotonic()))
            if frame is not None:
                return frame
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                return None
            if now >= next_warning:
                logger.warning("connected to %s, but no metadata from the server for %s s", self.shown_url,
                               seconds(now - opened))
                next_warning = now + 2 * self._warn_s

    def _dial(self, attempt: int, open_timeout: float) -> WebSocketClient | None:
        """One attempt at a WebSocket; None when it is worth another (said once)."""
        headers = {"Authorization": f"Api-Key {self.config.api_key}"} if self.config.api_key else {}
        if self.config.stream is not None:
            headers[messages.STREAM_HEADER] = "{}.{}".format(*self.config.stream)
        try:
            return connect(self.config.url, headers, open_timeout=open_timeout, close_timeout=2.0)
        except common.CertificateNotVerified as exc:
            raise ConfigError(
                f"the TLS certificate of {self.shown_url} did not verify ({exc.verify_message}); point SSL_CERT_FILE "
                "at the CA that signed it, or use ws:// on a trusted network"
            ) from None
        except common.InvalidServerURL as exc:
            raise ConfigError(f"invalid server URL {self.shown_url!r}: {redact_text(str(exc))}; use ws://host:port or "
                              "wss://host:port") from None
        except common.HandshakeRefused as exc:
            if 400 <= exc.status < 500 and exc.status not in RETRYABLE_STATUS:
                raise ConfigError(
                    f"the server at {self.shown_url} refused the WebSocket handshake with HTTP {exc.status}; check the "
                    f"URL and {self.config.word('api_key')}"
                ) from None
            self._say_waiting(attempt, exc)
            return None
        except common.ConnectFailed as exc:
            self._say_waiting(attempt, exc)
            return None

    # ------------------------------------------------------------------------------------------ what it says

    def _say_waiting(self, attempt: int, exc: BaseException) -> None:
        if attempt == 0:
            hint = self.config.waiting_hint
            logger.warning("waiting for a policy server at %s (%s).%s", self.shown_url, exc, f" {hint}" if hint else "")

    def _say_reconnecting(self, closed: Closed, progressed: bool) -> None:
        """One warning per close, except while a stopped server stays up: then one line, and a reminder every
        twice the warning period (a minute by default)."""
        if not closed.ends_a_run:
            self._stop_waits_since = None
            logger.warning("reconnecting to %s after close (%s)", self.shown_url, closed.describe())
            return
        now = time.monotonic()
        if self._stop_waits_since is None or progressed:
            self._stop_waits_since, self._stop_reminder_at = now, now + 2 * self._warn_s
            logger.warning("the server at %s ended its run (%s); waiting for its next run (%s)",
                           self.shown_url, closed.describe(), self.config.word("reconnect_on_server_stop"))
        elif now >= self._stop_reminder_at:
            self._stop_reminder_at = now + 2 * self._warn_s
            logger.warning("still waiting for the next run of the server at %s (for %s s; %s)",
                           self.shown_url, seconds(now - self._stop_waits_since),
                           self.config.word("reconnect_on_server_stop"))
        else:
            logger.debug("the server at %s ended its run again (%s); reconnecting", self.shown_url, closed.describe())


def plugrl_metadata(msg: Any) -> ServerMetadata:
    """A PlugRL v1 server's first message, checked."""
    if messages.message_type(msg) != messages.METADATA:
        raise ProtocolError(f"the server's first message must be 'metadata', got {messages.message_type(msg)!r}; "
                            "is this a PlugRL v1 policy server?")
    return messages.parse_metadata(msg)


def seconds(value: float) -> str:
    """A wait as a log line says it: whole seconds, tenths below ten."""
    return f"{value:.0f}" if value >= 10 else f"{value:.1f}"
