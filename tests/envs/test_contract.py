"""The env contract: what reset and step must return, each broken rule a clear error at run time (check_reset,
check_step) and a listed problem for plugrl-check-env (read_reset, read_step, observation_problems)."""

from __future__ import annotations

import re

import gymnasium as gym
import numpy as np
import pytest

from plugrl_env_client.envs import contract
from plugrl_env_client.envs.base_env import BaseEnv, Observation
from plugrl_env_client.envs.contract import slice_info
from plugrl_env_client.errors import EnvContractError

BOX2 = gym.spaces.Box(-1.0, 1.0, (2,), np.float64)


def _obs(n: int) -> Observation:
    return Observation(states={"x": np.zeros((n, 3))}, text="t")


# ------------------------------------------------------------------------------------------------ step


def _flags(n: int) -> np.ndarray:
    return np.zeros(n, bool)


def _step(obs: Observation, rewards, terminated=None, truncated=None, info=None):
    n = obs.batch_size
    return (obs, rewards, _flags(n) if terminated is None else terminated,
            _flags(n) if truncated is None else truncated, {} if info is None else info)


def test_check_step_accepts_and_converts() -> None:
    info = {"k": np.arange(2)}
    out = contract.check_step(2, (_obs(2), np.array([1.0, 2.0]), np.array([True, False]), [False, False], info))
    assert isinstance(out, contract.StepOutput)
    assert out.rewards.dtype == np.float32 and out.rewards.tolist() == [1.0, 2.0]
    assert out.terminated.dtype == bool and out.terminated.tolist() == [True, False]
    assert out.truncated.dtype == bool and out.truncated.tolist() == [False, False]
    assert out.info is info and out.obs.batch_size == 2
    assert out.zeroed_rewards.size == 0


def test_check_step_keeps_float32_rewards_without_a_copy() -> None:
    rewards = np.array([0.5, -1.0], np.float32)
    assert contract.check_step(2, _step(_obs(2), rewards)).rewards is rewards


def test_check_step_accepts_int_rewards() -> None:
    out = contract.check_step(2, _step(_obs(2), np.array([1, 2])))
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
        contract.check_step(2, result)
    assert words in str(err.value)
    if "got 6" in words:
        assert "old gym" not in str(err.value)


def test_scalar_reward_for_one_env_raises() -> None:
    with pytest.raises(EnvContractError, match=re.escape("Expected reward shape (1,), got ()")):
        contract.check_step(1, _step(_obs(1), np.float32(1.0)))


def test_wrong_length_flags_raise() -> None:
    with pytest.raises(EnvContractError, match=re.escape("Expected truncated shape (2,), got (3,)")):
        contract.check_step(2, _step(_obs(2), np.zeros(2), truncated=np.zeros(3, bool)))


@pytest.mark.parametrize("which", ["terminated", "truncated"])
def test_non_bool_flags_raise(which: str) -> None:
    flags = {"terminated": _flags(2), "truncated": _flags(2), which: np.array([0, 1])}
    with pytest.raises(EnvContractError) as err:
        contract.check_step(2, _step(_obs(2), np.zeros(2), flags["terminated"], flags["truncated"]))
    assert f"Expected {which} of dtype bool, got int64: return `np.asarray({which}, dtype=bool)`" in str(err.value)


def test_non_numeric_rewards_raise() -> None:
    with pytest.raises(EnvContractError, match="Expected numeric rewards, got dtype <U1"):
        contract.check_step(2, _step(_obs(2), np.array(["a", "b"])))


def test_step_observation_of_the_wrong_batch_raises() -> None:
    with pytest.raises(EnvContractError) as err:
        contract.check_step(2, _step(_obs(3), np.zeros(2)))
    assert "step() returned an Observation of 3 envs; expected 2: return every env's row" in str(err.value)
    with pytest.raises(EnvContractError, match="an Observation of 1 env; expected 2"):
        contract.check_step(2, _step(_obs(1), np.zeros(2)))


def test_step_must_return_an_observation_and_a_dict_info() -> None:
    with pytest.raises(EnvContractError, match="must return an Observation as its first value, got dict"):
        contract.check_step(2, ({"states": {}}, np.zeros(2), _flags(2), _flags(2), {}))
    with pytest.raises(EnvContractError, match=re.escape("step() must return a dict as info, got list: return {}")):
        contract.check_step(2, (_obs(2), np.zeros(2), _flags(2), _flags(2), []))


