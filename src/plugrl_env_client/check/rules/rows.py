"""Observations compared array by array and row by row, for the rules that compare resets and steps (4, 7, 8, 9).

Envs return batches; a rule asks whether one env's row came back the same, or which rows of which arrays changed.
NaN equals NaN here: a row that holds NaN twice did not change.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from plugrl_env_client.envs.base_env import Observation


def arrays(obs: Observation) -> Iterator[tuple[str, np.ndarray]]:
    """Every array of an observation by display name, text included."""
    for k, v in obs.images.items():
        yield f"images[{k!r}]", v
    for k, v in obs.states.items():
        yield f"states[{k!r}]", v
    yield "text", obs.text


def layout_of(obs: Observation) -> dict[str, tuple[tuple[int, ...], str]]:
    """The shape and dtype of every image and state array, by display name."""
    return {name: (arr.shape, arr.dtype.str) for name, arr in arrays(obs) if name != "text"}


def same(a: np.ndarray, b: np.ndarray) -> bool:
    """Same shape and values (NaN equal to NaN)."""
    if a.shape != b.shape:
        return False
    return bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc" and b.dtype.kind in "fc"))


def differences(a: Observation, b: Observation, rows: np.ndarray | None = None) -> list[str]:
    """Where ``a`` and ``b`` differ, restricted to ``rows``: ``states['pos'] in envs [0, 1]``-style phrases."""
    names_a, names_b = dict(arrays(a)), dict(arrays(b))
    out = []
    if names_a.keys() != names_b.keys():
        out.append(f"the keys differ ({sorted(names_a)} and {sorted(names_b)})")
    for name in names_a.keys() & names_b.keys():
        x, y = names_a[name], names_b[name]
        if x.shape != y.shape:
            out.append(f"{name} has shape {x.shape} and then {y.shape}")
            continue
        idx = np.arange(x.shape[0]) if rows is None else rows
        differ = [int(i) for i in idx if not same(x[i], y[i])]
        if differ:
            out.append(f"{name} in envs {differ}")
    return sorted(out)


def row_equal(a: Observation, i: int, b: Observation, j: int) -> bool:
    """Row ``i`` of ``a`` equals row ``j`` of ``b`` in every array, text included."""
    names_a, names_b = dict(arrays(a)), dict(arrays(b))
    if names_a.keys() != names_b.keys():
        return False
    return all(names_a[k].shape[1:] == names_b[k].shape[1:] and same(names_a[k][i], names_b[k][j]) for k in names_a)

