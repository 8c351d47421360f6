"""Policies of the reference server. They see the decoded observation and answer a time-major action chunk.

Numeric policies (``random``, ``zero``) answer ``[horizon, n, *action_shape]`` arrays of a numeric dtype; the
``text`` policy answers ``[horizon, n]`` '<U' arrays for language-agent envs (a ``gymnasium.spaces.Text`` action
space), picking one of a fixed set of strings per env and step. ``ars`` learns: Augmented Random Search (see
:mod:`~plugrl_env_client.server.ars`), fed by the feedback of every connection.

A policy sees one connection through :meth:`Policy.for_connection`: the server asks it once per connection, then
calls :meth:`Policy.infer` for each infer and :meth:`Policy.feedback` for each feedback of that connection, and
:meth:`Policy.disconnect` when it closes. Stateless policies answer from ``act`` and ignore the rest; a learner
keeps per-env state there (env indices are private to a connection). A value the client sent that a policy cannot
use (ARS: a NaN state) is a :class:`~plugrl_env_client.errors.ProtocolError`, which the server answers with a
resync. The server calls a policy on its event loop: a policy must answer promptly (the reference ones take
microseconds), or every connection waits.
"""

from __future__ import annotations

import abc
import copy
import dataclasses
import itertools
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import numpy as np
import tyro

from plugrl_env_client.errors import ProtocolError
from plugrl_env_client.server.ars import ArsLearner, ArsSettings, Episode, state_layout, state_matrix

if TYPE_CHECKING:
    from plugrl_env_client.protocol.messages import Feedback


@dataclasses.dataclass
class PolicyConfig:
    """What the reference server answers infers with."""

    name: Literal["random", "zero", "text", "ars"] = "random"
    """random: uniform in [low, high]; zero: all zeros; text: one of --policy.choices per env and step; ars: learns a
    linear policy on the env's states (Augmented Random Search), actions clipped to [low, high]."""
    action_dim: int = 7
    """Length of each action vector; 0 means scalar actions (discrete policies), sent as [horizon, n]."""
    action_horizon: Annotated[int | None, tyro.conf.arg(help_behavior_hint="(default: 4; ars: 1)")] = None
    """Steps per action chunk (with ars, a longer chunk repeats the action for its first observation)."""
    dtype: str = "float32"
    """numpy dtype of the actions (float32, float64, int64, ...); an integer dtype draws integers in [low, high]."""
    low: float = -1.0
    """Smallest action value: random and integer actions are drawn from [low, high], ars clips to it."""
    high: float = 1.0
    """Largest action value (see --policy.low)."""
    seed: Annotated[int | None, tyro.conf.arg(help_behavior_hint="(default: fresh entropy)")] = None
    """Seed of the random and text policies' generator, and of ARS's directions."""
    choices: Annotated[tuple[str, ...], tyro.conf.arg(help_behavior_hint="(required with --policy.name text)")] = ()
    """Strings the text policy picks from (e.g. --policy.choices "<answer>3</answer>" "hello"); text policy only."""
    latency_ms: float = 0.0
    """Milliseconds the server waits before answering each infer, simulating inference time (the wait blocks only
    that client's connection)."""
    directions: int = 8
    """ars: directions N drawn per iteration; each is rolled out twice (+ and - noise), one whole episode each."""
    top_directions: int = 4
    """ars: the b directions with the best max(r+, r-) that make the update."""
    step_size: float = 0.02
    """ars: step size alpha of the update."""
    noise: float = 0.03
    """ars: std nu of the exploration noise added to the weights."""
    save: Path | None = None
    """ars: write the policy (npz: weights, state mean and std) here, atomically, at every iteration; the iteration
    log goes next to it as a .jsonl file."""
    load: Path | None = None
    """ars: start from a policy --policy.save wrote (to go on training, or to evaluate with --policy.eval)."""
    eval: bool = False
    """ars: no noise and no updates: every episode runs the loaded policy (needs --policy.load)."""

    def ars_settings(self, save: Path | None = None) -> ArsSettings:
        return ArsSettings(directions=self.directions, top_directions=self.top_directions, step_size=self.step_size,
                           noise=self.noise, seed=self.seed, save=save or self.save, load=self.load,
                           evaluate=self.eval)


DEFAULT_HORIZONS = {"ars": 1}
"""The action horizon of a policy whose --policy.action-horizon is not given (others: DEFAULT_HORIZON)."""
DEFAULT_HORIZON = 4
ARS_FLAGS = {"directions": 8, "top_directions": 4, "step_size": 0.02, "noise": 0.03, "save": None, "load": None,
             "eval": False}
