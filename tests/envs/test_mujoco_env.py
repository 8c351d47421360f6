"""MuJoCo-v1 on both backends, and the EnvPool reset behaviour its envpool backend is built around."""

from __future__ import annotations

import importlib.util
import json
import logging
import sys
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from client_runs import check_run_of_one_process
from extras import need

from plugrl_env_client.envs.mujoco.mujoco_env import (
    MujocoEnv,
    MujocoEnvConfig,
    envpool_task,
    import_envpool,
)
from plugrl_env_client.errors import ConfigError

need("mujoco")
HAS_ENVPOOL = importlib.util.find_spec("envpool") is not None  # not imported here: import_envpool must come first
needs_envpool = pytest.mark.skipif(not HAS_ENVPOOL, reason="envpool is not installed")
BACKENDS = ["gymnasium", pytest.param("envpool", marks=needs_envpool)]

# The start states of the tasks: HalfCheetah-v5 draws its 8 observed joint positions within +-0.1 of 0;
# Hopper-v5 draws its whole observation within +-0.005 of (1.25, 0, ..., 0).
OBS_DIM = {"HalfCheetah-v5": 17, "Hopper-v5": 11}
ACTION_DIM = {"HalfCheetah-v5": 6, "Hopper-v5": 3}


def is_fresh_start(task: str, rows: np.ndarray) -> bool:
    if task == "Hopper-v5":
        centre = np.zeros(11, np.float32)
        centre[0] = 1.25
        return bool((np.abs(rows - centre) <= 0.005 + 1e-6).all())
    return bool((np.abs(rows[:, :8]) <= 0.1 + 1e-6).all())


def is_unhealthy_hopper(obs: np.ndarray) -> bool:
    """Hopper-v5 ends an episode when its torso is below z 0.7 or tilted beyond 0.2 rad (or a state leaves +-100)."""
    return bool(obs[0] <= 0.7 or abs(obs[1]) >= 0.2 or (np.abs(obs[1:]) >= 100).any())


def make(backend: str, task: str = "Hopper-v5", n: int = 4, **fields: Any) -> MujocoEnv:
    return MujocoEnv(MujocoEnvConfig(task=task, backend=backend, **fields), num_envs=n)  # type: ignore[arg-type]


def actions(n: int, dim: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1.0, 1.0, (n, dim)).astype(np.float32)


def run_until_terminated(env: MujocoEnv, n: int, limit: int = 300) -> tuple[Any, ...]:
    for k in range(limit):
        out = env.step(actions(n, 3, k))
        if out[2].any():
            return out
    raise AssertionError(f"no Hopper copy fell within {limit} random steps")


# ------------------------------------------------------------------------------------------------ both backends


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("task", ["HalfCheetah-v5", "Hopper-v5"])
def test_tasks_step_as_a_batch(backend: str, task: str) -> None:
    n = 4
    env = make(backend, task, n)
    try:
        gym_space = gym.make(task).action_space
        assert env.single_action_space == gym_space  # float32 on both backends, as the Gymnasium task declares
        obs, _ = env.reset(seed=0)
        assert obs.states["obs"].dtype == np.float32 and obs.states["obs"].shape == (n, OBS_DIM[task])
        assert obs.images == {}
        assert is_fresh_start(task, obs.states["obs"])
        assert len({row.tobytes() for row in obs.states["obs"]}) == n  # each copy has its own seed
        for k in range(5):
            obs, rewards, terminated, truncated, info = env.step(actions(n, ACTION_DIM[task], k))
        assert obs.states["obs"].shape == (n, OBS_DIM[task]) and obs.states["obs"].dtype == np.float32
        assert rewards.dtype == np.float32 and rewards.shape == (n,) and np.isfinite(rewards).all()
        assert terminated.dtype == np.bool_ and truncated.dtype == np.bool_ and not truncated.any()
        assert len(np.unique(rewards)) == n
        assert isinstance(info["x_position"], np.ndarray) and info["x_position"].shape == (n,)
    finally:
        env.close()


