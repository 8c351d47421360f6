"""Rules 11 and 12: what ``info`` carries.

The client forwards an info value to the server only when it is a per-env array
(:func:`plugrl_env_client.envs.contract.is_per_env`, the test the rollout slices info with), and reads a few keys of
its own (:data:`DOCUMENTED_INFO_KEYS`). Anything else is dropped without a word at run time; rule 11 names it.
Rule 12 asks that metrics keep their names from step to step, which trainers aggregate by.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from plugrl_env_client.check.harness import Context, Outcome, passed
from plugrl_env_client.envs.contract import describe_value, is_per_env

DOCUMENTED_INFO_KEYS: dict[str, str] = {
    "success": "bool (n,): the episode counts as a success when it is true on any step",
    "metrics": "dict of metric name -> per-env values (n,) (or a scalar for the whole batch)",
    "metrics_agg_mode": "dict of metric name -> how to aggregate it over an episode ('mean', 'sum', 'last', ...)",
    "env_instruction": "str, or one str per env: the task instruction",
    "action_is_valid": "bool (n,) or one bool: whether the action could be parsed and applied",
    "no_episode": "bool (n,) or one bool: the env has no episode to give (e.g. its task list is used up)",
}
"""Info keys with a meaning of their own; their values need not be per-env arrays (others do, to be forwarded)."""


def rule_info(ctx: Context) -> Outcome:
    """11. Info values are per-env arrays (leading dim n, a dtype the wire carries), possibly in nested dicts, or
    one of the documented keys (:data:`DOCUMENTED_INFO_KEYS`). Anything else is a warning: the client leaves it out
    of the feedback it sends. ``info["episode"]`` is the client's own key."""
    traj = ctx.trajectory()
    notes: dict[str, str] = {}
    for rec in traj.steps:
        for key, value in rec.info.items():
            if key == "episode":
                notes.setdefault("'episode'", "info['episode'] is written by the client (episode statistics) and "
                                 "would replace the env's")
            elif key in DOCUMENTED_INFO_KEYS:
                _documented(key, value, ctx.n, notes)
            else:
                _per_env(f"info[{key!r}]", value, ctx.n, notes)
    if not notes:
        return passed()
    return Outcome("warn", "; ".join(list(notes.values())[:6]) + ("; ..." if len(notes) > 6 else ""),
                   f"return per-env arrays (leading dim {ctx.n}) or leave the value out; documented keys: "
                   f"{', '.join(DOCUMENTED_INFO_KEYS)}")


def _per_env(path: str, value: Any, n: int, notes: dict[str, str]) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _per_env(f"{path}[{k!r}]", v, n, notes)
        return
    if is_per_env(value, n):  # what the client forwards, row by row
        return
    if isinstance(value, np.ndarray) and value.ndim >= 1 and value.shape[0] == n:
        notes.setdefault(path, f"{path} has dtype {value.dtype}, which cannot be sent")
        return
    what = f"an array of shape {value.shape}" if isinstance(value, np.ndarray) else describe_value(value)
    hint = " (return np.asarray(...))" if isinstance(value, list | tuple) and len(value) == n else ""
    notes.setdefault(path, f"{path} is {what}{hint}: dropped from feedback")


def _documented(key: str, value: Any, n: int, notes: dict[str, str]) -> None:
    path = f"info[{key!r}]"
    if key == "success":
        arr = np.asarray(value) if isinstance(value, np.ndarray) else None
        if arr is None or arr.shape != (n,) or arr.dtype.kind not in "biu":
            notes.setdefault(path, f"{path} is {describe_value(value)}: the client counts success only from "
                             f"a bool array of shape ({n},)")
    elif key in ("metrics", "metrics_agg_mode") and not isinstance(value, dict):
        notes.setdefault(path, f"{path} is {describe_value(value)}, not a dict of metric name -> value")
    elif key == "metrics":
        for name, v in value.items():
            if not (isinstance(v, np.ndarray | np.generic | int | float | bool)):
                notes.setdefault(f"{path}[{name!r}]", f"{path}[{name!r}] is {describe_value(v)}, not a number "
                                 "or a per-env array")


def rule_metric_keys(ctx: Context) -> Outcome:
    """12. When the env reports ``info["metrics"]``, it reports the same metric names on every step (trainers
    aggregate metrics by name over an episode; a name that comes and goes breaks the aggregate)."""
    traj = ctx.trajectory()
    seen = [(rec.number, _metric_names(rec.info)) for rec in traj.steps]
    reported = [(number, names) for number, names in seen if names is not None]
    if not reported:
        return passed("the env reports no info['metrics']")
    first_step, first = seen[0]
    for number, names in seen[1:]:
        if names != first:
            def show(x: frozenset[str] | None) -> str:
                return "no info['metrics']" if x is None else str(sorted(x))
            return Outcome("fail", f"info['metrics'] had {show(first)} at step {first_step} and {show(names)} at "
                           f"step {number}", "report every metric name on every step (a neutral value when it "
                           "does not apply)")
    modes = [rec.info.get("metrics_agg_mode") for rec in traj.steps]
    if any(isinstance(m, dict) for m in modes):
        missing = sorted(first - set().union(*(set(m) for m in modes if isinstance(m, dict)))) if first else []
        if missing:
            return Outcome("warn", f"metrics {missing} have no entry in info['metrics_agg_mode']",
                           "give every metric an aggregation mode ('mean', 'sum', 'last', ...)")
    return passed(f"{len(first or ())} metrics on every step")


def _metric_names(info: dict[str, Any]) -> frozenset[str] | None:
    metrics = info.get("metrics")
    if not isinstance(metrics, dict):
        return None
    return frozenset(str(k) for k in metrics)
