"""What an env must return: the batched env contract, per call and across calls, written once as checks the rollout
and the checker share.

The contract (``base_env.py`` is the API; this module decides what the client accepts):

* ``single_action_space`` is a gymnasium Space of one array per env: Box, Discrete, MultiDiscrete, MultiBinary or
  Text (the client sends each env's action as one array; a Dict or Tuple of spaces is not one);
* ``reset(seed=..., options=...)`` returns the tuple ``(observation, info)``;
* ``step(actions)`` returns the tuple ``(observation, rewards, terminated, truncated, info)``: rewards numeric of
  shape ``(n,)`` (float32; other numeric dtypes are cast), the two flags bool ``(n,)``;
* the observation is an :class:`Observation` of the whole batch: images uint8 ``(n, height, width, channels)``,
  states numeric ``(n, ...)``; info is a dict, whose per-env arrays (:func:`is_per_env`) reach the server;
* rewards and float states hold no NaN or inf, unless the run says what to do with them
  (``--runner.non-finite-rewards zero``, ``--runner.non-finite-observations allow``);
* across calls, an env keeps its observation's layout and leaves alone the rows a partial reset was not asked to
  reset (below).

Two mistakes show only across calls, and without their checks a run with them ends as "finished" with wrong data:

* an observation whose keys, shapes (after the batch axis) or dtypes change between ``reset()`` and ``step()``:
  servers and their policies size their inputs from the first observation, and a server that reuses feedback rows
  cannot put rows of two layouts in one batch (the reference server resyncs, the client reconnects, and the same
  thing happens again). :class:`ObservationSignature` keeps ``(key, shape, dtype)`` of every image and state array
  of the first observation and compares each later one with it: no pass over the data. A change of key order alone
  is accepted. Text is compared in one respect only, and only as a warning: a ``step()`` whose text is empty for
  every env after the first ``reset()`` returned text (a ``step`` that forgot its text). Text that comes and goes
  is not stopped, because envs do it on purpose: a first observation left empty for the instruction in
  ``info["env_instruction"]``, an env with no episode left returning empty rows.
* a partial reset that changes rows it was not asked to reset (an env that re-randomises every row): the client
  goes on with those rows as if their episodes went on, so the episodes it records mix two starts.
  :class:`PartialResetCheck` keeps a reference to the state arrays of the env's latest observation (no copy),
  copies the rows a reset leaves alone just before a partial reset (the env may reuse its buffers; the step's arrays
  are let go then) and compares them with the same rows of what the reset returns. State arrays only: images are
  skipped (a frame is tens of thousands of values per env, and a renderer may redraw an unchanged scene with
  different pixels), and so is text.

One more thing is fixed rather than refused, because it is easy to produce and the fix is obvious: a lone
surrogate (``"\\ud800"``, from text cut in the middle of a UTF-16 pair or decoded with ``surrogateescape``) in an
env's text. Python holds it, but no UTF-8 encoder writes it: the wire, the recorder's text samples and every JSON
line would fail on it. :class:`TextCheck` replaces each one by U+FFFD (the replacement character) in the text
observation and in the info's text (keys, str values and '<U' arrays, ``info["env_instruction"]`` and metric names
among them), and warns once per env and field. Text without one costs one decode or reduction over its code points
(or one ``str.encode``); an info entry whose key was clean before and whose value is a number, a non-text array or
a short str seen clean before costs a set lookup or two; a text is only copied when it holds one.

One set of rules with two callers, as Gymnasium's passive checker (on every call) and its env checker (once, in
full) share theirs. The rollout hands every reset and step result to its :class:`EnvChecks`. A step's gets one pass
over the observation for the rules of each value and those across calls together, and is gone over rule by rule, in
the order below, only when something in that pass is wrong or new; a reset's, which is rarer, is gone over rule by
rule. The first broken rule is an :class:`EnvContractError` naming the env, and the values come back as the client
uses them. The rules one by one are :func:`check_reset` and :func:`check_step` (each value), then
:class:`ObservationSignature`, :class:`PartialResetCheck` and :class:`TextCheck` (across calls).
``plugrl-check-env`` calls the functions those are made of, :func:`read_reset`, :func:`read_step`,
:func:`observation_problems`, :func:`action_space_problem` and :func:`partial_reset_problem`, which list every
broken rule as a :class:`Problem` (what came, what to change), and adds checks of its own that need more than one
call (seeding, time limits).

The checks run on every env step, so they look at types, shapes and dtypes, and make one vectorised
``np.isfinite`` pass per float array; which rows are wrong is worked out only once something is.
"""

