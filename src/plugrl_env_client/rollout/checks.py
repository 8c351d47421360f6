"""Contract checks on what an env returns and on what a server sends as actions, run on every step.

Each failure is one error whose message says what was expected, what came and what to change. Messages do not
name the env: the rollout loop prefixes ``env <id>: `` when it turns them into the user's error.

The checks run on every env step, so they look at types, shapes and dtypes, and make one vectorised
``np.isfinite(...).all()`` pass per float array; which rows are wrong is worked out only once something is.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import gymnasium as gym
import numpy as np

from plugrl_env_client.envs.base_env import BaseEnv, Observation, describe_space
from plugrl_env_client.errors import EnvContractError, ProtocolError

NonFiniteRewards = Literal["error", "zero"]
"""What to do with NaN/inf rewards: stop with an error, or replace them by 0.0 (the caller logs the rows)."""
NonFiniteObservations = Literal["error", "allow"]
"""What to do with NaN/inf in float state arrays: stop with an error, or send them as they are."""

REWARDS_FLAG = "--runner.non-finite-rewards zero"
OBSERVATIONS_FLAG = "--runner.non-finite-observations allow"

_STEP_VALUES = "(obs, reward, terminated, truncated, info)"
_NO_ROWS = np.zeros(0, np.intp)
_NO_ROWS.setflags(write=False)


@dataclasses.dataclass(frozen=True, slots=True)
class StepOutput:
    """One checked ``env.step`` result: rewards float32 ``(n,)``, flags bool ``(n,)``, info a dict."""

    obs: Observation
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    info: dict[str, Any]
    zeroed_rewards: np.ndarray
    """Env indices whose NaN/inf reward was replaced by 0.0 (only with ``non_finite_rewards="zero"``; usually
    empty). The caller logs them: a replaced reward changes the return the run reports."""


# ------------------------------------------------------------------------------------------------ action space


def action_space_of(env: BaseEnv) -> gym.Space:
    """The env's unbatched action space (the policy's contract)."""
    space = getattr(env, "single_action_space", None)
    if space is None:
        raise EnvContractError(
            "Env must expose action space via single_action_space/action_space: set "
            "`self.single_action_space = gymnasium.spaces.Box(...)` in the env's __init__"
        )
    if not isinstance(space, gym.Space):
        raise EnvContractError(
            f"the env's single_action_space is {describe_value(space)}, not a gymnasium Space: set "
            "`self.single_action_space = gymnasium.spaces.Box(...)` (or Discrete, MultiDiscrete, Text, ...)"
        )
    return space


# ------------------------------------------------------------------------------------------------ server actions


def check_actions(actions: np.ndarray, space: gym.Space, replan_steps: int | None, non_finite: str = "error") -> np.ndarray:
    """A server's chunk ``[H, m, *shape]`` checked against the env's action space, in the space's dtype.

    NaN or infinite values for a float space are an error (``non_finite="error"``) or are clipped into the
    space's bounds (``"clip"``: NaN becomes 0, then everything is clipped to [low, high]). For an integer space
    (Discrete, MultiDiscrete, ...) they are always an error: casting NaN to an integer gives an arbitrary number,
    and there are no float bounds to clip to.
    """
    expected = tuple(space.shape or ())
    tail = tuple(actions.shape[2:])
    if tail != expected:
        if isinstance(space, gym.spaces.Text):
            raise EnvContractError(
                f"Expected one text action per env (action shape tail ()), got {tail} (server sent actions of shape "
                f"{list(actions.shape)}). The env's single_action_space is {describe_space(space)}: the server needs "
                "a text policy (e.g. plugrl-run-policy-server --policy.name text --policy.choices ...)."
            )
        dim_hint = f" (e.g. its --policy.action-dim {expected[0]})" if len(expected) == 1 else ""
        raise EnvContractError(
            f"Expected action shape tail {expected}, got {tail} (server sent actions of shape {list(actions.shape)}). "
            f"The server's action dim{dim_hint} must match the env's single_action_space {space}."
        )
    if replan_steps is not None and actions.shape[0] < replan_steps:
        raise ProtocolError(
            f"the server sent a chunk of {actions.shape[0]} steps but --runner.replan-steps is {replan_steps}; "
            "lower --runner.replan-steps or raise the server's action horizon"
        )
    dtype = getattr(space, "dtype", None)
    if dtype is not None and np.dtype(dtype).kind == "U" and actions.dtype.kind != "U":
        raise ProtocolError(f"the server sent actions of dtype {actions.dtype.str}; the env's action space "
                            f"{describe_space(space)} needs text (a '<U' array, or lists of str): use a text policy "
                            "(e.g. plugrl-run-policy-server --policy.name text --policy.choices ...)")
    if dtype is not None and np.dtype(dtype).kind in "biuf":
        if actions.dtype.kind not in "biuf":
            raise ProtocolError(f"the server sent actions of dtype {actions.dtype.str}; the env's action space {space} needs numbers")
        if actions.dtype.kind == "f" and np.dtype(dtype).kind != "f" and not np.isfinite(actions).all():
            raise ProtocolError(
                f"the server sent NaN or infinite actions (for the infer's envs at positions "
                f"{_rows_text(_bad_action_positions(actions))}) for the integer action space {space}; fix the policy"
            )
        actions = actions.astype(dtype, copy=False)
        if actions.dtype.kind == "f" and not np.isfinite(actions).all():
            actions = _non_finite(actions, space, non_finite)
    return actions


def _bad_action_positions(actions: np.ndarray) -> np.ndarray:
    """Positions (in the infer's env order) whose chunk holds a NaN/inf anywhere."""
    return np.flatnonzero(~np.isfinite(actions).reshape(actions.shape[0], actions.shape[1], -1).all(axis=(0, 2)))


def _non_finite(actions: np.ndarray, space: gym.Space, mode: str) -> np.ndarray:
    if mode != "clip":
        raise ProtocolError(
            f"the server sent NaN or infinite actions (for the infer's envs at positions "
            f"{_rows_text(_bad_action_positions(actions))}); fix the policy, or pass "
            "--runner.non-finite-actions clip to replace them (NaN -> 0, then clipped to the action space bounds)"
        )
    finite_max = np.finfo(actions.dtype).max
    low = np.maximum(getattr(space, "low", -finite_max), -finite_max)
    high = np.minimum(getattr(space, "high", finite_max), finite_max)
    return np.clip(np.nan_to_num(actions, nan=0.0, posinf=finite_max, neginf=-finite_max), low, high)


# ------------------------------------------------------------------------------------------------ env outputs


def check_reset(
    num_envs: int, result: Any, non_finite_observations: NonFiniteObservations = "error"
) -> tuple[Observation, dict[str, Any]]:
    """Validate what ``env.reset`` returned (the raw value): exactly ``(Observation, dict)`` for the whole batch."""
    if not (isinstance(result, tuple) and len(result) == 2):
        hint = ": return `observation, info` (info may be {})"
        if isinstance(result, list) and len(result) == 2:
            hint = ": return a tuple"
        raise EnvContractError(f"reset() must return (observation, info); got {describe_value(result)}{hint}")
    obs, info = result
    if not isinstance(obs, Observation):
        raise EnvContractError(
            f"reset() must return an Observation as its first value, got {type(obs).__name__}: wrap the arrays in "
            "Observation(images=..., states=..., text=...)"
        )
    if not isinstance(info, dict):
        raise EnvContractError(f"reset() must return a dict as info, got {type(info).__name__}: return {{}} when there "
                               "is nothing to report")
    check_observation(num_envs, obs, "reset()")
    if non_finite_observations != "allow":
        check_finite_observation(obs, "reset()")
    return obs, info


def check_step(
    num_envs: int,
    result: Any,
    non_finite_rewards: NonFiniteRewards = "error",
    non_finite_observations: NonFiniteObservations = "error",
) -> StepOutput:
    """Validate what ``env.step`` returned (the raw value); rewards come back as float32, flags as bool.

    NaN/inf rewards are an error naming the env rows, or (``non_finite_rewards="zero"``) are replaced by 0.0 and
    listed in :attr:`StepOutput.zeroed_rewards`. NaN/inf in float state arrays are an error unless
    ``non_finite_observations="allow"``. Images are uint8 (checked) and cannot hold either.
    """
    if not (isinstance(result, tuple) and len(result) == 5):
        raise EnvContractError(_step_arity_message(result))
    obs, rewards, terminated, truncated, info = result
    if not isinstance(obs, Observation):
        raise EnvContractError(f"step() must return an Observation as its first value, got {type(obs).__name__}")
    check_observation(num_envs, obs, "step()")
    if not isinstance(info, dict):
        raise EnvContractError(f"step() must return a dict as info, got {type(info).__name__}: return {{}} when there "
                               "is nothing to report")
    rewards = _rewards(num_envs, rewards)
    terminated = _flags(num_envs, "terminated", terminated)
    truncated = _flags(num_envs, "truncated", truncated)
    zeroed = _NO_ROWS
    if not np.isfinite(rewards).all():
        rewards, zeroed = _non_finite_rewards(rewards, non_finite_rewards)
    if non_finite_observations != "allow":
        check_finite_observation(obs, "step()")
    return StepOutput(obs, rewards, terminated, truncated, info, zeroed)


def _step_arity_message(result: Any) -> str:
    head = f"step() must return 5 values {_STEP_VALUES}; got "
    if isinstance(result, tuple):
        old_gym = ": that is the old gym API: split done into terminated and truncated" if len(result) == 4 else ""
        return f"{head}{len(result)}{old_gym}"
    if isinstance(result, list) and len(result) == 5:
        return f"{head}a list of 5 values: return a tuple"
    return head + describe_value(result)


def _rewards(num_envs: int, value: Any) -> np.ndarray:
    arr = np.asarray(value)
    if arr.shape != (num_envs,):
        raise EnvContractError(f"Expected reward shape ({num_envs},), got {arr.shape}: return one value per env")
    if arr.dtype == np.float32:
        return arr
    if arr.dtype.kind not in "fiu":
        raise EnvContractError(f"Expected numeric rewards, got dtype {arr.dtype}: return `reward.astype(np.float32)`")
    with np.errstate(over="ignore"):  # a float64 beyond float32's range becomes inf, reported as non-finite
        return arr.astype(np.float32)


def _flags(num_envs: int, name: str, value: Any) -> np.ndarray:
    arr = np.asarray(value)
    if arr.shape != (num_envs,):
        raise EnvContractError(f"Expected {name} shape ({num_envs},), got {arr.shape}: return one value per env")
    if arr.dtype != np.bool_:
        raise EnvContractError(f"Expected {name} of dtype bool, got {arr.dtype}: return `np.asarray({name}, dtype=bool)`")
    return arr


def _non_finite_rewards(rewards: np.ndarray, mode: str) -> tuple[np.ndarray, np.ndarray]:
    bad = np.flatnonzero(~np.isfinite(rewards))
    if mode == "zero":
        return np.where(np.isfinite(rewards), rewards, np.float32(0.0)), bad
    if mode != "error":
        raise ValueError(f"non_finite_rewards must be 'error' or 'zero', got {mode!r}")
    raise EnvContractError(
        f"step() returned NaN or infinite rewards for envs {_rows_text(bad)}: return finite rewards, or pass "
        f"{REWARDS_FLAG} to replace them by 0.0"
    )


def check_observation(num_envs: int, obs: Observation, where: str) -> None:
    """Batch size and dtypes policy servers accept (dtype checks only: no pass over the data)."""
    if obs.batch_size != num_envs:
        got = f"{obs.batch_size} env" + ("" if obs.batch_size == 1 else "s")
        raise EnvContractError(
            f"{where} returned an Observation of {got}; expected {num_envs}: return every env's row, with the "
            "batch as the leading axis"
        )
    for name, arr in obs.images.items():
        if arr.dtype != np.uint8 or arr.ndim != 4:
            raise EnvContractError(
                f"{where} returned images[{name!r}] of dtype {arr.dtype} and shape {arr.shape}; images must be uint8 "
                "(n, height, width, channels): convert them, or put other arrays (depth, features) in states"
            )
    for name, arr in obs.states.items():
        if arr.dtype.kind not in "biuf":
            raise EnvContractError(f"{where} returned states[{name!r}] of dtype {arr.dtype}; states must be numeric")


def check_finite_observation(obs: Observation, where: str) -> None:
    """NaN/inf in any float state array is an error naming the keys and env rows (images are uint8: skipped)."""
    for arr in obs.states.values():  # the common case, on every step: one isfinite pass per float array
        if arr.dtype.kind in "fc" and not np.isfinite(arr).all():
            break
    else:
        return
    bad = {name: rows for name, arr in obs.states.items() if (rows := non_finite_rows(arr)) is not None}
    if bad:
        listing = "; ".join(f"states[{name!r}] in envs {_rows_text(rows)}" for name, rows in bad.items())
        raise EnvContractError(
            f"{where} returned NaN or infinite values: {listing}. Fix the env, or pass {OBSERVATIONS_FLAG} "
            "to send them as they are"
        )


def non_finite_rows(arr: np.ndarray) -> np.ndarray | None:
    """Rows (leading-axis indices) of ``arr`` holding a NaN/inf, or None when every value is finite.

    One ``np.isfinite(arr).all()`` pass for the common case; non-float arrays are never checked.
    """
    if arr.dtype.kind not in "fc" or np.isfinite(arr).all():
        return None
    if arr.ndim == 0:
        return np.zeros(1, np.intp)
    return np.flatnonzero(~np.isfinite(arr.reshape(arr.shape[0], -1)).all(axis=1))


def describe_value(value: Any) -> str:
    """A few words naming what an env returned, for messages ('a bare Observation', 'a tuple of 3 values')."""
    if isinstance(value, Observation):
        return "a bare Observation"
    if value is None:
        return "None"
    if isinstance(value, tuple | list):
        kind = "tuple" if isinstance(value, tuple) else "list"
        return f"a {kind} of {len(value)} value" + ("" if len(value) == 1 else "s")
    if isinstance(value, np.ndarray):
        return f"an array of shape {value.shape}"
    return f"a {type(value).__name__}"


def _rows_text(rows: np.ndarray, limit: int = 10) -> str:
    """``[1, 4, 7]``, or the first ``limit`` rows and how many there are in all."""
    shown = rows[:limit].tolist()
    return str(shown) if rows.size <= limit else f"{str(shown)[:-1]}, ... ({rows.size} in all)]"


# ------------------------------------------------------------------------------------------------ info


def slice_info(info: dict[str, Any], rows: np.ndarray, num_envs: int) -> dict[str, Any]:
    """The per-env part of a step's info, cut to ``rows``: arrays whose leading dim is ``num_envs``.

    Scalars and other values cannot be split per env, so they are left out (servers split info by rows).
    """
    out: dict[str, Any] = {}
    for key, value in info.items():
        if isinstance(value, dict):
            sub = slice_info(value, rows, num_envs)
            if sub:
                out[str(key)] = sub
        elif isinstance(value, np.ndarray) and value.ndim >= 1 and value.shape[0] == num_envs and value.dtype.kind not in "OVc":
            out[str(key)] = value[rows]
    return out
