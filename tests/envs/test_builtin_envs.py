"""The built-in envs Point-v1, Dummy-v1 and Probe-v1, built through the registry as the runner builds them."""

from __future__ import annotations

import copy

import gymnasium as gym
import numpy as np
import pytest

from plugrl_env_client.envs import discover_envs
from plugrl_env_client.envs.base_env import BaseEnv, Observation
from plugrl_env_client.envs.dummy.dummy_env import DummyEnvConfig
from plugrl_env_client.envs.point.point_env import PointEnvConfig
from plugrl_env_client.envs.probe.probe_env import ProbeEnvConfig
from plugrl_env_client.utils.registration import get_spec, make_env

BUILTINS = ["Point-v1", "Dummy-v1", "Probe-v1"]


@pytest.fixture(scope="module", autouse=True)
def _discovered() -> None:
    loaded = discover_envs()
    for uid in BUILTINS:
        assert get_spec(uid).module.startswith("plugrl_env_client.envs."), f"{uid} is shadowed: {get_spec(uid)}"
    assert {m.rsplit(".", 1)[-1] for m in loaded} >= {"point_env", "dummy_env", "probe_env"}


def _snapshot(obs: Observation) -> Observation:
    """A deep copy (an env may hand out views of its own buffers)."""
    return copy.deepcopy(obs)


def _check_step_types(n: int, out: tuple) -> None:
    obs, reward, terminated, truncated, info = out
    assert isinstance(obs, Observation) and obs.batch_size == n
    assert reward.dtype == np.float32 and reward.shape == (n,)
    assert terminated.dtype == np.bool_ and terminated.shape == (n,)
    assert truncated.dtype == np.bool_ and truncated.shape == (n,)
    assert isinstance(info, dict)


def _rollout(env: BaseEnv, seed: int | None, steps: int) -> list:
    """Observations and rewards of ``steps`` steps with fixed (seed-independent) actions."""
    obs, _ = env.reset(seed=seed)
    trace = [_snapshot(obs)]
    shape = env.action_space.shape
    for k in range(steps):
        actions = np.full(shape, 0.3 * (-1) ** k, dtype=env.action_space.dtype)
        obs, reward, terminated, truncated, _ = env.step(actions)
        trace.append((_snapshot(obs), reward.copy(), terminated.copy(), truncated.copy()))
    return trace


def _flatten(trace: list) -> list[np.ndarray]:
    out: list[np.ndarray] = []
    for item in trace:
        obs, *rest = item if isinstance(item, tuple) else (item,)
        out.extend(obs.images[k] for k in sorted(obs.images))
        out.extend(obs.states[k] for k in sorted(obs.states))
        out.append(obs.text)
        out.extend(rest)
    return out


def _same(a: list, b: list) -> bool:
    fa, fb = _flatten(a), _flatten(b)
    return len(fa) == len(fb) and all(x.shape == y.shape and np.array_equal(x, y) for x, y in zip(fa, fb))


# ---------------------------------------------------------------------------------------------- common


@pytest.mark.parametrize("uid", BUILTINS)
def test_step_types_and_spaces(uid: str) -> None:
    n = 4
    env = make_env(uid, num_envs=n)
    assert env.num_envs == n
    assert env.action_space.shape == (n, *env.single_action_space.shape)
    obs, info = env.reset(seed=0)
    assert obs.batch_size == n and isinstance(info, dict)
    assert obs.text.shape == (n,) and obs.text.dtype.kind == "U"
    _check_step_types(n, env.step(env.action_space.sample()))
    assert env.spec is not None and env.spec.id == uid


@pytest.mark.parametrize("uid", BUILTINS)
def test_same_seed_same_trajectory(uid: str) -> None:
    a = _rollout(make_env(uid, num_envs=3), seed=11, steps=4)
    b = _rollout(make_env(uid, num_envs=3), seed=11, steps=4)
    assert _same(a, b)


@pytest.mark.parametrize("uid", ["Point-v1", "Dummy-v1"])
def test_different_seed_different_trajectory(uid: str) -> None:
    a = _rollout(make_env(uid, num_envs=3), seed=11, steps=4)
    b = _rollout(make_env(uid, num_envs=3), seed=12, steps=4)
    assert not _same(a, b)


def test_probe_is_seed_independent() -> None:
    # Probe-v1 has no randomness at all: a different seed gives the same trajectory.
    a = _rollout(make_env("Probe-v1", num_envs=3), seed=11, steps=4)
    b = _rollout(make_env("Probe-v1", num_envs=3), seed=12, steps=4)
    assert _same(a, b)


