"""Test-only env and policy for trajectory tests: a planar two-link arm whose fingertip must reach a goal, and a
reactive controller that steers it from what it sees.

Every row is computed on its own (no reduction across the batch) and each env draws its start from its own
generator, seeded per episode, so an episode is decided by its start seed and by the actions it gets. The policy
answers a chunk of the same action repeated (its horizon), computed from the observation it was asked with: what
it sees, and when, decides the trajectory, so a client that ends an env's chunks early or late changes the
episode. Episodes end on success (tip within ``goal_radius``) after 10 to 60 steps, so envs of a batch finish at
different steps. Loaded with ``--env-path``; the policy is ``--local-policy arm-reach``.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import gymnasium as gym
import numpy as np

from plugrl_env_client.envs.base_env import BaseEnv, BaseEnvConfig, Observation, observation_space
from plugrl_env_client.server import Policy, PolicySetup, register_policy
from plugrl_env_client.utils.registration import register_env, register_env_config

LINKS = (0.6, 0.4)


@register_env_config("Arm2D-v1")
@dataclasses.dataclass
class Arm2DConfig(BaseEnvConfig):
    dt: float = 0.1
    goal_radius: float = 0.08
    step_sleep_s: float = 0.0
    """Seconds each batch step sleeps, so that a run lasts long enough to be stopped in the middle."""


@register_env("Arm2D-v1", max_episode_steps=60)
class Arm2DEnv(BaseEnv[Arm2DConfig]):
    metadata = {**BaseEnv.metadata, "per_env_seeds": True}

    def __init__(self, config: Arm2DConfig, num_envs: int = 1, **kwargs: Any) -> None:
        super().__init__(config, num_envs=num_envs, **kwargs)
        self.single_action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.single_observation_space = observation_space(states={"q": (2,), "tip": (2,), "goal": (2,)})
        self.q = np.zeros((num_envs, 2))
        self.goal = np.zeros((num_envs, 2))

    def _observe(self) -> Observation:
        return Observation(states={"q": self.q.copy(), "tip": tip(self.q), "goal": self.goal.copy()})

    def reset(self, *, seed: Any = None, options: dict[str, Any] | None = None) -> tuple[Observation, dict[str, Any]]:
        self.seed_rngs(seed)
        mask = self.reset_mask(options)
        for i, rng in self.env_rngs(seed, mask):
            self.q[i] = rng.uniform(-np.pi, np.pi, 2)
            radius, angle = rng.uniform(0.3, 0.9) * sum(LINKS), rng.uniform(-np.pi, np.pi)
            self.goal[i] = (radius * np.cos(angle), radius * np.sin(angle))
        return self._observe(), {}

    def step(self, actions: Any) -> tuple[Observation, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        if self.config.step_sleep_s:
            time.sleep(self.config.step_sleep_s)
        self.q += self.config.dt * np.clip(np.asarray(actions, np.float64), -1.0, 1.0)
        dist = np.sqrt(((tip(self.q) - self.goal) ** 2).sum(axis=1))
        success = dist < self.config.goal_radius
        return (self._observe(), (-dist).astype(np.float32), success, np.zeros(self.num_envs, bool),
                {"success": success})


def tip(q: np.ndarray) -> np.ndarray:
    a, b = q[:, 0], q[:, 0] + q[:, 1]
    return np.stack([LINKS[0] * np.cos(a) + LINKS[1] * np.cos(b), LINKS[0] * np.sin(a) + LINKS[1] * np.sin(b)], 1)


@dataclasses.dataclass
class ArmReachConfig:
    gain: float = 6.0


@register_policy("arm-reach", config=ArmReachConfig)
class ArmReachPolicy(Policy):
    """Jacobian-transpose control toward the goal, held for the whole chunk."""

    def __init__(self, setup: PolicySetup, config: ArmReachConfig) -> None:
        super().__init__(setup)
        self.gain = config.gain

    def act(self, obs: dict[str, Any], n: int) -> np.ndarray:
        q, err = obs["states"]["q"], obs["states"]["goal"] - obs["states"]["tip"]
        a, b = q[:, 0], q[:, 0] + q[:, 1]
        dq0 = (-LINKS[0] * np.sin(a) - LINKS[1] * np.sin(b)) * err[:, 0] + (LINKS[0] * np.cos(a) + LINKS[1] * np.cos(b)) * err[:, 1]
        dq1 = -LINKS[1] * np.sin(b) * err[:, 0] + LINKS[1] * np.cos(b) * err[:, 1]
        act = np.clip(self.gain * np.stack([dq0, dq1], 1), self.low, self.high).astype(self.dtype)
        return np.broadcast_to(act, (self.horizon, n, *self.action_shape)).copy()
