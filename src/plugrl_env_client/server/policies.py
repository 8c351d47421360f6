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
resync. The server calls a policy from a worker thread of its own (:mod:`~plugrl_env_client.server.worker`), so a
slow policy delays the infers waiting for it but never the connections' pings and other frames.

Every policy, these and a user's, registers by name in :mod:`~plugrl_env_client.server.registry`, with the
config dataclass of its own ``--policy.*`` flags (:class:`TextConfig`, :class:`ArsConfig`); ``random`` and
``text`` register as the defaults of the action spaces they accept (numeric ones, and Text spaces). The package
imports this module once, in ``plugrl_env_client/server/__init__.py``: that is what registers them.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import gymnasium as gym
import numpy as np
import tyro

from plugrl_env_client.errors import ProtocolError
from plugrl_env_client.server.ars import ArsLearner, ArsSettings, Episode, state_layout, state_matrix
from plugrl_env_client.server.policy import InferCall, Policy, PolicySetup
from plugrl_env_client.server.registry import (
    PolicyConfig,
    horizon_of,
    make_policy,
    register_policy,
)

if TYPE_CHECKING:
    from plugrl_env_client.protocol.messages import Feedback


@dataclasses.dataclass
class TextConfig:
    """The text policy's own flags."""

    choices: Annotated[tuple[str, ...], tyro.conf.arg(help_behavior_hint="(required with --policy.name text)")] = ()
    """Strings the text policy picks from (e.g. --policy.choices "<answer>3</answer>" "hello"); text policy only."""


@dataclasses.dataclass
class ArsConfig:
    """The ARS learner's own flags."""

    directions: int = 8
    """ars: directions N drawn per iteration; each is rolled out twice (+ and - noise), one whole episode each."""
    top_directions: int = 4
    """ars: the b directions with the best max(r+, r-) that make the update."""
    step_size: float = 0.02
    """ars: step size alpha of the update."""
    noise: float = 0.03
    """ars: std nu of the exploration noise added to the weights."""
    save: Annotated[Path | None, tyro.conf.arg(help_behavior_hint="(default: not written)")] = None
    """ars: write the policy (npz: weights, state mean and std) here, atomically, at every iteration; the iteration
    log goes next to it as a .jsonl file."""
    load: Annotated[Path | None, tyro.conf.arg(help_behavior_hint="(default: a new policy of zero weights)")] = None
    """ars: start from a policy --policy.save wrote (to go on training, or to evaluate with --policy.eval)."""
    eval: bool = False
    """ars: no noise and no updates: every episode runs the loaded policy (needs --policy.load)."""

    def settings(self, seed: int | None, save: Path | None = None) -> ArsSettings:
        return ArsSettings(directions=self.directions, top_directions=self.top_directions, step_size=self.step_size,
                           noise=self.noise, seed=seed, save=save or self.save, load=self.load, evaluate=self.eval)


LOCAL_ARS_POLICY = "policy/ars.npz"
"""Where ``--local-policy ars`` saves its policy, in the run folder (its iteration log: ``policy/ars.jsonl``)."""
DEFAULT_TEXT_CHOICES = 8
"""How many strings the text policy makes up for a Text action space when it is given none."""
DEFAULT_TEXT_LENGTH = 16
"""Longest made-up string (a Text space's max_length can be huge; a smoke-test answer need not be)."""
@register_policy("random", default=True)
class RandomPolicy(Policy):
    """Uniform in [low, high] (integers for an integer dtype; infinite bounds draw from [-1, 1])."""

    off_loop = False  # numpy on a batch: microseconds

    def __init__(self, setup: PolicySetup, config: Any = None) -> None:
        super().__init__(setup)
        self.seed = setup.seed
        self.rng = np.random.default_rng(setup.seed)
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


@register_policy("zero")
class ZeroPolicy(Policy):
    """All zeros."""

    off_loop = False  # numpy on a batch: microseconds

    def act(self, obs: dict[str, Any], n: int) -> np.ndarray:
        return np.zeros((self.horizon, n, *self.action_shape), dtype=self.dtype)


