"""The reference policy server.

It speaks PlugRL v1 exactly as a training server does, validates every client message strictly (a violation
closes the connection with ``plugrl-server-resync`` and a log line saying what was wrong), answers infers from a
:class:`~plugrl_env_client.server.policies.Policy`, and counts finished episodes from ``info["episode"]`` (see
:mod:`~plugrl_env_client.server.episodes`). With ``max_episodes`` it ends the run (``plugrl-server-stop``) once that
many episodes were reported.

Whatever a client sends, the server does not fail the connection for it: every field of every message is checked
(``messages.parse_infer``/``parse_feedback``, :mod:`~plugrl_env_client.server.info` for ``info``), and a value the
server cannot use is a resync whose log line names the field. ``1011 internal error`` is left for the server's own
bugs (and a policy's). Camera images a client sends encoded (the ``x-plugrl-env-client-images`` feature, offered
when the ``images`` extra is installed, SPEC 5a) are decoded while the message is parsed, the declared shapes
bounded first (``max_image_pixels`` for all cameras of a message together: a frame of a few bytes that declares
more is refused unread, as a violation) and each row's size checked against them, so the policy and the rows held
for reuse only ever see arrays. A malformed ``X-PlugRL-Stream`` header is ignored, with one warning: the header is optional
(SPEC 1), so refusing the handshake would lock out a client that means something else by it.

The policy sees each connection through ``policy.for_connection()``: every infer of it (with the env indices),
every feedback, and its end, so a learner can tell the envs of every connection apart. A policy that cannot serve
the client's env at all (a :class:`~plugrl_env_client.errors.ConfigError`, e.g. ARS for an env without state
arrays) ends the run: the error is logged, every client is closed with ``plugrl-server-stop``, and
:attr:`PolicyServer.failure` holds the message (``plugrl-run-policy-server`` then exits with it). A policy that
cannot use one value a client sent raises :class:`~plugrl_env_client.errors.ProtocolError`: a resync, as for any
other bad value.

Every connection is a coroutine on one event loop (:mod:`~plugrl_env_client.server.ws_server`, websockets' asyncio
server or picows), so a storm of connections costs no threads, and each connection's state is touched by its own
coroutine only. The policy runs off the loop, in one worker thread (:mod:`~plugrl_env_client.server.worker`): a
slow forward pass delays the infers waiting for it, never the pings and frames of the connections, and a policy
that batches answers the infers of several connections in one call. ``latency_ms`` holds each action back that
long, as a model's inference would: an ``await``, so it delays only its own connection while every other one is
served (to within a tenth of a millisecond: :mod:`~plugrl_env_client.server.delay`, since asyncio's own timers
would add up to one).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import re
import threading
import time
import traceback
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import numpy as np

from plugrl_env_client.errors import ConfigError, ProtocolError
from plugrl_env_client.protocol import codec, images, messages
from plugrl_env_client.protocol.openpi_keys import KeyMap
from plugrl_env_client.server.delay import Delays
from plugrl_env_client.server.episodes import EpisodeFile, EpisodeLog, Source, SuccessJudging
from plugrl_env_client.server.info import FinishedEpisodes, read_info
from plugrl_env_client.server.policies import Policy
from plugrl_env_client.server.worker import PolicyWorker
from plugrl_env_client.server.ws_server import Connection, Listener, ServeLimits, serve
from plugrl_env_client.version import __version__
from plugrl_env_client.websocket.common import WebSocketClosed

logger = logging.getLogger(__name__)

LOG_PERIOD_S = 5.0
OPENPI_GATHER_S = 0.001
"""In openpi's protocol, how far apart the requests of one burst may come for a batching policy to take them in one
call (:class:`~plugrl_env_client.server.worker.PolicyWorker`): a client sends its env group's requests back to
back."""
MAX_STREAMS = 1 << 16
"""Client streams whose connections the server counts (to seed each stream's generator); a server that has seen
more gives further new streams the shared generator, so the table stays bounded however many clients come."""
STREAM_PATTERN = re.compile(r"([0-9]{1,18})\.([0-9]{1,18})")
"""``<process>.<group>``: two decimal integers that fit an int64."""


class _Violation(Exception):
    """A client broke the protocol; the connection is resynced."""


class PolicyServer:
    """Serve ``policy`` on ``ws://host:port`` until :meth:`shutdown` (or ``max_episodes`` were reported).

    ``transport`` is the WebSocket library (websockets or picows); ``latency_ms`` delays each action (simulated
    inference time); ``episode_log`` is a file to append every reported episode to (one JSON line each, see
    :class:`~plugrl_env_client.server.episodes.EpisodeFile`); ``limits`` bound the connections (handshake time,
    keepalive, how many, see :class:`~plugrl_env_client.server.ws_server.ServeLimits`); ``api_key``, when given, is
    the key every client's handshake must carry (``Authorization: Api-Key <key>``; others get HTTP 401);
    ``image_codecs`` offers the images feature (camera images encoded per env row, decoded here before any policy
    sees them) when the ``images`` extra is installed, and ``max_image_pixels`` bounds the pixels (env rows x height
    x width) the encoded images of one message may declare.
    """

    def __init__(self, policy: Policy, host: str = "127.0.0.1", port: int = 8000, max_episodes: int | None = None,
                 reuse_feedback_obs: bool = True, seed: int | None = None, transport: str = "websockets",
                 latency_ms: float = 0.0, episode_log: Path | None = None, limits: ServeLimits | None = None,
                 api_key: str | None = None, image_codecs: bool = True,
                 max_image_pixels: int = images.DEFAULT_MAX_PIXELS, openpi: KeyMap | None = None) -> None:
        if not 0.0 <= latency_ms < float("inf"):
            raise ValueError(f"--policy.latency-ms must be a finite number >= 0, got {latency_ms}")
        if max_image_pixels < 1:
            raise ValueError(f"--max-image-pixels must be >= 1, got {max_image_pixels}")
        self.max_image_pixels = max_image_pixels
        if openpi is not None and policy.needs_feedback is not None:
            raise ConfigError(f"the {policy.metadata().get('policy', type(policy).__name__)} policy {policy.needs_feedback}, "
                              "so it cannot serve openpi's protocol, which has no feedback")
        self.policy = policy
        self.openpi = openpi
        """The key map of openpi's protocol, which the server then speaks (None: PlugRL v1)."""
        # openpi's protocol: one connection per env stream, so a client's group of envs asks as a burst to gather
        self._worker = PolicyWorker(policy, gather_s=OPENPI_GATHER_S if openpi is not None else 0.0)
        self.latency_s = latency_ms / 1000.0
        self._delays = Delays()
        self.seed = seed if seed is not None else int(np.random.SeedSequence().entropy % (1 << 63))  # type: ignore[operator]
        self._streams: dict[tuple[int, int], int] = {}  # connections seen per client stream
        self._warned_stream = False
        self.reuse_feedback_obs = reuse_feedback_obs
        self.image_codecs = image_codecs and images.available()
        """Whether the server offers (and decodes) encoded camera images (:data:`images.FEATURE`)."""
        self.max_episodes = max_episodes
        self.log = EpisodeLog(EpisodeFile(episode_log) if episode_log is not None else None)
        self.stopping = threading.Event()
        self.failed = threading.Event()
        self.failure: str | None = None
        """Why the policy could not serve a client's env (the run was ended), or None."""
        self._lock = threading.Lock()
        self._shut = False
        self._clients: set[Connection] = set()  # touched on the server's loop only
        self._connections = 0
        self._last_log = -LOG_PERIOD_S
        # Frames are decoded by the transport (picows decodes straight from its read buffer: one copy less).
        try:
            self._server: Listener = serve(self._handle, host, port, kind=transport, parse=codec.unpackb,
                                           limits=limits, api_key=api_key)
        except BaseException:
            self.log.close()
            raise
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self._server.address[1]

    @property
    def url(self) -> str:
        return f"ws://{self._server.address[0]}:{self.port}"

    @property
    def connections(self) -> int:
        """Client connections open now."""
        return self._server.connections

    @property
    def loopback_only(self) -> bool:
        """Whether only this machine can reach the server (it is bound to a loopback address)."""
        try:
            return ipaddress.ip_address(self._server.address[0].split("%")[0]).is_loopback
        except ValueError:  # not an IP address: nothing to say it is loopback
            return False

    def status_line(self) -> str:
        """The periodic log line: the episodes so far, and the connections (one line per connection would flood the
        log in a storm of connections, so they are counted here and logged one by one only at DEBUG)."""
        return f"{self.log.line()} connections_open={self.connections} connections_total={self._connections}"

    def metadata(self) -> dict[str, Any]:
        return {"protocol_version": messages.PROTOCOL_VERSION, "server": "plugrl-env-client-reference",
                "server_version": __version__, **self.policy.metadata(),
                "features": self.features()}

    def openpi_metadata(self) -> dict[str, Any]:
        """The first message of a connection in openpi's protocol: a plain map (the policy's action shape)."""
        return {"server": "plugrl-env-client-reference", "server_version": __version__, **self.policy.metadata()}

    def features(self) -> list[str]:
        """The optional protocol features this server offers (metadata ``features``)."""
        return ([messages.FEATURE_REUSE_FEEDBACK_OBS] if self.reuse_feedback_obs else []) + (
            [images.FEATURE] if self.image_codecs else [])

    def serve_forever(self) -> None:
        self._server.serve_forever()

    def start(self) -> PolicyServer:
        """Serve in a daemon thread (embedded use and tests). The server's loop runs from the start anyway; this
        thread only waits for the end, as :meth:`serve_forever` does."""
        self._thread = threading.Thread(target=self.serve_forever, name="plugrl-policy-server", daemon=True)
        self._thread.start()
        return self

    def shutdown(self) -> None:
        """Close every client with ``Server shutdown`` (they reconnect when a server comes back), then stop.
        Idempotent; not from the server's own loop."""
        with self._lock:
            if self._shut:
                return
            self._shut = True
        try:
            self._server.run(self._close_clients(messages.REASON_SHUTDOWN),
                             timeout=self._server.limits.close_timeout + 5)
        except (TimeoutError, RuntimeError):  # the loop is gone or stuck: the listener's shutdown drops what is left
            pass
        self._server.shutdown()
        self._delays.close()
        self._worker.close()  # after the last connection: the calls it left run before the policy closes
        logger.info("stopped: %s", self.status_line())  # the periodic line may be older than the last episodes
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.log.close()
        self.policy.close()

    async def _close_clients(self, reason: str) -> None:
        await asyncio.gather(*(ws.close(messages.CLOSE_GOING_AWAY, reason) for ws in list(self._clients)),
                             return_exceptions=True)

    # ------------------------------------------------------------------------------------------ one connection

    async def _handle(self, ws: Connection) -> None:
        peer = ws.remote_address
        logger.debug("client connected: %s", peer)
        self._clients.add(ws)
        self._connections += 1
        number = self._connections
        policy: Policy | None = None
        try:
            if self.openpi is not None:
                await ws.send(codec.packb(self.openpi_metadata()))
            else:
                await ws.send(codec.packb(messages.metadata_message(self.metadata())))
            key, stream = self._stream_of(ws)
            policy = await self._worker.call(self._connection_policy, key)
            if self.openpi is not None:
                await self._serve_openpi(ws, policy, self.openpi)
            else:
                await self._serve_connection(ws, policy, Source(number, stream))
        except ConfigError as exc:  # the policy cannot serve this env at all: no reconnect can help
            await self._fail(exc)
        except _Violation as exc:
            logger.warning("protocol violation by %s, closing with %s: %s", peer, messages.REASON_RESYNC, exc)
            await ws.close(messages.CLOSE_GOING_AWAY, messages.REASON_RESYNC)
        except WebSocketClosed as exc:
            if exc.code is None:  # not an error of ours or theirs; PlugRL SPEC 7.5 asks clients for a close frame
                logger.debug("client disconnected: %s (note: it dropped the socket without a close frame)", peer)
            else:
                logger.debug("client disconnected: %s", peer)
        except Exception:  # a bug in a policy or here: the client reconnects, the traceback is logged
            logger.exception("internal error while serving %s", peer)
            await ws.close(messages.CLOSE_INTERNAL, messages.REASON_INTERNAL)
        finally:
            self._clients.discard(ws)
            if policy is not None:
                try:  # after this connection's other calls; a policy's error is logged and ends nothing else
                    self._worker.post(policy.disconnect)
                except RuntimeError:  # the server shut down: the worker is gone
                    pass

    async def _fail(self, exc: ConfigError) -> None:
        """End the run because the policy cannot serve a client's env: say why, once, and close every client."""
        first = self.failure is None
        if first:
            self.failure = str(exc)
            logger.error("the %s policy cannot serve this env, so the run ends: %s", self.policy.metadata()["policy"],
                         exc)
        self.stopping.set()
        await self._close_clients(messages.REASON_STOP)
        self.failed.set()

    def _stream_of(self, ws: Connection) -> tuple[np.random.SeedSequence | None, str | None]:
        """The seed of one connection's generator, and its stream's name: a client that names its stream (process,
        env group) in the handshake gets a generator of its own, seeded from the server's seed, the stream and how
        often it connected, so the same client run gets the same actions whatever other streams do (None: the
        shared generator)."""
        raw = ws.header(messages.STREAM_HEADER)
        if raw is None:
            return None, None
        found = STREAM_PATTERN.fullmatch(raw)
        if found is None:
            if not self._warned_stream:  # once per server: a client that sends it sends it on every connection
                self._warned_stream = True
                logger.warning("ignoring the %s header %s of %s: it names a client stream as <process>.<group>, two "
                               "integers >= 0 (e.g. 0.1); this connection gets the shared generator, so its actions "
                               "do not repeat run to run (later malformed headers are ignored without a word)",
                               messages.STREAM_HEADER, messages.short_repr(raw, 80), ws.remote_address)
            return None, None
        key = (int(found.group(1)), int(found.group(2)))
        name = f"{key[0]}.{key[1]}"
        nth = self._streams.get(key)
        if nth is None and len(self._streams) >= MAX_STREAMS:
            return None, name
        self._streams[key] = (nth or 0) + 1
        return np.random.SeedSequence([self.seed, *key, nth or 0]), name

    def _connection_policy(self, key: np.random.SeedSequence | None) -> Policy:
        """What serves one connection (run by the worker, as every policy call is): the policy for its stream's
        generator, for that connection."""
        serving = self.policy if key is None else self.policy.for_stream(key)
        return serving.for_connection()

    async def _serve_connection(self, ws: Connection, policy: Policy, source: Source) -> None:
        outstanding: set[int] = set()  # envs that received a chunk and owe us its feedback
        seen: set[int] = set()  # envs that received a chunk on this connection: they have step state
        warned_stateless = False
        held: dict[int, HeldRow] = {}  # env -> its observation row in the last feedback (reuse)
        judging = SuccessJudging()
        expect = messages.INFER
        while True:
            msg = await self._receive(ws)
            if self.stopping.is_set():  # the run is over: whatever the client sent, it learns so now
                await ws.close(messages.CLOSE_GOING_AWAY, messages.REASON_STOP)
                return
            kind = _parse(messages.message_type, msg)
            if kind != expect:
                raise _Violation(f"expected a {expect!r} message, got {kind!r}")
            if kind == messages.INFER:
                request = _parse(messages.parse_infer, msg, self.image_codecs, self.max_image_pixels)
                envs = request.env_indices.tolist()
                stale = outstanding.intersection(envs)
                if stale:
                    raise _Violation(f"infer for envs {sorted(stale)} whose previous chunk got no feedback yet")
                obs = self._with_reused_rows(request, held)
                actions = await _policy_call(self._worker.infer(policy, obs, request.env_indices, request.step_ids))
                reply = codec.packb(messages.ActionReply(request.env_indices, actions).message())
                if self.latency_s:
                    await self._delays.sleep(self.latency_s)
                await ws.send(reply)
                outstanding.update(envs)
                seen.update(envs)
                expect = messages.FEEDBACK
            else:
                feedback = _parse(messages.parse_feedback, msg, self.image_codecs, self.max_image_pixels)
                envs = feedback.env_indices.tolist()
                info = _parse(read_info, feedback.info, len(envs))
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
                await _policy_call(self._worker.call(policy.feedback, feedback))
                episodes = info.episodes
                if episodes is not None and stateless:
                    episodes = episodes.without(np.array([e not in seen for e in envs]))
                shows_rule = not judging.known and info.shows_rule
                if self._record(episodes, judging, shows_rule, source, envs):
                    await ws.close(messages.CLOSE_GOING_AWAY, messages.REASON_STOP)
                    return
                expect = messages.INFER

    async def _serve_openpi(self, ws: Connection, policy: Policy, keys: KeyMap) -> None:
        """One connection in openpi's protocol: each request is one env's observation, answered with its chunk
        ``actions`` ``(H, D)`` and ``server_timing``. Requests of concurrent connections go to the worker together,
        so a batching policy answers them in one call. What goes wrong in a request is said as openpi's server says
        it: the traceback as a text frame, then a close with 1011."""
        step = 0
        env = np.zeros(1, np.int64)
        while True:
            try:
                msg = await ws.recv()  # decoded by codec.unpackb (see __init__)
                if self.stopping.is_set():
                    await ws.close(messages.CLOSE_GOING_AWAY, messages.REASON_STOP)
                    return
                if isinstance(msg, str):
                    raise ProtocolError("a text frame; openpi's protocol sends each request as a binary msgpack map")
                obs = keys.observation(msg)
                start = time.perf_counter()
                actions = await self._worker.infer(policy, obs, env, np.array([step], np.int64))
                infer_ms = (time.perf_counter() - start) * 1000.0
            except (WebSocketClosed, ConfigError):
                raise
            except Exception:
                logger.warning("openpi request from %s failed; sending the traceback and closing with 1011",
                               ws.remote_address, exc_info=True)
                await ws.send_text(traceback.format_exc())
                await ws.close(messages.CLOSE_INTERNAL, "Internal server error. Traceback included in previous frame.")
                return
            if self.latency_s:
                await self._delays.sleep(self.latency_s)
            await ws.send(codec.packb({"actions": actions[:, 0], "server_timing": {"infer_ms": infer_ms}}))
            step += 1

    def _with_reused_rows(self, request: messages.InferRequest[dict[str, Any]], held: dict[int, HeldRow]) -> dict[str, Any]:
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
            raise _Violation(f"infer reuses rows of envs {missing} (marked in 'reuse') whose last feedback on this "
                             "connection did not leave an observation to reuse (none yet, or the episode ended)")
        if request.reuse.all():
            block = _run_of_one_batch([held[e] for e in envs])
            if block is not None:
                return block
        sent = iter(range(int((~request.reuse).sum())))
        rows = [_row(*held[e]) if r else _row(request.obs, next(sent)) for e, r in zip(envs, request.reuse.tolist())]
        return _stack_rows(rows)

    async def _receive(self, ws: Connection) -> Any:
        try:
            msg = await ws.recv()  # decoded by codec.unpackb (see __init__)
        except ProtocolError as exc:
            raise _Violation(str(exc)) from None
        if isinstance(msg, str):
            raise _Violation("text frame received; PlugRL sends binary msgpack frames only")
        return msg

    def _record(self, episodes: FinishedEpisodes | None, judging: SuccessJudging, shows_rule: bool, source: Source,
                envs: list[int]) -> bool:
        """Count reported episodes; True when the run is over."""
        added = self.log.add(episodes, judging, shows_rule, source, envs)
        if added and time.monotonic() - self._last_log >= LOG_PERIOD_S:
            self._last_log = time.monotonic()
            logger.info("%s", self.status_line())
        if self.max_episodes is not None and self.log.episodes >= self.max_episodes and not self.stopping.is_set():
            logger.info("reached %d episodes (%s); ending the run (%s)", self.max_episodes, self.log.line(),
                        messages.REASON_STOP)
            self.stopping.set()
        return self.stopping.is_set()


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


def _hold_rows(held: dict[int, HeldRow], feedback: messages.Feedback[dict[str, Any]], skip: set[int]) -> None:
    done = feedback.terminated | feedback.truncated
    for i, env in enumerate(feedback.env_indices.tolist()):
        if env in skip:
            continue
        if done[i]:
            held.pop(env, None)
        else:
            held[env] = (feedback.obs, i)


async def _policy_call(call: Awaitable[Any]) -> Any:
    """The result of a policy call run by the worker, a :class:`ProtocolError` (the client's value cannot be used)
    turned into a violation."""
    try:
        return await call
    except ProtocolError as exc:
        raise _Violation(str(exc)) from None


def _parse(parser: Any, *args: Any) -> Any:
    """``parser(*args)``, a :class:`ProtocolError` (the client's value cannot be used) turned into a violation."""
    try:
        return parser(*args)
    except images.ImagesTooLarge as exc:
        raise _Violation(f"{exc} (a server started with a larger --max-image-pixels takes it)") from None
    except ProtocolError as exc:
        raise _Violation(str(exc)) from None