def test_read_step_lists_every_broken_rule_where_check_step_stops_at_the_first() -> None:
    result = (_obs(3), np.array(["a", "b"]), np.array([0, 1]), np.zeros(3, bool), [])
    out, problems = contract.read_step(2, result)
    assert out is None
    assert [p.key for p in problems] == ["observation batch", "info", "rewards dtype", "terminated dtype",
                                         "truncated shape"]
    assert all(p.severity == "error" and p.seen and p.fix for p in problems)
    with pytest.raises(EnvContractError) as err:
        contract.check_step(2, result)
    assert str(err.value) == problems[0].message


@pytest.mark.parametrize("dtype", [np.float64, np.int64])
def test_rewards_the_client_casts_are_a_warning_and_the_step_is_usable(dtype) -> None:
    out, problems = contract.read_step(2, _step(_obs(2), np.array([1, 2], dtype)))
    assert out is not None and out.rewards.dtype == np.float32 and out.rewards.tolist() == [1.0, 2.0]
    assert [(p.severity, p.seen, p.fix) for p in problems] == [
        ("warning", f"rewards have dtype {np.dtype(dtype)} (the client casts them to float32)",
         "return `reward.astype(np.float32)`")]
    assert contract.read_step(2, _step(_obs(2), np.array([1, 2], dtype)), warnings=False)[1] == []


def test_read_step_leaves_non_finite_rewards_to_the_caller() -> None:
    out, problems = contract.read_step(2, _step(_obs(2), np.array([np.nan, 1.0], np.float32)))
    assert problems == [] and out is not None and np.isnan(out.rewards[0])


def test_a_step_without_an_observation_says_how_to_wrap_the_arrays() -> None:
    with pytest.raises(EnvContractError) as err:
        contract.check_step(2, (np.zeros((2, 3)), np.zeros(2), _flags(2), _flags(2), {}))
    assert str(err.value) == ("step() must return an Observation as its first value, got ndarray: wrap the arrays "
                              "in Observation(images=..., states=..., text=...)")


# ------------------------------------------------------------------------------------------------ non-finite


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_rewards_name_the_rows_and_the_flag(bad: float) -> None:
    rewards = np.array([0.0, bad, 1.0, bad], np.float32)
    with pytest.raises(EnvContractError) as err:
        contract.check_step(4, _step(_obs(4), rewards))
    msg = str(err.value)
    assert "step() returned NaN or infinite rewards for envs [1, 3]" in msg
    assert "--runner.non-finite-rewards zero" in msg


def test_a_finite_float64_reward_beyond_float32_range_does_not_fit_float32() -> None:
    with pytest.raises(EnvContractError) as err:
        contract.check_step(2, _step(_obs(2), np.array([1e39, 0.0])))
    assert str(err.value) == ("step() returned rewards that do not fit float32 (1e+39; float32's largest is "
                              "3.40282e+38) for envs [0]: scale the rewards into float32's range, or pass "
                              "--runner.non-finite-rewards zero to replace them by 0.0")


def test_nan_next_to_a_reward_too_large_for_float32_is_named_as_nan() -> None:
    with pytest.raises(EnvContractError, match=re.escape("step() returned NaN or infinite rewards for envs [1]:")):
        contract.check_step(2, _step(_obs(2), np.array([1e39, np.nan])))


def test_rewards_too_large_for_float32_are_zeroed_under_their_own_words() -> None:
    out = contract.check_step(3, _step(_obs(3), np.array([-1e39, 2.0, np.inf])), non_finite_rewards="zero")
    assert out.rewards.tolist() == [0.0, 2.0, 0.0] and out.zeroed_rewards.tolist() == [0, 2]
    assert out.zeroed_why == ("NaN/inf rewards and rewards that do not fit float32 (-1e+39; float32's largest is "
                              "3.40282e+38)")
    assert contract.check_step(1, _step(_obs(1), np.array([1e39])), non_finite_rewards="zero").zeroed_why == (
        "rewards that do not fit float32 (1e+39; float32's largest is 3.40282e+38)")


def test_non_finite_rewards_replaced_by_zero_and_the_rows_returned() -> None:
    rewards = np.array([np.nan, 2.0, np.inf], np.float32)
    out = contract.check_step(3, _step(_obs(3), rewards), non_finite_rewards="zero")
    assert out.rewards.tolist() == [0.0, 2.0, 0.0]
    assert out.rewards.dtype == np.float32
    assert out.zeroed_rewards.tolist() == [0, 2] and out.zeroed_why == "NaN/inf rewards"
    assert np.isnan(rewards[0])  # the env's own array is not written to


def test_non_finite_rewards_mode_is_validated() -> None:
    with pytest.raises(ValueError, match="'error' or 'zero'"):
        contract.check_step(1, _step(_obs(1), np.array([np.nan])), non_finite_rewards="clip")  # type: ignore[arg-type]