from __future__ import annotations

import codecs
import dataclasses
import logging
import operator
import re
import sys
from collections.abc import Iterable, Sequence
from typing import Any, Literal

import gymnasium as gym
import numpy as np

from plugrl_env_client.envs.base_env import BaseEnv, Observation, describe_space, reset_mask_of
from plugrl_env_client.errors import EnvContractError

logger = logging.getLogger(__name__)

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
    for arr in obs.states.values():  # the common case: one isfinite pass per float array
        if arr.dtype.kind in "fc" and np.count_nonzero(np.isfinite(arr)) != arr.size:
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


# ================================================================================================ across calls

PARTIAL_RESET_FLAG = "--runner.check-partial-reset off"

Entry = tuple[str, tuple[int, ...], np.dtype]
"""One array of an observation as its layout sees it: key, shape, dtype. The whole shape: the batch axis is the same
in every observation of one env object (the contract checks it), and a shape need not be cut to be compared."""


# ------------------------------------------------------------------------------------------------ the rule texts


def partial_reset_problem(reset_rows: np.ndarray | Sequence[int], changed: Sequence[str]) -> Problem:
    """A partial reset of ``reset_rows`` that changed other rows: ``changed`` lists them, one phrase per array
    (``states['pos'] in envs [0, 2]``)."""
    return Problem(
        f"resetting envs {rows_text(reset_rows)} changed rows it was not asked to reset: {'; '.join(changed)}",
        "reset only the rows of `mask = self.reset_mask(options)` (options['reset_mask'] or options['reset_indices']) "
        "and leave the others as they are",
        key="partial reset",
    )


def changed_rows_phrase(name: str, rows: np.ndarray | Sequence[int]) -> str:
    """``states['pos'] in envs [0, 2]``: the rows of one array a reset changed."""
    return f"{name} in envs {rows_text(rows)}"


# ------------------------------------------------------------------------------------------------ layout


def _entries(arrays: dict[str, np.ndarray]) -> list[Entry]:
    return [(k, v.shape, v.dtype) for k, v in arrays.items()]


def _has_text(text: np.ndarray) -> bool:
    """Some env's text is not empty. A '<U' array wider than one character holds a string that long (the common
    case: no look at the strings); in a one-character-wide one, some character is not NUL."""
    return text.itemsize > 4 or bool(text.tobytes().strip(b"\0"))


class ObservationSignature:
    """The layout of the first observation (its image and state keys, each one's shape and dtype), compared with
    every later one; see the module docstring."""

    __slots__ = ("images", "states", "text", "_where")

    def __init__(self) -> None:
        self.images: list[Entry] | None = None
        """The first observation's image arrays, in the order of the latest observation."""
        self.states: list[Entry] | None = None
        """The same for its state arrays."""
        self.text = False
        """The first observation had text, and no step has dropped it yet."""
        self._where = ""

    def check(self, obs: Observation, where: str) -> None:
        """``obs``, returned by ``where`` (``"step()"``), against the first observation: a changed layout is an
        :class:`EnvContractError` naming each array and both shapes or dtypes."""
        states, images = _entries(obs.states), _entries(obs.images)
        if states != self.states or images != self.images:
            if self.states is None:
                self.images, self.states, self._where = images, states, where
                self.text = _has_text(obs.text)
                return
            changes = _layout_changes("images", self.images or [], images, where, self._where) + \
                _layout_changes("states", self.states, states, where, self._where)
            if changes:
                raise EnvContractError(
                    f"{'; '.join(changes)}: an env returns the same observation keys, each with one shape (after the "
                    "batch axis) and dtype, from every reset() and step() (servers size their inputs from the first "
                    "observation); fix the env"
                )
            self.images, self.states = images, states  # the same arrays in another order: compare with this one
        if self.text and where == "step()" and not _has_text(obs.text):
            self.text = False  # said once
            logger.warning("%s returned no text (an empty string for every env) where the first %s returned text: a "
                           "policy that reads text gets empty prompts; return the text on every step",
                           where, self._where)


