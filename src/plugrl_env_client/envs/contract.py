"""What an env must return: the batched env contract, written once as checks the rollout and the checker share.

The contract (``base_env.py`` is the API; this module decides what the client accepts):

* ``single_action_space`` is a gymnasium Space of one array per env: Box, Discrete, MultiDiscrete, MultiBinary or
  Text (the client sends each env's action as one array; a Dict or Tuple of spaces is not one);
* ``reset(seed=..., options=...)`` returns the tuple ``(observation, info)``;
* ``step(actions)`` returns the tuple ``(observation, rewards, terminated, truncated, info)``: rewards numeric of
  shape ``(n,)`` (float32; other numeric dtypes are cast), the two flags bool ``(n,)``;
* the observation is an :class:`Observation` of the whole batch: images uint8 ``(n, height, width, channels)``,
  states numeric ``(n, ...)``; info is a dict, whose per-env arrays (:func:`is_per_env`) reach the server;
* rewards and float states hold no NaN or inf, unless the run says what to do with them
  (``--runner.non-finite-rewards zero``, ``--runner.non-finite-observations allow``).

One set of rules with two callers, as Gymnasium's passive checker (on every call) and its env checker (once, in
full) share theirs. The rollout calls :func:`check_reset` and :func:`check_step` on every reset and step: the first
broken rule is an :class:`EnvContractError` (the loop prefixes ``env <id>: ``), and the values come back as the
client uses them. ``plugrl-check-env`` calls the functions those two are made of, :func:`read_reset`,
:func:`read_step`, :func:`observation_problems` and :func:`action_space_problem`, which list every broken rule as a
:class:`Problem` (what came, what to change), and adds checks of its own that need more than one call (seeding,
partial resets, time limits). What an env must keep the same from one call to the next is
:mod:`plugrl_env_client.envs.invariants`, with the same two callers.

The checks run on every env step, so they look at types, shapes and dtypes, and make one vectorised
``np.isfinite(...).all()`` pass per float array; which rows are wrong is worked out only once something is.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any, Literal

import gymnasium as gym
import numpy as np

from plugrl_env_client.envs.base_env import BaseEnv, Observation, describe_space
from plugrl_env_client.errors import EnvContractError

NonFiniteRewards = Literal["error", "zero"]
"""What to do with NaN/inf rewards: stop with an error, or replace them by 0.0 (the caller logs the rows)."""
NonFiniteObservations = Literal["error", "allow"]
"""What to do with NaN/inf in float state arrays: stop with an error, or send them as they are."""

REWARDS_FLAG = "--runner.non-finite-rewards zero"
OBSERVATIONS_FLAG = "--runner.non-finite-observations allow"

Severity = Literal["error", "warning"]

_STEP_VALUES = "(obs, reward, terminated, truncated, info)"
_WRAP = "wrap the arrays in Observation(images=..., states=..., text=...)"
_COMPOSITE_SPACES = (gym.spaces.Dict, gym.spaces.Tuple, gym.spaces.Graph, gym.spaces.Sequence, gym.spaces.OneOf)
_NO_ROWS = np.zeros(0, np.intp)
_NO_ROWS.setflags(write=False)


@dataclasses.dataclass(frozen=True, slots=True)
class Problem:
    """One broken rule: ``seen`` says what the env returned, ``fix`` what to change.

    An ``"error"`` stops a run. A ``"warning"`` is a value the client accepts and converts (float64 rewards): the
    run goes on without a word, ``plugrl-check-env`` mentions it."""

    seen: str
    fix: str = ""
    severity: Severity = "error"
    key: str = ""
    """Which rule, for which value (``"images['cam'] layout"``): a report that collects problems over many calls
    lists each key once."""

    @property
    def message(self) -> str:
        """The error message: what came, then what to do."""
        return f"{self.seen}: {self.fix}" if self.fix else self.seen


@dataclasses.dataclass(frozen=True, slots=True)
class StepOutput:
    """One checked ``env.step`` result: rewards float32 ``(n,)``, flags bool ``(n,)``, info a dict."""

    obs: Observation
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    info: dict[str, Any]
    zeroed_rewards: np.ndarray
    """Env indices whose NaN/inf reward, or finite reward beyond float32's range, was replaced by 0.0 (only with
    ``non_finite_rewards="zero"``; usually empty). The caller logs them: a replaced reward changes the return the
    run reports."""
    zeroed_why: str = ""
    """What the zeroed rewards were, for the caller's warning: ``"NaN/inf rewards"``, ``"rewards that do not fit
    float32 (...)"``, or both."""


