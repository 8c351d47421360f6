"""The env contract: what reset and step must return, each broken rule a clear error at run time and a listed problem
for plugrl-check-env (read_reset, read_step, observation_problems), and what an env must keep from call to call: the
observation's layout, and the rows a partial reset was not asked to reset.

The rules one by one are check_reset and check_step (each value) and the checks across calls; the rollout applies
them all in one pass per step (EnvChecks), which must say exactly what they say. The tests across calls drive a
real :class:`EnvGroup` against the in-memory server (``fake_server``) with a scripted env (``scripted_env``) broken
in one way, and look at what the server got: a broken env stops the run before its observation is sent. Two runs
go over real sockets (``run_client``), as a user's run does.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import broken_envs
import gymnasium as gym
import numpy as np
import pytest
from fake_server import FakeServer, MemoryBudget, MemorySink, loop_settings
from scripted_env import ScriptedEnv, by_env

from plugrl_env_client.app import run_client
from plugrl_env_client.check import check_env
from plugrl_env_client.config import ClientConfig, RunnerConfig
from plugrl_env_client.envs import contract
from plugrl_env_client.envs.base_env import BaseEnv, BaseEnvConfig, Observation
from plugrl_env_client.envs.contract import ObservationSignature, PartialResetCheck, partial_reset_problem, slice_info
from plugrl_env_client.envs.registry import register_env
from plugrl_env_client.errors import EnvContractError
from plugrl_env_client.records import ProcessStatus
from plugrl_env_client.rollout.group import EnvGroup
from plugrl_env_client.rollout.loop import Rollout
from plugrl_env_client.timing import Timing

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


# ================================================================================================ across calls

FIX = "reset only the rows of `mask = self.reset_mask(options)`"


@dataclasses.dataclass
class Run:
    status: ProcessStatus
    server: FakeServer
    sink: MemorySink


def run(env: BaseEnv, server: FakeServer | None = None, episodes: int | None = 12, **overrides: Any) -> Run:
    """One group's rollout to its end (``episodes`` recorded, every env retired, or an error raised)."""
    server = server if server is not None else FakeServer()
    budget, sink, chosen = MemoryBudget(episodes), MemorySink(), loop_settings(**overrides)
    group = EnvGroup(env, server.session(), chosen, budget, sink, Timing())
    status = Rollout([group], chosen, budget, sink).run()
    return Run(status, server, sink)


def stopped(env: BaseEnv, server: FakeServer | None = None, **overrides: Any) -> tuple[str, FakeServer]:
    """Run ``env`` expecting its run to stop with an :class:`EnvContractError`: (the message, the server)."""
    server = server if server is not None else FakeServer()
    with pytest.raises(EnvContractError) as err:
        run(env, server, **overrides)
    return str(err.value), server


# ================================================================================================ layout


class ChangedStep(ScriptedEnv):
    """A scripted env whose ``step`` (or, with ``resets``, every reset after the first instead) returns its
    observation through ``change``."""

    def __init__(self, num_envs: int, change: Callable[[Observation], Observation], resets: bool = False,
                 images: bool = False, **kwargs: Any) -> None:
        super().__init__(num_envs, **kwargs)
        self.change, self.change_resets, self.images = change, resets, images

    def obs(self) -> Observation:
        obs = super().obs()
        if self.images:
            obs.images = {"cam": np.zeros((self.num_envs, 4, 4, 3), np.uint8)}
        return obs

    def step(self, actions: np.ndarray) -> Any:
        obs, *rest = super().step(actions)
        return (obs if self.change_resets else self.change(obs), *rest)

    def reset(self, *, seed: Any = None, options: dict[str, Any] | None = None) -> Any:
        obs, info = super().reset(seed=seed, options=options)
        return (self.change(obs) if self.change_resets and len(self.resets) > 1 else obs), info


def _with(obs: Observation, images: dict[str, np.ndarray] | None = None, **states: np.ndarray | None) -> Observation:
    out = Observation.__new__(Observation)
    out.images = dict(obs.images) if images is None else images
    out.states = {k: v for k, v in {**obs.states, **states}.items() if v is not None}
    out.text = obs.text
    return out