def _layout_changes(kind: str, first: list[Entry], now: list[Entry], where: str, first_where: str) -> list[str]:
    """What differs between two layouts of ``images`` or ``states``, one phrase per array (keys in any order)."""
    old, new = {k: (s, d) for k, s, d in first}, {k: (s, d) for k, s, d in now}
    out = []
    for key in [k for k, _, _ in first] + [k for k, _, _ in now if k not in old]:
        name = f"{kind}[{key!r}]"
        if key not in new:
            out.append(f"{where} returned no {name}, which the first {first_where} returned")
        elif key not in old:
            out.append(f"{where} returned {name}, which the first {first_where} did not")
        elif new[key][0] != old[key][0]:
            out.append(f"{where} returned {name} of shape {new[key][0]} where the first {first_where} returned "
                       f"{old[key][0]}")
        elif new[key][1] != old[key][1]:
            out.append(f"{where} returned {name} of dtype {new[key][1]} where the first {first_where} returned "
                       f"{old[key][1]}")
    return out


# ------------------------------------------------------------------------------------------------ partial resets


class PartialResetCheck:
    """The rows a partial reset was not asked to reset come back as the env's latest observation had them (state
    arrays; see the module docstring)."""

    __slots__ = ("latest", "_kept", "_before", "_reset_rows")

    def __init__(self) -> None:
        self.latest: dict[str, np.ndarray] | None = None
        """The state arrays of the env's latest observation (:meth:`seen`)."""
        self._kept: np.ndarray | None = None
        self._before: dict[str, np.ndarray] = {}
        self._reset_rows: np.ndarray | None = None

    def seen(self, obs: Observation) -> None:
        """The env returned ``obs`` (a step's, or a reset's): the rows a next reset leaves alone must keep it."""
        self.latest = obs.states

    def before(self, mask: np.ndarray) -> None:
        """A reset of the rows of ``mask`` is about to run: copy the other rows of the latest state arrays, and let
        go of those arrays (the step's observation need not stay alive while the env builds a whole new batch)."""
        latest, self.latest = self.latest, None
        if latest is None or np.count_nonzero(mask) == mask.size:
            self._kept = None
            return
        self._kept, self._reset_rows = (~mask).nonzero()[0], mask
        self._before = {k: v[self._kept] for k, v in latest.items()}

    def after(self, obs: Observation) -> Problem | None:
        """What the reset returned, against the rows copied by :meth:`before`: the problem, or None."""
        self.latest = obs.states
        kept, self._kept = self._kept, None
        if kept is None:
            return None
        before, self._before = self._before, {}
        changed = []
        for key, old in before.items():
            new = obs.states.get(key)
            if new is None or new.shape[1:] != old.shape[1:]:
                continue  # a layout change, which the signature reports
            new = new[kept]
            if old.dtype == new.dtype and old.tobytes() == new.tobytes():
                continue  # the same bits: the common case, in one comparison of bytes
            same = old == new
            if old.dtype.kind in "fc" and new.dtype.kind in "fc":  # NaN stays NaN; -0.0 is 0.0
                same |= np.isnan(old) & np.isnan(new)
            rows = kept[~same.reshape(kept.size, -1).all(axis=1)]
            if rows.size:
                changed.append(changed_rows_phrase(f"states[{key!r}]", rows))
        if not changed:
            return None
        assert self._reset_rows is not None
        return partial_reset_problem(np.flatnonzero(self._reset_rows), sorted(changed))


# ------------------------------------------------------------------------------------------------ declared space


def undeclared_dtypes(space: Any, obs: Observation) -> list[str]:
    """Image and state arrays of ``obs`` whose dtype differs from the env's declared ``single_observation_space``,
    one phrase each (``states['pos'] is float64 where the space declares float32``). Checked once, on the first
    reset: gymnasium wrappers and recorders read the space, the server gets the arrays."""
    out = []
    for kind, arrays in (("images", obs.images), ("states", obs.states)):
        declared = _subspaces(space, kind)
        for key, arr in arrays.items():
            box = declared.get(key)
            dtype = getattr(box, "dtype", None)
            if dtype is not None and np.dtype(dtype) != arr.dtype:
                out.append(f"{kind}[{key!r}] is {arr.dtype} where the space declares {np.dtype(dtype)}")
    return out