# ------------------------------------------------------------------------------------------------ action space


def action_space_problem(env: Any) -> Problem | None:
    """What is wrong with the env's ``single_action_space`` (the policy's contract), or None."""
    space = getattr(env, "single_action_space", None)
    if space is None:
        return Problem("Env must expose action space via single_action_space/action_space",
                       "set `self.single_action_space = gymnasium.spaces.Box(...)` in the env's __init__")
    if not isinstance(space, gym.Space):
        return Problem(f"the env's single_action_space is {describe_value(space)}, not a gymnasium Space",
                       "set `self.single_action_space = gymnasium.spaces.Box(...)` (or Discrete, MultiDiscrete, "
                       "Text, ...)")
    if isinstance(space, _COMPOSITE_SPACES):
        return Problem(f"the env's single_action_space is {short_space(space)}: the client sends one array per env",
                       "use a Box (flatten the parts into one vector), Discrete, MultiDiscrete, MultiBinary or Text")
    return None


def action_space_of(env: BaseEnv) -> gym.Space:
    """The env's unbatched action space; a missing or unusable one is an :class:`EnvContractError`."""
    problem = action_space_problem(env)
    if problem is not None:
        raise EnvContractError(problem.message)
    return env.single_action_space


# ------------------------------------------------------------------------------------------------ reset


def read_reset(num_envs: int, result: Any) -> tuple[tuple[Observation, dict[str, Any]] | None, list[Problem]]:
    """What ``env.reset`` must return, as a reading of the raw value: ``(observation, info)`` when it can be used,
    and every broken rule. It can be used (is not None) exactly when no problem is an error.

    The rules: a tuple of two values; an :class:`Observation` of ``num_envs`` rows; a dict info. The observation's
    arrays are :func:`observation_problems`' business.
    """
    if not (isinstance(result, tuple) and len(result) == 2):
        fix = "return a tuple" if isinstance(result, list) and len(result) == 2 else \
            "return `observation, info` (info may be {})"
        return None, [Problem(f"reset() must return (observation, info); got {describe_value(result)}", fix,
                              key="reset")]
    obs, info = result
    problems = _obs_and_info_problems("reset()", num_envs, obs, info)
    return (None if problems else (obs, info)), problems


def _obs_and_info_problems(call: str, num_envs: int, obs: Any, info: Any) -> list[Problem]:
    """What reset() and step() share: an :class:`Observation` of ``num_envs`` rows first, a dict info last."""
    problems = []
    if not isinstance(obs, Observation):
        problems.append(Problem(f"{call} must return an Observation as its first value, got {type(obs).__name__}",
                                _WRAP, key="observation"))
    elif obs.batch_size != num_envs:
        problems.append(_batch_problem(call, obs, num_envs))
    if not isinstance(info, dict):
        problems.append(Problem(f"{call} must return a dict as info, got {type(info).__name__}",
                                "return {} when there is nothing to report", key="info"))
    return problems


def check_reset(
    num_envs: int, result: Any, non_finite_observations: NonFiniteObservations = "error"
) -> tuple[Observation, dict[str, Any]]:
    """The reset contract at run time (:func:`read_reset`, :func:`observation_problems`, finite states): the first
    broken rule is an :class:`EnvContractError`."""
    values, problems = read_reset(num_envs, result)
    if values is None:
        raise _first_error(problems)
    problems = observation_problems(num_envs, values[0], "reset()")
    if problems:
        raise _first_error(problems)
    if non_finite_observations != "allow":
        check_finite_observation(values[0], "reset()")
    return values


