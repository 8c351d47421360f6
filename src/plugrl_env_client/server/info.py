"""What the reference server reads from a feedback's ``info``, checked value by value.

PlugRL SPEC 5.4 (SPEC.md 4.4): an array whose leading dimension is ``m`` (the feedback's env count) is split per
env, any other value is passed through to every env unchanged, and servers read the finished episodes from
``info["episode"]``. What a server cannot use is a :class:`~plugrl_env_client.errors.ProtocolError` naming the
field, which the server answers with a resync:

* a key that is not a str, anywhere; maps nested deeper than :data:`MAX_DEPTH`;
* for ``m > 1``, a non-empty ``info`` with no array of leading dimension ``m`` anywhere (nothing says how to split
  it; PlugRL's server refuses it too);
* in an ``info["episode"]`` map, a field ``r`` (return), ``l`` (length), ``s`` (success) or ``mask`` (which rows
  finished an episode) that is not an ``[m]`` array of its kind, or one value of that kind for every row: numbers for
  ``r``; whole numbers >= 0 for ``l`` (integers, or floats with whole values); bools for ``s`` and ``mask``.

A field left out has its default (``l`` 0, no success flag, every row finished); an ``r`` left out means the map
reports no episode, and an ``info["episode"]`` that is not a map is not an episode report at all (both as before:
other clients' envs may carry such keys). Other keys of the map, such as PlugRL's ``mean_success_rate``, are not
read. Every check is a type, shape or dtype test, or one vectorized comparison over an ``[m]`` array: nothing loops
over elements in Python, so checking costs the same whatever the batch.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from plugrl_env_client.errors import ProtocolError
from plugrl_env_client.protocol.messages import short_repr

MAX_DEPTH = 32
"""Deepest nesting of maps accepted in ``info`` (clients send two or three levels; msgpack allows about 1000, which
would overflow Python's stack in a recursive walk)."""

SUCCESS_INFO_KEYS = ("success", "is_step_success")
"""Per-env step flags a client forwards in feedback ``info`` only for an env that judges success: this client
forwards the env's own ``info["success"]``, PlugRL's client sends ``info["is_step_success"]``."""

_INT64_MAX = np.iinfo(np.int64).max


@dataclasses.dataclass(frozen=True)
class FinishedEpisodes:
    """The episodes one feedback reports as finished: one entry per row whose ``mask`` is set, in row order."""

    rows: np.ndarray
    """The rows (positions in the feedback's ``env_indices``)."""
    returns: np.ndarray
    """float64."""
    lengths: np.ndarray
    """int64, >= 0."""
    success: np.ndarray | None
    """bool, or None when the report carries no ``s``."""

    def __len__(self) -> int:
        return int(self.rows.size)

    def without(self, drop: np.ndarray) -> FinishedEpisodes:
        """The report without the rows whose ``drop`` (a bool array over the feedback's rows) is set."""
        keep = ~drop[self.rows]
        return FinishedEpisodes(self.rows[keep], self.returns[keep], self.lengths[keep],
                                None if self.success is None else self.success[keep])


@dataclasses.dataclass(frozen=True)
class FeedbackInfo:
    episodes: FinishedEpisodes | None
    """The finished episodes ``info["episode"]`` reports, or None when it reports none."""
    shows_rule: bool
    """The info carries a per-env success flag (:data:`SUCCESS_INFO_KEYS`): its env judges success."""


def read_info(info: dict[str, Any], m: int) -> FeedbackInfo:
    """Check a feedback's ``info`` for ``m`` envs (see the module docstring) and read what the server uses."""
    has_rows = _walk(info, m)
    episode = info.get("episode")
    report = _finished_episodes(episode, m) if isinstance(episode, dict) else None  # first: its errors name the field
    if m > 1 and info and not has_rows:
        raise ProtocolError(f"feedback info {short_repr(info, 200)} cannot be split per env: for {m} envs it needs "
                            f"arrays with leading dim {m}")
    shows_rule = any(isinstance(v := info.get(key), np.ndarray) and v.ndim == 1 and v.shape[0] == m
                     for key in SUCCESS_INFO_KEYS)
    return FeedbackInfo(report, shows_rule)


def _walk(info: dict[str, Any], m: int) -> bool:
    """Check every key (str) and the nesting depth of ``info``, without recursion; whether any array in it has
    leading dim ``m``."""
    has_rows = False
    pending: list[tuple[dict[str, Any], str, int]] = [(info, "info", 1)]
    while pending:
        node, path, depth = pending.pop()
        for key, value in node.items():
            if type(key) is not str:
                raise ProtocolError(f"feedback {path} has a non-str key {short_repr(key, 80)}; use str keys only")
            if type(value) is dict:
                if depth >= MAX_DEPTH:
                    raise ProtocolError(f"feedback {path}[{key!r}] nests maps deeper than {MAX_DEPTH} levels")
                pending.append((value, f"{path}[{key!r}]", depth + 1))
            elif not has_rows and isinstance(value, np.ndarray) and value.ndim >= 1 and value.shape[0] == m:
                has_rows = True
    return has_rows


def _finished_episodes(episode: dict[str, Any], m: int) -> FinishedEpisodes | None:
    mask = _field(episode, "mask", m, "b", "bools")
    returns = _field(episode, "r", m, "iuf", "numbers")
    lengths = _field(episode, "l", m, "iuf", "whole numbers >= 0")
    success = _field(episode, "s", m, "b", "bools")
    if lengths is not None:
        lengths = _lengths(lengths)
    if returns is None:
        return None  # the map reports no episode (as before: nothing says what a row's return was)
    rows = np.flatnonzero(mask) if mask is not None else np.arange(m)
    return FinishedEpisodes(
        rows=rows,
        returns=returns[rows].astype(np.float64),
        lengths=lengths[rows] if lengths is not None else np.zeros(rows.size, np.int64),
        success=None if success is None else success[rows],
    )


def _field(episode: dict[str, Any], key: str, m: int, kinds: str, what: str) -> np.ndarray | None:
    """``info["episode"][key]`` as an ``[m]`` array of a dtype kind in ``kinds`` (one value stands for every row),
    None when the key is not there."""
    if key not in episode:
        return None
    value = episode[key]
    where = f"feedback info['episode'][{key!r}]"
    if isinstance(value, np.ndarray):
        if value.ndim != 1 or value.shape[0] != m:
            raise ProtocolError(f"{where} has shape {list(value.shape)}; it needs one row per env of the feedback "
                                f"({m})")
        if value.dtype.kind not in kinds:
            raise ProtocolError(f"{where} must hold {what}, got an array of dtype {value.dtype.str}")
        return value
    if _is_value(value, kinds):
        return np.full(m, value)
    raise ProtocolError(f"{where} must be a [{m}] array of {what}, or one such value for every row; got "
                        f"{short_repr(value, 80)} ({type(value).__name__})")


def _is_value(value: Any, kinds: str) -> bool:
    if isinstance(value, (bool, np.bool_)):
        return "b" in kinds
    if isinstance(value, (int, np.integer)):
        return "i" in kinds and (not isinstance(value, int) or -_INT64_MAX - 1 <= value <= _INT64_MAX)
    if isinstance(value, (float, np.floating)):
        return "f" in kinds
    return False


def _lengths(lengths: np.ndarray) -> np.ndarray:
    """Episode lengths as int64, refusing negative, fractional, non-finite and out-of-range values."""
    where = "feedback info['episode']['l']"
    if lengths.dtype.kind == "f":
        if lengths.size and not (np.isfinite(lengths).all() and (lengths == np.floor(lengths)).all()):
            raise ProtocolError(f"{where} must hold whole numbers (episode lengths in env steps), got "
                                f"{short_repr(lengths.tolist(), 120)}")
        if lengths.size and float(np.abs(lengths).max()) > 2.0**62:
            raise ProtocolError(f"{where} holds lengths too large for an int64: {short_repr(lengths.tolist(), 120)}")
    elif lengths.dtype.kind == "u" and lengths.size and int(lengths.max()) > _INT64_MAX:
        raise ProtocolError(f"{where} holds lengths too large for an int64: {short_repr(lengths.tolist(), 120)}")
    out = lengths.astype(np.int64)
    if out.size and int(out.min()) < 0:
        raise ProtocolError(f"{where} must hold lengths >= 0, got {short_repr(lengths.tolist(), 120)}")
    return out
