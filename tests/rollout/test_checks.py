"""Contract checks on env outputs and server actions: each failure says what was expected and what came."""

from __future__ import annotations

import re

import gymnasium as gym
import numpy as np
import pytest

from plugrl_env_client.envs.base_env import BaseEnv, Observation
from plugrl_env_client.errors import EnvContractError, ProtocolError
from plugrl_env_client.rollout import checks

BOX2 = gym.spaces.Box(-1.0, 1.0, (2,), np.float64)


def _obs(n: int) -> Observation:
    return Observation(states={"x": np.zeros((n, 3))}, text="t")


# ------------------------------------------------------------------------------------------------ actions


def test_action_tail_shape_mismatch_names_both_shapes_and_the_server_flag() -> None:
    actions = np.zeros((4, 3, 7), np.float32)
    with pytest.raises(EnvContractError) as err:
        checks.check_actions(actions, BOX2, None)
    msg = str(err.value)
    assert "Expected action shape tail (2,), got (7,)" in msg
    assert "--policy.action-dim" in msg
    assert "[4, 3, 7]" in msg


def test_action_tail_mismatch_for_a_discrete_space() -> None:
    with pytest.raises(EnvContractError, match=re.escape("Expected action shape tail (), got (3,)")):
        checks.check_actions(np.zeros((2, 1, 3), np.int64), gym.spaces.Discrete(4), None)


def test_action_tail_mismatch_for_a_multi_dim_space() -> None:
    space = gym.spaces.Box(0.0, 1.0, (2, 3), np.float32)
    with pytest.raises(EnvContractError, match=re.escape("Expected action shape tail (2, 3), got (3, 2)")):
        checks.check_actions(np.zeros((1, 1, 3, 2), np.float32), space, None)


def test_actions_are_cast_to_the_space_dtype() -> None:
    actions = np.array([[[0.5, -0.25]]], np.float32)
    out = checks.check_actions(actions, BOX2, None)
    assert out.dtype == np.float64
    assert out.tolist() == [[[0.5, -0.25]]]

    same = np.zeros((2, 2, 2), np.float64)
    assert checks.check_actions(same, BOX2, None) is same  # no copy when already right


def test_discrete_int_actions_keep_their_shape_and_take_the_space_dtype() -> None:
    space = gym.spaces.Discrete(5)
    out = checks.check_actions(np.array([[1, 2], [3, 4]], np.int32), space, None)
    assert out.shape == (2, 2)
    assert out.dtype == space.dtype
    assert out.tolist() == [[1, 2], [3, 4]]


def test_non_finite_actions_raise_and_name_positions() -> None:
    actions = np.zeros((2, 3, 2), np.float32)
    actions[1, 2, 0] = np.nan
    with pytest.raises(ProtocolError) as err:
        checks.check_actions(actions, BOX2, None)
    assert "NaN or infinite actions (for the infer's envs at positions [2])" in str(err.value)
    assert "--runner.non-finite-actions clip" in str(err.value)


def test_non_finite_actions_clipped_into_the_bounds() -> None:
    actions = np.array([[[np.nan, np.inf], [-np.inf, 0.5]]], np.float32)
    out = checks.check_actions(actions, BOX2, None, non_finite="clip")
    assert out.tolist() == [[[0.0, 1.0], [-1.0, 0.5]]]


@pytest.mark.parametrize("mode", ["error", "clip"])
def test_nan_actions_for_an_integer_space_are_an_error_before_the_cast(mode: str) -> None:
    # Cast first, NaN would become an arbitrary integer and pass unnoticed.
    actions = np.array([[1.0, np.nan]])
    with pytest.raises(ProtocolError, match=re.escape("at positions [1]) for the integer action space Discrete(4)")):
        checks.check_actions(actions, gym.spaces.Discrete(4), None, non_finite=mode)


def test_float_actions_for_an_integer_space_are_cast() -> None:
    out = checks.check_actions(np.array([[1.0, 3.0]]), gym.spaces.Discrete(4), None)
    assert out.dtype == np.int64 and out.tolist() == [[1, 3]]


def test_non_numeric_actions_for_a_numeric_space_raise() -> None:
    with pytest.raises(ProtocolError, match="needs numbers"):
        checks.check_actions(np.array([[["a", "b"]]]), BOX2, None)


def test_chunk_shorter_than_replan_steps_raises() -> None:
    with pytest.raises(ProtocolError, match=r"chunk of 2 steps.*replan-steps is 3"):
        checks.check_actions(np.zeros((2, 1, 2), np.float32), BOX2, 3)
    # equal or longer is fine
    assert checks.check_actions(np.zeros((3, 1, 2), np.float32), BOX2, 3).shape == (3, 1, 2)
    assert checks.check_actions(np.zeros((5, 1, 2), np.float32), BOX2, 3).shape == (5, 1, 2)