# ------------------------------------------------------------------------------------------------ step


def read_step(num_envs: int, result: Any, warnings: bool = True) -> tuple[StepOutput | None, list[Problem]]:
    """What ``env.step`` must return, as a reading of the raw value: the five values as the client uses them (rewards
    float32, flags bool) when they can be used, and every broken rule. They can be used (are not None) exactly
    when no problem is an error. ``warnings=False`` leaves out the values the client converts (the run converts
    them without a word, and a float64 reward on every step is not worth a message built on every step).

    The rules: a tuple of five values; an :class:`Observation` of ``num_envs`` rows; numeric rewards of shape
    ``(num_envs,)``, float32 (other numeric dtypes are cast: a warning); bool ``terminated`` and ``truncated`` of
    shape ``(num_envs,)``; a dict info. The observation's arrays are :func:`observation_problems`' business, and
    the rewards' values (NaN, inf) the caller's: ``read_step`` leaves them as they are.
    """
    if not (isinstance(result, tuple) and len(result) == 5):
        return None, [_step_arity_problem(result)]
    obs, rewards, terminated, truncated, info = result
    problems = _obs_and_info_problems("step()", num_envs, obs, info)
    rewards = _rewards(num_envs, rewards, problems, warnings)
    terminated = _flags(num_envs, "terminated", terminated, problems)
    truncated = _flags(num_envs, "truncated", truncated, problems)
    if problems and any(p.severity == "error" for p in problems):
        return None, problems
    return StepOutput(obs, rewards, terminated, truncated, info, _NO_ROWS), problems


def check_step(
    num_envs: int,
    result: Any,
    non_finite_rewards: NonFiniteRewards = "error",
    non_finite_observations: NonFiniteObservations = "error",
) -> StepOutput:
    """The step contract at run time (:func:`read_step`, :func:`observation_problems`, finite values): the first
    broken rule is an :class:`EnvContractError`; rewards come back as float32, flags as bool.

    NaN/inf rewards are an error naming the env rows, or (``non_finite_rewards="zero"``) are replaced by 0.0 and
    listed in :attr:`StepOutput.zeroed_rewards`. So are finite rewards the cast to float32 would make infinite
    (1e39), under their own words: they "do not fit float32". NaN/inf in float state arrays are an error unless
    ``non_finite_observations="allow"``. Images are uint8 (checked) and cannot hold either.
    """
    out, problems = read_step(num_envs, result, warnings=False)
    if out is None:
        raise _first_error(problems)
    problems = observation_problems(num_envs, out.obs, "step()")
    if problems:
        raise _first_error(problems)
    if not np.isfinite(out.rewards).all():
        rewards, zeroed, why = _non_finite_rewards(out.rewards, np.asarray(result[1]), non_finite_rewards)
        out = StepOutput(out.obs, rewards, out.terminated, out.truncated, out.info, zeroed, why)
    if non_finite_observations != "allow":
        check_finite_observation(out.obs, "step()")
    return out


RESET_IN_STEP = Problem("step() called the env's reset()",
                        "do not reset inside step(): return the terminal observation with terminated or truncated "
                        "set; the client calls reset(options={'reset_mask': ...}) for finished envs", key="reset in step")
"""An env that resets itself inside ``step`` sends next-episode observations as terminal ones. The rollout stops
at it (it sees the env's own ``reset`` run inside ``step``: :attr:`BaseEnv.reset_in_step`), and ``plugrl-check-env``
reports it (rule 9)."""


def _step_arity_problem(result: Any) -> Problem:
    head = f"step() must return 5 values {_STEP_VALUES}; got "
    if isinstance(result, tuple):
        old_gym = "that is the old gym API: split done into terminated and truncated" if len(result) == 4 else ""
        return Problem(f"{head}{len(result)}", old_gym, key="step")
    if isinstance(result, list) and len(result) == 5:
        return Problem(f"{head}a list of 5 values", "return a tuple", key="step")
    return Problem(head + describe_value(result), key="step")


