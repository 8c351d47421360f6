"""``plugrl-check-env``: the checklist from the command line, for built-ins, user files and broken envs."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from plugrl_env_client.check.cli import main

USER_ENV = '''
import dataclasses
import gymnasium as gym
import numpy as np
from plugrl_env_client.envs.base_env import BaseEnv, BaseEnvConfig, Observation
from plugrl_env_client.utils.registration import register_env, register_env_config


@register_env_config("Wobble-v1")
@dataclasses.dataclass
class WobbleConfig(BaseEnvConfig):
    gym_api: bool = False  # True: step returns the old gym 4-tuple


@register_env("Wobble-v1", max_episode_steps=10)
class WobbleEnv(BaseEnv[WobbleConfig]):
    def __init__(self, config, num_envs=1, **kwargs):
        super().__init__(config, num_envs=num_envs, **kwargs)
        self.single_action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.x = np.zeros((num_envs, 1))

    def reset(self, *, seed=None, options=None):
        self.seed_rngs(seed)
        mask = self.reset_mask(options)
        self.x[mask] = self.np_random.uniform(-1, 1, (int(mask.sum()), 1))
        return Observation(states={"x": self.x.copy()}), {}

    def step(self, actions):
        self.x += np.asarray(actions)
        n = self.num_envs
        obs, reward, done = Observation(states={"x": self.x.copy()}), np.zeros(n, np.float32), np.abs(self.x[:, 0]) > 3
        if self.config.gym_api:
            return obs, reward, done, {}
        return obs, reward, done, np.zeros(n, bool), {}
'''


def test_a_good_env_passes_every_rule(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["point-v1", "--num-envs", "3", "--env.step-size", "0.2", "--no-rollout"])
    out = capsys.readouterr().out
    assert exit_info.value.code == 0, out
    assert "check Point-v1 (num_envs=3" in out and "[FAIL]" not in out
    assert out.count("[PASS]") == 13 and "[SKIP] 14." in out and ": OK" in out


@pytest.mark.slow
def test_a_user_file_and_its_flags_through_env_path(tmp_path: Path) -> None:
    (tmp_path / "wobble_env.py").write_text(textwrap.dedent(USER_ENV))
    good = subprocess.run([sys.executable, "-m", "plugrl_env_client.check.cli", "wobble-v1", "--env-path",
                           str(tmp_path)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert good.returncode == 0, good.stdout + good.stderr
    assert "[PASS] 14." in good.stdout
    broken = subprocess.run([sys.executable, "-m", "plugrl_env_client.check.cli", "wobble-v1", "--env-path",
                             str(tmp_path), "--env.gym-api", "True"], capture_output=True, text=True, timeout=120,
                            cwd=tmp_path)
    assert broken.returncode == 1, broken.stdout + broken.stderr
    assert "[FAIL]  5." in broken.stdout
    assert "got 4" in broken.stdout and "old gym API" in broken.stdout
    assert "Traceback" not in broken.stderr


def test_an_unknown_env_is_one_line_and_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["pont-v1"])
    assert exit_info.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith("error: Unknown env id 'pont-v1'. Did you mean 'Point-v1'")