# ------------------------------------------------------------------------------------------------ step


def _flags(n: int) -> np.ndarray:
    return np.zeros(n, bool)


def _step(obs: Observation, rewards, terminated=None, truncated=None, info=None):
    n = obs.batch_size
    return (obs, rewards, _flags(n) if terminated is None else terminated,
            _flags(n) if truncated is None else truncated, {} if info is None else info)


def test_check_step_accepts_and_converts() -> None:
    info = {"k": np.arange(2)}
    out = checks.check_step(2, (_obs(2), np.array([1.0, 2.0]), np.array([True, False]), [False, False], info))
    assert isinstance(out, checks.StepOutput)
    assert out.rewards.dtype == np.float32 and out.rewards.tolist() == [1.0, 2.0]
    assert out.terminated.dtype == bool and out.terminated.tolist() == [True, False]
    assert out.truncated.dtype == bool and out.truncated.tolist() == [False, False]
    assert out.info is info and out.obs.batch_size == 2
    assert out.zeroed_rewards.size == 0


def test_check_step_keeps_float32_rewards_without_a_copy() -> None:
    rewards = np.array([0.5, -1.0], np.float32)
    assert checks.check_step(2, _step(_obs(2), rewards)).rewards is rewards


def test_check_step_accepts_int_rewards() -> None:
    out = checks.check_step(2, _step(_obs(2), np.array([1, 2])))
    assert out.rewards.dtype == np.float32 and out.rewards.tolist() == [1.0, 2.0]


@pytest.mark.parametrize(
    "result,words",
    [
        ((_obs(2), np.zeros(2), _flags(2), {}), "step() must return 5 values (obs, reward, terminated, truncated, "
         "info); got 4: that is the old gym API: split done into terminated and truncated"),
        ((_obs(2), np.zeros(2), _flags(2), _flags(2), {}, {}), "step() must return 5 values (obs, reward, terminated, "
         "truncated, info); got 6"),
        (_obs(2), "got a bare Observation"),
        (None, "got None"),
        ([_obs(2), np.zeros(2), _flags(2), _flags(2), {}], "got a list of 5 values: return a tuple"),
    ],
    ids=["old-gym-4", "six", "bare-observation", "none", "list"],
)
def test_step_arity_is_a_clear_error(result, words: str) -> None:
    with pytest.raises(EnvContractError) as err:
        checks.check_step(2, result)
    assert words in str(err.value)
    if "got 6" in words:
        assert "old gym" not in str(err.value)


def test_scalar_reward_for_one_env_raises() -> None:
    with pytest.raises(EnvContractError, match=re.escape("Expected reward shape (1,), got ()")):
        checks.check_step(1, _step(_obs(1), np.float32(1.0)))


def test_wrong_length_flags_raise() -> None:
    with pytest.raises(EnvContractError, match=re.escape("Expected truncated shape (2,), got (3,)")):
        checks.check_step(2, _step(_obs(2), np.zeros(2), truncated=np.zeros(3, bool)))


@pytest.mark.parametrize("which", ["terminated", "truncated"])
def test_non_bool_flags_raise(which: str) -> None:
    flags = {"terminated": _flags(2), "truncated": _flags(2), which: np.array([0, 1])}
    with pytest.raises(EnvContractError) as err:
        checks.check_step(2, _step(_obs(2), np.zeros(2), flags["terminated"], flags["truncated"]))
    assert f"Expected {which} of dtype bool, got int64: return `np.asarray({which}, dtype=bool)`" in str(err.value)


def test_non_numeric_rewards_raise() -> None:
    with pytest.raises(EnvContractError, match="Expected numeric rewards, got dtype <U1"):
        checks.check_step(2, _step(_obs(2), np.array(["a", "b"])))


def test_step_observation_of_the_wrong_batch_raises() -> None:
    with pytest.raises(EnvContractError) as err:
        checks.check_step(2, _step(_obs(3), np.zeros(2)))
    assert "step() returned an Observation of 3 envs; expected 2: return every env's row" in str(err.value)
    with pytest.raises(EnvContractError, match="an Observation of 1 env; expected 2"):
        checks.check_step(2, _step(_obs(1), np.zeros(2)))


def test_step_must_return_an_observation_and_a_dict_info() -> None:
    with pytest.raises(EnvContractError, match="must return an Observation as its first value, got dict"):
        checks.check_step(2, ({"states": {}}, np.zeros(2), _flags(2), _flags(2), {}))
    with pytest.raises(EnvContractError, match=re.escape("step() must return a dict as info, got list: return {}")):
        checks.check_step(2, (_obs(2), np.zeros(2), _flags(2), _flags(2), []))