def _nan_obs(n: int) -> Observation:
    pos = np.zeros((n, 2))
    pos[1, 0] = np.nan
    vel = np.zeros((n, 2, 2), np.float32)
    vel[0, 1, 1] = np.inf
    vel[2, 0, 0] = -np.inf
    return Observation(states={"pos": pos, "vel": vel, "count": np.arange(n)}, text="x")


def test_non_finite_step_observation_names_keys_rows_and_flag() -> None:
    with pytest.raises(EnvContractError) as err:
        contract.check_step(3, _step(_nan_obs(3), np.zeros(3)))
    msg = str(err.value)
    assert "step() returned NaN or infinite values: states['pos'] in envs [1]; states['vel'] in envs [0, 2]" in msg
    assert "count" not in msg
    assert "--runner.non-finite-observations allow" in msg


def test_non_finite_reset_observation_raises_unless_allowed() -> None:
    with pytest.raises(EnvContractError, match=re.escape("reset() returned NaN or infinite values: states['pos'] in envs [1]")):
        contract.check_reset(3, (_nan_obs(3), {}))
    obs, info = contract.check_reset(3, (_nan_obs(3), {}), non_finite_observations="allow")
    assert np.isnan(obs.states["pos"][1, 0])


def test_non_finite_observations_allowed() -> None:
    out = contract.check_step(3, _step(_nan_obs(3), np.zeros(3)), non_finite_observations="allow")
    assert np.isinf(out.obs.states["vel"][0, 1, 1])


def test_non_finite_rows_only_for_float_arrays() -> None:
    assert contract.non_finite_rows(np.arange(3)) is None
    assert contract.non_finite_rows(np.ones((3, 2))) is None
    arr = np.ones((4, 2, 2))
    arr[3, 1, 0] = np.nan
    assert contract.non_finite_rows(arr).tolist() == [3]


def test_long_row_lists_are_shortened() -> None:
    rewards = np.full(30, np.nan, np.float32)
    with pytest.raises(EnvContractError, match=re.escape("for envs [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, ... (30 in all)]")):
        contract.check_step(30, _step(_obs(30), rewards))


# ------------------------------------------------------------------------------------------------ reset


def test_check_reset_returns_observation_and_info() -> None:
    obs, info = _obs(2), {"seed": 3}
    got_obs, got_info = contract.check_reset(2, (obs, info))
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
        contract.check_reset(2, result)
    assert words in str(err.value)


def test_read_reset_lists_every_broken_rule() -> None:
    values, problems = contract.read_reset(2, ({"x": 1}, None))
    assert values is None
    assert [p.seen for p in problems] == ["reset() must return an Observation as its first value, got dict",
                                          "reset() must return a dict as info, got NoneType"]
    obs, info = _obs(2), {}
    assert contract.read_reset(2, (obs, info)) == ((obs, info), [])


@pytest.mark.parametrize(
    "value,words",
    [(_obs(1), "a bare Observation"), ((1, 2), "a tuple of 2 values"), ([1], "a list of 1 value"),
     (np.zeros((2, 3)), "an array of shape (2, 3)"), (None, "None"), ({}, "a dict"), (3, "a int")],
)
def test_describe_value(value, words: str) -> None:
    assert contract.describe_value(value) == words


# ------------------------------------------------------------------------------------------------ action space


class _NoSpaceEnv(BaseEnv):
    pass


class _SpaceEnv(BaseEnv):
    def __init__(self) -> None:
        super().__init__(None, num_envs=2)
        self.single_action_space = BOX2


def test_action_space_missing_raises() -> None:
    with pytest.raises(EnvContractError, match="Env must expose action space via single_action_space/action_space"):
        contract.action_space_of(_NoSpaceEnv(None, num_envs=2))


def test_action_space_of_returns_the_single_space() -> None:
    assert contract.action_space_of(_SpaceEnv()) is BOX2


def test_action_space_that_is_not_a_space_raises() -> None:
    env = _SpaceEnv()
    env.single_action_space = (2,)  # type: ignore[assignment]
    with pytest.raises(EnvContractError, match=re.escape("single_action_space is a tuple of 1 value, not a gymnasium Space")):
        contract.action_space_of(env)



@pytest.mark.parametrize("space", [gym.spaces.Dict({"a": gym.spaces.Discrete(2)}),
                                   gym.spaces.Tuple((gym.spaces.Discrete(2), BOX2))], ids=["dict", "tuple"])
def test_an_action_space_of_several_arrays_is_refused(space: gym.Space) -> None:
    env = _SpaceEnv()
    env.single_action_space = space
    problem = contract.action_space_problem(env)
    assert problem is not None and "the client sends one array per env" in problem.seen
    assert problem.fix.startswith("use a Box (flatten the parts into one vector)")
    with pytest.raises(EnvContractError, match="sends one array per env: use a Box"):
        contract.action_space_of(env)
    assert contract.action_space_problem(_SpaceEnv()) is None