@needs_envpool
@pytest.mark.parametrize("task", ["HalfCheetah-v4", "Hopper-v4"])
def test_envpool_runs_its_v4_tasks_too(task: str) -> None:
    n = 4
    env = make("envpool", task, n)
    try:
        assert env.backend.task == task  # type: ignore[attr-defined]
        assert env.single_action_space == gym.make(task.replace("-v4", "-v5")).action_space
        obs, _ = env.reset(seed=0)
        dim = OBS_DIM[task.replace("-v4", "-v5")]
        assert obs.states["obs"].shape == (n, dim) and obs.states["obs"].dtype == np.float32
        _, rewards, *_ = env.step(actions(n, env.single_action_space.shape[0], 0))
        assert rewards.shape == (n,) and np.isfinite(rewards).all()
    finally:
        env.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_hopper_terminates_early_and_resets_explicitly(backend: str) -> None:
    n = 4
    env = make(backend, "Hopper-v5", n)
    try:
        env.reset(seed=1)
        obs, rewards, terminated, truncated, info = run_until_terminated(env, n)
        done = terminated | truncated
        assert not truncated.any()
        for i in np.flatnonzero(terminated):  # the done step carries the terminal observation, not a reset one
            assert is_unhealthy_hopper(obs.states["obs"][i])
            assert not is_fresh_start("Hopper-v5", obs.states["obs"][i : i + 1])
        with pytest.raises(RuntimeError, match="not reset"):
            env.step(actions(n, 3, 0))
        after, _ = env.reset(options={"reset_mask": done, "reset_indices": np.flatnonzero(done)})
        assert is_fresh_start("Hopper-v5", after.states["obs"][done])
        np.testing.assert_array_equal(after.states["obs"][~done], obs.states["obs"][~done])
        nxt, rewards, *_, info = env.step(actions(n, 3, 99))
        # A real step, not a second reset: an automatic reset step would pay reward 0 and return a start state.
        assert (rewards[done] != 0).all()
        assert not np.array_equal(nxt.states["obs"][done], after.states["obs"][done])
        if backend == "envpool":
            np.testing.assert_array_equal(info["elapsed_step"][done], 1)
    finally:
        env.close()


def trajectory(backend: str, seed: int, n: int = 3) -> list[np.ndarray]:
    env = make(backend, "Hopper-v5", n)
    try:
        out = [env.reset(seed=seed)[0].states["obs"]]
        for k in range(8):
            obs, rewards, *_ = env.step(actions(n, 3, k))
            out += [obs.states["obs"], rewards]
        out.append(env.reset(seed=seed)[0].states["obs"])  # the same seed again: the same start
        return out
    finally:
        env.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_seeds_reproduce(backend: str) -> None:
    a, b, c = trajectory(backend, 4), trajectory(backend, 4), trajectory(backend, 5)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(a[0], a[-1])
    assert not np.array_equal(a[0], c[0])
    np.testing.assert_array_equal(a[0][1], c[0][0])  # copy i gets seed + i


