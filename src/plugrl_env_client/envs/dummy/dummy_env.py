"""Dummy-v1: camera-sized images, states and text at almost no simulation cost, for throughput and wire tests.

The images are drawn once per env at reset and only marked by a cheap per-step counter, so a step costs one
copy of the image buffers (observations never alias env state), not fresh random megabytes.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any

import gymnasium as gym
import numpy as np
import tyro

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


@register_env_config("Dummy-v1")
@dataclasses.dataclass
class DummyEnvConfig(BaseEnvConfig):
    base_image_size: int = 224
    """Height and width of images['base']."""
    wrist_image_size: int = 112
    """Height and width of images['wrist']."""
    robot_state_dim: int = 10
    """Length of states['robot_state']."""
    joint_angles_dim: int = 5
    """Length of states['joint_angles']."""
    action_dim: int = 7
    """Length of the action vector (float32 in [-1, 1])."""
    terminated_prob: float = 0.01
    """Probability that an env terminates on a step."""
    text: str = "do something useful"
    """Instruction text sent with every observation."""
    img_width: Annotated[int | None, tyro.conf.arg(help_behavior_hint="(default: img_height, or base_image_size)")
                         ] = None
    """PlugRL's name: images['base'] is img_height x img_width and images['wrist'] half of each (overrides the sizes
    above when given)."""
    img_height: Annotated[int | None, tyro.conf.arg(help_behavior_hint="(default: img_width, or base_image_size)")
                          ] = None
    """PlugRL's name; see img_width."""
    state_dim: Annotated[int | None, tyro.conf.arg(help_behavior_hint="(default: robot_state_dim)")] = None
    """PlugRL's name: robot_state_dim = state_dim and joint_angles_dim = state_dim // 2 (when given)."""

    def shapes(self) -> tuple[tuple[int, int], tuple[int, int], int, int]:
        """(base h, w), (wrist h, w), robot_state dim, joint_angles dim, with PlugRL's names taking precedence."""
        if self.img_width is None and self.img_height is None:
            base = (self.base_image_size, self.base_image_size)
            wrist = (self.wrist_image_size, self.wrist_image_size)
        else:
            width = self.img_width or self.img_height or self.base_image_size
            height = self.img_height or width
            base, wrist = (height, width), (max(height // 2, 1), max(width // 2, 1))
        if self.state_dim is None:
            return base, wrist, self.robot_state_dim, self.joint_angles_dim
        return base, wrist, self.state_dim, self.state_dim // 2


@register_env("Dummy-v1")
class DummyEnv(BaseEnv[DummyEnvConfig]):
    metadata = {**BaseEnv.metadata, "per_env_seeds": True}  # reset(seed=[...]) starts env i from seed[i]

    def __init__(self, config: DummyEnvConfig, num_envs: int = 1, **kwargs: Any) -> None:
        super().__init__(config, num_envs=num_envs, **kwargs)
        c = config
        base, wrist, robot_dim, joint_dim = c.shapes()
        self.single_action_space = gym.spaces.Box(-1.0, 1.0, (c.action_dim,), np.float32)
        self.single_observation_space = observation_space(
            images={"base": (*base, 3), "wrist": (*wrist, 3)},
            states={"robot_state": (robot_dim,), "joint_angles": (joint_dim,)},
        )
        self.base = np.zeros((num_envs, *base, 3), np.uint8)
        self.wrist = np.zeros((num_envs, *wrist, 3), np.uint8)
        self.robot_state = np.zeros((num_envs, robot_dim))
        self.joint_angles = np.zeros((num_envs, joint_dim))
        self.steps = np.zeros(num_envs, np.int64)

    def _observe(self) -> Observation:
        return Observation(
            images={"base": self.base.copy(), "wrist": self.wrist.copy()},
            states={"robot_state": self.robot_state.copy(), "joint_angles": self.joint_angles.copy()},
            text=self.config.text,
        )

    def reset(self, *, seed: int | list[int | None] | None = None,
              options: dict[str, Any] | None = None) -> tuple[Observation, dict]:
        self.seed_rngs(seed)
        mask = self.reset_mask(options)
        for i, rng in self.env_rngs(seed, mask):  # env i's start from its own seed
            self.base[i] = rng.integers(0, 256, (1, 1, 3), dtype=np.uint8)
            self.wrist[i] = rng.integers(0, 256, (1, 1, 3), dtype=np.uint8)
            self.robot_state[i] = rng.standard_normal(self.robot_state.shape[1])
            self.joint_angles[i] = rng.uniform(-np.pi, np.pi, self.joint_angles.shape[1])
        self.steps[mask] = 0
        return self._observe(), {}

    def step(self, actions: Action) -> tuple[Observation, RewardArray, BoolArray, BoolArray, dict]:
        actions = np.asarray(actions, dtype=np.float64)
        self.steps += 1
        self.base[:, 0, 0, 0] = self.steps.astype(np.uint8)
        self.robot_state[:, : min(actions.shape[1], self.robot_state.shape[1])] += 0.01 * actions[:, : self.robot_state.shape[1]]
        reward = self.np_random.random(self.num_envs).astype(np.float32)
        terminated = self.np_random.random(self.num_envs) < self.config.terminated_prob
        return self._observe(), reward, terminated, np.zeros(self.num_envs, dtype=bool), {}

