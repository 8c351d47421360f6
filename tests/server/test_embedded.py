"""The embedded reference server matched to an env's action space, text spaces included."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from websockets.sync.client import connect

from plugrl_env_client.errors import ConfigError
from plugrl_env_client.protocol import codec, messages
from plugrl_env_client.server.embedded import (
    local_policy_flag,
    policy_for_space,
    server_command,
    start_local_server,
)
from plugrl_env_client.server.policies import (
    DEFAULT_TEXT_CHOICES,
    DEFAULT_TEXT_LENGTH,
    RandomPolicy,
    TextPolicy,
    ZeroPolicy,
    default_text_choices,
)
from plugrl_env_client.server.policy import Policy, PolicySetup
from plugrl_env_client.server.registry import _POLICIES, default_policy, register_policy


def test_text_space_with_given_choices():
    policy = policy_for_space("text", gym.spaces.Text(max_length=100), horizon=3, seed=0,
                              options={"choices": ("<answer>3</answer>", "hello")})
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

    code = ("import gymnasium as gym; from plugrl_env_client.server.policies import default_text_choices; "
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
    server = start_local_server("text", gym.spaces.Text(max_length=64), 2, seed=3,
                                options={"choices": ("über", "<answer>7</answer>")})
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


def test_options_the_policy_lacks_are_refused_naming_those_it_has():
    with pytest.raises(ConfigError, match="--local-policy text: the text policy has no option value: its options are "
                                          "choices"):
        policy_for_space("text", gym.spaces.Text(max_length=10), horizon=2, options={"value": 1.0})
    with pytest.raises(ConfigError, match="the random policy has no option choices: it has no options of its own"):
        policy_for_space("random", gym.spaces.Box(-1, 1, (2,)), horizon=2, options={"choices": ("a",)})


@pytest.fixture
def dict_policy():
    """A policy registered as the default of Dict action spaces, which no built-in answers (removed afterwards)."""

    @register_policy("test-dict", default=True)
    class DictPolicy(Policy):
        @classmethod
        def refuses(cls, space: gym.Space) -> str | None:
            return None if isinstance(space, gym.spaces.Dict) else "answers Dict spaces only"

        @classmethod
        def server_flags(cls, space: gym.Space) -> str:
            return "--policy.keys " + ",".join(space.spaces)

        def __init__(self, setup: PolicySetup, config: object = None) -> None:
            super().__init__(setup)

        def act(self, obs, n):
            return np.zeros((self.horizon, n), np.float32)

    try:
        yield DictPolicy
    finally:
        del _POLICIES["test-dict"]


def test_the_policy_offered_for_a_space_is_the_registry_s_default_for_it(dict_policy):
    """Hints and the check's rollout ask the registry: a registered default serves a space no built-in does, with
    no edit of the modules that offer it."""
    space = gym.spaces.Dict({"arm": gym.spaces.Box(-1, 1, (2,)), "grip": gym.spaces.Discrete(2)})
    assert default_policy(space) == "test-dict"
    assert local_policy_flag(space) == "--local-policy test-dict"
    assert server_command(space, 8001) == "plugrl-run-policy-server --port 8001 --policy.name test-dict --policy.keys arm,grip"
    assert isinstance(policy_for_space("test-dict", space, horizon=1), dict_policy)
    with pytest.raises(ConfigError, match="Use --local-policy test-dict"):
        policy_for_space("random", space, horizon=2)


def test_the_built_in_defaults_and_their_commands():
    assert local_policy_flag(gym.spaces.Text(max_length=5)) == "--local-policy text"
    assert local_policy_flag(gym.spaces.Box(-1, 1, (3,))) == "--local-policy random"
    assert server_command(gym.spaces.Text(max_length=5), 9) == \
        'plugrl-run-policy-server --port 9 --policy.name text --policy.choices "<an answer>" "<another>"'
    assert server_command(gym.spaces.Box(-1, 1, (3,), np.float64), 9) == \
        "plugrl-run-policy-server --port 9 --policy.action-dim 3 --policy.dtype float64"
    assert server_command(gym.spaces.Discrete(4, start=2), 9) == \
        "plugrl-run-policy-server --port 9 --policy.action-dim 0 --policy.dtype int64 --policy.low 2 --policy.high 5"
    assert default_policy(gym.spaces.Dict({"a": gym.spaces.Discrete(2)})) is None
    assert local_policy_flag(gym.spaces.Dict({"a": gym.spaces.Discrete(2)})) == \
        "--local-policy <a policy registered for this space>"
