"""Test-only env shaped like LIBERO-v1 for openpi's protocol: two cameras ``agentview`` and ``wrist`` (not square,
so they are resized with padding), an 8-d ``state``, an instruction, 7-d actions.

Every pixel is a function of the env's row, its step in the episode and its place (:func:`openpi_pixels.camera`), and
``state[:2]`` holds that row and step, so a policy that gets the request can build the image the env rendered and
check what arrived. The reward of a step is the first action component, so an episode's return shows which
actions the env executed. Episodes last ``LENGTH`` steps. Loaded with ``--env-path``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import gymnasium as gym
import numpy as np
from openpi_pixels import HEIGHT, INSTRUCTION, LENGTH, WIDTH, camera

from plugrl_env_client.envs.base_env import BaseEnv, BaseEnvConfig, Observation, observation_space
from plugrl_env_client.utils.registration import register_env, register_env_config


@register_env_config("OpenpiCams-v1")
@dataclasses.dataclass
class OpenpiCamsConfig(BaseEnvConfig):
    pass


@register_env("OpenpiCams-v1", max_episode_steps=100)
class OpenpiCamsEnv(BaseEnv[OpenpiCamsConfig]):
    def __init__(self, config: OpenpiCamsConfig, num_envs: int = 1, **kwargs: Any) -> None:
        super().__init__(config, num_envs=num_envs, **kwargs)
        self.single_action_space = gym.spaces.Box(-1.0, 1.0, (7,), np.float32)
        self.single_observation_space = observation_space(
            images={"agentview": (HEIGHT, WIDTH, 3), "wrist": (HEIGHT, WIDTH, 3)},
            states={"state": np.zeros(8, np.float32)})
        self.steps = np.zeros(num_envs, np.int64)

    def _observe(self) -> Observation:
        rows = range(self.num_envs)
        state = np.zeros((self.num_envs, 8), np.float32)
        state[:, 0], state[:, 1] = np.arange(self.num_envs), self.steps
        return Observation(images={"agentview": np.stack([camera(i, int(self.steps[i])) for i in rows]),
                                   "wrist": np.stack([camera(i, int(self.steps[i]), True) for i in rows])},
                           states={"state": state}, text=INSTRUCTION)

    def reset(self, *, seed: Any = None, options: dict[str, Any] | None = None) -> tuple[Observation, dict[str, Any]]:
        self.steps[self.reset_mask(options)] = 0
        return self._observe(), {}

    def step(self, actions: Any) -> tuple[Observation, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        self.steps += 1
        rewards = np.asarray(actions, np.float32)[:, 0].copy()
        return self._observe(), rewards, self.steps >= LENGTH, np.zeros(self.num_envs, bool), {}
