"""Test-only env for resumed runs: every episode is decided by its start seed alone, and says which seed it was.

Env i draws its episode at reset from its own seed (it takes per-env seeds): a length of 2..9 steps and a reward
per step, so an episode's (seed, return, length) is the same in every run that starts it from that seed, and
episodes of different lengths make the envs of a batch finish at different steps. Each step sleeps
``step_sleep_s`` so that a run lasts long enough to be stopped in the middle. Every process that builds the env
writes its pid to ``pid_dir`` (``pid-<pid>``), for the tests that kill a rollout process. With
``hold_after_episodes`` N, an env batch that has finished N episodes holds in its next step while the file
``pid_dir/closed`` exists (a test acts on a run that is surely alive, then removes it), for at most
``hold_timeout_s``.

Loaded with ``--env-path``; any policy works (the actions are ignored).
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from plugrl_env_client.envs.base_env import BaseEnv, BaseEnvConfig, Observation
from plugrl_env_client.utils.registration import register_env, register_env_config


@register_env_config("SeededLength-v1")
@dataclasses.dataclass
class SeededLengthConfig(BaseEnvConfig):
    step_sleep_s: float = 0.002
    pid_dir: str = ""
    hold_after_episodes: int = 0
    hold_timeout_s: float = 120.0


@register_env("SeededLength-v1")
class SeededLengthEnv(BaseEnv[SeededLengthConfig]):
    metadata = {**BaseEnv.metadata, "per_env_seeds": True}

    def __init__(self, config: SeededLengthConfig, num_envs: int = 1, **kwargs: Any) -> None:
        super().__init__(config, num_envs=num_envs, **kwargs)
        self.single_action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.t = np.zeros(num_envs, np.int64)
        self.length = np.ones(num_envs, np.int64)
        self.reward = np.zeros(num_envs, np.float32)
        self.finished = 0
        if config.pid_dir:
            (Path(config.pid_dir) / f"pid-{os.getpid()}").write_text(str(os.getpid()))

    def _obs(self) -> Observation:
        return Observation(states={"t": self.t[:, None].astype(np.float32)})

    def reset(self, *, seed=None, options=None):
        self.seed_rngs(seed)
        mask = self.reset_mask(options)
        for i, rng in self.env_rngs(seed, mask):
            self.length[i] = rng.integers(2, 10)
            self.reward[i] = rng.uniform(0.0, 1.0)
        self.t[mask] = 0
        return self._obs(), {}

    def step(self, actions):
        if 0 < self.config.hold_after_episodes <= self.finished:
            closed, deadline = Path(self.config.pid_dir) / "closed", time.monotonic() + self.config.hold_timeout_s
            while closed.exists():
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{closed} was not removed within {self.config.hold_timeout_s} s")
                time.sleep(0.01)
        time.sleep(self.config.step_sleep_s)
        self.t += 1
        terminated = self.t >= self.length
        self.finished += int(terminated.sum())
        return self._obs(), self.reward.copy(), terminated, np.zeros(self.num_envs, bool), {}
