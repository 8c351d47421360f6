"""Session behaviour seen from a real loopback server: auth header, waiting for a server, backoff bounds."""

from __future__ import annotations

import socket
import threading
import time

import numpy as np

from plugrl_env_client.protocol import messages
from plugrl_env_client.protocol.connection import Session, SessionConfig
from plugrl_env_client.protocol.messages import ServerMetadata


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
        time.sleep(1.0)
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
    session = Session(SessionConfig(url=f"ws://127.0.0.1:{port}", backoff_max_s=0.3))
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
