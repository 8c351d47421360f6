"""bench/minimal_client.py: the minimal client that bench/pipeline.py sets the package's lockstep against must speak
PlugRL v1 as the reference server checks it (every message parsed strictly, a violation is a resync, which the
minimal client takes as an error), and stay minimal. Real sockets on 127.0.0.1; no figure is asserted."""

from __future__ import annotations

import logging

import pytest
from file_modules import BENCH, bench_script
from waiting import wait_until

from plugrl_env_client.server.policies import PolicyConfig, make_policy
from plugrl_env_client.server.server import PolicyServer

pytest.importorskip("mujoco")

TIMEOUT_S = 60.0
MAX_LINES = 150


@pytest.fixture(scope="module")
def minimal():
    with bench_script("minimal_client") as module:
        yield module


def test_the_minimal_client_is_at_most_150_lines():
    lines = len((BENCH / "minimal_client.py").read_text().splitlines())
    assert lines <= MAX_LINES, f"bench/minimal_client.py has {lines} lines"


@pytest.mark.slow
def test_the_reference_server_counts_every_episode_of_the_minimal_client_and_no_violation(minimal, caplog):
    """Hopper-v5 x2, chunks of 4, for 0.5 s: the server counted exactly the episodes the client finished (each one
    reported once, in the feedback that carried its terminal observation), and logged nothing at WARNING or above
    (a protocol violation, a feedback for an env without step state, a dropped socket are all logged)."""
    caplog.set_level(logging.DEBUG, logger="plugrl_env_client.server")
    server = PolicyServer(make_policy(PolicyConfig(action_dim=3, action_horizon=4, seed=0)), host="127.0.0.1",
                          port=0).start()
    try:
        result = minimal.run(server.url, num_envs=2, horizon=4, seconds=0.5)
        wait_until(lambda: server.connections == 0, TIMEOUT_S, "end of the minimal client's connection on the server")
    finally:
        server.shutdown()
    assert result["episodes"] > 0 and result["batch_steps"] > 0
    assert server.log.episodes == result["episodes"]
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert not [r.getMessage() for r in caplog.records if "without a close frame" in r.getMessage()]
    assert 0 < result["cpu_per_batch_step_s"] and 0 < result["env_steps_per_s"]