def _subspaces(space: Any, kind: str) -> dict[str, Any]:
    try:
        return dict(space[kind].spaces)
    except (KeyError, TypeError, AttributeError):
        return {}


# ------------------------------------------------------------------------------------------------ lone surrogates

_SURROGATE_CODES = (0xD800, 0xE000)
_REPLACEMENT = 0xFFFD
_LONE = re.compile("[\ud800-\udfff]")
_PLAIN = frozenset({float, int, bool, type(None), np.float32, np.float64, np.int32, np.int64, np.bool_})
# A native '<U' array's code units, decoded straight from the array's buffer (no copy, no codec lookup).
_UTF32_DECODE = codecs.utf_32_le_decode if sys.byteorder == "little" else codecs.utf_32_be_decode
_DECODE_MAX = 4096  # bytes of text up to which decoding it costs less than numpy's reduction over it
_ARRAYS = {np.ndarray}
_DTYPE_KIND = operator.attrgetter("dtype.kind")
_CLEAN_KEYS_KEPT = 4096  # past this many distinct keys (or str values), new ones are checked on every call
_CLEAN_STR_LENGTH = 64  # longer str values are not kept: text that changes from step to step


def _field(where: tuple[Any, ...]) -> str:
    """The words for a place in an info: ``info['metrics']['score']``."""
    return "info" + "".join(f"[{key!r}]" for key in where)


def _codes(text: np.ndarray) -> np.ndarray:
    """The code points of a C-contiguous '<U' array, flat (a view: writing to it writes to ``text``)."""
    return text.reshape(-1).view(np.uint32)


def _native(text: np.ndarray) -> np.ndarray:
    """``text`` in the machine's byte order (a '>U' array read as code points otherwise gives byte-swapped ones)."""
    return text if text.dtype.byteorder in "=|" else text.astype(text.dtype.newbyteorder("="))


def _surrogate_mask(text: np.ndarray) -> np.ndarray | None:
    """Where a '<U' array holds a surrogate code point (a mask over its flat code points), or None when it holds
    none: one ``max`` for the common text entirely below U+D800, one range test otherwise."""
    if text.size == 0 or text.itemsize == 0:
        return None
    codes = _codes(np.ascontiguousarray(_native(text)))
    if int(codes.max()) < _SURROGATE_CODES[0]:
        return None
    mask = (codes >= _SURROGATE_CODES[0]) & (codes < _SURROGATE_CODES[1])
    return mask if mask.any() else None


def _text_array_fixed(text: np.ndarray) -> np.ndarray | None:
    """A copy of a '<U' array with every surrogate replaced by U+FFFD, or None when it holds none."""
    mask = _surrogate_mask(text)
    if mask is None:
        return None
    fixed = np.array(_native(text), copy=True, order="C")
    _codes(fixed)[mask] = _REPLACEMENT
    return fixed


