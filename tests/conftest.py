"""Shared fixtures: a scripted PlugRL server on 127.0.0.1 for end-to-end tests over real sockets.

A test gives the harness a ``script(conn)`` function; ``conn`` wraps one accepted WebSocket with helpers that
encode/decode through the project's codec and record every message the client sent, per connection.
"""

from __future__ import annotations

import shutil
import ssl
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.server import ServerConnection, serve

from plugrl_env_client.protocol import codec, messages

# Importable helpers for tests (and for spawned rollout processes, which inherit sys.path).
sys.path.insert(0, str(Path(__file__).parent / "_support"))

from ws_servers import bare, served  # noqa: F401  (fixtures: WebSocket servers for a test)


class HarnessConnection:
    def __init__(self, ws: ServerConnection, index: int) -> None:
        self.ws = ws
        self.index = index
        self.received: list[dict[str, Any]] = []

    def send(self, msg: dict[str, Any]) -> None:
        self.ws.send(codec.packb(msg))

    def send_metadata(self, **data: Any) -> None:
        self.send(messages.metadata_message(data))

    def recv(self) -> dict[str, Any]:
        msg = codec.unpackb(self.ws.recv())
        self.received.append(msg)
        return msg

    def close(self, code: int, reason: str = "") -> None:
        self.ws.close(code, reason)

    def send_zero_action(self, infer: dict[str, Any], horizon: int, action_dim: int) -> None:
        """Answer ``infer`` with an all-zero float64 chunk ``[horizon, n, action_dim]``."""
        ids = infer["env_indices"]
        self.send(messages.ActionReply(ids, np.zeros((horizon, len(ids), action_dim))).message())

    def answer_infers_with_zeros(self, horizon: int, action_dim: int) -> None:
        """Serve until the client leaves: zero chunks for every infer, feedback just recorded."""
        while True:
            msg = self.recv()
            if msg["message_type"] == "infer":
                self.send_zero_action(msg, horizon, action_dim)


class Harness:
    """Runs ``script`` for every connection (in order), and keeps each connection's received messages."""

    def __init__(self, script: Callable[[HarnessConnection], None], **serve_kwargs: Any) -> None:
        self.script = script
        self.connections: list[HarnessConnection] = []
        self.errors: list[BaseException] = []
        self._lock = threading.Lock()
        self._server = serve(self._handle, "127.0.0.1", 0, compression=None, max_size=None, **serve_kwargs)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return self._server.socket.getsockname()[1]

    def _handle(self, ws: ServerConnection) -> None:
        with self._lock:
            conn = HarnessConnection(ws, len(self.connections))
            self.connections.append(conn)
        try:
            self.script(conn)
        except ConnectionClosed:
            pass
        except BaseException as exc:  # surfaced by the test through harness.errors
            self.errors.append(exc)
            ws.close(1011, "harness error")

    def shutdown(self) -> None:
        self._server.shutdown()
        self._thread.join(timeout=5)


@pytest.fixture
def harness() -> Iterator[Callable[[Callable[[HarnessConnection], None]], Harness]]:
    made: list[Harness] = []

    def start(script: Callable[[HarnessConnection], None], **serve_kwargs: Any) -> Harness:
        h = Harness(script, **serve_kwargs)
        made.append(h)
        return h

    yield start
    for h in made:
        h.shutdown()


@pytest.fixture
def registry() -> Iterator[None]:
    """Built-ins discovered first (their modules import once per session), then the env and policy registries
    restored after."""
    import gymnasium as gym

    from plugrl_env_client.envs import discover_envs
    from plugrl_env_client.envs import registry as registration
    from plugrl_env_client.server import registry as policies

    discover_envs()
    before, gym_registry, policies_before = registration.snapshot(), dict(gym.registry), policies.snapshot()
    yield
    policies.restore(policies_before)
    registration.restore(before)
    gym.registry.clear()
    gym.registry.update(gym_registry)


@pytest.fixture
def tls(tmp_path):
    """A self-signed certificate for 127.0.0.1 and a server TLS context using it."""
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True, timeout=60)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    return cert, context
