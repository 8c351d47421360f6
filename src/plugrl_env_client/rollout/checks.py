"""Contract checks on what an env returns and on what a server sends as actions.

Each failure is one error with a message that says what was expected, what came, and what to change.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from plugrl_env_client.envs.base_env import BaseEnv, Observation
from plugrl_env_client.errors import EnvContractError, ProtocolError


def action_space_of(env: BaseEnv) -> gym.Space:
    """The env's unbatched action space (the policy's contract)."""
    space = getattr(env, "single_action_space", None)
    if space is None:
        raise EnvContractError(
            "Env must expose action space via single_action_space/action_space: set "
            "`self.single_action_space = gymnasium.spaces.Box(...)` in the env's __init__"
        )
    return space


def check_actions(actions: np.ndarray, space: gym.Space, replan_steps: int | None, non_finite: str = "error") -> np.ndarray:
    """A server's chunk ``[H, m, *shape]`` checked against the env's action space, in the space's dtype.

    NaN or infinite values for a float space are an error (``non_finite="error"``) or are clipped into the
    space's bounds (``"clip"``: NaN becomes 0, then everything is clipped to [low, high]).
    """
    expected = tuple(space.shape or ())
    tail = tuple(actions.shape[2:])
    if tail != expected:
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
        raise ProtocolError(f"the server sent actions of dtype {actions.dtype.str}; the env's action space {space} "
                            "needs text (a '<U' array)")
    if dtype is not None and np.dtype(dtype).kind in "biuf":
        if actions.dtype.kind not in "biuf":
            raise ProtocolError(f"the server sent actions of dtype {actions.dtype.str}; the env's action space {space} needs numbers")
        actions = actions.astype(dtype, copy=False)
        if actions.dtype.kind == "f" and not np.isfinite(actions).all():
            actions = _non_finite(actions, space, non_finite)
    return actions


def _non_finite(actions: np.ndarray, space: gym.Space, mode: str) -> np.ndarray:
    if mode != "clip":
        bad = np.flatnonzero(~np.isfinite(actions).reshape(actions.shape[0], actions.shape[1], -1).all(axis=(0, 2)))
        raise ProtocolError(
            f"the server sent NaN or infinite actions (for the infer's envs at positions {bad.tolist()}); fix the policy, or pass "
            "--runner.non-finite-actions clip to replace them (NaN -> 0, then clipped to the action space bounds)"
        )
    finite_max = np.finfo(actions.dtype).max
    low = np.maximum(getattr(space, "low", -finite_max), -finite_max)
    high = np.minimum(getattr(space, "high", finite_max), finite_max)
    return np.clip(np.nan_to_num(actions, nan=0.0, posinf=finite_max, neginf=-finite_max), low, high)


def check_step(
    num_envs: int, obs: Any, rewards: Any, terminated: Any, truncated: Any, info: Any
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Validate ``env.step`` outputs; returns rewards (float32) and the two flag arrays (bool)."""
    if not isinstance(obs, Observation):
        raise EnvContractError(f"env.step must return an Observation as its first value, got {type(obs).__name__}")
    check_observation(num_envs, obs, "env.step")
    if not isinstance(info, dict):
        raise EnvContractError(f"env.step must return a dict as info, got {type(info).__name__}")
    out = []
    for name, value, kind in (("reward", rewards, "f"), ("terminated", terminated, "b"), ("truncated", truncated, "b")):
        arr = np.asarray(value)
        if arr.shape != (num_envs,):
            raise EnvContractError(f"Expected {name} shape ({num_envs},), got {arr.shape}: return one value per env")
        if kind == "b" and arr.dtype != bool:
            raise EnvContractError(f"Expected {name} of dtype bool, got {arr.dtype}")
        if kind == "f" and arr.dtype.kind not in "fiu":
            raise EnvContractError(f"Expected numeric rewards, got dtype {arr.dtype}")
        out.append(arr.astype(np.float32, copy=False) if kind == "f" else arr)
    return out[0], out[1], out[2]


def check_reset(num_envs: int, result: Any) -> Observation:
    """Validate ``env.reset`` output; returns the observation batch."""
    if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], Observation)):
        raise EnvContractError("env.reset must return (Observation, info) for the whole batch")
    check_observation(num_envs, result[0], "env.reset")
    return result[0]


def check_observation(num_envs: int, obs: Observation, where: str) -> None:
    """Batch size and dtypes policy servers accept (dtype checks only: no pass over the data)."""
    if obs.batch_size != num_envs:
        raise EnvContractError(f"{where} returned an Observation of {obs.batch_size} envs; expected {num_envs}")
    for name, arr in obs.images.items():
        if arr.dtype != np.uint8 or arr.ndim != 4:
            raise EnvContractError(
                f"{where} returned images[{name!r}] of dtype {arr.dtype} and shape {arr.shape}; images must be uint8 "
                "(n, height, width, channels): convert them, or put other arrays (depth, features) in states"
            )
    for name, arr in obs.states.items():
        if arr.dtype.kind not in "biuf":
            raise EnvContractError(f"{where} returned states[{name!r}] of dtype {arr.dtype}; states must be numeric")


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
