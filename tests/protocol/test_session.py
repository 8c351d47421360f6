"""Session behaviour seen from a real loopback server: auth header, waiting for a server, backoff bounds."""

from __future__ import annotations

import socket
import threading
import time

import numpy as np
import pytest
from waiting import wait_until

from plugrl_env_client.envs.base_env import Observation
from plugrl_env_client.errors import ConfigError
from plugrl_env_client.protocol import messages
from plugrl_env_client.protocol.connection import CloseAction, ConnectionLost
from plugrl_env_client.protocol.messages import ServerMetadata
from plugrl_env_client.protocol.session import Session, SessionConfig


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
    session = Session(SessionConfig(url=f"ws://127.0.0.1:{port}", backoff_max_s=0.3, connect_timeout=60))
    meta = session.open()
    session.close()
    assert started.is_set() and isinstance(meta, ServerMetadata) and meta.action_horizon == 2
    waiting = [r for r in caplog.records if "waiting for a policy server" in r.getMessage()]
    assert len(waiting) == 1 and "plugrl-run-policy-server" in waiting[0].getMessage()
    for server in holder:
        server.shutdown()


def test_backoff_grows_with_jitter_and_is_capped():
    session = Session(SessionConfig(url="ws://127.0.0.1:1", backoff_initial_s=0.1, backoff_max_s=2.0))
    first = [session._backoff(1) for _ in range(200)]
    late = [session._backoff(20) for _ in range(200)]
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
        with pytest.raises(ConfigError, match="refused the WebSocket handshake with HTTP 403.*--api-key"):
            session.open()
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
            session.infer(obs, np.arange(1), np.zeros(1, np.int64))
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
    reply = session.infer(obs, ids, steps)
    assert meta.action_horizon == 2 and reply.actions.shape == (2, 2, 3) and not reply.actions.any()
    session.feedback(ids, steps, obs, np.zeros(2, np.float32), np.zeros(2, bool), np.zeros(2, bool), {})
    with pytest.raises(ConnectionLost) as info:
        session.infer(obs, ids, steps)
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
    session.open()
    obs = Observation(states={"x": np.zeros((2, 1))}, text="a")
    ids, steps = np.arange(2), np.zeros(2, np.int64)
    with pytest.raises(RuntimeError, match="no infer is waiting"):
        session.receive_actions(0.0)
    session.send_infer(obs, ids, steps)
    with pytest.raises(RuntimeError, match="already waiting"):
        session.send_infer(obs, ids, steps)
    assert session.receive_actions(0.0) is None and session.receive_actions(0.05) is None
    release.set()
    reply = session.receive_actions(None)
    assert reply is not None and reply.actions.shape == (2, 2, 3) and reply.env_ids.tolist() == [0, 1]
    with pytest.raises(RuntimeError, match="no infer is waiting"):
        session.receive_actions(0.0)
    assert session.timing.infer_calls == 1 and session.timing.actions_received == 1
    session.close()


def test_run_client_with_transport_picows_against_the_picows_reference_server(tmp_path):
    """``--transport picows`` names the embedded server's library; the client speaks to a picows server as to any."""
    pytest.importorskip("picows")
    import json

    from plugrl_env_client.app import run_client
    from plugrl_env_client.config import ClientConfig, ConnectionConfig
    from plugrl_env_client.envs import discover_envs
    from plugrl_env_client.server.policies import PolicyConfig, make_policy
    from plugrl_env_client.server.server import PolicyServer

    discover_envs()
    from plugrl_env_client.envs.point.point_env import PointEnvConfig

    server = PolicyServer(make_policy(PolicyConfig(action_dim=2, action_horizon=4)), port=0, transport="picows").start()
    try:
        cfg = ClientConfig(server_port=server.port, num_envs=3, num_episodes=5, output_dir=tmp_path, exp_name="run",
                           progress=False, connection=ConnectionConfig(transport="picows"),
                           env=PointEnvConfig())
        assert run_client(cfg, "Point-v1") == 0
    finally:
        server.shutdown()
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["completed_episodes"] == 5 and summary["timing"]["bytes_sent"] > 0
    assert server.log.episodes >= 5