# ------------------------------------------------------------------------------------------------ non-finite


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_rewards_name_the_rows_and_the_flag(bad: float) -> None:
    rewards = np.array([0.0, bad, 1.0, bad], np.float32)
    with pytest.raises(EnvContractError) as err:
        checks.check_step(4, _step(_obs(4), rewards))
    msg = str(err.value)
    assert "step() returned NaN or infinite rewards for envs [1, 3]" in msg
    assert "--runner.non-finite-rewards zero" in msg


def test_float64_reward_beyond_float32_range_is_reported_as_non_finite() -> None:
    with pytest.raises(EnvContractError, match=re.escape("rewards for envs [0]")):
        checks.check_step(2, _step(_obs(2), np.array([1e300, 0.0])))


def test_non_finite_rewards_replaced_by_zero_and_the_rows_returned() -> None:
    rewards = np.array([np.nan, 2.0, np.inf], np.float32)
    out = checks.check_step(3, _step(_obs(3), rewards), non_finite_rewards="zero")
    assert out.rewards.tolist() == [0.0, 2.0, 0.0]
    assert out.rewards.dtype == np.float32
    assert out.zeroed_rewards.tolist() == [0, 2]
    assert np.isnan(rewards[0])  # the env's own array is not written to


def test_non_finite_rewards_mode_is_validated() -> None:
    with pytest.raises(ValueError, match="'error' or 'zero'"):
        checks.check_step(1, _step(_obs(1), np.array([np.nan])), non_finite_rewards="clip")  # type: ignore[arg-type]


def _nan_obs(n: int) -> Observation:
    pos = np.zeros((n, 2))
    pos[1, 0] = np.nan
    vel = np.zeros((n, 2, 2), np.float32)
    vel[0, 1, 1] = np.inf
    vel[2, 0, 0] = -np.inf
    return Observation(states={"pos": pos, "vel": vel, "count": np.arange(n)}, text="x")


def test_non_finite_step_observation_names_keys_rows_and_flag() -> None:
    with pytest.raises(EnvContractError) as err:
        checks.check_step(3, _step(_nan_obs(3), np.zeros(3)))
    msg = str(err.value)
    assert "step() returned NaN or infinite values: states['pos'] in envs [1]; states['vel'] in envs [0, 2]" in msg
    assert "count" not in msg
    assert "--runner.non-finite-observations allow" in msg


def test_non_finite_reset_observation_raises_unless_allowed() -> None:
    with pytest.raises(EnvContractError, match=re.escape("reset() returned NaN or infinite values: states['pos'] in envs [1]")):
        checks.check_reset(3, (_nan_obs(3), {}))
    obs, info = checks.check_reset(3, (_nan_obs(3), {}), non_finite_observations="allow")
    assert np.isnan(obs.states["pos"][1, 0])


def test_non_finite_observations_allowed() -> None:
    out = checks.check_step(3, _step(_nan_obs(3), np.zeros(3)), non_finite_observations="allow")
    assert np.isinf(out.obs.states["vel"][0, 1, 1])


def test_non_finite_rows_only_for_float_arrays() -> None:
    assert checks.non_finite_rows(np.arange(3)) is None
    assert checks.non_finite_rows(np.ones((3, 2))) is None
    arr = np.ones((4, 2, 2))
    arr[3, 1, 0] = np.nan
    assert checks.non_finite_rows(arr).tolist() == [3]


def test_long_row_lists_are_shortened() -> None:
    rewards = np.full(30, np.nan, np.float32)
    with pytest.raises(EnvContractError, match=re.escape("for envs [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, ... (30 in all)]")):
        checks.check_step(30, _step(_obs(30), rewards))


# ------------------------------------------------------------------------------------------------ reset


def test_check_reset_returns_observation_and_info() -> None:
    obs, info = _obs(2), {"seed": 3}
    got_obs, got_info = checks.check_reset(2, (obs, info))
    assert got_obs is obs and got_info is info


@pytest.mark.parametrize(
    "result,words",
    [
        (_obs(2), "reset() must return (observation, info); got a bare Observation: return `observation, info`"),
        ((_obs(2), {}, {}), "reset() must return (observation, info); got a tuple of 3 values"),
        ((_obs(2),), "got a tuple of 1 value:"),
        (None, "reset() must return (observation, info); got None"),
        ([_obs(2), {}], "got a list of 2 values: return a tuple"),
        (({"x": 1}, {}), "reset() must return an Observation as its first value, got dict: wrap the arrays"),
        ((_obs(2), None), "reset() must return a dict as info, got NoneType: return {} when"),
        ((_obs(1), {}), "reset() returned an Observation of 1 env; expected 2"),
    ],
    ids=["bare", "three", "one", "none", "list", "dict-obs", "none-info", "batch"],
)
def test_check_reset_errors(result, words: str) -> None:
    with pytest.raises(EnvContractError) as err:
        checks.check_reset(2, result)
    assert words in str(err.value)