LAYOUT_CASES: dict[str, tuple[Callable[[Observation], Observation], str]] = {
    "shape": (lambda o: _with(o, a=np.zeros((3, 2))),
              "step() returned states['a'] of shape (3, 2) where the first reset() returned (3, 1)"),
    "dtype": (lambda o: _with(o, t=o.states["t"].astype(np.float32)),
              "step() returned states['t'] of dtype float32 where the first reset() returned float64"),
    "key appears": (lambda o: _with(o, extra=np.zeros((3, 1))),
                    "step() returned states['extra'], which the first reset() did not"),
    "key disappears": (lambda o: _with(o, a=None), "step() returned no states['a'], which the first reset() returned"),
    "image size": (lambda o: _with(o, images={"cam": np.zeros((3, 4, 5, 3), np.uint8)}),
                   "step() returned images['cam'] of shape (3, 4, 5, 3) where the first reset() returned (3, 4, 4, 3)"),
    "image gone": (lambda o: _with(o, images={}), "step() returned no images['cam'], which the first reset() returned"),
}


@pytest.mark.parametrize("case", sorted(LAYOUT_CASES))
def test_a_step_whose_layout_differs_from_the_first_reset_stops_before_it_is_sent(case: str) -> None:
    change, expected = LAYOUT_CASES[case]
    message, server = stopped(ChangedStep(3, change, images=True))
    assert message.startswith(f"env Scripted-v0: {expected}: an env returns the same observation keys"), message
    assert len(server.infers) == 1 and not server.feedbacks, "the first step's observation never reached the server"


def test_a_later_reset_whose_layout_differs_names_the_reset() -> None:
    message, server = stopped(ChangedStep(3, lambda o: _with(o, a=np.zeros((3, 2))), resets=True))
    assert "reset() returned states['a'] of shape (3, 2) where the first reset() returned (3, 1)" in message
    assert all(m.obs.states["a"].shape[1:] == (1,) for m in server.infers + server.feedbacks)


def test_every_change_is_named_in_one_message() -> None:
    message, _ = stopped(ChangedStep(3, lambda o: _with(o, a=np.zeros((3, 2)), env=None, t=o.states["t"].astype(int))))
    assert ("step() returned no states['env'], which the first reset() returned; step() returned states['t'] of "
            "dtype int64 where the first reset() returned float64; step() returned states['a'] of shape (3, 2) "
            "where the first reset() returned (3, 1): ") in message


def test_the_same_arrays_in_another_order_are_the_same_layout() -> None:
    def reorder(obs: Observation) -> Observation:
        out = _with(obs)
        out.states = dict(reversed(list(obs.states.items())))
        return out

    r = run(ChangedStep(3, reorder), episodes=9)
    assert r.status is ProcessStatus.FINISHED and len(r.sink.episodes) == 9


def _text(value: str) -> Callable[[Observation], Observation]:
    def change(obs: Observation) -> Observation:
        out = _with(obs)
        out.text = np.full(obs.batch_size, value)
        return out

    return change


def test_a_step_that_drops_the_text_is_warned_about_once(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, "plugrl_env_client"):
        r = run(ChangedStep(3, _text(""), text=True), episodes=9)
    assert r.status is ProcessStatus.FINISHED
    warned = [rec.getMessage() for rec in caplog.records if "returned no text" in rec.getMessage()]
    assert warned == ["step() returned no text (an empty string for every env) where the first reset() returned "
                      "text: a policy that reads text gets empty prompts; return the text on every step"]


def test_text_that_appears_after_an_empty_first_observation_is_fine(caplog: pytest.LogCaptureFixture) -> None:
    """Envs leave the first text empty on purpose (the instruction comes in info['env_instruction'])."""
    with caplog.at_level(logging.WARNING, "plugrl_env_client"):
        r = run(ChangedStep(3, _text("go on")), episodes=6)
    assert r.status is ProcessStatus.FINISHED and not caplog.records


# ------------------------------------------------------------------------------------------------ the signature alone


def obs(**states: np.ndarray) -> Observation:
    return Observation(states=states)


def test_signature_compares_shapes_dtypes_and_keys_but_not_values() -> None:
    sig = ObservationSignature()
    sig.check(obs(x=np.zeros((2, 3)), y=np.zeros((2,), np.int64)), "reset()")
    sig.check(obs(x=np.ones((2, 3)), y=np.arange(2)), "step()")
    sig.check(obs(y=np.arange(2), x=np.ones((2, 3))), "step()")  # order alone
    with pytest.raises(EnvContractError, match=r"step\(\) returned states\['x'\] of shape \(2, 2\) where the first "
                                               r"reset\(\) returned \(2, 3\)"):
        sig.check(obs(x=np.zeros((2, 2)), y=np.arange(2)), "step()")


