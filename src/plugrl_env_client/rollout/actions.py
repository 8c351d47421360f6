"""What a server sends as actions, checked against the env's action space before the env sees a chunk.

What an env must return is :mod:`plugrl_env_client.envs.contract`; this module is the other direction: an action
chunk from the server, checked and cast to the space's dtype. A failure is one error whose message says what was
expected, what came and what to change.
"""

from __future__ import annotations

from typing import Any, NoReturn

import gymnasium as gym
import numpy as np

from plugrl_env_client.envs.base_env import describe_space
from plugrl_env_client.envs.contract import rows_text
from plugrl_env_client.errors import EnvContractError, ProtocolError

# ------------------------------------------------------------------------------------------------ server actions


def check_actions(actions: np.ndarray, space: gym.Space, replan_steps: int | None, non_finite: str = "error") -> np.ndarray:
    """A server's chunk ``[H, m, *shape]`` checked against the env's action space, in the space's dtype.

    NaN or infinite values for a float space are an error (``non_finite="error"``) or are clipped into the
    space's bounds (``"clip"``: NaN becomes 0, then everything is clipped to [low, high]). For an integer space
    (Discrete, MultiDiscrete, ...) they are always an error: casting NaN to an integer gives an arbitrary number,
    and there are no float bounds to clip to.

    The server's values must be actions the space holds when it is discrete (Discrete with its ``start``,
    MultiDiscrete, MultiBinary): one vectorised min/max test per chunk, and a value outside is an error that names
    it and what the space allows (the env would fail on it, or silently take another action). A Box space's bounds
    are the env's business: finite values outside them reach the env as they are, unless they do not fit the
    space's dtype (1e300 for float32, which the cast would make infinite).
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
    target = None if dtype is None else np.dtype(dtype)
    if target is not None and target.kind == "U" and actions.dtype.kind != "U":
        raise ProtocolError(f"the server sent actions of dtype {actions.dtype.str}; the env's action space "
                            f"{describe_space(space)} needs text (a '<U' array, or lists of str): use a text policy "
                            "(e.g. plugrl-run-policy-server --policy.name text --policy.choices ...)")
    if target is not None and target.kind in "biuf":
        if actions.dtype.kind not in "biuf":
            raise ProtocolError(f"the server sent actions of dtype {actions.dtype.str}; the env's action space {space} needs numbers")
        if actions.dtype.kind == "f" and target.kind != "f" and not np.isfinite(actions).all():
            raise ProtocolError(
                f"the server sent NaN or infinite actions (for the infer's envs at positions "
                f"{rows_text(_bad_action_positions(actions))}) for the integer action space {space}; fix the policy"
            )
        bounds = None if type(space) is gym.spaces.Box else _discrete_bounds(space)
        if bounds is not None:
            _check_discrete(actions, space, *bounds)
        elif target.kind in "iu" and actions.dtype != target:
            _check_fits(actions, target, space)
        sent = actions
        if actions.dtype.kind == "f" and target.kind == "f" and actions.dtype.itemsize > target.itemsize:
            with np.errstate(over="ignore"):  # a value beyond the dtype becomes inf: reported below, by its value
                actions = actions.astype(target)
        else:
            actions = actions.astype(target, copy=False)
        if actions.dtype.kind == "f" and np.count_nonzero(np.isfinite(actions)) != actions.size:
            actions = _non_finite(actions, space, non_finite, sent)
    return actions


def _discrete_bounds(space: gym.Space) -> tuple[Any, Any] | None:
    """The smallest and largest action of a discrete space (numbers, or arrays of the space's shape for the
    multi-component spaces); None for other spaces."""
    if isinstance(space, gym.spaces.Discrete):
        return int(space.start), int(space.start + space.n - 1)
    if isinstance(space, gym.spaces.MultiDiscrete):
        start = np.asarray(getattr(space, "start", 0))
        return start, start + space.nvec - 1
    if isinstance(space, gym.spaces.MultiBinary):
        return 0, 1
    return None


def _check_discrete(actions: np.ndarray, space: gym.Space, low: Any, high: Any) -> None:
    """Every value of the chunk within ``[low, high]``: two reductions for one pair of bounds, one comparison per
    value for bounds per component."""
    if np.ndim(low) == 0 and np.ndim(high) == 0:
        if actions.min() >= low and actions.max() <= high:
            return
    elif not ((actions < low) | (actions > high)).any():
        return
    outside = (actions < low) | (actions > high)
    first = tuple(int(i) for i in np.argwhere(outside)[0])
    value, where = _number(actions[first]), rows_text(_positions(outside))
    component = first[2:]
    lo, hi = (np.broadcast_to(b, actions.shape[2:])[component] if component else b for b in (low, high))
    if not component:
        raise ProtocolError(
            f"the server's policy sent the action {value} (for the infer's envs at positions {where}), but the env's "
            f"action space {describe_space(space)} allows {int(lo)} to {int(hi)}: fix the server's policy (its "
            f"actions must be integers from {int(lo)} to {int(hi)})"
        )
    raise ProtocolError(
        f"the server's policy sent {value} as component {list(component)} of an action (for the infer's envs at "
        f"positions {where}), but the env's action space {describe_space(space)} allows {int(lo)} to {int(hi)} there: "
        "fix the server's policy"
    )


def _check_fits(actions: np.ndarray, target: np.dtype, space: gym.Space) -> None:
    """Every value of the chunk within the range of the integer dtype it is cast to (a Box of integers)."""
    info = np.iinfo(target)
    if actions.min() >= info.min and actions.max() <= info.max:
        return
    outside = (actions < info.min) | (actions > info.max)
    _does_not_fit(actions, outside, target, space, f"range {info.min} to {info.max}")


def _does_not_fit(sent: np.ndarray, outside: np.ndarray, target: np.dtype, space: gym.Space, limits: str,
                  clip_hint: str = "") -> NoReturn:
    """The error for values of ``sent`` (where ``outside`` is true) that the cast to ``target`` cannot hold."""
    value = _number(sent[tuple(np.argwhere(outside)[0])])
    raise ProtocolError(
        f"the server's policy sent {value} (for the infer's envs at positions {rows_text(_positions(outside))}), which "
        f"does not fit {target.name}, the dtype of the env's action space {describe_space(space)} ({limits}): fix "
        f"the server's policy{clip_hint}"
    )


def _number(value: Any) -> str:
    """A value of a chunk as a message shows it: ``5``, ``1.5``, ``1e+300``."""
    number = value.item() if isinstance(value, np.generic) else value
    if isinstance(number, float) and number.is_integer() and abs(number) < 1e15:
        return str(int(number))
    return f"{number:g}" if isinstance(number, float) else str(number)


def _positions(mask: np.ndarray) -> np.ndarray:
    """Positions (in the infer's env order) whose chunk has a true value of ``mask`` anywhere."""
    return np.flatnonzero(mask.reshape(mask.shape[0], mask.shape[1], -1).any(axis=(0, 2)))


def _bad_action_positions(actions: np.ndarray) -> np.ndarray:
    """Positions (in the infer's env order) whose chunk holds a NaN/inf anywhere."""
    return _positions(~np.isfinite(actions))


def _non_finite(actions: np.ndarray, space: gym.Space, mode: str, sent: np.ndarray) -> np.ndarray:
    """``actions`` (cast to the space's float dtype) hold NaN or inf: values the server sent so, or finite values
    the cast made infinite (``sent`` is the chunk as it came)."""
    if mode != "clip":
        if np.isfinite(sent).all():
            finfo = np.finfo(actions.dtype)
            _does_not_fit(sent, ~np.isfinite(actions), actions.dtype, space, f"largest {float(finfo.max):g}",
                          ", or pass --runner.non-finite-actions clip to clip such values into the action space bounds")
        raise ProtocolError(
            f"the server sent NaN or infinite actions (for the infer's envs at positions "
            f"{rows_text(_bad_action_positions(actions))}); fix the policy, or pass "
            "--runner.non-finite-actions clip to replace them (NaN -> 0, then clipped to the action space bounds)"
        )
    finite_max = np.finfo(actions.dtype).max
    low = np.maximum(getattr(space, "low", -finite_max), -finite_max)
    high = np.minimum(getattr(space, "high", finite_max), finite_max)
    return np.clip(np.nan_to_num(actions, nan=0.0, posinf=finite_max, neginf=-finite_max), low, high)
