"""The embedded default: a reference server in a thread, matched to the env's action space.

``--local-policy random`` needs no second terminal and no flags to match: the action shape, dtype and bounds come
from the env's ``single_action_space``, and the server binds a free port on 127.0.0.1.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from plugrl_env_client.errors import ConfigError
from plugrl_env_client.server.policies import PolicyConfig, make_policy
from plugrl_env_client.server.server import PolicyServer


def policy_for_space(name: str, space: gym.Space, horizon: int, seed: int | None = None):
    """A reference policy whose actions fit ``space`` (Box, Discrete or MultiDiscrete)."""
    if isinstance(space, gym.spaces.Box):
        shape, dtype, low, high = space.shape, space.dtype, space.low, space.high
    elif isinstance(space, gym.spaces.Discrete):
        shape, dtype, low, high = (), np.dtype(np.int64), space.start, space.start + space.n - 1
    elif isinstance(space, gym.spaces.MultiDiscrete):
        shape, dtype, low, high = space.shape, np.dtype(np.int64), space.start, space.start + space.nvec - 1
    else:
        raise ConfigError(
            f"--local-policy cannot produce actions for {space}; run a policy server that can "
            "(plugrl-run-policy-server) and connect with --server-host/--server-port"
        )
    config = PolicyConfig(name=name, action_horizon=horizon, dtype=np.dtype(dtype).name, seed=seed)
    return make_policy(config, action_shape=tuple(shape), low=low, high=high)


def start_local_server(name: str, space: gym.Space, horizon: int, seed: int | None = None) -> PolicyServer:
    """Start the reference server on a free loopback port, serving in a daemon thread."""
    return PolicyServer(policy_for_space(name, space, horizon, seed), host="127.0.0.1", port=0).start()