@pytest.mark.parametrize("uid", BUILTINS)
def test_partial_reset_only_changes_given_rows(uid: str) -> None:
    n = 5
    env = make_env(uid, num_envs=n)
    env.reset(seed=3)
    for _ in range(3):
        obs, *_ = env.step(np.full(env.action_space.shape, 0.5, dtype=env.action_space.dtype))
    before = _snapshot(obs)
    rows = np.array([1, 3])
    keep = np.array([0, 2, 4])
    after, _ = env.reset(options={"reset_indices": rows})
    assert after.batch_size == n
    changed = False
    for group in ("images", "states"):
        for key, arr in getattr(before, group).items():
            new = getattr(after, group)[key]
            np.testing.assert_array_equal(new[keep], arr[keep], err_msg=f"{uid}: {group}[{key!r}] row outside reset")
            changed |= not np.array_equal(new[rows], arr[rows])
    assert changed, f"{uid}: reset_indices rows did not change"


# ---------------------------------------------------------------------------------------------- Point-v1


def test_point_observation_layout() -> None:
    env = make_env("Point-v1", num_envs=3)
    obs, _ = env.reset(seed=0)
    assert obs.images == {}
    assert set(obs.states) == {"pos", "goal"}
    for key in ("pos", "goal"):
        assert obs.states[key].shape == (3, 2) and obs.states[key].dtype == np.float64
        assert np.all(np.abs(obs.states[key]) <= 1.0)
    assert list(obs.text) == ["move to the goal"] * 3
    assert env.single_action_space == gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    assert get_spec("Point-v1").max_episode_steps == 100
    assert get_spec("Point-v1").best_reward_threshold_for_success == 1.0


def test_point_moves_by_step_size_times_action_and_rewards() -> None:
    cfg = PointEnvConfig(step_size=0.5, goal_radius=0.2)
    env = make_env("Point-v1", num_envs=3, config=cfg)
    env.reset(seed=0)
    env.pos[:] = [[0.0, 0.0], [0.0, 0.0], [0.9, 0.9]]
    env.goal[:] = [[0.5, 0.0], [0.0, 1.0], [-0.9, -0.9]]
    actions = np.array([[1.0, 0.0], [0.0, 0.2], [3.0, -3.0]], np.float32)  # the last one is clipped to [1, -1]
    obs, reward, terminated, truncated, info = env.step(actions)
    np.testing.assert_allclose(obs.states["pos"], [[0.5, 0.0], [0.0, 0.1], [1.4, 0.4]])
    np.testing.assert_array_equal(terminated, [True, False, False])
    assert not truncated.any()
    dist = np.array([0.0, 0.9, np.hypot(2.3, 1.3)])
    np.testing.assert_allclose(info["distance"], dist, atol=1e-6)
    np.testing.assert_allclose(reward, [1.0, -0.9, -np.hypot(2.3, 1.3)], rtol=1e-6)
    assert reward.dtype == np.float32


def test_point_goal_radius_boundary() -> None:
    env = make_env("Point-v1", num_envs=2, config=PointEnvConfig(step_size=0.1, goal_radius=0.25))
    env.reset(seed=0)
    env.pos[:] = 0.0
    env.goal[:] = [[0.3, 0.0], [0.5, 0.0]]
    _, reward, terminated, _, _ = env.step(np.array([[0.5, 0.0], [0.5, 0.0]]))  # both move 0.05
    np.testing.assert_array_equal(terminated, [True, False])  # 0.25 <= radius, 0.45 > radius
    np.testing.assert_allclose(reward, [1.0, -0.45], rtol=1e-6)


def test_point_default_config_from_registry() -> None:
    env = make_env("Point-v1", num_envs=1)
    assert env.config == PointEnvConfig()


# ---------------------------------------------------------------------------------------------- Dummy-v1


def test_dummy_observation_layout_follows_config() -> None:
    cfg = DummyEnvConfig(base_image_size=16, wrist_image_size=8, robot_state_dim=4, joint_angles_dim=3,
                         action_dim=6, text="stack blocks")
    env = make_env("Dummy-v1", num_envs=2, config=cfg)
    obs, _ = env.reset(seed=0)
    assert obs.images["base"].shape == (2, 16, 16, 3) and obs.images["base"].dtype == np.uint8
    assert obs.images["wrist"].shape == (2, 8, 8, 3) and obs.images["wrist"].dtype == np.uint8
    assert obs.states["robot_state"].shape == (2, 4)
    assert obs.states["joint_angles"].shape == (2, 3)
    assert np.all(np.abs(obs.states["joint_angles"]) <= np.pi)
    assert list(obs.text) == ["stack blocks", "stack blocks"]
    assert env.single_action_space == gym.spaces.Box(-1.0, 1.0, (6,), np.float32)
    assert env.action_space.shape == (2, 6)
    obs, reward, *_ = env.step(np.zeros((2, 6), np.float32))
    assert list(obs.text) == ["stack blocks", "stack blocks"]
    assert np.all((reward >= 0) & (reward < 1))


