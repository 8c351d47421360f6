"""Test-only env whose code ends the process the ways libraries do: ``sys.exit(code)``, a ``KeyboardInterrupt`` of
its own, or another ``BaseException`` subclass, in the call a test picks.

Kept in an importable module (tests put this folder on sys.path) so spawned rollout processes can load it; the CLI
tests pass it with ``--env-path``.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

import gymnasium as gym
import numpy as np

from plugrl_env_client.envs.base_env import BaseEnv, BaseEnvConfig, Observation
from plugrl_env_client.utils.registration import register_env, register_env_config


class SimulatorAbort(BaseException):
    """What some simulators' bindings raise when their C side gives up: a BaseException, not an Exception."""


@register_env_config("Exiting-v1")
@dataclasses.dataclass
class ExitingConfig(BaseEnvConfig):
    call: str = "step"
    """The call that ends the process: __init__, reset, step or close."""
    how: str = "exit0"
    """exit0 (sys.exit(0)), exit2 (SystemExit(2), as argparse's error does), keyboard (KeyboardInterrupt) or base
    (a BaseException subclass)."""
    at_step: int = 5
    """With call=step: the step (counted per env object) that ends the process."""
    process: int = -1
    """Only the env of this process (needs --runner.pass-proc-id); -1: every process."""


def end_the_process(how: str) -> None:
    if how == "exit0":
        sys.exit(0)
    if how == "exit2":
        raise SystemExit(2)
    if how == "keyboard":
        raise KeyboardInterrupt
    if how == "base":
        raise SimulatorAbort("the simulator gave up")
    raise ValueError(f"unknown how {how!r}")


@register_env("Exiting-v1")
class ExitingEnv(BaseEnv[ExitingConfig]):
    def __init__(self, config: ExitingConfig, num_envs: int = 1, **kwargs: Any) -> None:
        super().__init__(config, num_envs=num_envs, **kwargs)
        self.single_action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.steps = 0
        self.t = np.zeros(num_envs)
        self._maybe_end("__init__")

    def _maybe_end(self, call: str) -> None:
        mine = self.config.process < 0 or self.process_id == self.config.process
        if mine and self.config.call == call:
            end_the_process(self.config.how)

    def _obs(self) -> Observation:
        return Observation(states={"t": self.t[:, None].copy()})

    def reset(self, *, seed=None, options=None):
        self._maybe_end("reset")
        self.seed_rngs(seed)
        self.t[self.reset_mask(options)] = 0
        return self._obs(), {}

    def step(self, actions):
        self.steps += 1
        if self.steps >= self.config.at_step:
            self._maybe_end("step")
        self.t += 1
        terminated = self.t >= 2
        return self._obs(), np.ones(self.num_envs, np.float32), terminated, np.zeros(self.num_envs, bool), {}

    def close(self) -> None:
        self._maybe_end("close")
