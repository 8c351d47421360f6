"""The statistics of ``obs_stats.jsonl``: per observation key, its shape, dtype and the moments of its finite
values, as PlugRL writes them."""

from __future__ import annotations

from typing import Any

import numpy as np

from plugrl_env_client.outputs.recording.episode import Frame


class _Moments:
    """Min, max, mean and (population) std of the finite values of many arrays, combined one array at a time, so
    the statistics of a long episode never need its frames stacked or converted to float at once."""

    def __init__(self) -> None:
        self.count = 0
        self.mean = 0.0
        self.m2 = 0.0
        self.min = np.inf
        self.max = -np.inf
        self.non_finite = 0

    def add(self, array: np.ndarray) -> None:
        values = np.asarray(array)
        if values.dtype.kind == "b":
            values = values.astype(np.uint8)
        if values.dtype.kind not in "iuf":
            return
        if values.dtype.kind == "f":
            finite = np.isfinite(values)
            if not finite.all():
                self.non_finite += int(values.size - np.count_nonzero(finite))
                values = values[finite]
        n = int(values.size)
        if n == 0:
            return
        x = values.astype(np.float64, copy=False)
        mean = float(x.mean())
        m2 = float(np.square(x - mean).sum())
        total = self.count + n
        delta = mean - self.mean
        self.mean += delta * n / total
        self.m2 += m2 + delta * delta * self.count * n / total
        self.count = total
        self.min = min(self.min, float(x.min()))
        self.max = max(self.max, float(x.max()))

    def to_json(self) -> dict[str, Any]:
        """``mean``, ``std``, ``min`` and ``max`` of the finite values (null when there are none), their ``count``
        and the ``non_finite`` values left out."""
        if self.count == 0:
            return {"min": None, "max": None, "mean": None, "std": None, "count": 0, "non_finite": self.non_finite}
        return {"min": self.min, "max": self.max, "mean": self.mean, "std": float(np.sqrt(self.m2 / self.count)),
                "count": self.count, "non_finite": self.non_finite}


def array_stats(array: np.ndarray) -> dict[str, Any]:
    """PlugRL's statistics of one observation array: ``shape``, ``dtype``, ``mean``, ``std``, ``min``, ``max``
    (over its finite values, so every number is finite; null when it has none), then ours."""
    moments = _Moments()
    moments.add(array)
    out: dict[str, Any] = {"shape": list(array.shape), "dtype": str(array.dtype)}
    if array.dtype.kind in "biuf":
        stats = moments.to_json()
        out.update({k: stats[k] for k in ("mean", "std", "min", "max", "count", "non_finite")})  # PlugRL's order
    return out


def phase_stats(frame: Frame) -> dict[str, Any]:
    """One observation's statistics as PlugRL's ``first`` / ``last``: ``images``, ``states`` and ``text`` (its
    ``shape``, ``dtype`` and ``value`` as a batch of one row, as PlugRL writes it)."""
    text = np.array([frame.text])
    return {"images": {k: array_stats(v) for k, v in frame.images.items()},
            "states": {k: array_stats(v) for k, v in frame.states.items()},
            "text": {"shape": list(text.shape), "dtype": str(text.dtype), "value": text.tolist()}}