def _rewards(num_envs: int, value: Any, problems: list[Problem], warnings: bool) -> np.ndarray:
    arr = np.asarray(value)
    if arr.shape != (num_envs,):
        problems.append(Problem(f"Expected reward shape ({num_envs},), got {arr.shape}", "return one value per env",
                                key="rewards shape"))
    if arr.dtype == np.float32:
        return arr
    if arr.dtype.kind not in "fiu":
        problems.append(Problem(f"Expected numeric rewards, got dtype {arr.dtype}", "return `reward.astype(np.float32)`",
                                key="rewards dtype"))
        return arr
    if warnings:
        problems.append(Problem(f"rewards have dtype {arr.dtype} (the client casts them to float32)",
                                "return `reward.astype(np.float32)`", "warning", "rewards dtype"))
    with np.errstate(over="ignore"):  # a float64 beyond float32's range becomes inf: check_step says it does not fit
        return arr.astype(np.float32)


def _flags(num_envs: int, name: str, value: Any, problems: list[Problem]) -> np.ndarray:
    arr = np.asarray(value)
    if arr.shape != (num_envs,):
        problems.append(Problem(f"Expected {name} shape ({num_envs},), got {arr.shape}", "return one value per env",
                                key=f"{name} shape"))
    if arr.dtype != np.bool_:
        problems.append(Problem(f"Expected {name} of dtype bool, got {arr.dtype}",
                                f"return `np.asarray({name}, dtype=bool)`", key=f"{name} dtype"))
    return arr


def _non_finite_rewards(rewards: np.ndarray, returned: np.ndarray, mode: str) -> tuple[np.ndarray, np.ndarray, str]:
    """``rewards`` (cast to float32) hold NaN or inf: values the env returned so, or finite values beyond float32's
    range that the cast made infinite (``returned`` holds the rewards as the env returned them). Replaced by 0.0
    (``mode="zero"``: the rows and what they were come back for the caller's warning), or an error."""
    if mode not in ("error", "zero"):
        raise ValueError(f"non_finite_rewards must be 'error' or 'zero', got {mode!r}")
    bad = np.flatnonzero(~np.isfinite(rewards))
    with np.errstate(invalid="ignore"):  # the env's own values: NaN, inf, or numbers of any numeric dtype
        too_large = bad[np.isfinite(returned[bad])] if returned.dtype.kind == "f" else bad
    parts = []
    if too_large.size < bad.size:
        parts.append("NaN/inf rewards")
    if too_large.size:
        value = float(returned[too_large[0]])
        parts.append(f"rewards that do not fit float32 ({value:g}; float32's largest is "
                     f"{float(np.finfo(np.float32).max):g})")
    why = " and ".join(parts)
    if mode == "zero":
        return np.where(np.isfinite(rewards), rewards, np.float32(0.0)), bad, why
    if too_large.size == bad.size:
        raise EnvContractError(
            f"step() returned {why} for envs {rows_text(too_large)}: scale the rewards into float32's range, or pass "
            f"{REWARDS_FLAG} to replace them by 0.0"
        )
    raise EnvContractError(
        f"step() returned NaN or infinite rewards for envs {rows_text(np.setdiff1d(bad, too_large))}: return finite "
        f"rewards, or pass {REWARDS_FLAG} to replace them by 0.0"
    )


# ------------------------------------------------------------------------------------------------ observations


def observation_problems(num_envs: int, obs: Observation, where: str) -> list[Problem]:
    """The layout policy servers accept, array by array (dtypes and shapes only: no pass over the data): images
    uint8 ``(n, height, width, channels)``, states numeric, every array with the batch of ``num_envs`` leading.
    ``where`` names the call in the messages (``"step()"``)."""
    problems = []
    for name, arr in obs.images.items():
        if arr.dtype != np.uint8 or arr.ndim != 4:
            fix = ("convert them (`(img * 255).clip(0, 255).astype(np.uint8)` for values in [0, 1])"
                   if arr.dtype != np.uint8 else "add the channel axis (`img[..., None]`)")
            problems.append(Problem(
                f"{where} returned images[{name!r}] of dtype {arr.dtype} and shape {arr.shape}; images must be uint8 "
                "(n, height, width, channels)", f"{fix}, or put other arrays (depth, features) in states",
                key=f"images[{name!r}] layout"))
        elif arr.shape[0] != num_envs:
            problems.append(_leading_problem(where, f"images[{name!r}]", arr, num_envs))
    for name, arr in obs.states.items():
        if arr.dtype.kind not in "biuf":
            problems.append(Problem(f"{where} returned states[{name!r}] of dtype {arr.dtype}; states must be numeric",
                                    "put strings in text, other values in info", key=f"states[{name!r}] dtype"))
        if arr.ndim == 0 or arr.shape[0] != num_envs:
            problems.append(_leading_problem(where, f"states[{name!r}]", arr, num_envs))
    return problems