# ================================================================================================ partial resets


class OthersTouched(ScriptedEnv):
    """A scripted env whose partial resets also change ``states['a']`` of the rows ``touched(mask)`` picks."""

    def __init__(self, num_envs: int, touched: Callable[[ScriptedEnv, np.ndarray], np.ndarray], **kwargs: Any) -> None:
        super().__init__(num_envs, **kwargs)
        self.touched = touched

    def reset(self, *, seed: Any = None, options: dict[str, Any] | None = None) -> Any:
        obs, info = super().reset(seed=seed, options=options)
        if options is not None:
            rows = self.touched(self, self.reset_mask(options))
            self.last_action[rows] = 0.5
            obs = self.obs()
        return obs, info


def every_other_row(env: ScriptedEnv, mask: np.ndarray) -> np.ndarray:
    return ~mask


def test_a_partial_reset_that_changes_other_rows_stops_the_run_with_rule_8s_message() -> None:
    """Episodes of 3, 5 and 4 steps: env 0's reset after step 3 also changes rows 1 and 2."""
    message, server = stopped(OthersTouched(3, every_other_row))
    assert message == ("env Scripted-v0: resetting envs [0] changed rows it was not asked to reset: states['a'] in "
                       f"envs [1, 2]: {FIX} (options['reset_mask'] or options['reset_indices']) and leave the others "
                       "as they are (checked after every partial reset; --runner.check-partial-reset off skips the "
                       "check)")
    assert all((m.obs.states["a"] != 0.5).all() for m in server.infers), "the changed rows were never sent"


def test_check_partial_reset_off_lets_such_an_env_run() -> None:
    r = run(OthersTouched(3, every_other_row), check_partial_reset="off")
    assert r.status is ProcessStatus.FINISHED and len(r.sink.episodes) == 12


def test_rows_not_reset_must_equal_the_step_before_not_the_reset_before() -> None:
    """An env that gives back the rows it did not reset as they were at the previous reset (a cached start)."""

    class StaleRows(ScriptedEnv):
        cached: Observation | None = None

        def reset(self, *, seed: Any = None, options: dict[str, Any] | None = None) -> Any:
            obs, info = super().reset(seed=seed, options=options)
            if self.cached is not None:
                keep = ~self.reset_mask(options)
                for key in obs.states:
                    obs.states[key][keep] = self.cached.states[key][keep]
            self.cached = obs
            return obs, info

    message, _ = stopped(StaleRows(3))
    assert "resetting envs [0] changed rows it was not asked to reset: states['a'] in envs [1, 2]; states['t'] in " \
           "envs [1, 2]: " in message


class BufferEnv(BaseEnv[BaseEnvConfig]):
    """Returns its own buffer as the observation (no copy) and re-randomises every row, in place, on any reset."""

    def __init__(self, num_envs: int = 3) -> None:
        super().__init__(BaseEnvConfig(), num_envs=num_envs)
        self.single_action_space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float64)
        self.pos = np.zeros((num_envs, 1))
        self.t = np.zeros(num_envs)

    def reset(self, *, seed: Any = None, options: dict[str, Any] | None = None) -> Any:
        self.seed_rngs(seed)
        self.pos[:] = self.np_random.uniform(-1.0, 1.0, self.pos.shape)
        self.t[self.reset_mask(options)] = 0
        return Observation(states={"pos": self.pos}), {}

    def step(self, actions: np.ndarray) -> Any:
        self.pos += 1e-3 * np.asarray(actions).reshape(self.pos.shape)
        self.t += 1
        n = self.num_envs
        return Observation(states={"pos": self.pos}), np.zeros(n, np.float32), self.t >= 2 + np.arange(n), \
            np.zeros(n, bool), {}


def test_an_env_that_changes_its_returned_buffers_in_place_is_caught_too() -> None:
    """The rows kept are copied before the reset runs: the env's earlier observation is the buffer it writes to."""
    message, _ = stopped(BufferEnv(3), seed=0)
    assert "resetting envs [0] changed rows it was not asked to reset: states['pos'] in envs [1, 2]" in message


