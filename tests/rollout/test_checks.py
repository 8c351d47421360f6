"""Checks on server actions and info slicing: each failure says what was expected and what came."""

from __future__ import annotations

import re

import gymnasium as gym
import numpy as np
import pytest

from plugrl_env_client.errors import EnvContractError, ProtocolError
from plugrl_env_client.rollout import checks

BOX2 = gym.spaces.Box(-1.0, 1.0, (2,), np.float64)


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
