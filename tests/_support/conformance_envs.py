"""Test-only env for the conformance-gap tests: observations with text only (no images, no states).

``TextOnly-v1`` env ``i`` shows ``"env <i> t <t>"`` as its text, so a harness can tell rows apart and check their
order. Its step info holds a per-env array, a value that cannot be split per env and a nested map with an integer
key, so a harness can check what the client forwards. ``slow_first_step_s`` makes the first ``step`` call block,
and ``slow_reset_s`` every ``reset`` after the first, to check that the client keeps its connection alive while its
envs step and reset.

Kept in an importable module (tests put this folder on sys.path) so spawned rollout processes can load it.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import gymnasium as gym
import numpy as np

from plugrl_env_client.envs.base_env import BaseEnv, BaseEnvConfig, Observation
from plugrl_env_client.utils.registration import register_env, register_env_config

ACTION_DIM = 2


def episode_lengths(num_envs: int) -> np.ndarray:
    """Env i's episode lasts 2 + (i % 2) steps."""
    return 2 + np.arange(num_envs) % 2


@register_env_config("TextOnly-v1")
@dataclasses.dataclass
class TextOnlyConfig(BaseEnvConfig):
    slow_first_step_s: float = 0.0
    """Seconds the first step() call sleeps (the client's main thread is busy meanwhile)."""
    slow_reset_s: float = 0.0
    """Seconds every reset() call but the first sleeps (the partial resets of finished envs)."""
    step_s: float = 0.0
    """Seconds every step() call sleeps."""
    episode_length: int = 0
    """Steps of every episode (0: env i's last 2 + i % 2)."""


@register_env("TextOnly-v1")
class TextOnlyEnv(BaseEnv):
    def __init__(self, config: TextOnlyConfig, num_envs: int = 1, **kwargs: Any) -> None:
        super().__init__(config, num_envs=num_envs, **kwargs)
        self.single_action_space = gym.spaces.Box(-1.0, 1.0, (ACTION_DIM,), np.float32)
        self.t = np.zeros(num_envs, dtype=np.int64)
        self.lengths = episode_lengths(num_envs) if not config.episode_length else np.full(num_envs, config.episode_length)
        self.steps = self.resets = 0

    def _obs(self) -> Observation:
        return Observation(text=[f"env {i} t {t}" for i, t in enumerate(self.t.tolist())])

    def reset(self, *, seed=None, options=None):
        if self.resets > 0 and self.config.slow_reset_s > 0:
            time.sleep(self.config.slow_reset_s)
        self.resets += 1
        self.seed_rngs(seed)
        self.t[self.reset_mask(options)] = 0
        return self._obs(), {}

    def step(self, actions):
        if self.steps == 0 and self.config.slow_first_step_s > 0:
            time.sleep(self.config.slow_first_step_s)
        if self.config.step_s > 0:
            time.sleep(self.config.step_s)
        self.steps += 1
        self.t += 1
        ids = np.arange(self.num_envs)
        info = {
            "env": ids.astype(np.float64),  # per env: forwarded, cut to the feedback's rows
            "scalar": 1.0,  # cannot be split per env: left out
            "nested": {7: ids * 10, "note": "text"},  # int key of an array: sent as "7"
            2: {"deep": ids + 100},  # int key of a map: sent as "2"
        }
        terminated = self.t >= self.lengths
        return self._obs(), np.ones(self.num_envs, np.float32), terminated, np.zeros(self.num_envs, bool), info


@register_env_config("EchoText-v1")
@dataclasses.dataclass
class EchoTextConfig(BaseEnvConfig):
    episode_length: int = 4


@register_env("EchoText-v1")
class EchoTextEnv(BaseEnv):
    """Text actions in, the same text out as the observation: shows what a language-agent env receives."""

    def __init__(self, config: EchoTextConfig, num_envs: int = 1, **kwargs: Any) -> None:
        super().__init__(config, num_envs=num_envs, **kwargs)
        self.single_action_space = gym.spaces.Text(max_length=64)
        self.t = np.zeros(num_envs, np.int64)
        self.last = np.array([""] * num_envs, dtype="<U64")

    def reset(self, *, seed=None, options=None):
        self.seed_rngs(seed)
        mask = self.reset_mask(options)
        self.t[mask] = 0
        self.last[mask] = ""
        return Observation(text=self.last.copy()), {}

    def step(self, actions):
        self.last[:] = np.asarray(actions, dtype=str)
        self.t += 1
        terminated = self.t >= self.config.episode_length
        return Observation(text=self.last.copy()), np.zeros(self.num_envs, np.float32), terminated, np.zeros(self.num_envs, bool), {}