"""The fields only --policy.name ars reads, with their defaults (any other value is refused for other policies)."""


def horizon_of(config: PolicyConfig) -> int:
    """The action horizon ``config`` asks for: --policy.action-horizon, else the policy's default."""
    if config.action_horizon is not None:
        return config.action_horizon
    return DEFAULT_HORIZONS.get(config.name, DEFAULT_HORIZON)


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

    def for_connection(self) -> Policy:
        """What serves one connection (asked once per connection): the policy itself, or, for a policy that keeps
        per-env state, an object holding that connection's envs."""
        return self

    @abc.abstractmethod
    def act(self, obs: dict[str, Any], n: int) -> np.ndarray:
        """Action chunk for ``n`` envs."""

    def infer(self, obs: dict[str, Any], env_indices: np.ndarray, step_ids: np.ndarray) -> np.ndarray:
        """Action chunk for the envs ``env_indices`` of this connection (``step_ids``: chunks each has finished
        since its reset). Default: :meth:`act`, for policies that do not care which env is which."""
        return self.act(obs, len(env_indices))

    def feedback(self, feedback: Feedback[dict[str, Any]]) -> None:
        """A feedback of this connection (default: ignored)."""
        return None

    def disconnect(self) -> None:
        """The connection closed (default: nothing to let go of)."""
        return None

    def close(self) -> None:
        """The server shut down (default: nothing to close)."""
        return None


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


class ArsPolicy(Policy):
    """Augmented Random Search behind the protocol: one :class:`~plugrl_env_client.server.ars.ArsLearner` for the
    whole server, fed by every connection (:meth:`for_connection` gives each its own env table).

    Each env of each connection runs one rollout for one whole episode: it gets the rollout at the first infer of
    its episode, and the episode ends with the feedback that says terminated or truncated. The return is the sum of
    the feedback's chunk-summed rewards (float32 on the wire, added in float64): the rewards a learner trains on,
    and at horizon 1 bit for bit the ``return`` the client writes to episodes.jsonl (it sums the same float32
    rewards in float64). ``act`` alone (no env identity) answers with the current policy, without noise.
    """

    def __init__(self, action_shape: tuple[int, ...], dtype: np.dtype, horizon: int, low: Any, high: Any,
                 settings: ArsSettings) -> None:
        super().__init__(action_shape, dtype, horizon, low, high)
        if self.dtype.kind != "f":
            raise ValueError(f"--policy.name ars answers continuous actions: --policy.dtype must be a float dtype "
                             f"(float32, float64), got {self.dtype.name}")
        self.learner = ArsLearner(self.action_shape, self.low, self.high, settings, self.horizon)
        self._numbers = itertools.count(1)  # next() is atomic: connection threads may start at once

    def metadata(self) -> dict[str, Any]:
        return {**super().metadata(), "algorithm": "ARS V2-t"}

    def for_connection(self) -> Policy:
        return _ArsConnection(self, next(self._numbers))

    def act(self, obs: dict[str, Any], n: int) -> np.ndarray:
        rollout = self.learner.start_episode(whole=False)
        return self.chunk(self.learner.actions([rollout] * n, self.states(obs, n)))

    def states(self, obs: dict[str, Any], n: int) -> np.ndarray:
        """The ``[n, state size]`` matrix of an observation's states (binding the learner's layout to the first);
        a NaN or infinite state is a :class:`ProtocolError` (the client's value: it would poison the state
        statistics every client shares)."""
        states = obs["states"]
        layout = state_layout(states)
        self.learner.bind(layout)
        x = state_matrix(states, layout, n)
        if not np.isfinite(x).all():
            bad = sorted({key for key, _ in layout if not np.isfinite(np.asarray(states[key], np.float64)).all()})
            raise ProtocolError(f"infer data['states'] {bad} hold NaN or infinite values; ARS acts on finite states "
                                "only")
        return x

    def chunk(self, actions: np.ndarray) -> np.ndarray:
        """``[horizon, n, *shape]`` in the policy's dtype: the same action at every step of the chunk."""
        out = actions.astype(self.dtype)
        return np.ascontiguousarray(np.broadcast_to(out, (self.horizon, *out.shape)))

    def close(self) -> None:
        self.learner.close()


