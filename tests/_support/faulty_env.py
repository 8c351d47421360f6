"""Test-only env that raises in ``step`` on a chosen process and step, for failure-path tests.

Kept in an importable module (tests put this folder on sys.path) so spawned rollout processes can load it.
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


@register_env_config("Faulty-v1")
@dataclasses.dataclass
class FaultyConfig(BaseEnvConfig):
    fail_process: int = 0
    """Process id whose env raises (-1: none)."""
    fail_at_step: int = 5
    episode_length: int = 2
    reward_shape_bug: bool = False
    """Return a scalar reward instead of one per env."""
    init_log: str = ""
    """If set, append '<start> <end>' wall times of each constructor to this file (it sleeps init_sleep_s)."""
    init_sleep_s: float = 0.0
    hard_kill: bool = False
    """Die by SIGKILL instead of raising (no Python cleanup at all)."""
    sigterm_self: bool = False
    """Send SIGTERM to its own process (as if something outside stopped just this process)."""
    fail_in_init: bool = False
    """Raise in the constructor (a simulator that cannot start)."""
    hang_process: int = -1
    """Process id whose env hangs at hang_at_step, deaf to SIGINT/SIGTERM (a simulator stuck in C code; -1: none)."""
    hang_at_step: int = 3
    hang_marker: str = ""
    """With hang_process: a file the hanging env creates as it hangs; the failing env fails only once it exists."""


@register_env("Faulty-v1")
class FaultyEnv(BaseEnv[FaultyConfig]):
    def __init__(self, config: FaultyConfig, num_envs: int = 1, **kwargs: Any) -> None:
        super().__init__(config, num_envs=num_envs, **kwargs)
        if config.fail_in_init:
            raise OSError("simulator license not found")
        if config.init_log:
            start = time.time()
            time.sleep(config.init_sleep_s)
            with open(config.init_log, "a") as f:
                f.write(f"{start} {time.time()}\n")
        self.single_action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.steps = 0
        self.t = np.zeros(num_envs)

    def _obs(self) -> Observation:
        return Observation(states={"t": self.t[:, None].copy()})

    def reset(self, *, seed=None, options=None):
        self.seed_rngs(seed)
        self.t[self.reset_mask(options)] = 0
        return self._obs(), {}

    def step(self, actions):
        self.steps += 1
        if self.process_id == self.config.hang_process and self.steps >= self.config.hang_at_step:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            if self.config.hang_marker:
                open(self.config.hang_marker, "w").close()
            time.sleep(600)
        hung = not self.config.hang_marker or os.path.exists(self.config.hang_marker)
        if self.process_id == self.config.fail_process and self.steps >= self.config.fail_at_step and hung:
            if self.config.hard_kill:
                os.kill(os.getpid(), signal.SIGKILL)
            if self.config.sigterm_self:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)  # the handler interrupts this sleep
            raise RuntimeError(f"simulated simulator crash at step {self.steps}")
        self.t += 1
        reward = np.float32(1.0) if self.config.reward_shape_bug else np.ones(self.num_envs, np.float32)
        terminated = self.t >= self.config.episode_length
        return self._obs(), reward, terminated, np.zeros(self.num_envs, bool), {}
