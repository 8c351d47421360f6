"""Checks on what a server sends as actions, and the per-env part of an env's info, on every chunk and step.

What an env must return is :mod:`plugrl_env_client.envs.contract`; this module holds the rollout's side: an action
chunk checked against the env's action space before the env sees it, and the info values cut to the envs a
feedback is about. A failure is one error whose message says what was expected, what came and what to change.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from plugrl_env_client.envs.base_env import describe_space
from plugrl_env_client.envs.contract import is_per_env, rows_text
from plugrl_env_client.errors import EnvContractError, ProtocolError

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
                f"{rows_text(_bad_action_positions(actions))}) for the integer action space {space}; fix the policy"
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
            f"{rows_text(_bad_action_positions(actions))}); fix the policy, or pass "
            "--runner.non-finite-actions clip to replace them (NaN -> 0, then clipped to the action space bounds)"
        )
    finite_max = np.finfo(actions.dtype).max
    low = np.maximum(getattr(space, "low", -finite_max), -finite_max)
    high = np.minimum(getattr(space, "high", finite_max), finite_max)
    return np.clip(np.nan_to_num(actions, nan=0.0, posinf=finite_max, neginf=-finite_max), low, high)


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
        elif is_per_env(value, num_envs):
            out[str(key)] = value[rows]
    return out