class _ArsConnection(Policy):
    """One connection's envs: which episode each runs (env indices are private to a connection)."""

    def __init__(self, policy: ArsPolicy, number: int) -> None:
        super().__init__(policy.action_shape, policy.dtype, policy.horizon, policy.low, policy.high)
        self.policy, self.learner, self.number = policy, policy.learner, number
        self.episodes: dict[int, Episode] = {}
        self.seen: set[int] = set()

    def metadata(self) -> dict[str, Any]:
        return self.policy.metadata()

    def act(self, obs: dict[str, Any], n: int) -> np.ndarray:
        return self.policy.act(obs, n)

    def infer(self, obs: dict[str, Any], env_indices: np.ndarray, step_ids: np.ndarray) -> np.ndarray:
        x = self.policy.states(obs, len(env_indices))
        rollouts = []
        for j, (env, step) in enumerate(zip(env_indices.tolist(), step_ids.tolist())):
            episode = self.episodes.get(env)
            if episode is None:
                # An env new to this connection with chunks behind it joined mid-episode (a reconnect): its return
                # would not be the episode's, so it just runs the current policy until its next episode.
                whole = step == 0 or env in self.seen
                episode = self.episodes[env] = Episode(self.learner.start_episode(whole))
                self.seen.add(env)
            episode.observe(x[j])
            rollouts.append(episode.rollout)
        return self.policy.chunk(self.learner.actions(rollouts, x))

    def feedback(self, feedback: Feedback[dict[str, Any]]) -> None:
        done = (feedback.terminated | feedback.truncated).tolist()
        lengths = _episode_lengths(feedback.info.get("episode"), len(done))
        rewards = feedback.rewards.tolist()  # float32 to Python floats: exact
        finished = []
        for i, env in enumerate(feedback.env_indices.tolist()):
            episode = self.episodes.get(env)
            if episode is None:  # an env that got no chunk here (PlugRL SPEC 7.6): the server ignores its rows
                continue
            episode.add(rewards[i])
            if done[i]:
                del self.episodes[env]
                length = lengths[i] if lengths is not None else episode.chunks * self.horizon
                finished.append((episode, length))
        if finished:
            self.learner.finish(finished, self.number)

    def disconnect(self) -> None:
        self.learner.abandon(self.episodes.values())
        self.episodes.clear()


def _episode_lengths(episode: Any, m: int) -> list[int] | None:
    """``info["episode"]["l"]`` per row, when the feedback carries it (the episode's length in env steps)."""
    if not isinstance(episode, dict):
        return None
    lengths = episode.get("l")
    if not isinstance(lengths, np.ndarray) or lengths.shape != (m,) or lengths.dtype.kind not in "iu":
        return None
    return [int(v) for v in lengths.tolist()]


POLICIES: dict[str, type[Policy]] = {"random": RandomPolicy, "zero": ZeroPolicy, "text": TextPolicy, "ars": ArsPolicy}


def make_policy(config: PolicyConfig, action_shape: tuple[int, ...] | None = None, low: Any = None, high: Any = None,
                save: Path | None = None) -> Policy:
    """Build the policy named in ``config``; ``action_shape``/``low``/``high`` override the config (embedded use),
    and so does ``save`` (where ARS saves its policy)."""
    if config.name not in POLICIES:
        raise ValueError(f"unknown policy {config.name!r}; choose one of {', '.join(POLICIES)}")
    horizon = horizon_of(config)
    if config.name != "ars":
        given = [f"--policy.{k.replace('_', '-')}" for k, default in ARS_FLAGS.items() if getattr(config, k) != default]
        if given:
            raise ValueError(f"{', '.join(given)} {'is' if len(given) == 1 else 'are'} for the ARS learner; "
                             f"--policy.name {config.name} ignores {'it' if len(given) == 1 else 'them'} (pass "
                             "--policy.name ars to learn)")
    if config.name == "text":  # action_dim, dtype, low and high describe numbers; a text policy has none of them
        return TextPolicy(config.choices, horizon, seed=config.seed)
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
    args = (shape, dtype, horizon, config.low if low is None else low, config.high if high is None else high)
    if config.name == "random":
        return RandomPolicy(*args, seed=config.seed)
    if config.name == "ars":
        if not shape:
            raise ValueError("--policy.name ars answers vectors of continuous actions: --policy.action-dim must be "
                             ">= 1 (the length of the env's action vector)")
        return ArsPolicy(*args, settings=config.ars_settings(save))
    return POLICIES[config.name](*args)
