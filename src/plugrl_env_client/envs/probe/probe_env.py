"""Probe-v1: the conformance probe. Its observations reveal what the client did with each action.

``states["t"]`` counts steps in the episode, ``states["a"]`` is the last action applied; reward 1 per step; env i
terminates when ``t == 3 + 2 * (i % 3)``; it never truncates. A harness encodes (step, env, dim) into action values
and checks ordering, chunk sums, terminal observations and resets from what comes back.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import gymnasium as gym
import numpy as np

from plugrl_env_client.envs.base_env import (
    Action,
    BaseEnv,
    BaseEnvConfig,
    BoolArray,
    Observation,
    RewardArray,
    observation_space,
)
from plugrl_env_client.envs.registry import register_env, register_env_config


@register_env_config("Probe-v1")
@dataclasses.dataclass
class ProbeEnvConfig(BaseEnvConfig):
    action_dim: int = 3
    """Length of the action vector (float64, unbounded)."""


@register_env("Probe-v1")
class ProbeEnv(BaseEnv[ProbeEnvConfig]):
    metadata = {**BaseEnv.metadata, "per_env_seeds": True}  # every start is the same: any seed list will do

    def __init__(self, config: ProbeEnvConfig, num_envs: int = 1, **kwargs: Any) -> None:
        super().__init__(config, num_envs=num_envs, **kwargs)
        self.single_action_space = gym.spaces.Box(-np.inf, np.inf, (config.action_dim,), np.float64)
        self.single_observation_space = observation_space(states={"t": (1,), "a": (config.action_dim,)})
        self.t = np.zeros((num_envs, 1))
        self.a = np.zeros((num_envs, config.action_dim))
        self.episode_length = 3 + 2 * (np.arange(num_envs) % 3)

    def _observe(self) -> Observation:
        return Observation(states={"t": self.t.copy(), "a": self.a.copy()}, text="probe")

    def reset(self, *, seed: int | list[int | None] | None = None,
              options: dict[str, Any] | None = None) -> tuple[Observation, dict]:
        self.seed_rngs(seed)
        mask = self.reset_mask(options)
        self.t[mask] = 0.0
        self.a[mask] = 0.0
        return self._observe(), {}

    def step(self, actions: Action) -> tuple[Observation, RewardArray, BoolArray, BoolArray, dict]:
        self.a[:] = np.asarray(actions, dtype=np.float64).reshape(self.num_envs, -1)
        self.t += 1.0
        terminated = self.t[:, 0] == self.episode_length
        reward = np.ones(self.num_envs, dtype=np.float32)
        return self._observe(), reward, terminated, np.zeros(self.num_envs, dtype=bool), {}

