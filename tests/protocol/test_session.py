"""Session behaviour seen from real loopback servers: auth header, waiting for a server, backoff bounds, the
exchange, and every wait bounded or announced (connect and infer timeouts, slow replies, a stopped server, replies
that answer no infer)."""

from __future__ import annotations

import contextlib
import re
import socket
import threading
import time
from typing import Any

import numpy as np
import pytest
from extras import need
from waiting import wait_until
from websockets.exceptions import ConnectionClosed

from plugrl_env_client.envs.base_env import Observation
from plugrl_env_client.errors import ConfigError
from plugrl_env_client.protocol import messages
from plugrl_env_client.protocol.dialing import ReconnectsExhausted, ServerUnreachable, SessionConfig
from plugrl_env_client.protocol.exchange import (
    AlreadyAwaitingReply,
    CloseAction,
    Closed,
    ConnectionLost,
    Exchange,
    ExchangeMisuse,
    FeedbackStillDue,
    NoFeedbackDue,
    NoReplyAwaited,
    NotConnected,
)
from plugrl_env_client.protocol.messages import ServerMetadata
from plugrl_env_client.protocol.session import Session
from plugrl_env_client.timing import Stopwatch, Timing
from plugrl_env_client.websocket import client as ws_client


def test_api_key_header_from_flag(harness):
    seen = {}

    def script(conn):
        seen["auth"] = conn.ws.request.headers.get("Authorization")
        conn.send_metadata(server="x")
        conn.ws.recv()

    h = harness(script)
    session = Session(SessionConfig(url=f"ws://127.0.0.1:{h.port}", api_key="s3cret"))
    meta = session.open()
    assert isinstance(meta, ServerMetadata) and meta.server == "x"
    session.close()
    assert seen["auth"] == "Api-Key s3cret"


def test_no_auth_header_without_key(harness):
    seen = {}

    def script(conn):
        seen["auth"] = conn.ws.request.headers.get("Authorization")
        conn.send_metadata()
        conn.ws.recv()

    h = harness(script)
    session = Session(SessionConfig(url=f"ws://127.0.0.1:{h.port}"))
    session.open()
    session.close()
    assert seen["auth"] is None


def test_waits_for_a_server_that_comes_up_later_and_says_so_once(harness, caplog):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    started = threading.Event()

    def bring_up_later():
        # Once the client has said it waits (the event), the server stays down a little longer, so the client
        # retries unanswered (the behaviour under test: saying so once, not on every retry), then comes up.
        wait_until(lambda: any("waiting for a policy server" in r.getMessage() for r in caplog.records), 30,
                   "client saying it waits")
        time.sleep(0.5)
        from websockets.sync.server import serve

        from plugrl_env_client.protocol import codec

        def handler(ws):
            ws.send(codec.packb(messages.metadata_message({"action_horizon": 2})))
            try:
                ws.recv()
            except Exception:
                pass

        server = serve(handler, "127.0.0.1", port, compression=None)
        started.set()
        threading.Thread(target=server.serve_forever, daemon=True).start()
        holder.append(server)

    holder: list = []
    threading.Thread(target=bring_up_later, daemon=True).start()
    session = Session(SessionConfig(url=f"ws://127.0.0.1:{port}", backoff_max_s=0.3, connect_timeout=60,
                                    waiting_hint="Start one with `plugrl-run-policy-server`."))
    meta = session.open()
    session.close()
    assert started.is_set() and isinstance(meta, ServerMetadata) and meta.action_horizon == 2
    waiting = [r for r in caplog.records if "waiting for a policy server" in r.getMessage()]
    assert len(waiting) == 1 and waiting[0].getMessage().endswith("refused). Start one with `plugrl-run-policy-server`.")
    for server in holder:
        server.shutdown()