def test_dummy_default_sizes() -> None:
    env = make_env("Dummy-v1", num_envs=1)
    obs, _ = env.reset(seed=0)
    assert obs.images["base"].shape == (1, 224, 224, 3)
    assert obs.images["wrist"].shape == (1, 112, 112, 3)
    assert obs.states["robot_state"].shape == (1, 10)
    assert obs.states["joint_angles"].shape == (1, 5)
    assert env.single_action_space.shape == (7,)
    assert list(obs.text) == ["do something useful"]


@pytest.mark.parametrize("action_dim,state_dim", [(3, 5), (8, 4)])
def test_dummy_actions_nudge_robot_state(action_dim: int, state_dim: int) -> None:
    cfg = DummyEnvConfig(base_image_size=4, wrist_image_size=4, robot_state_dim=state_dim, action_dim=action_dim)
    env = make_env("Dummy-v1", num_envs=2, config=cfg)
    obs0, _ = env.reset(seed=0)
    start = obs0.states["robot_state"].copy()
    obs, *_ = env.step(np.ones((2, action_dim), np.float32))
    k = min(action_dim, state_dim)
    np.testing.assert_allclose(obs.states["robot_state"][:, :k] - start[:, :k], 0.01)
    np.testing.assert_array_equal(obs.states["robot_state"][:, k:], start[:, k:])


def test_dummy_terminated_prob() -> None:
    small = dict(base_image_size=4, wrist_image_size=4)
    env = make_env("Dummy-v1", num_envs=6, config=DummyEnvConfig(terminated_prob=1.0, **small))
    env.reset(seed=0)
    _, _, terminated, truncated, _ = env.step(np.zeros((6, 7), np.float32))
    assert terminated.all() and not truncated.any()
    env = make_env("Dummy-v1", num_envs=6, config=DummyEnvConfig(terminated_prob=0.0, **small))
    env.reset(seed=0)
    for _ in range(5):
        _, _, terminated, truncated, _ = env.step(np.zeros((6, 7), np.float32))
        assert not terminated.any() and not truncated.any()


def test_dummy_image_counter() -> None:
    env = make_env("Dummy-v1", num_envs=2, config=DummyEnvConfig(base_image_size=4, wrist_image_size=4))
    env.reset(seed=0)
    for k in range(1, 4):
        obs, *_ = env.step(np.zeros((2, 7), np.float32))
        np.testing.assert_array_equal(obs.images["base"][:, 0, 0, 0], [k, k])


# ---------------------------------------------------------------------------------------------- Probe-v1


def test_probe_layout_and_action_space() -> None:
    env = make_env("Probe-v1", num_envs=2)
    assert env.single_action_space == gym.spaces.Box(-np.inf, np.inf, (3,), np.float64)
    env = make_env("Probe-v1", num_envs=2, config=ProbeEnvConfig(action_dim=5))
    assert env.single_action_space == gym.spaces.Box(-np.inf, np.inf, (5,), np.float64)
    assert env.action_space.shape == (2, 5) and env.action_space.dtype == np.float64
    obs, _ = env.reset(seed=0)
    assert obs.images == {}
    assert set(obs.states) == {"t", "a"}
    assert obs.states["t"].shape == (2, 1) and obs.states["t"].dtype == np.float64
    assert obs.states["a"].shape == (2, 5) and obs.states["a"].dtype == np.float64
    assert not obs.states["t"].any() and not obs.states["a"].any()
    assert list(obs.text) == ["probe", "probe"]


def test_probe_action_dim_from_cli_flag() -> None:
    from plugrl_env_client import cli

    env_id, config, _line = cli.parse(["probe-v1", "--env.action-dim", "4"])
    env = make_env(env_id, num_envs=3, config=config.env)
    assert env.single_action_space == gym.spaces.Box(-np.inf, np.inf, (4,), np.float64)
    assert env.action_space.shape == (3, 4)


