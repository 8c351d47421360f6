"""examples/pusht: the PushT-v1 env file, run as a user runs it, and its env checked directly."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from extras import need
from file_modules import imported

need("gym_pusht")

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "pusht" / "pusht_env.py"


@pytest.fixture
def pusht(registry: None) -> Iterator[ModuleType]:
    """The example file imported as a module (its envs are unregistered again afterwards by ``registry``)."""
    with imported(EXAMPLE, "pusht_env_under_test") as module:
        yield module


def make(pusht: ModuleType, n: int, **fields: Any) -> Any:
    return pusht.PushTEnv(pusht.PushTConfig(**fields), num_envs=n)


@pytest.mark.slow
def test_the_readme_command_runs(tmp_path: Path) -> None:
    cmd = [sys.executable, str(EXAMPLE), "pusht-v1", "--num-episodes", "2", "--local-policy", "random",
           "--output-dir", str(tmp_path), "--exp-name", "pusht", "--runner.max-episode-steps", "20"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads((tmp_path / "pusht" / "summary.json").read_text())
    assert summary["completed_episodes"] == 2
    assert 1 <= summary["mean_length"] <= 20
    assert summary["mean_success_rate"] is not None  # judged from the env's info["success"]


@pytest.mark.slow
def test_observations_and_spaces(pusht: ModuleType) -> None:
    env = make(pusht, 3)
    try:
        assert env.single_action_space.shape == (2,) and env.single_action_space.dtype == np.float32
        assert float(env.single_action_space.low.min()) == 0.0 and float(env.single_action_space.high.max()) == 512.0
        obs, _ = env.reset(seed=0)
        pixels, agent = obs.images["pixels"], obs.states["agent_pos"]
        assert pixels.dtype == np.uint8 and pixels.shape == (3, 96, 96, 3)
        assert agent.dtype == np.float32 and agent.shape == (3, 2) and ((agent >= 0) & (agent <= 512)).all()
        assert list(obs.text) == [pusht.PushTConfig().instruction] * 3
        obs, rewards, terminated, truncated, info = env.step(np.full((3, 2), 256.0, np.float32))
        assert rewards.dtype == np.float32 and rewards.shape == (3,)
        assert info["success"].dtype == np.bool_ and info["success"].shape == (3,)
        np.testing.assert_array_equal(info["success"], info["is_success"])
        assert not truncated.any()  # no inner time limit: the client owns it
        # the pusher moves toward the commanded (256, 256)
        assert (np.abs(obs.states["agent_pos"] - 256) <= np.abs(agent - 256) + 1e-3).all()
    finally:
        env.close()


def test_image_size_is_configurable(pusht: ModuleType) -> None:
    env = make(pusht, 1, image_size=64)
    try:
        assert env.reset(seed=0)[0].images["pixels"].shape == (1, 64, 64, 3)
    finally:
        env.close()


def test_partial_reset_keeps_other_rows_and_seeds_reproduce(pusht: ModuleType) -> None:
    env, twin = make(pusht, 3), make(pusht, 3)
    try:
        start, _ = env.reset(seed=4)
        np.testing.assert_array_equal(twin.reset(seed=4)[0].images["pixels"], start.images["pixels"])
        for k in range(3):
            before, *_ = env.step(np.full((3, 2), 100.0 + 100 * k, np.float32))
        mask = np.array([True, False, True])
        after, _ = env.reset(options={"reset_mask": mask, "reset_indices": np.flatnonzero(mask)})
        np.testing.assert_array_equal(after.images["pixels"][1], before.images["pixels"][1])
        np.testing.assert_array_equal(after.states["agent_pos"][1], before.states["agent_pos"][1])
        for i in (0, 2):
            assert not np.array_equal(after.images["pixels"][i], before.images["pixels"][i])
    finally:
        env.close()
        twin.close()


def test_success_is_reported(pusht: ModuleType) -> None:
    """Start with the block on the target: the first step is a success and ends the episode."""
    env = make(pusht, 2)
    try:
        env.reset(seed=0)
        inner = env.envs.envs[0].unwrapped
        goal = np.asarray(inner.goal_pose, dtype=float)  # x, y, angle of the target
        # gym-pusht sets the block's position first and its angle second, which turns the block about its centre
        # of gravity (in block coordinates); place it where that turn brings it onto the target.
        cog = np.asarray(inner.block.center_of_gravity, dtype=float)
        c, s = np.cos(goal[2]), np.sin(goal[2])
        position = goal[:2] - (cog - np.array([[c, -s], [s, c]]) @ cog)
        agent = np.array([60.0, 60.0])  # far from the block
        state = [*agent, *position, goal[2]]
        env.reset(options={"reset_to_state": state})
        _, rewards, terminated, _, info = env.step(np.tile(agent.astype(np.float32), (2, 1)))
        assert info["success"].all() and terminated.all()
        np.testing.assert_allclose(rewards, 1.0)
    finally:
        env.close()
