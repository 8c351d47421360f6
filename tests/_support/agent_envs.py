"""Test-only text envs for the language-agent conventions: per-step metrics with aggregation modes, an episode
supply that runs out (``info["no_episode"]``), env-owned timeouts (terminated and truncated together).

Importable by spawned processes (tests put this folder on sys.path); registered at import.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import gymnasium as gym
import numpy as np

from plugrl_env_client.envs.base_env import BaseEnv, BaseEnvConfig, Observation
from plugrl_env_client.utils.registration import register_env, register_env_config


@register_env_config("Counting-v1")
@dataclasses.dataclass
class CountingConfig(BaseEnvConfig):
    episode_length: int = 4
    """Env i's episodes end after episode_length + i steps, terminated and truncated together (an env timeout)."""
    episodes_per_env: int = 0
    """After this many episodes an env has no episode left (0: never runs out)."""
    bad_mode: str = ""
    """A metric aggregation mode to report for 'step' (an unknown one, to see the error)."""
    no_episode_when_out_only: bool = False
    """Put info['no_episode'] in a reset's info only once some env is out (the first reset then lacks it)."""
    switch_mode_at: int = 0
    """Report 'step' with mode 'last' from this step on (a mode that changes, to see the error; 0: never)."""


@register_env("Counting-v1")
class CountingEnv(BaseEnv[CountingConfig]):
    """Text observations counting steps; metrics step (sum), step_max (max), step_first (first), value (mean)."""

    def __init__(self, config: CountingConfig, num_envs: int = 1, **kwargs: Any) -> None:
        super().__init__(config, num_envs=num_envs, **kwargs)
        self.single_action_space = gym.spaces.Text(max_length=100)
        self.t = np.zeros(num_envs, np.int64)
        self.episodes = np.zeros(num_envs, np.int64)
        self.steps_total = 0
        self.length = config.episode_length + np.arange(num_envs)

    def reset(self, *, seed=None, options=None):
        self.seed_rngs(seed)
        mask = self.reset_mask(options)
        self.t[mask] = 0
        no_episode = np.zeros(self.num_envs, bool)
        if self.config.episodes_per_env:
            no_episode = mask & (self.episodes >= self.config.episodes_per_env)
        self.episodes[mask & ~no_episode] += 1
        texts = ["" if no_episode[i] else f"env {i} episode {self.episodes[i]}" for i in range(self.num_envs)]
        info: dict[str, Any] = {"env_instruction": [f"count for env {i}" for i in range(self.num_envs)]}
        if no_episode.any() or not self.config.no_episode_when_out_only:
            info["no_episode"] = no_episode
        return Observation(text=texts), info

    def step(self, actions):
        self.t += 1
        self.steps_total += 1
        n = self.num_envs
        modes = {"step": "sum", "step_max": "max", "step_first": "first"}
        if self.config.bad_mode:
            modes["step"] = self.config.bad_mode
        if self.config.switch_mode_at and self.steps_total >= self.config.switch_mode_at:
            modes["step"] = "last"
        info = {"metrics": {"step": self.t.astype(np.float64), "step_max": self.t.copy(), "step_first": self.t * 10,
                            "value": np.full(n, 2.0)},
                "metrics_agg_mode": modes}
        timeout = self.t >= self.length
        return (Observation(text=[f"t={t}" for t in self.t]), np.ones(n, np.float32), timeout, timeout.copy(), info)


@register_env("CountingFinite-v1", config=CountingConfig)
class CountingFiniteEnv(CountingEnv):
    """Counting-v1 that declares up front that its envs may run out of episodes."""

    metadata = {**CountingEnv.metadata, "finite_episodes": True}
