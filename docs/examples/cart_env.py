"""Cart-v1: push a cart along a rail and stop it on a green mark. The worked example of docs/custom-environments.md.

Each of the ``num_envs`` carts sits on a rail from -1 to 1 with its own mark. An action in [-1, 1] pushes the cart
left or right; friction slows it down. The episode ends (terminated) when the cart rests on its mark, which is a
success, or when it falls off an end of the rail. The registered time limit cuts it after 200 steps otherwise.

Run it directly: ``python docs/examples/cart_env.py cart-v1 --num-episodes 3 --local-policy random``.
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
from plugrl_env_client.utils.registration import register_env

DT = 0.05
"""Seconds of simulated time per step."""
CAMERA_HEIGHT, CAMERA_WIDTH = 16, 64


@dataclasses.dataclass
class CartConfig(BaseEnvConfig):
    push: float = 2.0
    """Acceleration of an action of 1, in rail units per second squared."""
    friction: float = 0.5
    """Share of its speed the cart loses per second."""
    tolerance: float = 0.05
    """The cart rests on its mark when it is this close to it and slower than this."""
    camera: bool = True
    """Render a top view into images["camera"]; --env.camera False leaves the image out."""
    instruction: str = "Stop the cart on the green mark."
    """The text sent with every observation."""


@register_env("Cart-v1", max_episode_steps=200, config=CartConfig)
class CartEnv(BaseEnv[CartConfig]):
    """A cart on a rail must come to rest on a green mark."""

    def __init__(self, config: CartConfig, num_envs: int = 1, **kwargs: Any) -> None:
        super().__init__(config, num_envs=num_envs, **kwargs)
        self.single_action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        images = {"camera": (CAMERA_HEIGHT, CAMERA_WIDTH, 3)} if config.camera else {}
        self.single_observation_space = observation_space(images=images, states={"cart": (3,)})
        self.x = np.zeros(num_envs)  # position on the rail
        self.v = np.zeros(num_envs)  # velocity
        self.mark = np.zeros(num_envs)  # where the cart must stop

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Observation, dict]:
        self.seed_rngs(seed)  # seeds self.np_random when a seed is given
        mask = self.reset_mask(options)  # the envs to reset: all of them unless options name some
        k = int(mask.sum())
        self.x[mask] = self.np_random.uniform(-0.8, 0.8, k)
        self.v[mask] = 0.0
        self.mark[mask] = self.np_random.uniform(-0.8, 0.8, k)
        return self._observe(), {}  # every row; the rows not reset are unchanged

    def step(self, actions: Action) -> tuple[Observation, RewardArray, BoolArray, BoolArray, dict]:
        push = np.clip(np.asarray(actions, dtype=np.float64)[:, 0], -1.0, 1.0)
        self.v += DT * (self.config.push * push - self.config.friction * self.v)
        self.x += DT * self.v
        distance = np.abs(self.x - self.mark)
        success = (distance < self.config.tolerance) & (np.abs(self.v) < self.config.tolerance)
        fell = np.abs(self.x) > 1.0
        reward = np.where(success, 1.0, np.where(fell, -1.0, -distance)).astype(np.float32)
        terminated = success | fell
        truncated = np.zeros(self.num_envs, dtype=bool)  # the client applies the time limit
        info = {"success": success, "distance": distance}  # per-env arrays reach the server
        return self._observe(), reward, terminated, truncated, info

    def _observe(self) -> Observation:
        states = {"cart": np.stack([self.x, self.v, self.mark], axis=1)}
        images = {"camera": self._render()} if self.config.camera else {}
        return Observation(images=images, states=states, text=self.config.instruction)

    def _render(self) -> np.ndarray:
        """A top view, uint8 (n, 16, 64, 3): a grey rail, the mark as a green column, the cart as a red block."""
        n, h, w = self.num_envs, CAMERA_HEIGHT, CAMERA_WIDTH
        image = np.full((n, h, w, 3), 255, dtype=np.uint8)
        image[:, h // 2] = (128, 128, 128)
        column = np.arange(w)

        def to_column(x: np.ndarray) -> np.ndarray:
            return np.clip(np.rint((x + 1.0) / 2.0 * (w - 1)), 0, w - 1).astype(np.intp)

        image[np.arange(n), :, to_column(self.mark)] = (0, 160, 0)
        cart = np.abs(column - to_column(self.x)[:, None]) <= 2  # (n, w)
        body = image[:, h // 4 : 3 * h // 4]  # a view: writing to it draws into image
        body[np.broadcast_to(cart[:, None, :], body.shape[:3])] = (200, 0, 0)
        return image


if __name__ == "__main__":
    from plugrl_env_client.cli import main

    main()
