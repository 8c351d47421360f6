"""Template-v1: a point on the plane moves toward a goal. The env file to copy when writing your own.

Run it directly, with its id (in any case) first:
``python this_file.py Template-v1 --num-episodes 3 --local-policy random``.
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
from plugrl_env_client.utils.registration import register_env, register_env_config


@register_env_config("Template-v1")
@dataclasses.dataclass
class TemplateEnvConfig(BaseEnvConfig):
    step_size: float = 0.1
    """How far an action of norm 1 moves the point per step."""
    goal_radius: float = 0.1
    """The episode ends (terminated, reward 1) when the point is this close to the goal."""


@register_env("Template-v1", max_episode_steps=100, best_reward_threshold_for_success=1.0)
class TemplateEnv(BaseEnv[TemplateEnvConfig]):
    metadata = {**BaseEnv.metadata, "per_env_seeds": True}  # reset(seed=[...]) starts env i from seed[i]

    def __init__(self, config: TemplateEnvConfig, num_envs: int = 1, **kwargs: Any) -> None:
        super().__init__(config, num_envs=num_envs, **kwargs)
        self.single_action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.single_observation_space = observation_space(states={"pos": (2,), "goal": (2,)})
        self.pos = np.zeros((num_envs, 2))
        self.goal = np.zeros((num_envs, 2))

    def _observe(self) -> Observation:
        return Observation(states={"pos": self.pos.copy(), "goal": self.goal.copy()}, text="move to the goal")

    def reset(self, *, seed: int | list[int | None] | None = None,
              options: dict[str, Any] | None = None) -> tuple[Observation, dict]:
        self.seed_rngs(seed)  # seeds self.np_random when an int seed is given
        mask = self.reset_mask(options)  # the envs to reset: all of them unless options name some
        for i, rng in self.env_rngs(seed, mask):  # env i's start from its own seed: seed + i, or seed[i] of a list
            self.pos[i] = rng.uniform(-1.0, 1.0, 2)
            self.goal[i] = rng.uniform(-1.0, 1.0, 2)
        return self._observe(), {}  # every row; the rows not reset are unchanged

    def step(self, actions: Action) -> tuple[Observation, RewardArray, BoolArray, BoolArray, dict]:
        move = np.clip(np.asarray(actions, dtype=np.float64), -1.0, 1.0)
        self.pos += self.config.step_size * move
        distance = np.linalg.norm(self.goal - self.pos, axis=1)
        terminated = distance <= self.config.goal_radius
        reward = np.where(terminated, 1.0, -distance).astype(np.float32)
        truncated = np.zeros(self.num_envs, dtype=bool)  # the client applies the time limit
        return self._observe(), reward, terminated, truncated, {"distance": distance}  # per-env arrays in info


if __name__ == "__main__":
    from plugrl_env_client.cli import main

    main()