def test_backoff_grows_with_jitter_and_is_capped():
    session = Session(SessionConfig(url="ws://127.0.0.1:1", backoff_initial_s=0.1, backoff_max_s=2.0))
    first = [session._dialer.backoff(1) for _ in range(200)]
    late = [session._dialer.backoff(20) for _ in range(200)]
    assert 0.05 <= min(first) and max(first) <= 0.1
    assert len(set(np.round(first, 6))) > 1, "jitter spreads retries"
    assert 1.0 <= min(late) and max(late) <= 2.0


def test_stop_request_ends_waiting_for_a_server():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    session = Session(SessionConfig(url=f"ws://127.0.0.1:{port}"), should_stop=lambda: True)
    with pytest.raises(ConnectionLost) as info:
        session.open()
    assert info.value.close.action is CloseAction.END


def test_http_4xx_handshake_is_an_error_that_says_so():
    from websockets.sync.server import serve

    server = serve(lambda ws: None, "127.0.0.1", 0, process_request=lambda conn, req: conn.respond(403, "no key\n"))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        session = Session(SessionConfig(url=f"ws://127.0.0.1:{server.socket.getsockname()[1]}"))
        with pytest.raises(ConfigError, match="refused the WebSocket handshake with HTTP 403.*api_key"):
            session.open()
        named = Session(SessionConfig(url=session.config.url, words={"api_key": "--api-key / $PLUGRL_API_KEY"}))
        with pytest.raises(ConfigError, match=r"refused .* check the URL and --api-key / \$PLUGRL_API_KEY$"):
            named.open()
    finally:
        server.shutdown()


@pytest.mark.parametrize("url", ["ws://[::1", "ws://127.0.0.1:99999", "http://127.0.0.1:8000"])
def test_invalid_url_is_an_error_that_says_so(url):
    with pytest.raises(ConfigError, match="invalid server URL"):
        Session(SessionConfig(url=url)).open()


def test_reconnects_that_fail_at_once_back_off_further(harness):
    times = []

    def script(conn):
        times.append(time.monotonic())
        conn.send_metadata()
        conn.recv()
        conn.close(1001, messages.REASON_RESYNC)

    h = harness(script)
    session = Session(SessionConfig(url=f"ws://127.0.0.1:{h.port}", backoff_initial_s=0.05))
    session.open()
    for _ in range(4):
        obs = Observation(states={"x": np.zeros((1, 1))}, text="a")
        with pytest.raises(ConnectionLost) as info:
            session.infer(messages.InferRequest(obs, np.arange(1), np.zeros(1, np.int64)))
        assert info.value.close.action is CloseAction.RECONNECT
        session.reconnect(info.value.close)
    session.close()
    gaps = np.diff(times)
    assert len(gaps) == 4 and gaps[-1] > 3 * gaps[0], f"no growing backoff: {gaps}"


# ------------------------------------------------------------------------------------------ the exchange


def test_session_reads_chunks_and_classifies_closes(harness):
    seen = {}

    def script(conn):
        seen["stream"] = conn.ws.request.headers.get(messages.STREAM_HEADER)
        conn.send_metadata(action_horizon=2)
        conn.send_zero_action(conn.recv(), 2, 3)
        conn.recv()  # the feedback
        conn.recv()  # the next infer: answered by a resync close
        conn.close(1001, messages.REASON_RESYNC)

    h = harness(script)
    session = Session(SessionConfig(url=f"ws://127.0.0.1:{h.port}", stream=(3, 1)))
    meta = session.open()
    obs = Observation(states={"x": np.zeros((2, 1))}, text="a")
    ids, steps = np.arange(2), np.zeros(2, np.int64)
    reply = session.infer(messages.InferRequest(obs, ids, steps))
    assert meta.action_horizon == 2 and reply.actions.shape == (2, 2, 3) and not reply.actions.any()
    session.feedback(messages.Feedback(ids, steps, obs, np.zeros(2, np.float32), np.zeros(2, bool), np.zeros(2, bool), {}))
    with pytest.raises(ConnectionLost) as info:
        session.infer(messages.InferRequest(obs, ids, steps))
    session.close()
    assert info.value.close.action is CloseAction.RECONNECT and info.value.close.reason == messages.REASON_RESYNC
    assert seen["stream"] == "3.1"
    assert session.timing.bytes_sent > 0 and session.timing.infer_calls == 2 and session.timing.feedback_calls == 1


