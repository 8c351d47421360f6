"""Checks on server actions and info slicing: each failure says what was expected and what came."""

from __future__ import annotations

import re

import gymnasium as gym
import numpy as np
import pytest

from plugrl_env_client.errors import EnvContractError, ProtocolError
from plugrl_env_client.rollout.actions import check_actions

BOX2 = gym.spaces.Box(-1.0, 1.0, (2,), np.float64)


# ------------------------------------------------------------------------------------------------ actions


def test_action_tail_shape_mismatch_names_both_shapes_and_the_server_flag() -> None:
    actions = np.zeros((4, 3, 7), np.float32)
    with pytest.raises(EnvContractError) as err:
        check_actions(actions, BOX2, None)
    msg = str(err.value)
    assert "Expected action shape tail (2,), got (7,)" in msg
    assert "--policy.action-dim" in msg
    assert "[4, 3, 7]" in msg


def test_action_tail_mismatch_for_a_discrete_space() -> None:
    with pytest.raises(EnvContractError, match=re.escape("Expected action shape tail (), got (3,)")):
        check_actions(np.zeros((2, 1, 3), np.int64), gym.spaces.Discrete(4), None)


def test_action_tail_mismatch_for_a_multi_dim_space() -> None:
    space = gym.spaces.Box(0.0, 1.0, (2, 3), np.float32)
    with pytest.raises(EnvContractError, match=re.escape("Expected action shape tail (2, 3), got (3, 2)")):
        check_actions(np.zeros((1, 1, 3, 2), np.float32), space, None)


def test_actions_are_cast_to_the_space_dtype() -> None:
    actions = np.array([[[0.5, -0.25]]], np.float32)
    out = check_actions(actions, BOX2, None)
    assert out.dtype == np.float64
    assert out.tolist() == [[[0.5, -0.25]]]

    same = np.zeros((2, 2, 2), np.float64)
    assert check_actions(same, BOX2, None) is same  # no copy when already right


def test_discrete_int_actions_keep_their_shape_and_take_the_space_dtype() -> None:
    space = gym.spaces.Discrete(5)
    out = check_actions(np.array([[1, 2], [3, 4]], np.int32), space, None)
    assert out.shape == (2, 2)
    assert out.dtype == space.dtype
    assert out.tolist() == [[1, 2], [3, 4]]


def test_non_finite_actions_raise_and_name_positions() -> None:
    actions = np.zeros((2, 3, 2), np.float32)
    actions[1, 2, 0] = np.nan
    with pytest.raises(ProtocolError) as err:
        check_actions(actions, BOX2, None)
    assert "NaN or infinite actions (for the infer's envs at positions [2])" in str(err.value)
    assert "--runner.non-finite-actions clip" in str(err.value)


def test_non_finite_actions_clipped_into_the_bounds() -> None:
    actions = np.array([[[np.nan, np.inf], [-np.inf, 0.5]]], np.float32)
    out = check_actions(actions, BOX2, None, non_finite="clip")
    assert out.tolist() == [[[0.0, 1.0], [-1.0, 0.5]]]


@pytest.mark.parametrize("mode", ["error", "clip"])
def test_nan_actions_for_an_integer_space_are_an_error_before_the_cast(mode: str) -> None:
    # Cast first, NaN would become an arbitrary integer and pass unnoticed.
    actions = np.array([[1.0, np.nan]])
    with pytest.raises(ProtocolError, match=re.escape("at positions [1]) for the integer action space Discrete(4)")):
        check_actions(actions, gym.spaces.Discrete(4), None, non_finite=mode)


def test_float_actions_for_an_integer_space_are_cast() -> None:
    out = check_actions(np.array([[1.0, 3.0]]), gym.spaces.Discrete(4), None)
    assert out.dtype == np.int64 and out.tolist() == [[1, 3]]


def test_non_numeric_actions_for_a_numeric_space_raise() -> None:
    with pytest.raises(ProtocolError, match="needs numbers"):
        check_actions(np.array([[["a", "b"]]]), BOX2, None)


def test_chunk_shorter_than_replan_steps_raises() -> None:
    with pytest.raises(ProtocolError, match=r"chunk of 2 steps.*replan-steps is 3"):
        check_actions(np.zeros((2, 1, 2), np.float32), BOX2, 3)
    # equal or longer is fine
    assert check_actions(np.zeros((3, 1, 2), np.float32), BOX2, 3).shape == (3, 1, 2)
    assert check_actions(np.zeros((5, 1, 2), np.float32), BOX2, 3).shape == (5, 1, 2)