def _str_fixed(text: str) -> str | None:
    """``text`` with every lone surrogate replaced by U+FFFD, or None when it holds none (``encode`` refuses
    surrogates and nothing else)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return _LONE.sub("\ufffd", text)
    return None


def _utf32_clean(text: np.ndarray) -> bool:
    """A native, C-contiguous '<U' array of at most :data:`_DECODE_MAX` bytes holds no surrogate: the UTF-32 codec
    refuses surrogates (and only those, in a numpy '<U' array)."""
    try:
        _UTF32_DECODE(text, "strict", True)  # type: ignore[arg-type]  # an ndarray is a buffer
    except UnicodeDecodeError:
        return False
    return True


class TextCheck:
    """Lone surrogates in an env's text replaced by U+FFFD, with a warning once per field (see the module
    docstring)."""

    __slots__ = ("env_id", "_warned", "_clean_keys", "_clean_strs")

    def __init__(self, env_id: str) -> None:
        self.env_id = env_id
        self._warned: set[str] = set()
        self._clean_keys: set[Any] = set()  # keys that hold no lone surrogate (an info's keys repeat every step)
        self._clean_strs: set[str] = set()  # short str values that hold none (an info's modes and tags repeat too)

    def observation(self, obs: Observation) -> None:
        """The observation's text, fixed in place (a new array: the env's own is not written to)."""
        text = obs.text
        if text.dtype.byteorder == "=" and text.flags.c_contiguous:  # the common case, in one pass
            if text.nbytes <= _DECODE_MAX:
                if _utf32_clean(text):  # a small batch: one decode
                    return
            elif int(text.view(np.uint32).max()) < _SURROGATE_CODES[0]:  # a big one: a reduction is cheaper
                return
        fixed = _text_array_fixed(text)
        if fixed is not None:
            obs.text = fixed
            self._warn("the observation's text")

    def info(self, info: dict[str, Any], where: tuple[Any, ...] = ()) -> dict[str, Any]:
        """``info`` with its text fixed: the same dict when it holds no lone surrogate, else a copy of the maps on
        the way to each one (the env's own are not written to). ``where``: the keys of the map inside the info
        (the words of a warning are built only for a warning)."""
        clean = self._clean_keys
        if clean.issuperset(info):  # every key seen clean before: look at the values' types in C loops
            kinds = set(map(type, info.values()))
            if kinds <= _PLAIN or (kinds == _ARRAYS and "U" not in set(map(_DTYPE_KIND, info.values()))):
                return info
        out: dict[str, Any] | None = None
        for key, value in info.items():
            kind = type(value)
            if key in clean and (kind in _PLAIN or (kind is np.ndarray and value.dtype.kind != "U")
                                 or (kind is str and value in self._clean_strs)):
                continue  # a key seen before, a value that holds no text or a text seen clean: the common case
            name = key
            if type(key) is str and (fixed_key := _str_fixed(key)) is not None:
                name = fixed_key
                self._warn("a key of " + _field(where))
            fixed = self._value(value, (*where, name))
            if name is not key or fixed is not None:
                if out is None:
                    out = dict(info)
                if name is not key:
                    del out[key]
                out[name] = value if fixed is None else fixed
            elif name is key and len(clean) < _CLEAN_KEYS_KEPT:
                clean.add(key)
        return info if out is None else out

    def _value(self, value: Any, where: tuple[Any, ...]) -> Any:
        """``value`` with its text fixed, or None when it needs no fix."""
        fixed: Any = None
        if isinstance(value, np.ndarray):
            if value.dtype.kind == "U":
                fixed = _text_array_fixed(value)
        elif isinstance(value, dict):
            fixed = self.info(value, where)
            return None if fixed is value else fixed
        elif isinstance(value, str):
            fixed = _str_fixed(value)
            if fixed is None and len(value) <= _CLEAN_STR_LENGTH and len(self._clean_strs) < _CLEAN_KEYS_KEPT:
                self._clean_strs.add(value)  # a text that comes back step after step ("mean", a mode, a tag)
        elif isinstance(value, (list, tuple)) and any(type(v) is str for v in value):
            texts = [_str_fixed(v) if type(v) is str else None for v in value]
            if any(t is not None for t in texts):
                fixed = type(value)(v if t is None else t for v, t in zip(value, texts))
        if fixed is not None:
            self._warn(_field(where))
        return fixed

    def _warn(self, field: str) -> None:
        if field not in self._warned:
            self._warned.add(field)
            logger.warning("env %s returned a lone surrogate (half of a UTF-16 pair, which no UTF-8 file or message "
                           "can hold) in %s; each one is replaced by U+FFFD", self.env_id, field)


# ================================================================================================ the one pass


class EnvChecks:
    """Every rule of the contract for one env object's results, as its group calls them: :meth:`before_reset` right
    before each ``env.reset``, :meth:`reset` and :meth:`step` with what each call returned.

    A step's result gets one pass: its types and flags, then each image and state array once (dtype, shape, batch
    axis, and one ``isfinite`` for a float state), which also gives the observation's layout, compared with the
    first observation's; then its text and its info's text. Only when something in that pass is wrong or new (a
    first layout, a reordered one, converted rewards, a non-finite value) does :meth:`step` go over the result rule
    by rule (:func:`check_step`, then the rules across calls), so an error says exactly what a rule says, in the
    same order, whichever way it was found."""

    __slots__ = ("env_id", "n", "non_finite_rewards", "non_finite_observations", "layout", "rows", "text", "_flags")

    def __init__(self, env_id: str, num_envs: int, check_partial_reset: Literal["on", "off"] = "on",
                 non_finite_rewards: NonFiniteRewards = "error",
                 non_finite_observations: NonFiniteObservations = "error") -> None:
        self.env_id, self.n = env_id, num_envs
        self.non_finite_rewards, self.non_finite_observations = non_finite_rewards, non_finite_observations
        self.layout = ObservationSignature()
        self.rows = PartialResetCheck() if check_partial_reset == "on" else None
        self.text = TextCheck(env_id)
        self._flags = (num_envs,)

    def before_reset(self, options: dict[str, Any] | None) -> None:
        """Call right before ``env.reset(options=options)``."""
        if self.rows is not None:
            mask = None if options is None else options.get("reset_mask")
            self.rows.before(mask if isinstance(mask, np.ndarray) and mask.dtype == np.bool_ and mask.shape == (self.n,)
                             else reset_mask_of(options, self.n))

    def reset(self, result: Any) -> tuple[Observation, dict[str, Any]]:
        """What ``env.reset`` returned, checked (every rule, in order: resets are few): the observation and the
        info to use (its text fixed, see :class:`TextCheck`)."""
        try:
            obs, info = check_reset(self.n, result, self.non_finite_observations)
        except EnvContractError as exc:
            raise EnvContractError(f"env {self.env_id}: {exc}") from None
        self._layout(obs, "reset()")
        self.text.observation(obs)
        info = self.text.info(info)
        if self.rows is not None:
            problem = self.rows.after(obs)
            if problem is not None:
                raise EnvContractError(f"env {self.env_id}: {problem.message} (checked after every partial reset; "
                                       f"{PARTIAL_RESET_FLAG} skips the check)")
        return obs, info

    def step(self, result: Any) -> StepOutput:
        """What ``env.step`` returned, checked in one pass (see the class docstring): the values as the client uses
        them (rewards float32, flags bool, the info with its text fixed)."""
        n, shape = self.n, self._flags
        if type(result) is tuple and len(result) == 5:
            obs, rewards, terminated, truncated, info = result
            if (type(obs) is Observation and type(info) is dict and type(rewards) is np.ndarray
                    and rewards.dtype == np.float32 and rewards.shape == shape
                    and type(terminated) is np.ndarray and terminated.dtype == np.bool_ and terminated.shape == shape
                    and type(truncated) is np.ndarray and truncated.dtype == np.bool_ and truncated.shape == shape
                    and np.count_nonzero(np.isfinite(rewards)) == n):
                finite = self.non_finite_observations != "allow"
                images, states, whole = [], [], True
                for key, arr in obs.images.items():
                    images.append((key, arr.shape, arr.dtype))
                    if arr.dtype != np.uint8 or arr.ndim != 4 or arr.shape[0] != n:
                        whole = False
                for key, arr in obs.states.items():
                    kind = arr.dtype.kind
                    states.append((key, arr.shape, arr.dtype))
                    if (kind not in "biuf" or arr.ndim == 0 or arr.shape[0] != n
                            or (finite and kind == "f" and np.count_nonzero(np.isfinite(arr)) != arr.size)):
                        whole = False
                layout = self.layout
                if (whole and states == layout.states and images == layout.images
                        and (images or states or obs.text.shape[0] == n)):
                    if layout.text and obs.text.itemsize <= 4:  # may have lost the text the first observation had
                        layout.check(obs, "step()")
                    if self.rows is not None:
                        self.rows.latest = obs.states
                    text = obs.text
                    if not (text.dtype.byteorder == "=" and text.flags.c_contiguous and text.nbytes <= _DECODE_MAX
                            and _utf32_clean(text)):
                        self.text.observation(obs)
                    return StepOutput(obs, rewards, terminated, truncated, self.text.info(info) if info else info,
                                      _NO_ROWS)
        return self._step_rule_by_rule(result)

    def _step_rule_by_rule(self, result: Any) -> StepOutput:
        """:meth:`step` for a result the one pass found something wrong or new in: each rule in turn."""
        try:
            out = check_step(self.n, result, self.non_finite_rewards, self.non_finite_observations)
        except EnvContractError as exc:
            raise EnvContractError(f"env {self.env_id}: {exc}") from None
        self._layout(out.obs, "step()")
        if self.rows is not None:
            self.rows.seen(out.obs)
        self.text.observation(out.obs)
        return dataclasses.replace(out, info=self.text.info(out.info)) if out.info else out

    def _layout(self, obs: Observation, where: str) -> None:
        try:
            self.layout.check(obs, where)
        except EnvContractError as exc:
            raise EnvContractError(f"env {self.env_id}: {exc}") from None