def test_an_infer_sent_now_is_collected_later_and_only_once(harness):
    """The two halves of infer (what a pipelined rollout uses): looking for the reply before it is there returns
    None and loses nothing; the reply then comes exactly once; one infer is outstanding at most."""
    release = threading.Event()

    def script(conn):
        conn.send_metadata(action_horizon=2)
        request = conn.recv()
        release.wait(10)
        conn.send_zero_action(request, 2, 3)
        conn.recv()  # keep the connection open until the client closes

    h = harness(script)
    session = Session(SessionConfig(url=f"ws://127.0.0.1:{h.port}"))
    obs = Observation(states={"x": np.zeros((2, 1))}, text="a")
    ids, steps = np.arange(2), np.zeros(2, np.int64)
    flags = np.zeros(2, bool)
    feedback = messages.Feedback(ids, steps, obs, np.zeros(2, np.float32), flags, flags, {})
    with pytest.raises(NotConnected, match="call open"):
        session.send_infer(messages.InferRequest(obs, ids, steps))
    session.open()
    assert session.state is Exchange.IDLE
    with pytest.raises(NoReplyAwaited, match="no infer is waiting"):
        session.receive_actions(0.0)
    with pytest.raises(NoFeedbackDue, match="a feedback that answers no reply"):
        session.feedback(feedback)
    session.send_infer(messages.InferRequest(obs, ids, steps))
    assert session.state is Exchange.AWAITING_REPLY and session.awaiting
    with pytest.raises(AlreadyAwaitingReply, match="already waiting"):
        session.send_infer(messages.InferRequest(obs, ids, steps))
    with pytest.raises(AlreadyAwaitingReply, match="a feedback while an infer waits"):
        session.feedback(feedback)
    assert session.receive_actions(0.0) is None and session.receive_actions(0.05) is None
    release.set()
    reply = session.receive_actions(None)
    assert reply is not None and reply.actions.shape == (2, 2, 3) and reply.env_ids.tolist() == [0, 1]
    assert session.state is Exchange.FEEDBACK_DUE and not session.awaiting
    with pytest.raises(NoReplyAwaited, match="no infer is waiting"):
        session.receive_actions(0.0)
    with pytest.raises(FeedbackStillDue, match="feedback on the last action is still due"):
        session.send_infer(messages.InferRequest(obs, ids, steps))
    session.feedback(feedback)
    assert session.state is Exchange.IDLE
    with pytest.raises(NoFeedbackDue, match="a feedback that answers no reply"):
        session.feedback(feedback)  # one feedback per action
    assert all(issubclass(e, ExchangeMisuse) and issubclass(e, RuntimeError)
               for e in (NotConnected, NoReplyAwaited, NoFeedbackDue, AlreadyAwaitingReply, FeedbackStillDue))
    assert session.timing.infer_calls == 1 and session.timing.actions_received == 1 and session.timing.feedback_calls == 1
    session.close()


def test_run_client_with_transport_picows_against_the_picows_reference_server(tmp_path):
    """``--transport picows`` names the embedded server's library; the client speaks to a picows server as to any."""
    need("picows")
    import json

    from plugrl_env_client.app import run_client
    from plugrl_env_client.config import ClientConfig
    from plugrl_env_client.envs import discover_envs
    from plugrl_env_client.server.policies import PolicyConfig, make_policy
    from plugrl_env_client.server.server import PolicyServer

    discover_envs()
    from plugrl_env_client.envs.point.point_env import PointEnvConfig

    server = PolicyServer(make_policy(PolicyConfig(action_dim=2, action_horizon=4)), port=0, transport="picows").start()
    try:
        cfg = ClientConfig(server_port=server.port, num_envs=3, num_episodes=5, output_dir=tmp_path, exp_name="run",
                           progress=False, transport="picows",
                           env=PointEnvConfig())
        assert run_client(cfg, "Point-v1") == 0
    finally:
        server.shutdown()
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["completed_episodes"] == 5 and summary["timing"]["bytes_sent"] > 0
    assert server.log.episodes >= 5


