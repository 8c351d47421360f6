"""Test-only env that returns odd values on purpose: a reward beyond float32's range, lone surrogates in its text,
instruction and metric names, a reset of its own inside ``step()``, states of a dtype its space does not declare.

Kept in an importable module (tests put this folder on sys.path) so spawned rollout processes can load it; the CLI
tests pass it with ``--env-path``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import gymnasium as gym
import numpy as np

from plugrl_env_client.envs.base_env import BaseEnv, BaseEnvConfig, Observation, observation_space
from plugrl_env_client.utils.registration import register_env, register_env_config

LONE = "\ud800"
"""A lone surrogate: a str Python holds, but no UTF-8 encoder writes."""


@register_env_config("Odd-v1")
@dataclasses.dataclass
class OddConfig(BaseEnvConfig):
    episode_length: int = 3
    reward: float = 1.0
    """Every step's reward, returned as float64 (1e39 does not fit float32)."""
    surrogate: bool = False
    """A lone surrogate in the text observation, the instruction and a metric's name and text."""
    reset_in_step_at: int = 0
    """The env's step (counted over the run) at which step() calls its own reset() (0: never)."""
    states_dtype: str = "float32"
    """The dtype of states['pos'] as returned; the declared space says float32."""


@register_env("Odd-v1")
class OddEnv(BaseEnv[OddConfig]):
    """Two-dimensional actions, states['pos'] (declared float32) and text; every episode lasts ``episode_length``."""

    def __init__(self, config: OddConfig, num_envs: int = 1, **kwargs: Any) -> None:
        super().__init__(config, num_envs=num_envs, **kwargs)
        self.single_action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.single_observation_space = observation_space(
            states={"pos": gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)})
        self.t = np.zeros(num_envs, np.int64)
        self.steps = 0

    def _obs(self) -> Observation:
        mark = LONE if self.config.surrogate else ""
        pos = np.zeros((self.num_envs, 2), self.config.states_dtype)
        return Observation(states={"pos": pos}, text=[f"t={t}{mark}" for t in self.t])

    def reset(self, *, seed=None, options=None):
        self.seed_rngs(seed)
        self.t[self.reset_mask(options)] = 0
        mark = LONE if self.config.surrogate else ""
        return self._obs(), {"env_instruction": [f"go{mark}"] * self.num_envs}

    def step(self, actions):
        self.steps += 1
        if self.steps == self.config.reset_in_step_at:
            self.reset()
        self.t += 1
        n = self.num_envs
        info: dict[str, Any] = {}
        if self.config.surrogate:
            info["metrics"] = {f"score{LONE}": np.ones(n)}
        done = self.t >= self.config.episode_length
        return self._obs(), np.full(n, self.config.reward, np.float64), done, np.zeros(n, bool), info