def test_waiting_members_of_a_seed_group_are_not_the_resets_to_change() -> None:
    """Seed groups of 2, episodes of 2 and 4 steps: envs 0 and 2 end first and are reset alone while their group
    mates play on; an env that resets the whole group then changes rows 1 and 3."""

    def group_mates(env: ScriptedEnv, mask: np.ndarray) -> np.ndarray:
        rows = np.flatnonzero(mask)
        return np.setdiff1d(rows ^ 1, rows)

    env = OthersTouched(4, group_mates, length=by_env([2, 4]), per_env_seeds=True)
    message, _ = stopped(env, seed=1, group_size=2)
    assert "resetting envs [0, 2] changed rows it was not asked to reset: states['a'] in envs [1, 3]" in message


def test_retired_rows_are_not_the_resets_to_change() -> None:
    """Env 0 has one episode: its second reset retires it; the next reset (env 2's) must leave its row alone."""

    def retired(env: ScriptedEnv, mask: np.ndarray) -> np.ndarray:
        return ~mask & ~env.live

    env = OthersTouched(3, retired, length=by_env([3, 9, 4]), episodes_per_env=[1, 3, 3])
    message, _ = stopped(env, group_size=1)
    assert "resetting envs [2] changed rows it was not asked to reset: states['a'] in envs [0]" in message


@pytest.mark.parametrize("case", ["seed-groups", "retirement", "seed-groups-retirement"])
def test_envs_that_keep_their_other_rows_run_through_with_seed_groups_and_retirement(case: str) -> None:
    kwargs = {"seed-groups": dict(per_env_seeds=True), "retirement": dict(episodes_per_env=[1, 3, 2, 2]),
              "seed-groups-retirement": dict(per_env_seeds=True, episodes_per_env=2)}[case]
    env = ScriptedEnv(4, lambda e, k: 2 + (5 * e + k) % 4, **kwargs)
    r = run(env, episodes=None if "episodes_per_env" in kwargs else 16, seed=2,
            group_size=2 if kwargs.get("per_env_seeds") else 1)
    assert r.status is ProcessStatus.FINISHED and r.sink.episodes


def test_partial_reset_check_alone_treats_nan_as_equal_and_leaves_reset_rows_free() -> None:
    check = PartialResetCheck()
    check.seen(obs(x=np.array([[np.nan, 1.0], [2.0, 3.0], [4.0, 5.0]]), k=np.arange(3)))
    check.before(np.array([False, True, False]))
    assert check.after(obs(x=np.array([[np.nan, 1.0], [9.0, 9.0], [4.0, 5.0]]), k=np.array([0, 7, 2]))) is None
    check.before(np.array([True, False, False]))
    problem = check.after(obs(x=np.array([[0.0, 0.0], [9.0, 9.0], [4.0, 6.0]]), k=np.array([0, 8, 2])))
    assert problem is not None
    assert problem.seen == ("resetting envs [0] changed rows it was not asked to reset: states['k'] in envs [1]; "
                            "states['x'] in envs [2]")


# ------------------------------------------------------------------------------------------------ one rule, two callers


@pytest.mark.slow
@pytest.mark.parametrize("cls, reset, changed", [
    (broken_envs.ResetAllEnv, 0, 1),  # env 0's episode ends first (3 steps); its reset resets env 1 too
    (broken_envs.ResetFirstRowsEnv, 1, 0),  # then env 1's (4 steps): its reset resets env 0 instead
])
def test_the_run_and_plugrl_check_env_say_rule_8_in_the_same_words(cls: type[broken_envs.GoodEnv], reset: int,
                                                                   changed: int) -> None:
    checked = check_env(cls()).result(8)
    rule = partial_reset_problem([1], ["states['pos'] in envs [0]", "states['t'] in envs [0]"])
    assert (checked.status, checked.seen, checked.fix) == ("fail", rule.seen, rule.fix)
    message, _ = stopped(cls(), FakeServer(action_shape=(2,)), env_id="Broken-v0")
    ran = partial_reset_problem([reset], [f"states['pos'] in envs [{changed}]", f"states['t'] in envs [{changed}]"])
    assert message.startswith(f"env Broken-v0: {ran.message} ("), message


# ================================================================================================ whole runs