# ------------------------------------------------------------------------------------------ every wait bounded


@pytest.fixture
def fast_warnings(monkeypatch):
    """Warnings about slow replies after 0.2 s (then every 0.4 s) instead of 30 s: tests take seconds."""
    monkeypatch.setenv("PLUGRL_WAIT_WARNING_S", "0.2")


def _warnings(caplog, words: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and words in r.getMessage()]


@pytest.mark.slow
def test_connect_timeout_counts_the_metadata_read(harness):
    """A server that completes the handshake and never sends its metadata: connect_timeout still holds (named by
    its field: the protocol names no flag; the app layer's words are tested in test_session_faults.py)."""
    h = harness(lambda conn: conn.ws.recv())  # waits for the client, says nothing
    session = Session(SessionConfig(url=f"ws://127.0.0.1:{h.port}", connect_timeout=1.5))
    start = time.monotonic()
    with pytest.raises(ConfigError, match=r"accepted the connection but sent no metadata within 1.5 s "
                                          r"\(connect_timeout\)"):
        session.open()
    assert 1.5 <= time.monotonic() - start < 2.5


def test_late_metadata_is_announced_when_there_is_no_limit(harness, caplog, fast_warnings):
    def script(conn):
        time.sleep(0.7)
        conn.send_metadata(action_horizon=2)
        conn.ws.recv()

    h = harness(script)
    session = Session(SessionConfig(url=f"ws://127.0.0.1:{h.port}"))
    assert session.open().action_horizon == 2
    session.close()
    said = _warnings(caplog, "but no metadata from the server for")
    assert said and said[0].endswith("for 0.2 s")


class _NeverAccepts:
    """A listening socket whose one backlog slot is taken: the kernel drops every further SYN, so a connect to it
    never completes (what an address that never answers does)."""

    def __enter__(self) -> int:
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(0)
        self.filler = socket.create_connection(self.listener.getsockname(), timeout=5)
        return self.listener.getsockname()[1]

    def __exit__(self, *exc: object) -> None:
        self.filler.close()
        self.listener.close()


@pytest.mark.slow
@pytest.mark.parametrize("peer", ["nothing-listening", "never-accepts", "never-answers-the-handshake"])
def test_connect_timeout_holds_to_within_a_second(peer):
    """Backoff pauses and each attempt's handshake timeout are cut to the time left."""
    with contextlib.ExitStack() as stack:
        if peer == "nothing-listening":
            bound = stack.enter_context(socket.socket())  # bound, never listening: every connect is refused
            bound.bind(("127.0.0.1", 0))
            port = bound.getsockname()[1]
        elif peer == "never-accepts":
            port = stack.enter_context(_NeverAccepts())
        else:
            silent = stack.enter_context(socket.create_server(("127.0.0.1", 0)))  # TCP completes, nobody speaks
            port = silent.getsockname()[1]
        session = Session(SessionConfig(url=f"ws://127.0.0.1:{port}", connect_timeout=2.0))
        start = time.monotonic()
        with pytest.raises(ServerUnreachable, match=r"no policy server answered at .* within 2 s \(connect_timeout\)$"
                           ) as raised:
            session.open()
        assert 2.0 <= time.monotonic() - start < 3.0
        assert raised.value.first and raised.value.timeout_s == 2.0 and isinstance(raised.value, ConfigError)


