"""``--server-url wss://...``: TLS to a server whose certificate the system trusts (here via SSL_CERT_FILE)."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest
from websockets.sync.server import serve

from plugrl_env_client.app import run_client
from plugrl_env_client.config import ClientConfig, RunnerConfig
from plugrl_env_client.envs import discover_envs
from plugrl_env_client.protocol import codec, messages

discover_envs()
from plugrl_env_client.envs.point.point_env import PointEnvConfig  # noqa: E402


def test_wss_server_url(tmp_path, monkeypatch, tls):
    cert, context = tls

    def handler(ws):
        ws.send(codec.packb(messages.metadata_message({"action_horizon": 4})))
        for frame in ws:
            msg = codec.unpackb(frame)
            if msg["message_type"] == "infer":
                ids = msg["env_indices"]
                ws.send(codec.packb(messages.ActionReply(ids, np.zeros((4, len(ids), 2), np.float32)).message()))

    server = serve(handler, "127.0.0.1", 0, ssl=context, compression=None, max_size=None)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    try:
        port = server.socket.getsockname()[1]
        cfg = ClientConfig(server_url=f"wss://127.0.0.1:{port}", num_episodes=2, output_dir=tmp_path, exp_name="run",
                           progress=False, env=PointEnvConfig(), runner=RunnerConfig(max_episode_steps=5))
        assert run_client(cfg, "Point-v1") == 0
    finally:
        server.shutdown()
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["completed_episodes"] == 2


def test_untrusted_certificate_is_an_error_that_says_so(monkeypatch, tls):
    from plugrl_env_client.errors import ConfigError
    from plugrl_env_client.protocol.dialing import SessionConfig
    from plugrl_env_client.protocol.session import Session

    cert, context = tls
    server = serve(lambda ws: None, "127.0.0.1", 0, ssl=context)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    try:
        session = Session(SessionConfig(url=f"wss://127.0.0.1:{server.socket.getsockname()[1]}"))
        with pytest.raises(ConfigError, match="TLS certificate .* did not verify .*SSL_CERT_FILE"):
            session.open()
    finally:
        server.shutdown()
