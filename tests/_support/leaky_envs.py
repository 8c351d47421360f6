"""Test-only envs that leave something behind when a run ends: a ``close()`` that raises, and a thread that never
ends. Both run episodes of two steps; they register themselves when imported (``--env-path`` this file).
"""

from __future__ import annotations

import threading
from typing import Any

import gymnasium as gym
import numpy as np

from plugrl_env_client.envs.base_env import BaseEnv, BaseEnvConfig, Observation
from plugrl_env_client.utils.registration import register_env

THREAD_NAME = "sim-worker"


class TwoStepEnv(BaseEnv[BaseEnvConfig]):
    def __init__(self, config: BaseEnvConfig, num_envs: int = 1, **kwargs: Any) -> None:
        super().__init__(config, num_envs=num_envs, **kwargs)
        self.single_action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.t = np.zeros(num_envs)

    def _obs(self) -> Observation:
        return Observation(states={"t": self.t[:, None].copy()})

    def reset(self, *, seed: Any = None, options: dict[str, Any] | None = None) -> Any:
        self.t[self.reset_mask(options)] = 0
        return self._obs(), {}

    def step(self, actions: np.ndarray) -> Any:
        self.t += 1
        n = self.num_envs
        return self._obs(), np.ones(n, np.float32), self.t >= 2, np.zeros(n, bool), {}


@register_env("BadClose-v1")
class BadCloseEnv(TwoStepEnv):
    def close(self) -> None:
        raise RuntimeError("simulator already gone")


@register_env("Lingering-v1")
class LingeringEnv(TwoStepEnv):
    """Starts a non-daemon thread that waits forever (a simulator's worker nobody stops)."""

    def __init__(self, config: BaseEnvConfig, num_envs: int = 1, **kwargs: Any) -> None:
        super().__init__(config, num_envs=num_envs, **kwargs)
        threading.Thread(target=threading.Event().wait, name=THREAD_NAME).start()