class ReshapedEnv(BaseEnv[BaseEnvConfig]):
    """``states['x']`` of (n, 3) from reset, (n, 2) from step."""

    def __init__(self, config: BaseEnvConfig, num_envs: int = 1, **kwargs: Any) -> None:
        super().__init__(config, num_envs=num_envs, **kwargs)
        self.single_action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)

    def reset(self, *, seed: Any = None, options: dict[str, Any] | None = None) -> Any:
        return Observation(states={"x": np.zeros((self.num_envs, 3))}), {}

    def step(self, actions: np.ndarray) -> Any:
        n = self.num_envs
        return Observation(states={"x": np.zeros((n, 2))}), np.zeros(n, np.float32), np.ones(n, bool), \
            np.zeros(n, bool), {}


class RerandomisingEnv(broken_envs.GoodEnv):
    """Every reset re-randomises every row (as if the mask were not there)."""

    def __init__(self, config: BaseEnvConfig | None = None, num_envs: int = 2, **kwargs: Any) -> None:
        super().__init__(None, num_envs=num_envs, **kwargs)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        return super().reset(seed=seed, options=None)


def client(tmp_path: Path, **kwargs: Any) -> ClientConfig:
    values: dict[str, Any] = dict(output_dir=tmp_path, exp_name="run", progress=False, num_envs=2, num_episodes=4,
                                  local_policy="random")
    return ClientConfig(**{**values, **kwargs})


