"""Server metadata with unknown keys of any shape (SPEC 4.1: ignored): the client connects and runs, and its log
line shows a bounded picture of the map."""

from __future__ import annotations

import json
from pathlib import Path

from plugrl_env_client.app import run_client
from plugrl_env_client.config import ClientConfig, RunnerConfig
from plugrl_env_client.envs import discover_envs

discover_envs()
from plugrl_env_client.envs.point.point_env import PointEnvConfig  # noqa: E402


def _nested(depth: int) -> dict:
    value: dict = {"leaf": "x" * 1000}
    for _ in range(depth):
        value = {"x": value}
    return value


def test_an_unknown_key_nested_990_deep_is_ignored_and_the_run_completes(harness, tmp_path: Path):
    def script(conn):
        conn.send_metadata(action_horizon=1, vendor_extra=_nested(990), vendor_list=[list(range(5000))])
        conn.answer_infers_with_zeros(horizon=1, action_dim=2)

    server = harness(script)
    cfg = ClientConfig(output_dir=tmp_path, exp_name="run", progress=False, env=PointEnvConfig(),
                       server_port=server.port, num_episodes=1, runner=RunnerConfig(max_episode_steps=3))
    assert run_client(cfg, "Point-v1") == 0
    assert json.loads((tmp_path / "run/summary.json").read_text())["completed_episodes"] == 1
    log = (tmp_path / "run/logs/client.log").read_text().splitlines()
    [line] = [line for line in log if "server metadata:" in line]
    assert "'vendor_extra': {'x': {'x':" in line and "..." in line
    assert len(line.split("server metadata: ", 1)[1]) <= 403, "the metadata's log line is bounded"
    assert not server.errors