def test_probe_exact_behaviour() -> None:
    n, d = 7, 2
    env = make_env("Probe-v1", num_envs=n, config=ProbeEnvConfig(action_dim=d))
    env.reset(seed=0)
    lengths = 3 + 2 * (np.arange(n) % 3)  # 3, 5, 7, 3, 5, 7, 3
    np.testing.assert_array_equal(lengths, [3, 5, 7, 3, 5, 7, 3])
    ended_at = np.full(n, -1)
    for step in range(1, 10):
        # encode (step, env, dim) into the action values, unbounded
        actions = step * 1000.0 + 10.0 * np.arange(n)[:, None] + np.arange(d)[None, :] - 5000.0
        obs, reward, terminated, truncated, _ = env.step(actions)
        np.testing.assert_array_equal(obs.states["a"], actions)
        np.testing.assert_array_equal(obs.states["t"][:, 0], np.full(n, float(step)))
        np.testing.assert_array_equal(reward, np.ones(n, np.float32))
        assert reward.dtype == np.float32
        np.testing.assert_array_equal(terminated, lengths == step)
        assert not truncated.any()
        ended_at[terminated] = step
    np.testing.assert_array_equal(ended_at, lengths)


def test_probe_reset_restarts_episode_of_given_rows() -> None:
    n = 6
    env = make_env("Probe-v1", num_envs=n)
    env.reset(seed=0)
    for _ in range(3):
        obs, _, terminated, _, _ = env.step(np.full((n, 3), 2.5))
    done = np.flatnonzero(terminated)
    np.testing.assert_array_equal(done, [0, 3])
    obs, _ = env.reset(options={"reset_indices": done})
    np.testing.assert_array_equal(obs.states["t"][:, 0], [0, 3, 3, 0, 3, 3])
    np.testing.assert_array_equal(obs.states["a"][done], 0.0)
    np.testing.assert_array_equal(obs.states["a"][[1, 2, 4, 5]], 2.5)
    # the restarted envs terminate again after their own episode length, the others continue theirs
    for step in range(1, 4):
        obs, _, terminated, _, _ = env.step(np.zeros((n, 3)))
        if step == 2:
            np.testing.assert_array_equal(terminated, [False, True, False, False, True, False])  # t == 5
        if step == 3:
            np.testing.assert_array_equal(terminated, [True, False, False, True, False, False])  # restarted, t == 3
    np.testing.assert_array_equal(obs.states["t"][:, 0], [3, 6, 6, 3, 6, 6])


def _start(env: BaseEnv, obs: Observation) -> dict[str, np.ndarray]:
    """What an env's reset drew, row per env: the observation's arrays (GuessNumber-v1: its secret numbers)."""
    if hasattr(env, "target"):
        return {"target": np.array(env.target, copy=True)}
    return {**{f"states[{k!r}]": v.copy() for k, v in obs.states.items()},
            **{f"images[{k!r}]": v.copy() for k, v in obs.images.items()}}


@pytest.mark.parametrize("uid", ["Point-v1", "Dummy-v1", "GuessNumber-v1"])
def test_a_partial_reset_starts_each_env_from_its_own_seed(uid: str) -> None:
    """Per-env seeds: ``reset(seed=[None, s, None])`` starts env 1 as the first reset with ``s - 1`` did (env i
    from seed + i), whatever was drawn before, and leaves the other rows as they were."""
    env = make_env(uid, num_envs=3)
    assert env.metadata.get("per_env_seeds") is True
    first = _start(env, env.reset(seed=40)[0])
    other = _start(env, env.reset(seed=50)[0])
    assert any(not np.array_equal(first[k], other[k]) for k in first), f"{uid}: the seed makes a difference"
    env.reset(options={"reset_mask": np.array([True, True, False])})  # unseeded draws in between
    before = _start(env, env.reset(options={"reset_mask": np.array([False, False, True])})[0])
    after = _start(env, env.reset(seed=[None, 41, None], options={"reset_mask": np.array([False, True, False])})[0])
    for name in first:
        np.testing.assert_array_equal(after[name][1], first[name][1], err_msg=f"{uid} {name}: env 1 from seed 41")
        np.testing.assert_array_equal(after[name][[0, 2]], before[name][[0, 2]], err_msg=f"{uid} {name}: others")
    env.close()


def test_probe_takes_any_per_env_seeds() -> None:
    env = make_env("Probe-v1", num_envs=2)
    assert env.metadata.get("per_env_seeds") is True
    env.reset(seed=1)
    env.step(np.ones(env.action_space.shape))
    obs, _ = env.reset(seed=[None, 123], options={"reset_mask": np.array([False, True])})
    assert obs.states["t"][:, 0].tolist() == [1.0, 0.0]
    env.close()