def non_finite_states(obs: Observation) -> dict[str, np.ndarray]:
    """The float state arrays holding a NaN/inf, by key, with their rows; empty when every value is finite (one
    ``isfinite`` pass per float array; images are uint8 and are skipped)."""
    for arr in obs.states.values():  # the common case, on every step: one isfinite pass per float array
        if arr.dtype.kind in "fc" and not np.isfinite(arr).all():
            break
    else:
        return {}
    return {name: rows for name, arr in obs.states.items() if (rows := non_finite_rows(arr)) is not None}


def check_finite_observation(obs: Observation, where: str) -> None:
    """NaN/inf in any float state array is an error naming the keys and env rows."""
    bad = non_finite_states(obs)
    if bad:
        listing = "; ".join(f"states[{name!r}] in envs {rows_text(rows)}" for name, rows in bad.items())
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


def _batch_problem(where: str, obs: Observation, num_envs: int) -> Problem:
    got = f"{obs.batch_size} env" + ("" if obs.batch_size == 1 else "s")
    return Problem(f"{where} returned an Observation of {got}; expected {num_envs}",
                   "return every env's row, with the batch as the leading axis", key="observation batch")


def _leading_problem(where: str, name: str, arr: np.ndarray, num_envs: int) -> Problem:
    return Problem(f"{where} returned {name} of shape {arr.shape}; every array needs the batch leading",
                   f"put the batch first: ({num_envs}, ...)", key=f"{name} batch")


# ------------------------------------------------------------------------------------------------ info


def is_per_env(value: Any, num_envs: int) -> bool:
    """Whether an info value reaches the server row by row: an array with ``num_envs`` rows of a dtype the wire
    carries (bool, numbers, strings). Scalars, lists and object arrays stay on the client."""
    return (isinstance(value, np.ndarray) and value.ndim >= 1 and value.shape[0] == num_envs
            and value.dtype.kind not in "OVc")


def slice_info(info: dict[str, Any], rows: np.ndarray | slice, num_envs: int) -> dict[str, Any]:
    """The per-env part of a step's info, cut to ``rows`` (an index array, or a slice: views, no copies): the values
    :func:`is_per_env` accepts, in nested maps too.

    Scalars and other values cannot be split per env, so they are left out (servers split info by rows).
    """
    out: dict[str, Any] = {}
    for key, value in info.items():
        if isinstance(value, dict):
            sub = slice_info(value, rows, num_envs)
            if sub:
                out[str(key)] = sub
        elif is_per_env(value, num_envs):
            out[str(key)] = value[rows]
    return out


# ------------------------------------------------------------------------------------------------ words


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


def short_space(space: gym.Space) -> str:
    """A space in one line of at most 100 characters (a Dict of many keys is long)."""
    text = describe_space(space)
    return text if len(text) <= 100 else text[:97] + "..."


def rows_text(rows: np.ndarray | Sequence[int], limit: int = 10) -> str:
    """``[1, 4, 7]``, or the first ``limit`` rows and how many there are in all."""
    shown = [int(i) for i in list(rows[:limit])]
    return str(shown) if len(rows) <= limit else f"{str(shown)[:-1]}, ... ({len(rows)} in all)]"


def _first_error(problems: Iterable[Problem]) -> EnvContractError:
    return EnvContractError(next(p for p in problems if p.severity == "error").message)