@pytest.mark.parametrize("space, sent, expected", [
    (gym.spaces.Discrete(2), [[0, 5]], "the server's policy sent the action 5 (for the infer's envs at positions [1]), "
     "but the env's action space Discrete(2) allows 0 to 1: fix the server's policy"),
    (gym.spaces.Discrete(3, start=-1), [[-2, 0], [1, 0]], "sent the action -2 (for the infer's envs at positions [0]), "
     "but the env's action space Discrete(3, start=-1) allows -1 to 1"),
    (gym.spaces.Discrete(3, start=1), [[0, 1]], "sent the action 0 (for the infer's envs at positions [0]), but the "
     "env's action space Discrete(3, start=1) allows 1 to 3"),
    (gym.spaces.Discrete(2), [[1.0, 2.0]], "sent the action 2 (for the infer's envs at positions [1])"),
    (gym.spaces.Discrete(2), [[1e300, 0.0]], "sent the action 1e+300 (for the infer's envs at positions [0])"),
    (gym.spaces.MultiDiscrete([3, 2]), [[[2, 1], [0, 2]]], "sent 2 as component [1] of an action (for the infer's "
     "envs at positions [1]), but the env's action space MultiDiscrete([3 2]) allows 0 to 1 there"),
    (gym.spaces.MultiDiscrete([3, 2], start=[1, 0]), [[[0, 1]]], "sent 0 as component [0] of an action (for the "
     "infer's envs at positions [0]), but the env's action space MultiDiscrete([3 2], start=[1 0]) allows 1 to 3 "
     "there"),
    (gym.spaces.MultiBinary(3), [[[0, 1, 2]]], "sent 2 as component [2] of an action (for the infer's envs at "
     "positions [0]), but the env's action space MultiBinary(3) allows 0 to 1 there"),
])
def test_discrete_actions_outside_the_space_name_the_value_and_what_the_space_allows(space: gym.Space, sent: list,
                                                                                     expected: str) -> None:
    with pytest.raises(ProtocolError) as err:
        check_actions(np.asarray(sent), space, None)
    assert expected in str(err.value), str(err.value)


@pytest.mark.parametrize("space, sent", [
    (gym.spaces.Discrete(2), [[0, 1], [1, 1]]),
    (gym.spaces.Discrete(3, start=-1), [[-1, 1]]),
    (gym.spaces.MultiDiscrete([3, 2]), [[[2, 1], [0, 0]]]),
    (gym.spaces.MultiBinary(2), [[[True, False]]]),
])
def test_discrete_actions_inside_the_space_pass(space: gym.Space, sent: list) -> None:
    out = check_actions(np.asarray(sent), space, None)
    assert out.dtype == space.dtype and out.tolist() == np.asarray(sent).astype(space.dtype).tolist()


def test_finite_values_outside_a_box_still_reach_the_env() -> None:
    out = check_actions(np.array([[[5.0, -7.5]]]), BOX2, None)
    assert out.tolist() == [[[5.0, -7.5]]]


def test_a_value_beyond_the_dtype_of_a_float_box_says_it_does_not_fit() -> None:
    space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    actions = np.array([[[0.5, 1e300], [0.0, 0.0]]])
    with pytest.raises(ProtocolError) as err:
        check_actions(actions, space, None)
    msg = str(err.value)
    assert "the server's policy sent 1e+300 (for the infer's envs at positions [0]), which does not fit float32, the " \
           "dtype of the env's action space Box(-1.0, 1.0, (2,), float32) (largest 3.40282e+38)" in msg, msg
    assert "NaN" not in msg and "--runner.non-finite-actions clip" in msg
    clipped = check_actions(actions, space, None, non_finite="clip")
    assert clipped.dtype == np.float32 and clipped.tolist() == [[[0.5, 1.0], [0.0, 0.0]]]


def test_a_value_beyond_the_dtype_of_an_integer_box_says_it_does_not_fit() -> None:
    space = gym.spaces.Box(-3, 3, (1,), np.int32)
    with pytest.raises(ProtocolError, match=re.escape("sent 4000000000 (for the infer's envs at positions [1]), which does "
                                                      "not fit int32")):
        check_actions(np.array([[[1], [4_000_000_000]]], np.int64), space, None)
    assert check_actions(np.array([[[9]]], np.int64), space, None).tolist() == [[[9]]], "out of bounds: passes"


# ------------------------------------------------------------------------------------------------ a whole run


def test_a_server_sending_an_action_outside_a_discrete_space_is_blamed_for_it(tmp_path, capsys) -> None:
    """CartPole's Discrete(2) sent 5 by a reference server over a real socket: the run stops before the env sees it,
    naming the server's policy, the value and the space (without the check, Gymnasium's assert in step() made it
    look like the env's failure)."""
    from plugrl_env_client.app import run_client
    from plugrl_env_client.config import ClientConfig
    from plugrl_env_client.envs.gym.gym_env import GymEnvConfig
    from plugrl_env_client.server.policies import PolicyConfig, make_policy
    from plugrl_env_client.server.server import PolicyServer

    policy = make_policy(PolicyConfig(action_dim=0, dtype="int64", low=5, high=5), action_shape=(), low=5, high=5)
    server = PolicyServer(policy, host="127.0.0.1", port=0).start()
    try:
        config = ClientConfig(env=GymEnvConfig(id="CartPole-v1"), num_envs=2, num_episodes=2, server_port=server.port,
                              output_dir=tmp_path, exp_name="run", progress=False)
        assert run_client(config, "Gym-v1") == 1
    finally:
        server.shutdown()
    err = capsys.readouterr().err
    assert "error: process 0 failed: the server's policy sent the action 5 (for the infer's envs at positions [0, 1]), " \
           "but the env's action space Discrete(2) allows 0 to 1" in err, err
    assert "raised in step()" not in err and "Traceback" not in err
