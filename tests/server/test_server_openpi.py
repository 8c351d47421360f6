"""The reference server in openpi's protocol, over real sockets on 127.0.0.1: openpi's own client library
(``openpi_client.WebsocketClientPolicy``, in a child with openpi's packages, :mod:`openpi_site`) gets its metadata,
its chunks and, for a request it cannot read, the traceback error openpi's server gives; the requests of concurrent
connections reach a batching policy in one call; a policy that learns from feedback is refused; and the embedded
server serves ``--local-policy random --protocol openpi`` with nothing to start."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from openpi_site import install_openpi, python_path_with

from plugrl_env_client.app import run_client
from plugrl_env_client.config import ClientConfig, ConnectionConfig
from plugrl_env_client.connection_flags import OpenpiConfig
from plugrl_env_client.envs import discover_envs
from plugrl_env_client.errors import ConfigError
from plugrl_env_client.protocol.dialing import SessionConfig
from plugrl_env_client.protocol.messages import InferRequest
from plugrl_env_client.protocol.openpi import OpenpiSession
from plugrl_env_client.protocol.openpi_keys import KeyMap
from plugrl_env_client.server.embedded import start_local_server
from plugrl_env_client.server.policies import PolicyConfig, make_policy
from plugrl_env_client.server.policy import InferCall, Policy, PolicySetup
from plugrl_env_client.server.server import PolicyServer

discover_envs()  # Point-v1

CLIENT = """
import json, sys
import numpy as np
from openpi_client.websocket_client_policy import WebsocketClientPolicy
policy = WebsocketClientPolicy(host="127.0.0.1", port=int(sys.argv[1]))
obs = {"observation/image": np.zeros((224, 224, 3), np.uint8), "observation/wrist_image": np.zeros((224, 224, 3),
       np.uint8), "observation/state": np.zeros(8, np.float32), "prompt": "pick up the bowl"}
out = policy.infer(obs)
seen = {"metadata": {k: v for k, v in policy.get_server_metadata().items() if isinstance(v, (int, str))},
        "actions": [list(out["actions"].shape), out["actions"].dtype.str], "timing": sorted(out["server_timing"])}
try:
    policy.infer({"prompt": "no cameras"})
except RuntimeError as exc:
    seen["error"] = str(exc)
print(json.dumps(seen))
"""


@pytest.mark.slow
def test_openpis_own_client_is_served(tmp_path_factory: pytest.TempPathFactory) -> None:
    site = install_openpi(tmp_path_factory.mktemp("openpi-site"))
    policy = make_policy(PolicyConfig(name="random", action_dim=7, action_horizon=10, seed=0))
    server = PolicyServer(policy, port=0, openpi=KeyMap.of("libero")).start()
    try:
        res = subprocess.run([sys.executable, "-c", CLIENT, str(server.port)], capture_output=True, text=True,
                             timeout=120, env={"PYTHONPATH": python_path_with(site), "PATH": "/usr/bin:/bin"})
    finally:
        server.shutdown()
    assert res.returncode == 0, res.stderr
    seen = json.loads(res.stdout)
    assert seen["metadata"]["action_horizon"] == 10 and seen["metadata"]["action_dim"] == 7
    assert seen["actions"] == [[10, 7], "<f4"] and seen["timing"] == ["infer_ms"]
    assert seen["error"].startswith("Error in inference server:\nTraceback")
    assert "the request has no 'observation/image'" in seen["error"]


class Batching(Policy):
    """Answers zeros; its first call waits (bounded) until all four connections' requests are in or queued behind
    it, so the next call shows whether the queued ones were taken together."""

    batches = True

    def __init__(self, setup: PolicySetup) -> None:
        super().__init__(setup)
        self.sizes: list[int] = []
        self.pending = lambda: 0

    def act(self, obs: dict[str, Any], n: int) -> np.ndarray:
        return np.zeros((self.horizon, n, *self.action_shape), self.dtype)

    def infer_batch(self, calls: list[InferCall]) -> list[np.ndarray]:
        if not self.sizes:
            deadline = time.monotonic() + 10
            while len(calls) + self.pending() < 4 and time.monotonic() < deadline:
                time.sleep(0.005)
        self.sizes.append(len(calls))
        return super().infer_batch(calls)


@pytest.mark.slow
def test_requests_of_concurrent_connections_are_answered_in_one_batched_call() -> None:
    policy = Batching(PolicySetup((2,), np.dtype(np.float32), 4, -1.0, 1.0))
    server = PolicyServer(policy, port=0, openpi=KeyMap.of("none")).start()
    policy.pending = lambda: server._worker.pending
    session = OpenpiSession(SessionConfig(url=server.url, openpi=OpenpiConfig(connections=4), connect_timeout=10),
                            num_envs=4)
    try:
        session.open()

        class Obs:
            images: dict[str, np.ndarray] = {}
            states = {"pos": np.arange(8, dtype=np.float32).reshape(4, 2)}
            text = np.array(["go"] * 4)

        reply = session.infer(InferRequest(Obs(), np.arange(4), np.zeros(4, np.int64)))
    finally:
        session.close()
        server.shutdown()
    assert reply.actions.shape == (4, 4, 2), "the 4 envs' chunks, stacked time-major"
    assert sum(policy.sizes) == 4 and len(policy.sizes) <= 2, f"requests taken together, not one by one: {policy.sizes}"


def test_a_policy_that_learns_from_feedback_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="ars learns from the episodes' returns.*cannot serve --protocol openpi"):
        start_local_server("ars", gym.spaces.Box(-1, 1, (2,), np.float32), None, run_root=tmp_path,
                           openpi=KeyMap.of("none"))


@pytest.mark.slow
def test_the_embedded_server_speaks_openpi(tmp_path: Path) -> None:
    config = ClientConfig(num_envs=3, num_episodes=3, output_dir=tmp_path, exp_name="run", progress=False,
                          local_policy="random", connection=ConnectionConfig(protocol="openpi"))
    assert run_client(config, "Point-v1") == 0
    summary = json.loads((tmp_path / "run/summary.json").read_text())
    assert summary["completed_episodes"] == 3 and summary["protocol"] == "openpi"
    assert summary["timing"]["infer_rows"] == summary["timing"]["infer_calls"], "one env per request"