def test_a_run_whose_env_changes_its_layout_fails_naming_the_key(registry: None, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    register_env("Reshaped-v1")(ReshapedEnv)
    assert run_client(client(tmp_path), "Reshaped-v1") == 1
    err = capsys.readouterr().err
    assert "error: process 0 failed: env Reshaped-v1: step() returned states['x'] of shape (2, 2) where the first " \
           "reset() returned (2, 3)" in err, err
    assert "Traceback" not in err
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["completed_episodes"] == 0


def test_a_run_whose_env_rerandomises_every_row_fails_unless_told_not_to_check(
        registry: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    register_env("Rerandomising-v1")(RerandomisingEnv)
    assert run_client(client(tmp_path), "Rerandomising-v1") == 1
    err = capsys.readouterr().err
    assert "env Rerandomising-v1: resetting envs [0] changed rows it was not asked to reset: states['pos'] in envs " \
           "[1]; states['t'] in envs [1]: reset only the rows" in err, err
    assert "--runner.check-partial-reset off" in err
    # Shared split: under the static one an env that ran its share is idle, its row is reset whenever it ends, and
    # this env's resets would restart the other env's episode every time.
    off = client(tmp_path, exp_name="off", runner=RunnerConfig(check_partial_reset="off", episode_split="shared"))
    assert run_client(off, "Rerandomising-v1") == 0


# ------------------------------------------------------------------------------------------------ lone surrogates


def test_text_without_a_lone_surrogate_is_left_as_it_is(caplog) -> None:
    from plugrl_env_client.envs.contract import TextCheck

    check = TextCheck("E-v1")
    obs = Observation(states={"x": np.zeros((2, 1))}, text=["plain", "\U0001f600 and \ud7ff and \ue000"])
    text = obs.text
    info = {"env_instruction": ["go", "go"], "metrics": {"m": np.ones(2)}, "tags": np.array(["a", "b"]), 3: "x"}
    check.observation(obs)
    assert obs.text is text and check.info(info) is info and not caplog.records


def test_lone_surrogates_become_u_fffd_with_one_warning_per_field(caplog) -> None:
    from plugrl_env_client.envs.contract import TextCheck

    check = TextCheck("E-v1")
    env_text = np.array(["a\ud800b", "ok"])
    obs = Observation(text=env_text)
    info = {"env_instruction": ("go\udfff", "fine"), "metrics": {"score\udc80": np.ones(2)},
            "tags": np.array(["\ud800", "t"]), "note": "n\ud801"}
    for _ in range(2):
        check.observation(obs)
        fixed = check.info(info)
    assert obs.text.tolist() == ["a\ufffdb", "ok"] and env_text[0] == "a\ud800b", "the env's array is not written to"
    assert fixed["env_instruction"] == ("go\ufffd", "fine") and list(fixed["metrics"]) == ["score\ufffd"]
    assert fixed["tags"].tolist() == ["\ufffd", "t"] and fixed["note"] == "n\ufffd"
    assert list(info["metrics"]) == ["score\udc80"], "the env's info is not written to"
    fields = ["the observation's text", "info['env_instruction']", "a key of info['metrics']", "info['tags']",
              "info['note']"]
    assert sorted(r.getMessage() for r in caplog.records) == sorted(
        f"env E-v1 returned a lone surrogate (half of a UTF-16 pair, which no UTF-8 file or message can hold) in "
        f"{field}; each one is replaced by U+FFFD" for field in fields)


@pytest.mark.parametrize("rows, width, order", [(2, 3, "<"), (2, 3, ">"), (300, 20, "<"), (300, 20, ">")])
def test_lone_surrogates_are_found_in_small_and_big_batches_of_either_byte_order(rows, width, order) -> None:
    """Small batches are checked by decoding them, big ones by a reduction; a byte-swapped '>U' array is read as
    code points, not as its raw bytes."""
    from plugrl_env_client.envs.contract import TextCheck

    text = np.array(["x" * (width - 1)] * rows, dtype=f"{order}U{width}")
    text[rows // 2] = "y\ud800"
    obs = Observation(text=text)
    TextCheck("E-v1").observation(obs)
    assert obs.text[rows // 2] == "y\ufffd" and obs.text[0] == "x" * (width - 1)
    clean = Observation(text=np.array(["x" * (width - 1)] * rows, dtype=f"{order}U{width}"))
    kept = clean.text
    TextCheck("E-v1").observation(clean)
    assert clean.text is kept


def test_a_text_seen_clean_is_passed_over_and_a_new_one_is_still_fixed(caplog) -> None:
    """Short str values that come back step after step (a metric's mode) are looked at once; a new value, or the
    same key with another value, is checked again, also deep in the info, and named by its path."""
    from plugrl_env_client.envs.contract import TextCheck

    check = TextCheck("E-v1")
    info = {"metrics_agg_mode": {"score": "mean"}, "tag": "t"}
    for _ in range(3):
        assert check.info(info) is info
    fixed = check.info({"metrics_agg_mode": {"score": "me\ud800"}, "tag": "t"})
    assert fixed["metrics_agg_mode"] == {"score": "me\ufffd"} and fixed["tag"] == "t"
    assert [r.getMessage().split(" in ")[1] for r in caplog.records] == [
        "info['metrics_agg_mode']['score']; each one is replaced by U+FFFD"]
    assert check.info(info) is info


# ================================================================================================ the one pass


def _states(n: int = 2, **arrays: np.ndarray) -> Observation:
    return Observation(states=arrays or {"x": np.zeros((n, 3), np.float32)}, text="go on")


_F32 = np.zeros(2, np.float32)
def _good() -> tuple[Any, ...]:
    return (_states(), _F32, _flags(2), _flags(2), {})

_ONE_PASS_CASES: dict[str, Callable[[], list[Any]]] = {  # built afresh for each run: a fix is made in place
    "good": lambda: [_good()],
    "float64 rewards, list flags": lambda: [(_states(), np.zeros(2), [False, True], _flags(2), {"k": np.arange(2)})],
    "four values": lambda: [(_states(), _F32, _flags(2), {})],
    "a list of five": lambda: [list(_good())],
    "a bare array": lambda: [np.zeros(2)],
    "no Observation": lambda: [(np.zeros((2, 3)), _F32, _flags(2), _flags(2), {})],
    "a batch of 3": lambda: [(_states(3), _F32, _flags(2), _flags(2), {})],
    "info a list": lambda: [(_states(), _F32, _flags(2), _flags(2), [])],
    "rewards of 3": lambda: [(_states(), np.zeros(3, np.float32), _flags(2), _flags(2), {})],
    "int flags": lambda: [(_states(), _F32, np.zeros(2, int), _flags(2), {})],
    "NaN reward": lambda: [(_states(), np.array([0.0, np.nan], np.float32), _flags(2), _flags(2), {})],
    "reward beyond float32": lambda: [(_states(), np.array([0.0, 1e39]), _flags(2), _flags(2), {})],
    "NaN state": lambda: [(_states(x=np.array([[0.0], [np.nan]], np.float32)), _F32, _flags(2), _flags(2), {})],
    "string state": lambda: [(_states(x=np.array([["a"], ["b"]])), _F32, _flags(2), _flags(2), {})],
    "scalar-batch state": lambda: [(_states(x=np.zeros((3, 1), np.float32)), _F32, _flags(2), _flags(2), {})],
    "float image": lambda: [(Observation(images={"cam": np.zeros((2, 4, 4, 3), np.float32)}), _F32, _flags(2), _flags(2),
                     {})],
    "3-d image": lambda: [(Observation(images={"cam": np.zeros((2, 4, 4), np.uint8)}), _F32, _flags(2), _flags(2), {})],
    "a lone surrogate": lambda: [(Observation(states={"x": np.zeros((2, 3), np.float32)}, text=["ok", "\ud800"]), _F32,
                          _flags(2), _flags(2), {"note": "\udc00"})],
    "layout changed": lambda: [_good(), (_states(x=np.zeros((2, 4), np.float32)), _F32, _flags(2), _flags(2), {})],
    "dtype changed": lambda: [_good(), (_states(x=np.zeros((2, 3))), _F32, _flags(2), _flags(2), {})],
    "keys reordered": lambda: [(_states(a=np.zeros((2, 1), np.float32), b=np.zeros((2, 1), np.float32)), _F32, _flags(2),
                        _flags(2), {}),
                       (_states(b=np.zeros((2, 1), np.float32), a=np.zeros((2, 1), np.float32)), _F32, _flags(2),
                        _flags(2), {})],
    "text dropped": lambda: [_good(), (Observation(states={"x": np.zeros((2, 3), np.float32)}), _F32, _flags(2), _flags(2),
                             {})],
}


def _outcome(step: Callable[[Any], contract.StepOutput], results: list[Any]) -> list[Any]:
    """What each step of ``results`` came to: its values as the client uses them, or the error's message."""
    out: list[Any] = []
    for result in results:
        try:
            got = step(result)
        except EnvContractError as exc:
            out.append(str(exc))
            break
        out.append((got.rewards.dtype.str, got.rewards.tolist(), got.terminated.tolist(), got.truncated.tolist(),
                    got.zeroed_rewards.tolist(), got.zeroed_why, got.obs.text.tolist(), repr(got.info),
                    {k: (v.shape, v.dtype.str) for k, v in got.obs.states.items()}))
    return out


@pytest.mark.parametrize("mode", ["error", "zero"])
@pytest.mark.parametrize("case", list(_ONE_PASS_CASES))
def test_the_one_pass_says_what_the_rules_say_one_by_one(case: str, mode: str, caplog: pytest.LogCaptureFixture
                                                         ) -> None:
    """Whatever an env returns, a step checked in one pass comes to the same values, the same error in the same
    words, and the same warnings as the same step checked rule by rule (check_step, then the rules across calls)."""
    caplog.set_level(logging.WARNING)
    one_pass = contract.EnvChecks("E-v1", 2, non_finite_rewards=mode)  # type: ignore[arg-type]
    fast = _outcome(one_pass.step, _ONE_PASS_CASES[case]())
    fast_logs = [r.getMessage() for r in caplog.records]
    caplog.clear()
    by_rule = contract.EnvChecks("E-v1", 2, non_finite_rewards=mode)  # type: ignore[arg-type]
    slow = _outcome(by_rule._step_rule_by_rule, _ONE_PASS_CASES[case]())
    assert fast == slow
    assert fast_logs == [r.getMessage() for r in caplog.records]


def test_a_good_step_is_checked_in_one_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """A step whose values are as the client uses them, with the layout of the first observation, does not go over
    the rules one by one (its arrays are looked at once, in the pass), and still comes back as it was returned."""
    checks = contract.EnvChecks("E-v1", 2)
    checks.step(_good())  # the first observation sets the layout, rule by rule

    def by_rule(*args: Any) -> None:
        raise AssertionError("a good step went over the rules one by one")

    monkeypatch.setattr(contract, "check_step", by_rule)
    monkeypatch.setattr(contract, "observation_problems", by_rule)
    monkeypatch.setattr(contract.ObservationSignature, "check", by_rule)
    obs = _states()
    out = checks.step((obs, _F32, _flags(2), _flags(2), {}))
    assert out.obs is obs and out.rewards is _F32 and out.zeroed_rewards.size == 0
    with pytest.raises(EnvContractError, match=r"^env E-v1: step\(\) returned NaN or infinite values: states\['x'\] "
                                               r"in envs \[1\]"):
        monkeypatch.undo()
        checks.step((_states(x=np.array([[0.0] * 3, [np.inf] * 3], np.float32)), _F32, _flags(2), _flags(2), {}))