@pytest.mark.slow
def test_infer_timeout_closes_the_connection_names_the_infer_and_a_reconnect_goes_on(harness, caplog,
                                                                                    fast_warnings):
    closes: list[tuple[Any, Any]] = []

    def script(conn):
        conn.send_metadata(action_horizon=2)
        if conn.index > 0:
            conn.send_zero_action(conn.recv(), 2, 1)
            conn.ws.recv()
            return
        conn.recv()  # the infer, never answered
        try:
            conn.ws.recv()
        except ConnectionClosed:
            closes.append((conn.ws.close_code, conn.ws.close_reason))
            raise

    h = harness(script)
    session = Session(SessionConfig(url=f"ws://127.0.0.1:{h.port}", infer_timeout=1.0,
                                    words={"infer_timeout": "--infer-timeout"}))
    session.open()
    obs = Observation(states={"x": np.zeros((2, 1))}, text="a")
    ids, steps = np.arange(2), np.zeros(2, np.int64)
    start = time.monotonic()
    with pytest.raises(ConnectionLost) as info:
        session.infer(messages.InferRequest(obs, ids, steps))
    assert 1.0 <= time.monotonic() - start < 2.0
    closed = info.value.close
    assert closed.action is CloseAction.RECONNECT
    assert re.fullmatch(r"no reply from the server to the infer for 2 envs sent at \d\d:\d\d:\d\d within "
                        r"--infer-timeout 1 s", closed.why)
    said = _warnings(caplog, "no reply from the server for")
    assert said and re.fullmatch(r"no reply from the server for 0.2 s to the infer for 2 envs sent at "
                                 r"\d\d:\d\d:\d\d \(--infer-timeout 1 s\)", said[0])
    wait_until(lambda: closes, 10, "the server seeing the client's close")
    assert closes == [(1001, "Infer timeout")]
    assert not session.awaiting
    session.reconnect(closed)
    assert session.infer(messages.InferRequest(obs, ids, steps)).actions.shape == (2, 2, 1)
    assert session.timing.reconnects == 1
    session.close()


@pytest.mark.slow
def test_a_slow_reply_is_announced_and_then_taken(harness, caplog, fast_warnings):
    def script(conn):
        conn.send_metadata(action_horizon=2)
        request = conn.recv()
        time.sleep(1.0)  # longer than the first two warnings (0.2 s, then 0.6 s)
        conn.send_zero_action(request, 2, 1)
        conn.ws.recv()

    h = harness(script)
    session = Session(SessionConfig(url=f"ws://127.0.0.1:{h.port}"))
    session.open()
    reply = session.infer(messages.InferRequest(Observation(states={"x": np.zeros((3, 1))}, text="a"), np.arange(3), np.zeros(3, np.int64)))
    assert reply.actions.shape == (2, 3, 1)
    said = _warnings(caplog, "no reply from the server for")
    assert len(said) >= 2 and all("to the infer for 3 envs sent at" in line for line in said)
    assert said[0].startswith("no reply from the server for 0.2 s") and "infer-timeout" not in said[0]
    session.close()


@pytest.mark.slow
def test_a_server_that_stays_stopped_gets_one_line_and_a_reminder(harness, caplog, fast_warnings):
    """With --reconnect-on-server-stop, a stopped server that stays up ends every connection at once: the client
    says once that it waits for the next run, then reminds every 0.4 s (a minute by default), not per reconnect."""

    def script(conn):
        conn.send_metadata(action_horizon=2)
        conn.recv()
        conn.close(1001, messages.REASON_STOP)

    h = harness(script)
    session = Session(SessionConfig(url=f"ws://127.0.0.1:{h.port}", reconnect_on_server_stop=True,
                                    backoff_initial_s=0.05, backoff_max_s=0.1))
    session.open()
    obs = Observation(states={"x": np.zeros((1, 1))}, text="a")
    start = time.monotonic()
    while time.monotonic() - start < 1.5:
        with pytest.raises(ConnectionLost) as info:
            session.infer(messages.InferRequest(obs, np.arange(1), np.zeros(1, np.int64)))
        assert info.value.close.action is CloseAction.RECONNECT
        session.reconnect(info.value.close)
    session.close()
    assert session.timing.reconnects >= 6
    assert len(_warnings(caplog, "ended its run")) == 1
    assert "waiting for its next run (reconnect_on_server_stop)" in _warnings(caplog, "ended its run")[0]
    assert 1 <= len(_warnings(caplog, "still waiting for the next run")) <= 4
    assert _warnings(caplog, "reconnecting to") == []


