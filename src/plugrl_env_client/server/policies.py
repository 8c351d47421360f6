"""Policies of the reference server. They see the decoded observation and answer a time-major action chunk.

Numeric policies (``random``, ``zero``) answer ``[horizon, n, *action_shape]`` arrays of a numeric dtype; the
``text`` policy answers ``[horizon, n]`` '<U' arrays for language-agent envs (a ``gymnasium.spaces.Text`` action
space), picking one of a fixed set of strings per env and step.
"""

from __future__ import annotations

import abc
import copy
import dataclasses
from typing import Any, Literal

import numpy as np


@dataclasses.dataclass
class PolicyConfig:
    """What the reference server answers infers with."""

    name: Literal["random", "zero", "text"] = "random"
    """random: uniform in [low, high]; zero: all zeros; text: one of --policy.choices per env and step."""
    action_dim: int = 7
    """Length of each action vector; 0 means scalar actions (discrete policies), sent as [horizon, n]."""
    action_horizon: int = 4
    """Steps per action chunk."""
    dtype: str = "float32"
    """numpy dtype of the actions (float32, float64, int64, ...); an integer dtype draws integers in [low, high]."""
    low: float = -1.0
    high: float = 1.0
    seed: int | None = None
    """Seed of the random and text policies' generator (default: fresh entropy)."""
    choices: tuple[str, ...] = ()
    """Strings the text policy picks from (e.g. --policy.choices "<answer>3</answer>" "hello"); text policy only."""
    latency_ms: float = 0.0
    """Milliseconds the server waits before answering each infer, simulating inference time (the wait blocks only
    that client's connection)."""


class Policy(abc.ABC):
    """Maps a batch of observations to an action chunk of shape ``[horizon, n, *action_shape]``."""

    def __init__(self, action_shape: tuple[int, ...], dtype: np.dtype, horizon: int, low: Any, high: Any) -> None:
        if horizon < 1:
            raise ValueError(f"the action horizon (--policy.action-horizon) must be >= 1, got {horizon}")
        self.action_shape = tuple(action_shape)
        self.dtype = np.dtype(dtype)
        self.horizon = int(horizon)
        self.low = np.broadcast_to(np.asarray(low, dtype=np.float64), self.action_shape)
        self.high = np.broadcast_to(np.asarray(high, dtype=np.float64), self.action_shape)

    def metadata(self) -> dict[str, Any]:
        dim = self.action_shape[0] if len(self.action_shape) == 1 else (0 if not self.action_shape else None)
        meta = {"policy": type(self).__name__, "action_horizon": self.horizon, "action_dtype": self.dtype.str}
        if dim is not None:
            meta["action_dim"] = dim
        return meta

    def for_stream(self, key: np.random.SeedSequence) -> Policy:
        """This policy for one client stream (a process's connection): policies that draw random numbers return
        a copy with its own generator seeded from ``key``, so each stream's actions are reproducible whatever the
        other streams do; the others return themselves."""
        return self

    @abc.abstractmethod
    def act(self, obs: dict[str, Any], n: int) -> np.ndarray:
        """Action chunk for ``n`` envs."""