@register_policy("text", config=TextConfig, default=True)
class TextPolicy(Policy):
    """One of --policy.choices per env and step, for envs whose actions are text (a gymnasium Text space).

    Answers ``[horizon, n]`` '<U' chunks: each env and step gets one of the choices, drawn uniformly (seeded). The
    '<U' width is that of the longest choice, so no choice is ever cut short; non-ASCII text travels as is (a '<U'
    array is UCS-4 on the wire). A test double for language-agent envs: it exercises the text path end to end
    without a language model. Given no choices for a known Text space (``--local-policy text``), it makes up
    :data:`DEFAULT_TEXT_CHOICES` strings from the space's characters (:func:`default_text_choices`).
    """

    off_loop = False  # numpy on a batch: microseconds

    def __init__(self, setup: PolicySetup, config: TextConfig) -> None:
        choices = tuple(config.choices)
        if not choices and isinstance(setup.space, gym.spaces.Text):
            choices = default_text_choices(setup.space, setup.seed)
        if not choices:
            raise ValueError('the text policy needs at least one string to answer with: pass e.g. '
                             '--policy.choices "<answer>3</answer>" "hello"')
        bad = [c for c in choices if not isinstance(c, str)]
        if bad:
            raise ValueError(f"text policy choices must be strings, got {bad[:3]!r}")
        width = max(1, *(len(c) for c in choices))  # '<U0' has no item size: an all-empty set still needs '<U1'
        super().__init__(dataclasses.replace(setup, action_shape=(), dtype=np.dtype(f"<U{width}"), low=0.0, high=0.0))
        self.choices = np.array(choices, dtype=self.dtype)
        self.rng = np.random.default_rng(setup.seed)

    @classmethod
    def refuses(cls, space: gym.Space) -> str | None:
        return None if isinstance(space, gym.spaces.Text) else "answers with strings"

    @classmethod
    def server_flags(cls, space: gym.Space) -> str:
        return '--policy.choices "<an answer>" "<another>"'

    def metadata(self) -> dict[str, Any]:
        """Text actions have no action_dim; the dtype says they are '<U' strings of at most this width."""
        return {"policy": type(self).__name__, "action_horizon": self.horizon, "action_dtype": self.dtype.str}

    def act(self, obs: dict[str, Any], n: int) -> np.ndarray:
        return self.choices[self.rng.integers(len(self.choices), size=(self.horizon, n))]

    def for_stream(self, key: np.random.SeedSequence) -> Policy:
        stream = copy.copy(self)
        stream.rng = np.random.default_rng(key)
        return stream


def default_text_choices(space: gym.spaces.Text, seed: int | None = None) -> tuple[str, ...]:
    """:data:`DEFAULT_TEXT_CHOICES` strings drawn from ``space``'s charset, lengths within its bounds (capped at
    :data:`DEFAULT_TEXT_LENGTH` unless its min_length is longer).

    The charset is sorted first: a frozenset's iteration order changes with Python's hash seed, and the same seed
    must give the same strings in every run.
    """
    charset = sorted(space.character_set)
    low = int(space.min_length)
    high = max(low, min(int(space.max_length), DEFAULT_TEXT_LENGTH))
    rng = np.random.default_rng(seed)
    lengths = rng.integers(low, high + 1, size=DEFAULT_TEXT_CHOICES)
    return tuple("".join(charset[i] for i in rng.integers(len(charset), size=int(k))) for k in lengths)


@register_policy("ars", config=ArsConfig, horizon=1)
class ArsPolicy(Policy):
    """Learns a linear policy on the env's states (Augmented Random Search), actions clipped to [low, high].

    Augmented Random Search behind the protocol: one :class:`~plugrl_env_client.server.ars.ArsLearner` for the
    whole server, fed by every connection (:meth:`for_connection` gives each its own env table).

    Each env of each connection runs one rollout for one whole episode: it gets the rollout at the first infer of
    its episode, and the episode ends with the feedback that says terminated or truncated. The return is the sum of
    the feedback's chunk-summed rewards (float32 on the wire, added in float64): the rewards a learner trains on,
    and at horizon 1 bit for bit the ``return`` the client writes to episodes.jsonl (it sums the same float32
    rewards in float64). ``act`` alone (no env identity) answers with the current policy, without noise.

    With ``--local-policy ars`` it saves its policy into the run folder (:data:`LOCAL_ARS_POLICY`) unless
    --policy.save says where.
    """

    needs_feedback = "learns from the episodes' returns, which only PlugRL's feedback messages report"
    off_loop = False  # numpy on a batch: microseconds

    def __init__(self, setup: PolicySetup, config: ArsConfig) -> None:
        super().__init__(setup)
        if not self.action_shape:
            raise ValueError("--policy.name ars answers vectors of continuous actions: --policy.action-dim must be "
                             ">= 1 (the length of the env's action vector)")
        if self.dtype.kind != "f":
            raise ValueError(f"--policy.name ars answers continuous actions: --policy.dtype must be a float dtype "
                             f"(float32, float64), got {self.dtype.name}")
        save = setup.run_dir / LOCAL_ARS_POLICY if setup.run_dir is not None and config.save is None else None
        self.learner = ArsLearner(self.action_shape, self.low, self.high, config.settings(setup.seed, save),
                                  self.horizon)
        self._numbers = itertools.count(1)  # next() is atomic: connection threads may start at once

    @classmethod
    def refuses(cls, space: gym.Space) -> str | None:
        if isinstance(space, gym.spaces.Box) and np.dtype(space.dtype).kind == "f":
            return None
        return ("learns a linear map from the env's state arrays to continuous actions, so it needs a gymnasium "
                "Box action space of floats")

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

    off_loop = False  # numpy on a batch: microseconds

    def __init__(self, policy: ArsPolicy, number: int) -> None:
        super().__init__(policy.setup)
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


__all__ = ["ArsConfig", "ArsPolicy", "InferCall", "Policy", "PolicyConfig", "PolicySetup", "RandomPolicy",
           "TextConfig", "TextPolicy", "ZeroPolicy", "default_text_choices", "horizon_of", "make_policy",
           "register_policy"]