@pytest.mark.parametrize("extra", ["second-reply", "reply-after-feedback"])
def test_a_reply_that_answers_no_infer_is_a_resync(harness, caplog, extra):
    """Taken as the next chunk, it would make every later chunk one reply stale: the session closes with the
    protocol's resync close and raises it, and the next connection starts over."""
    closes: list[tuple[Any, Any]] = []
    fed_back = threading.Event()

    def script(conn):
        conn.send_metadata(action_horizon=2)
        if conn.index > 0:
            return conn.answer_infers_with_zeros(2, 1)
        request = conn.recv()
        conn.send_zero_action(request, 2, 1)
        if extra == "second-reply":
            conn.send_zero_action(request, 2, 1)
        conn.recv()  # the feedback
        if extra == "reply-after-feedback":
            conn.send_zero_action(request, 2, 1)
        fed_back.set()
        try:
            conn.ws.recv()
        except ConnectionClosed:
            closes.append((conn.ws.close_code, conn.ws.close_reason))
            raise

    h = harness(script)
    session = Session(SessionConfig(url=f"ws://127.0.0.1:{h.port}"))
    session.open()
    obs = Observation(states={"x": np.zeros((2, 1))}, text="a")
    ids, steps, flags = np.arange(2), np.zeros(2, np.int64), np.zeros(2, bool)
    session.infer(messages.InferRequest(obs, ids, steps))
    session.feedback(messages.Feedback(ids, steps, obs, np.zeros(2, np.float32), flags, flags, {}))
    assert fed_back.wait(10)
    assert ws_client.wait_any([session._client], timeout=10)  # the extra reply is in (read, not taken)
    with pytest.raises(ConnectionLost) as info:
        session.send_infer(messages.InferRequest(obs, ids, steps + 1))
    closed = info.value.close
    assert (closed.action, closed.code, closed.reason) == (CloseAction.RECONNECT, 1001, messages.REASON_RESYNC)
    assert "sent an action that answers no infer" in closed.why
    wait_until(lambda: closes, 10, "the server seeing the client's close")
    assert closes == [(1001, messages.REASON_RESYNC)]
    session.reconnect(closed)
    assert session.infer(messages.InferRequest(obs, ids, steps + 1)).actions.shape == (2, 2, 1)
    session.close()


def test_reconnects_past_the_limit_are_a_typed_error_that_says_why():
    """Named as the app layer says the user sets the limit (the protocol itself names no flag)."""
    session = Session(SessionConfig(url="ws://127.0.0.1:1", max_reconnects=0,
                                    words={"max_reconnects": "--max-reconnects"}))
    closed = Closed(CloseAction.RECONNECT, messages.CLOSE_GOING_AWAY, messages.REASON_RESYNC)
    with pytest.raises(ReconnectsExhausted) as raised:
        session.reconnect(closed)
    assert str(raised.value) == ("the server closed the connection (code 1001, reason 'plugrl-server-resync') more "
                                 "than --max-reconnects=0 times; giving up")
    assert raised.value.closed == closed and raised.value.limit == 0 and session.timing.reconnects == 0


def test_a_stopwatch_adds_each_blocks_seconds_to_every_field_it_names():
    timing = Timing()
    packing, sending = Stopwatch(timing, "pack_s", "infer_obs_pack_s"), Stopwatch(timing, "feedback_s")

    def busy(seconds: float) -> None:  # the clock moves on while the block runs (no sleep: CPU time)
        until = time.perf_counter() + seconds
        while time.perf_counter() < until:
            pass

    with sending:
        with packing:
            busy(0.01)
        busy(0.01)
    assert timing.pack_s == timing.infer_obs_pack_s >= 0.01 and timing.feedback_s >= timing.pack_s + 0.01
    first = timing.pack_s
    with packing:
        busy(0.01)
    assert timing.pack_s == timing.infer_obs_pack_s >= first + 0.01 and timing.env_step_s == 0.0