def test_the_gymnasium_backend_takes_per_env_seeds_and_envpool_does_not() -> None:
    """Gymnasium's vector env starts copy i from seed[i] (copy 1 from 6 as the first reset with 5 did); EnvPool
    seeds its envs only when the pool is made, so its backend does not declare per-env seeds."""
    env = make("gymnasium", n=2)
    try:
        assert env.metadata.get("per_env_seeds") is True
        first = env.reset(seed=5)[0].states["obs"].copy()
        env.step(actions(2, 3, 0))
        obs = env.reset(seed=[None, 6], options={"reset_mask": np.array([False, True])})[0].states["obs"]
        np.testing.assert_array_equal(obs[1], first[1])
        assert not np.array_equal(obs[0], first[0]), "copy 0 was stepped, not reset"
    finally:
        env.close()
    if HAS_ENVPOOL:
        pooled = make("envpool", n=2)
        try:
            assert not pooled.metadata.get("per_env_seeds")
        finally:
            pooled.close()


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_render_frames(backend: str) -> None:
    n = 3
    env = make(backend, "HalfCheetah-v5", n, render=True, width=64, height=48)
    try:
        obs, _ = env.reset(seed=0)
        frames = obs.images["render"]
        assert frames.dtype == np.uint8 and frames.shape == (n, 48, 64, 3)
        assert frames.std() > 0  # a scene, not a blank buffer
        for k in range(10):
            obs, *_ = env.step(actions(n, 6, k))
        moved = obs.images["render"]
        assert moved.shape == (n, 48, 64, 3) and not np.array_equal(moved, frames)
        after, _ = env.reset(options={"reset_mask": np.array([True, False, False])})
        np.testing.assert_array_equal(after.images["render"][1:], moved[1:])
        assert not np.array_equal(after.images["render"][0], moved[0])
    finally:
        env.close()


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_frames_for_the_recorder_only_are_drawn_on_request(backend: str) -> None:
    """--env.render-for-recorder-only: no frames in the observations; render_frames draws the rows asked for. On
    EnvPool they are the frames --env.render would have sent; Gymnasium's tracking camera follows its body from
    where it was at the first render, so there they frame the scene as the first request left the camera."""
    n = 3
    env = make(backend, "HalfCheetah-v5", n, render_for_recorder_only=True, width=32, height=24)
    twin = make(backend, "HalfCheetah-v5", n, render=True, width=32, height=24)
    try:
        assert env.frames_for_recorder and not twin.frames_for_recorder
        obs, _ = env.reset(seed=0)
        sent, _ = twin.reset(seed=0)
        for k in range(3):
            obs, *_ = env.step(actions(n, 6, k))
            sent, *_ = twin.step(actions(n, 6, k))
        assert obs.images == {}
        drawn = env.render_frames(np.array([2, 0]))["render"]
        assert drawn.shape == (2, 24, 32, 3) and drawn.dtype == np.uint8 and drawn.std() > 0
        np.testing.assert_array_equal(env.render_frames(np.array([2, 0]))["render"], drawn), "the state's frame"
        if backend == "envpool":
            np.testing.assert_array_equal(drawn, sent.images["render"][[2, 0]])
    finally:
        env.close()
        twin.close()
    with pytest.raises(ConfigError, match="drop it to render only the recorded episodes' frames"):
        make(backend, "HalfCheetah-v5", 1, render=True, render_for_recorder_only=True)


def test_backends_share_the_task_definition() -> None:
    """Both backends step the same Hopper: from a start, a few identical actions keep it within noise of each
    other (their MuJoCo builds differ, so not bit for bit)."""
    if not HAS_ENVPOOL:
        pytest.skip("envpool is not installed")
    ends = []
    for backend in ("gymnasium", "envpool"):
        env = make(backend, "Hopper-v5", 2)
        try:
            env.reset(seed=0)
            for _ in range(10):
                obs, *_ = env.step(np.zeros((2, 3), np.float32))
            ends.append(obs.states["obs"][:, 0])
        finally:
            env.close()
    np.testing.assert_allclose(ends[0], ends[1], atol=0.05)


# ------------------------------------------------------------------------------------------------ errors


def test_gymnasium_backend_refuses_non_mujoco_and_unknown_tasks() -> None:
    with pytest.raises(ConfigError, match="not a Gymnasium MuJoCo task"):
        make("gymnasium", "CartPole-v1", 1)
    with pytest.raises(ConfigError, match="'Hopper-v5'"):
        make("gymnasium", "Hoper-v5", 1)


def test_kwargs_reach_the_task() -> None:
    env = make("gymnasium", "Hopper-v5", 2, kwargs=json.dumps({"ctrl_cost_weight": 0.25}))
    try:
        inner = env.backend.vector_env.envs  # type: ignore[attr-defined]
        assert [e.unwrapped._ctrl_cost_weight for e in inner] == [0.25, 0.25]
    finally:
        env.close()


