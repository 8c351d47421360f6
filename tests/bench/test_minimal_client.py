"""bench/minimal_client.py: the minimal client that bench/pipeline.py sets the package's lockstep against must speak
PlugRL v1 as the reference server checks it (every message parsed strictly, a violation is a resync, which the
minimal client takes as an error), and stay minimal. Real sockets on 127.0.0.1; no figure is asserted."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from extras import need
from file_modules import BENCH, bench_script
from waiting import wait_until

from plugrl_env_client.protocol import codec
from plugrl_env_client.server.policies import PolicyConfig, make_policy
from plugrl_env_client.server.server import PolicyServer

need("mujoco")

TIMEOUT_S = 60.0
MAX_LINES = 150


@pytest.fixture(scope="module")
def minimal():
    with bench_script("minimal_client") as module:
        yield module


def test_the_minimal_client_is_at_most_150_lines():
    lines = len((BENCH / "minimal_client.py").read_text().splitlines())
    assert lines <= MAX_LINES, f"bench/minimal_client.py has {lines} lines"


def test_the_minimal_encoder_writes_the_packages_bytes_and_reads_them_back(minimal):
    """One encoder, the openpi ndarray convention (SPEC 3.1): a feedback as the minimal client builds it is byte for
    byte what the package's codec writes, and the package's bytes decode to the same arrays."""
    ids = np.array([0, 3], np.int64)
    message = {"message_type": "feedback", "env_indices": ids, "step_ids": np.array([1, 0], np.int64),
               "data": {"obs": {"images": {}, "states": {"obs": np.arange(22, dtype=np.float32).reshape(2, 11)},
                                "text": np.full(2, "", "<U1")},
                        "rewards": np.array([1.5, -2.0], np.float32), "terminated": np.array([False, True]),
                        "truncated": np.zeros(2, bool),
                        "info": {"episode": {"r": np.array([3.0, 4.0], np.float32), "l": np.array([5, 6], np.int64),
                                             "mask": np.array([False, True])}}}}
    assert minimal.packb(message) == codec.packb(message)
    back = minimal.msgpack.unpackb(codec.packb(message), object_hook=minimal.unpack_array)
    assert back["data"]["obs"]["states"]["obs"].dtype == np.float32
    np.testing.assert_array_equal(back["data"]["obs"]["states"]["obs"], message["data"]["obs"]["states"]["obs"])
    np.testing.assert_array_equal(back["data"]["info"]["episode"]["mask"], [False, True])


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
