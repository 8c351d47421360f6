"""A registered env's time limit for plain Gymnasium code (``gymnasium.make_vec(uid)``).

The runner counts episode steps itself (``--runner.max-episode-steps``, default the registered limit). Code that
builds an env with ``gymnasium.make_vec`` has no runner, so the registry wraps the env in :class:`EpisodeTimeLimit`,
the vector counterpart of Gymnasium's ``TimeLimit``: an env reaching the limit reports ``truncated`` (unless it
terminated on that step), and its count restarts when the caller resets it.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from plugrl_env_client.envs.base_env import reset_mask_of


class EpisodeTimeLimit(gym.vector.VectorWrapper):
    """Truncate each env's episode after ``max_episode_steps`` steps (the caller resets it, as always)."""

    def __init__(self, env: gym.vector.VectorEnv, max_episode_steps: int) -> None:
        super().__init__(env)
        if max_episode_steps < 1:
            raise ValueError(f"max_episode_steps must be >= 1, got {max_episode_steps}")
        self.max_episode_steps = int(max_episode_steps)
        self.elapsed = np.zeros(env.num_envs, np.int64)

    def reset(self, *, seed: Any = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        self.elapsed[reset_mask_of(options, self.num_envs)] = 0
        return self.env.reset(seed=seed, options=options)

    def step(self, actions: Any) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        obs, rewards, terminated, truncated, info = self.env.step(actions)
        self.elapsed += 1
        truncated = np.asarray(truncated, dtype=bool) | ((self.elapsed >= self.max_episode_steps)
                                                          & ~np.asarray(terminated, dtype=bool))
        return obs, rewards, terminated, truncated, info
