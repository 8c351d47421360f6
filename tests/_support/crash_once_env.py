"""Test-only env for the Ray launcher: short episodes with seed-dependent returns, and a process that SIGKILLs
itself once (remembered through a marker file, so the restarted process runs on).

Loaded with ``--env-path`` (it is uploaded to Ray workers like any user env file); ``--runner.pass-proc-id true``
tells it which process it is.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from typing import Any

import gymnasium as gym
import numpy as np

from plugrl_env_client.envs.base_env import BaseEnv, BaseEnvConfig, Observation
from plugrl_env_client.utils.registration import register_env, register_env_config


@register_env_config("CrashOnce-v1")
@dataclasses.dataclass
class CrashOnceConfig(BaseEnvConfig):
    episode_length: int = 3
    kill_process: int = -1
    """Process whose env kills its own process (-1: none)."""
    kill_after_steps: int = 10
    marker: str = ""
    """The kill happens only while this file does not exist; the env creates it just before."""
    step_sleep_s: float = 0.0
    """Seconds each step takes (to keep a run going while a test acts on it)."""


@register_env("CrashOnce-v1")
class CrashOnceEnv(BaseEnv[CrashOnceConfig]):
    def __init__(self, config: CrashOnceConfig, num_envs: int = 1, **kwargs: Any) -> None:
        super().__init__(config, num_envs=num_envs, **kwargs)
        self.single_action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.steps = 0
        self.t = np.zeros(num_envs)
        self.reward = np.zeros(num_envs, np.float32)  # per episode, drawn at reset: returns reveal the seeds

    def reset(self, *, seed=None, options=None):
        self.seed_rngs(seed)
        mask = self.reset_mask(options)
        self.t[mask] = 0
        self.reward[mask] = self.np_random.uniform(0.0, 1.0, int(mask.sum()))
        return Observation(states={"t": self.t[:, None].copy()}), {}

    def step(self, actions):
        self.steps += 1
        cfg = self.config
        if self.process_id == cfg.kill_process and self.steps >= cfg.kill_after_steps and not os.path.exists(cfg.marker):
            with open(cfg.marker, "w") as f:
                f.write(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGKILL)
        if cfg.step_sleep_s:
            time.sleep(cfg.step_sleep_s)
        self.t += 1
        terminated = self.t >= cfg.episode_length
        return (Observation(states={"t": self.t[:, None].copy()}), self.reward.copy(), terminated,
                np.zeros(self.num_envs, bool), {})