@pytest.mark.parametrize(
    "value,words",
    [(_obs(1), "a bare Observation"), ((1, 2), "a tuple of 2 values"), ([1], "a list of 1 value"),
     (np.zeros((2, 3)), "an array of shape (2, 3)"), (None, "None"), ({}, "a dict"), (3, "a int")],
)
def test_describe_value(value, words: str) -> None:
    assert checks.describe_value(value) == words


# ------------------------------------------------------------------------------------------------ action space


class _NoSpaceEnv(BaseEnv):
    pass


class _SpaceEnv(BaseEnv):
    def __init__(self) -> None:
        super().__init__(None, num_envs=2)
        self.single_action_space = BOX2


def test_action_space_missing_raises() -> None:
    with pytest.raises(EnvContractError, match="Env must expose action space via single_action_space/action_space"):
        checks.action_space_of(_NoSpaceEnv(None, num_envs=2))


def test_action_space_of_returns_the_single_space() -> None:
    assert checks.action_space_of(_SpaceEnv()) is BOX2


def test_action_space_that_is_not_a_space_raises() -> None:
    env = _SpaceEnv()
    env.single_action_space = (2,)  # type: ignore[assignment]
    with pytest.raises(EnvContractError, match=re.escape("single_action_space is a tuple of 1 value, not a gymnasium Space")):
        checks.action_space_of(env)


# ------------------------------------------------------------------------------------------------ info


def test_slice_info_keeps_per_env_arrays_cut_to_rows() -> None:
    n = 4
    rows = np.array([1, 3])
    info = {
        "distance": np.arange(n, dtype=np.float64),
        "pos": np.arange(n * 2).reshape(n, 2),
        "scalar": 3.0,
        "np_scalar": np.float32(1.0),
        "zero_d": np.array(5),
        "other_len": np.zeros(n + 1),
        "a_list": [1, 2, 3, 4],
        "objects": np.array([object()] * n, dtype=object),
        7: np.arange(n),
        "nested": {"inner": np.arange(n) * 10, "drop": "text", 2: {"deep": np.arange(n) + 100}},
        "empty_nested": {"only": 1.0},
    }
    out = checks.slice_info(info, rows, n)
    assert set(out) == {"distance", "pos", "7", "nested"}
    assert out["distance"].tolist() == [1.0, 3.0]
    assert out["pos"].tolist() == [[2, 3], [6, 7]]
    assert out["7"].tolist() == [1, 3]
    assert set(out["nested"]) == {"inner", "2"}
    assert out["nested"]["inner"].tolist() == [10, 30]
    assert set(out["nested"]["2"]) == {"deep"}
    assert out["nested"]["2"]["deep"].tolist() == [101, 103]
    assert all(isinstance(k, str) for k in out) and all(isinstance(k, str) for k in out["nested"])


def test_slice_info_of_nothing_splittable_is_empty() -> None:
    assert checks.slice_info({"a": 1, "b": np.zeros(3)}, np.array([0]), 2) == {}


@pytest.mark.parametrize(
    "obs,words",
    [
        (lambda n: Observation(images={"cam": np.zeros((n, 4, 4, 3), np.float32)}), "images['cam'] of dtype float32"),
        (lambda n: Observation(images={"cam": np.zeros((n, 4, 4), np.uint8)}), "(n, height, width, channels)"),
        (lambda n: Observation(states={"s": np.array(["a"] * n, dtype=object)[:, None]}), "states must be numeric"),
    ],
    ids=["float-image", "3d-image", "object-state"],
)
def test_observation_dtypes_a_server_would_refuse_are_env_errors(obs, words):
    with pytest.raises(EnvContractError, match=re.escape(words)):
        checks.check_step(2, _step(obs(2), np.zeros(2, np.float32)))
    with pytest.raises(EnvContractError, match=re.escape(words)):
        checks.check_reset(2, (obs(2), {}))


def test_uint8_images_skip_the_finite_check() -> None:
    obs = Observation(images={"cam": np.full((2, 2, 2, 3), 255, np.uint8)}, states={"s": np.ones((2, 1))})
    assert checks.check_step(2, _step(obs, np.zeros(2))).obs is obs
