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


def test_non_numeric_actions_for_a_numeric_space_raise() -> None:
    with pytest.raises(ProtocolError, match="needs numbers"):
        checks.check_actions(np.array([[["a", "b"]]]), BOX2, None)


def test_chunk_shorter_than_replan_steps_raises() -> None:
    with pytest.raises(ProtocolError, match=r"chunk of 2 steps.*replan-steps is 3"):
        checks.check_actions(np.zeros((2, 1, 2), np.float32), BOX2, 3)
    # equal or longer is fine
    assert checks.check_actions(np.zeros((3, 1, 2), np.float32), BOX2, 3).shape == (3, 1, 2)
    assert checks.check_actions(np.zeros((5, 1, 2), np.float32), BOX2, 3).shape == (5, 1, 2)


# ------------------------------------------------------------------------------------------------ step / reset


def test_check_step_accepts_and_converts() -> None:
    rewards, terminated, truncated = checks.check_step(
        2, _obs(2), np.array([1.0, 2.0]), np.array([True, False]), [False, False], {}
    )
    assert rewards.dtype == np.float32 and rewards.tolist() == [1.0, 2.0]
    assert terminated.dtype == bool and terminated.tolist() == [True, False]
    assert truncated.dtype == bool and truncated.tolist() == [False, False]


def test_check_step_accepts_int_rewards() -> None:
    rewards, _, _ = checks.check_step(2, _obs(2), np.array([1, 2]), np.zeros(2, bool), np.zeros(2, bool), {})
    assert rewards.dtype == np.float32 and rewards.tolist() == [1.0, 2.0]


def test_scalar_reward_for_one_env_raises() -> None:
    with pytest.raises(EnvContractError, match=re.escape("Expected reward shape (1,), got ()")):
        checks.check_step(1, _obs(1), np.float32(1.0), np.zeros(1, bool), np.zeros(1, bool), {})


def test_wrong_length_flags_raise() -> None:
    with pytest.raises(EnvContractError, match=re.escape("Expected truncated shape (2,), got (3,)")):
        checks.check_step(2, _obs(2), np.zeros(2), np.zeros(2, bool), np.zeros(3, bool), {})


@pytest.mark.parametrize("which", ["terminated", "truncated"])
def test_non_bool_flags_raise(which: str) -> None:
    flags = {"terminated": np.zeros(2, bool), "truncated": np.zeros(2, bool)}
    flags[which] = np.array([0, 1])
    with pytest.raises(EnvContractError, match=f"Expected {which} of dtype bool, got int"):
        checks.check_step(2, _obs(2), np.zeros(2), flags["terminated"], flags["truncated"], {})


def test_non_numeric_rewards_raise() -> None:
    with pytest.raises(EnvContractError, match="numeric rewards"):
        checks.check_step(2, _obs(2), np.array(["a", "b"]), np.zeros(2, bool), np.zeros(2, bool), {})


def test_step_observation_of_the_wrong_batch_raises() -> None:
    with pytest.raises(EnvContractError, match="Observation of 3 envs; expected 2"):
        checks.check_step(2, _obs(3), np.zeros(2), np.zeros(2, bool), np.zeros(2, bool), {})


def test_step_must_return_an_observation_and_a_dict_info() -> None:
    with pytest.raises(EnvContractError, match="must return an Observation.*got dict"):
        checks.check_step(2, {"states": {}}, np.zeros(2), np.zeros(2, bool), np.zeros(2, bool), {})
    with pytest.raises(EnvContractError, match="dict as info, got list"):
        checks.check_step(2, _obs(2), np.zeros(2), np.zeros(2, bool), np.zeros(2, bool), [])


def test_check_reset() -> None:
    obs = _obs(2)
    assert checks.check_reset(2, (obs, {})) is obs
    with pytest.raises(EnvContractError, match=r"must return \(Observation, info\)"):
        checks.check_reset(2, obs)
    with pytest.raises(EnvContractError, match=r"must return \(Observation, info\)"):
        checks.check_reset(2, ({"x": 1}, {}))
    with pytest.raises(EnvContractError, match="Observation of 1 envs; expected 2"):
        checks.check_reset(2, (_obs(1), {}))


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
        checks.check_step(2, obs(2), np.zeros(2, np.float32), np.zeros(2, bool), np.zeros(2, bool), {})
    with pytest.raises(EnvContractError, match=re.escape(words)):
        checks.check_reset(2, (obs(2), {}))