# ------------------------------------------------------------------------------------------------ observations

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
        contract.check_step(2, _step(obs(2), np.zeros(2, np.float32)))
    with pytest.raises(EnvContractError, match=re.escape(words)):
        contract.check_reset(2, (obs(2), {}))


def test_uint8_images_skip_the_finite_check() -> None:
    obs = Observation(images={"cam": np.full((2, 2, 2, 3), 255, np.uint8)}, states={"s": np.ones((2, 1))})
    assert contract.check_step(2, _step(obs, np.zeros(2))).obs is obs


def test_observation_problems_name_each_array_with_its_own_fix() -> None:
    obs = _with_state(2, "pos", np.zeros((3, 3)))  # changed after the Observation checked its batch
    obs.images = {"depth": np.zeros((2, 4, 4, 1), np.float32), "gray": np.zeros((2, 4, 4), np.uint8)}
    obs.states = {"tag": np.array([["a"], ["b"]], dtype=object), "pos": obs.states["pos"]}
    problems = contract.observation_problems(2, obs, "step 4")
    assert [p.key for p in problems] == ["images['depth'] layout", "images['gray'] layout", "states['tag'] dtype",
                                         "states['pos'] batch"]
    depth, gray, tag, pos = problems
    assert depth.seen == ("step 4 returned images['depth'] of dtype float32 and shape (2, 4, 4, 1); images must be "
                          "uint8 (n, height, width, channels)")
    assert ".astype(np.uint8)" in depth.fix and "img[..., None]" in gray.fix
    assert tag.message == "step 4 returned states['tag'] of dtype object; states must be numeric: put strings in " \
                          "text, other values in info"
    assert pos.message == "step 4 returned states['pos'] of shape (3, 3); every array needs the batch leading: put " \
                          "the batch first: (2, ...)"
    with pytest.raises(EnvContractError, match=re.escape("step() returned states['pos'] of shape (3, 3)")):
        contract.check_step(2, (_with_state(2, "pos", np.zeros((3, 3))), np.zeros(2), _flags(2), _flags(2), {}))


def _with_state(n: int, key: str, arr: np.ndarray) -> Observation:
    """An Observation of ``n`` envs whose ``states[key]`` was replaced by ``arr`` after it checked its arrays."""
    obs = Observation(states={"t": np.zeros((n, 1)), key: np.zeros((n, *arr.shape[1:]), arr.dtype)})
    obs.states[key] = arr
    return obs


def test_non_finite_states_by_key_with_their_rows() -> None:
    assert contract.non_finite_states(_obs(3)) == {}
    bad = contract.non_finite_states(_nan_obs(3))
    assert {k: v.tolist() for k, v in bad.items()} == {"pos": [1], "vel": [0, 2]}


# ------------------------------------------------------------------------------------------------ info and words


def test_is_per_env_is_what_reaches_the_server() -> None:
    n = 3
    assert contract.is_per_env(np.zeros(n), n) and contract.is_per_env(np.zeros((n, 2), bool), n)
    assert contract.is_per_env(np.array(["a", "b", "c"]), n)
    assert not contract.is_per_env(np.array([object()] * n, dtype=object), n)
    assert not contract.is_per_env(np.zeros(n + 1), n) and not contract.is_per_env(np.array(1.0), n)
    assert not contract.is_per_env([1, 2, 3], n) and not contract.is_per_env(2.0, n)


def test_rows_text_of_arrays_and_lists() -> None:
    assert contract.rows_text(np.array([1, 4])) == "[1, 4]" and contract.rows_text([0]) == "[0]"
    assert contract.rows_text(list(range(12))) == "[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, ... (12 in all)]"


def test_short_space_cuts_a_long_space_to_one_line() -> None:
    space = gym.spaces.Dict({f"key{i}": gym.spaces.Discrete(2) for i in range(20)})
    text = contract.short_space(space)
    assert len(text) == 100 and text.endswith("...") and text.startswith("Dict('key0': Discrete(2)")
    assert contract.short_space(BOX2) == str(BOX2)


def test_a_problem_reads_as_what_came_then_what_to_do() -> None:
    assert contract.Problem("got 3", "return 5").message == "got 3: return 5"
    assert contract.Problem("got 3").message == "got 3"


# ------------------------------------------------------------------------------------------------ info cut to rows


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
    out = slice_info(info, rows, n)
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
    assert slice_info({"a": 1, "b": np.zeros(3)}, np.array([0]), 2) == {}
