"""The embedded reference server matched to an env's action space, text spaces included."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from websockets.sync.client import connect

from plugrl_env_client.errors import ConfigError
from plugrl_env_client.protocol import codec, messages
from plugrl_env_client.server.embedded import (
    DEFAULT_TEXT_CHOICES,
    DEFAULT_TEXT_LENGTH,
    default_text_choices,
    policy_for_space,
    start_local_server,
)
from plugrl_env_client.server.policies import RandomPolicy, TextPolicy, ZeroPolicy


def test_text_space_with_given_choices():
    policy = policy_for_space("text", gym.spaces.Text(max_length=100), horizon=3, seed=0,
                              choices=["<answer>3</answer>", "hello"])
    assert isinstance(policy, TextPolicy)
    chunk = policy.act({}, 4)
    assert chunk.shape == (3, 4) and set(chunk.ravel().tolist()) <= {"<answer>3</answer>", "hello"}


def test_text_space_default_choices_come_from_its_charset_and_bounds():
    space = gym.spaces.Text(min_length=2, max_length=1 << 20, charset="<>/ab")
    choices = default_text_choices(space, seed=5)
    assert len(choices) == DEFAULT_TEXT_CHOICES
    assert all(set(c) <= set("<>/ab") and 2 <= len(c) <= DEFAULT_TEXT_LENGTH for c in choices)
    assert len(set(choices)) > 1
    assert choices == default_text_choices(space, seed=5)  # seeded: the same strings in every run
    policy = policy_for_space("text", space, horizon=2, seed=5)
    assert set(policy.act({}, 8).ravel().tolist()) <= set(choices)


def test_default_choices_respect_a_long_min_length_and_a_short_max_length():
    long_min = default_text_choices(gym.spaces.Text(min_length=40, max_length=50), seed=0)
    assert all(len(c) == 40 for c in long_min)
    short_max = default_text_choices(gym.spaces.Text(min_length=1, max_length=3), seed=0)
    assert all(1 <= len(c) <= 3 for c in short_max)


@pytest.mark.slow
def test_default_choices_do_not_depend_on_the_hash_seed(tmp_path):
    import os
    import subprocess
    import sys

    code = ("import gymnasium as gym; from plugrl_env_client.server.embedded import default_text_choices; "
            "print(default_text_choices(gym.spaces.Text(max_length=9), seed=1))")
    outs = {subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONHASHSEED": str(h)}, capture_output=True,
                           text=True, check=True, timeout=120).stdout for h in (1, 2)}
    assert len(outs) == 1


@pytest.mark.parametrize("name", ["random", "zero"])
def test_numeric_policy_on_a_text_space_suggests_text(name):
    with pytest.raises(ConfigError, match="--local-policy text"):
        policy_for_space(name, gym.spaces.Text(max_length=10), horizon=2)


def test_text_policy_on_a_numeric_space_suggests_random():
    with pytest.raises(ConfigError, match="--local-policy random"):
        policy_for_space("text", gym.spaces.Box(-1, 1, (2,)), horizon=2)


def test_numeric_spaces_unchanged():
    box = policy_for_space("random", gym.spaces.Box(-2.0, 2.0, (3,), np.float32), horizon=4, seed=0)
    assert isinstance(box, RandomPolicy)
    chunk = box.act({}, 5)
    assert chunk.shape == (4, 5, 3) and chunk.dtype == np.float32 and np.abs(chunk).max() <= 2.0
    disc = policy_for_space("random", gym.spaces.Discrete(3, start=1), horizon=2, seed=0).act({}, 50)
    assert disc.shape == (2, 50) and disc.dtype == np.int64 and set(disc.ravel().tolist()) == {1, 2, 3}
    multi = policy_for_space("zero", gym.spaces.MultiDiscrete([2, 5]), horizon=2)
    assert isinstance(multi, ZeroPolicy) and multi.act({}, 3).shape == (2, 3, 2)
    with pytest.raises(ConfigError, match="plugrl-run-policy-server"):
        policy_for_space("random", gym.spaces.Dict({"a": gym.spaces.Discrete(2)}), horizon=2)


def test_local_server_serves_text_on_a_free_port():
    server = start_local_server("text", gym.spaces.Text(max_length=64), 2, seed=3, choices=("über", "<answer>7</answer>"))
    try:
        assert server.port > 0
        with connect(server.url, compression=None, max_size=None, proxy=None) as ws:
            meta = messages.parse_metadata(codec.unpackb(ws.recv(timeout=5)))
            assert meta.action_horizon == 2 and meta.raw["action_dtype"] == "<U18"
            ids = np.array([0, 1], dtype=np.int64)
            obs = {"images": {}, "states": {}, "text": np.array(["a", "b"])}
            ws.send(codec.packb(messages.InferRequest(obs, ids, np.zeros(2, np.int64)).message()))
            reply = messages.parse_action(codec.unpackb(ws.recv(timeout=5)), ids)
            assert reply.actions.shape == (2, 2) and set(reply.actions.ravel().tolist()) <= {"über", "<answer>7</answer>"}
    finally:
        server.shutdown()
