"""Test-only env for the Ray launcher tests: short episodes with seed-dependent returns, a process that SIGKILLs
itself once, and a gate that holds every process at a given step until the test lets it go.

A test that kills an actor, removes a node or signals the driver must act while the run is collecting, and (for
exact totals) before the other processes could finish without the one it hits. Timing cannot promise that on a
loaded machine; the gate does: each process writes ``held-<process id>`` in the gate folder when its env reaches
``hold_after_steps`` and then waits, inside that step, until the test creates ``open`` there. The test acts once
it sees the files it waits for, and opens the gate when the run has taken in what it did. A process left waiting
(its test died) gives up after ``hold_timeout_s`` with an error, so no run waits for ever.

Loaded with ``--env-path`` (it is uploaded to Ray workers like any user env file); ``--runner.pass-proc-id true``
tells it which process it is. All files live on one machine's disk: the test cluster's nodes are on this machine.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from plugrl_env_client.envs.base_env import BaseEnv, BaseEnvConfig, Observation
from plugrl_env_client.utils.registration import register_env, register_env_config

POLL_S = 0.01
"""How often a held process looks for the ``open`` file."""


@register_env_config("RayGated-v1")
@dataclasses.dataclass
class RayGatedConfig(BaseEnvConfig):
    episode_length: int = 3
    gate: str = ""
    """Folder of the files through which the test and the processes meet (needed by a kill or a hold)."""
    kill_process: int = -1
    """Process whose env kills its own process once, at its ``kill_after_steps``-th step (-1: none). Once: the
    kill happens only while the ``killed`` file does not exist, and the env writes it just before."""
    kill_after_steps: int = 4
    exit_process: int = -1
    """Process whose env calls ``sys.exit(0)`` at its ``kill_after_steps``-th step (-1: none): env code that ends
    the process, which must fail the run rather than end an actor's thread unnoticed."""
    hold_after_steps: int = 0
    """Every process holds in this step of its env (each env instance once; 0: never), until the gate is open."""
    hold_timeout_s: float = 180.0

    def held_file(self, process_id: int) -> Path:
        """Written by process ``process_id`` when it starts to hold (again by each new epoch of it that holds)."""
        return Path(self.gate) / f"held-{process_id}"

    def open_file(self) -> Path:
        """Created by the test: held processes go on, and later ones do not hold."""
        return Path(self.gate) / "open"

    def killed_file(self) -> Path:
        """Written by the process that kills itself, just before (its pid)."""
        return Path(self.gate) / "killed"


@register_env("RayGated-v1")
class RayGatedEnv(BaseEnv[RayGatedConfig]):
    def __init__(self, config: RayGatedConfig, num_envs: int = 1, **kwargs: Any) -> None:
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
        if self.process_id == cfg.kill_process and self.steps == cfg.kill_after_steps and not cfg.killed_file().exists():
            _write(cfg.killed_file(), str(os.getpid()))
            os.kill(os.getpid(), signal.SIGKILL)
        if self.process_id == cfg.exit_process and self.steps == cfg.kill_after_steps:
            sys.exit(0)
        if self.steps == cfg.hold_after_steps:
            self._hold()
        self.t += 1
        terminated = self.t >= cfg.episode_length
        return (Observation(states={"t": self.t[:, None].copy()}), self.reward.copy(), terminated,
                np.zeros(self.num_envs, bool), {})

    def _hold(self) -> None:
        """Say this process holds, then wait until the test opens the gate (or give up with an error)."""
        cfg = self.config
        if cfg.open_file().exists():
            return
        _write(cfg.held_file(-1 if self.process_id is None else self.process_id), str(os.getpid()))
        deadline = time.monotonic() + cfg.hold_timeout_s
        while not cfg.open_file().exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"the gate {cfg.gate} was not opened within {cfg.hold_timeout_s:g} s")
            time.sleep(POLL_S)


def _write(path: Path, text: str) -> None:
    """Whole or not at all (a reader never sees a half-written file), in a folder made if needed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(f".{path.name}.{os.getpid()}")
    part.write_text(text)
    os.replace(part, path)