def test_missing_packages_name_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "mujoco", None)  # `import mujoco` now fails as if it were not installed
    with pytest.raises(ConfigError, match=r'plugrl-env-client\[mujoco\]'):
        make("gymnasium", "Hopper-v5", 1)
    monkeypatch.setitem(sys.modules, "envpool", None)
    with pytest.raises(ConfigError, match=r'plugrl-env-client\[envpool\]'):
        make("envpool", "Hopper-v5", 1)


def test_envpool_task_names(caplog: pytest.LogCaptureFixture) -> None:
    has = ["Hopper-v3", "Hopper-v4", "HalfCheetah-v3", "HalfCheetah-v4", "Reacher-v2"]
    assert envpool_task("Hopper-v4", has) == "Hopper-v4"
    with caplog.at_level(logging.WARNING):
        assert envpool_task("HalfCheetah-v5", has) == "HalfCheetah-v4"
    assert "EnvPool has no HalfCheetah-v5; using its HalfCheetah-v4" in caplog.text
    assert envpool_task("Reacher-v5", has) == "Reacher-v2"
    assert envpool_task("Hopper-v1", has) == "Hopper-v3"  # nothing below: the lowest above
    with pytest.raises(ConfigError, match="EnvPool has no MuJoCo task 'Walker2d-v5'; it has: HalfCheetah-v3"):
        envpool_task("Walker2d-v5", has)


@needs_envpool
def test_envpool_backend_errors() -> None:
    with pytest.raises(ConfigError, match="EnvPool has no MuJoCo task 'Cheetah-v5'; it has: .*HalfCheetah-v5"):
        make("envpool", "Cheetah-v5", 1)
    with pytest.raises(ConfigError, match="EnvPool cannot make Hopper-v5"):
        make("envpool", "Hopper-v5", 1, kwargs='{"no_such_option": 1}')


# ------------------------------------------------------------------------------------------------ EnvPool itself


@needs_envpool
def test_envpool_resets_a_done_env_on_its_next_step_unless_reset_explicitly() -> None:
    """What the envpool backend is built around, observed on EnvPool directly (see the module docstring)."""
    envpool = import_envpool()
    n = 4
    for explicit in (False, True):
        pool = envpool.make("Hopper-v5", env_type="gymnasium", num_envs=n, seed=3)
        try:
            pool.reset()
            for k in range(300):
                obs, rewards, terminated, truncated, info = pool.step(actions(n, 3, k))
                if terminated.any():
                    break
            done = np.flatnonzero(terminated)
            assert (info["elapsed_step"][done] == k + 1).all()  # the done step is a real step: terminal obs
            if explicit:
                reset_obs, reset_info = pool.reset(env_id=done.astype(np.int32))
                np.testing.assert_array_equal(reset_info["env_id"], done)
                np.testing.assert_array_equal(reset_info["elapsed_step"], 0)
            obs, rewards, terminated, truncated, info = pool.step(actions(n, 3, 1000))
            if explicit:  # one reset only: the next step is the episode's first real step
                np.testing.assert_array_equal(info["elapsed_step"][done], 1)
                assert (rewards[done] != 0).all()
            else:  # EnvPool reset them inside this step and ignored their actions
                np.testing.assert_array_equal(info["elapsed_step"][done], 0)
                np.testing.assert_array_equal(rewards[done], 0)
                assert is_fresh_start("Hopper-v5", np.asarray(obs[done], np.float32))
            others = np.setdiff1d(np.arange(n), done)
            np.testing.assert_array_equal(info["elapsed_step"][others], k + 2)
        finally:
            pool.close()


# ------------------------------------------------------------------------------------------------ end to end


@needs_envpool
def test_run_through_the_client(tmp_path: Any, registry: None) -> None:
    from plugrl_env_client.app import run_client
    from plugrl_env_client.config import ClientConfig

    config = ClientConfig(num_envs=2, num_episodes=3, local_policy="random", output_dir=tmp_path, progress=False,
                          exp_name="mujoco-e2e", env=MujocoEnvConfig(task="Hopper-v5", backend="envpool"))
    assert run_client(config, "MuJoCo-v1") == 0
    check_run_of_one_process(tmp_path / "mujoco-e2e", episodes=3, max_length=1000)  # the env's own time limit