class RandomPolicy(Policy):
    def __init__(self, *args: Any, seed: int | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.seed = seed
        self.rng = np.random.default_rng(seed)
        # Infinite bounds (e.g. an unbounded Box) fall back to [-1, 1] so draws stay finite.
        self.low = np.where(np.isfinite(self.low), self.low, -1.0)
        self.high = np.where(np.isfinite(self.high), self.high, 1.0)

    def act(self, obs: dict[str, Any], n: int) -> np.ndarray:
        shape = (self.horizon, n, *self.action_shape)
        if self.dtype.kind in "iu":
            return self.rng.integers(self.low.astype(np.int64), self.high.astype(np.int64) + 1, size=shape).astype(self.dtype)
        if self.dtype.kind == "b":
            return self.rng.random(size=shape) < 0.5
        return self.rng.uniform(self.low, self.high, size=shape).astype(self.dtype)

    def for_stream(self, key: np.random.SeedSequence) -> Policy:
        stream = copy.copy(self)
        stream.rng = np.random.default_rng(key)
        return stream


class ZeroPolicy(Policy):
    def act(self, obs: dict[str, Any], n: int) -> np.ndarray:
        return np.zeros((self.horizon, n, *self.action_shape), dtype=self.dtype)


class TextPolicy(Policy):
    """Answers ``[horizon, n]`` '<U' chunks: each env and step gets one of ``choices``, drawn uniformly (seeded).

    The '<U' width is that of the longest choice, so no choice is ever cut short; non-ASCII text travels as is
    (a '<U' array is UCS-4 on the wire). A test double for language-agent envs: it exercises the text path end to
    end without a language model.
    """

    def __init__(self, choices: tuple[str, ...] | list[str], horizon: int, seed: int | None = None) -> None:
        choices = tuple(choices)
        if not choices:
            raise ValueError('the text policy needs at least one string to answer with: pass e.g. '
                             '--policy.choices "<answer>3</answer>" "hello"')
        bad = [c for c in choices if not isinstance(c, str)]
        if bad:
            raise ValueError(f"text policy choices must be strings, got {bad[:3]!r}")
        width = max(1, *(len(c) for c in choices))  # '<U0' has no item size: an all-empty set still needs '<U1'
        super().__init__((), np.dtype(f"<U{width}"), horizon, 0.0, 0.0)
        self.choices = np.array(choices, dtype=self.dtype)
        self.rng = np.random.default_rng(seed)

    def metadata(self) -> dict[str, Any]:
        """Text actions have no action_dim; the dtype says they are '<U' strings of at most this width."""
        return {"policy": type(self).__name__, "action_horizon": self.horizon, "action_dtype": self.dtype.str}

    def act(self, obs: dict[str, Any], n: int) -> np.ndarray:
        return self.choices[self.rng.integers(len(self.choices), size=(self.horizon, n))]

    def for_stream(self, key: np.random.SeedSequence) -> Policy:
        stream = copy.copy(self)
        stream.rng = np.random.default_rng(key)
        return stream


POLICIES: dict[str, type[Policy]] = {"random": RandomPolicy, "zero": ZeroPolicy, "text": TextPolicy}


def make_policy(config: PolicyConfig, action_shape: tuple[int, ...] | None = None, low: Any = None, high: Any = None) -> Policy:
    """Build the policy named in ``config``; ``action_shape``/``low``/``high`` override the config (embedded use)."""
    if config.name not in POLICIES:
        raise ValueError(f"unknown policy {config.name!r}; choose one of {', '.join(POLICIES)}")
    if config.name == "text":  # action_dim, dtype, low and high describe numbers; a text policy has none of them
        return TextPolicy(config.choices, config.action_horizon, seed=config.seed)
    if config.choices:
        raise ValueError(f"--policy.choices is for the text policy; --policy.name {config.name} ignores it "
                         "(pass --policy.name text to answer with those strings)")
    if config.action_dim < 0:
        raise ValueError(f"--policy.action-dim must be >= 0 (0: scalar actions), got {config.action_dim}")
    try:
        dtype = np.dtype(config.dtype)
    except TypeError:
        raise ValueError(f"--policy.dtype {config.dtype!r} is not a numpy dtype; use e.g. float32, float64 or int64") from None
    if dtype.kind not in "biuf":
        raise ValueError(f"--policy.dtype {config.dtype!r} is not numeric; actions are numbers")
    shape = action_shape if action_shape is not None else ((config.action_dim,) if config.action_dim > 0 else ())
    args = (shape, dtype, config.action_horizon, config.low if low is None else low, config.high if high is None else high)
    if config.name == "random":
        return RandomPolicy(*args, seed=config.seed)
    return POLICIES[config.name](*args)
