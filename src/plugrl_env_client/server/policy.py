"""What a policy of the reference server is: the :class:`Policy` base class, the :class:`PolicySetup` it is built
from (the actions to answer) and the :class:`InferCall` a batching policy gets.

The built-in policies (:mod:`~plugrl_env_client.server.policies`) and a user's subclass :class:`Policy` and register
by name in :mod:`~plugrl_env_client.server.registry`; both import this module, which imports neither.
"""

from __future__ import annotations

import abc
import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import gymnasium as gym
import numpy as np

if TYPE_CHECKING:
    from plugrl_env_client.protocol.messages import Feedback


@dataclasses.dataclass(frozen=True)
class PolicySetup:
    """What a policy answers: ``[horizon, n, *action_shape]`` arrays of ``dtype`` within ``[low, high]``.

    ``space`` is the env's single action space when the server knows it (``--local-policy``), else None;
    ``run_dir`` is the client's run folder with ``--local-policy`` (a place for what a policy writes), else None.
    ``seed`` is ``--policy.seed`` (or ``--runner.seed`` with ``--local-policy``), None for fresh entropy.
    """

    action_shape: tuple[int, ...]
    dtype: np.dtype
    horizon: int
    low: Any
    high: Any
    seed: int | None = None
    space: gym.Space | None = None
    run_dir: Path | None = None


NUMERIC_SPACES = (gym.spaces.Box, gym.spaces.Discrete, gym.spaces.MultiDiscrete)


@dataclasses.dataclass(frozen=True)
class InferCall:
    """One connection's infer, as a policy that answers several connections at once sees it
    (:meth:`Policy.infer_batch`): ``policy`` is what :meth:`Policy.for_connection` gave that connection."""

    policy: Policy
    obs: dict[str, Any]
    env_indices: np.ndarray
    step_ids: np.ndarray


class Policy(abc.ABC):
    """Maps a batch of observations to an action chunk of shape ``[horizon, n, *action_shape]``.

    A policy is built from a :class:`~plugrl_env_client.server.registry.PolicySetup` (the actions to answer) and
    the config it was registered with (its own options; None for a policy without). The server makes every call
    that serves a client (``for_stream``, ``for_connection``, ``infer``, ``infer_batch``, ``feedback``,
    ``disconnect``) one at a time, so a policy needs no lock; unless it says it is fast (:attr:`off_loop` False),
    from one worker thread of its own, so that a slow one (a model's forward pass) holds up no connection's pings or
    frames, only the infers waiting for it; ``metadata`` is read on the event loop and ``close`` once the worker has
    stopped.
    """

    off_loop: ClassVar[bool] = True
    """Whether the server runs this policy's calls in its worker thread (the default: a call may take long). A
    policy whose every call takes microseconds sets it False and is called on the event loop, saving the two thread
    hops of each call (the built-in policies do)."""

    needs_feedback: ClassVar[str | None] = None
    """Why this policy cannot serve without PlugRL's feedback messages (None: it can), e.g. a learner that needs the
    episodes' returns: the reference server refuses to serve it over openpi's protocol, which has none."""

    batches: ClassVar[bool] = False
    """True: the server answers the infers of every connection waiting at one moment with one
    :meth:`infer_batch` call (a model that runs one forward pass for several clients)."""

    def __init__(self, setup: PolicySetup, config: Any = None) -> None:
        if setup.horizon < 1:
            raise ValueError(f"the action horizon (--policy.action-horizon) must be >= 1, got {setup.horizon}")
        self.setup = setup
        self.action_shape = tuple(setup.action_shape)
        self.dtype = np.dtype(setup.dtype)
        self.horizon = int(setup.horizon)
        self.low = np.broadcast_to(np.asarray(setup.low, dtype=np.float64), self.action_shape)
        self.high = np.broadcast_to(np.asarray(setup.high, dtype=np.float64), self.action_shape)

    @classmethod
    def refuses(cls, space: gym.Space) -> str | None:
        """Why this policy cannot answer actions of the env's action ``space`` (None: it can). Default: the
        numeric spaces (Box, Discrete, MultiDiscrete) only."""
        if isinstance(space, NUMERIC_SPACES):
            return None
        if isinstance(space, gym.spaces.Text):
            return "cannot produce text actions"
        return "cannot produce actions for this space"

    @classmethod
    def server_flags(cls, space: gym.Space) -> str:
        """The ``--policy.*`` flags (beside ``--policy.name``) with which ``plugrl-run-policy-server`` answers the
        env action ``space`` with this policy: what the client's hint says when no server answers. Default: the
        shared flags of a numeric space's actions (a Discrete space's bounds, a vector Box's length and dtype)."""
        if isinstance(space, gym.spaces.Discrete):
            return f"--policy.action-dim 0 --policy.dtype int64 --policy.low {space.start} " \
                   f"--policy.high {space.start + space.n - 1}"
        if isinstance(space, gym.spaces.Box) and len(space.shape) == 1:
            return f"--policy.action-dim {space.shape[0]} --policy.dtype {np.dtype(space.dtype).name}"
        return ""

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

    def infer_batch(self, calls: list[InferCall]) -> list[np.ndarray]:
        """One action chunk per call, in order: the infers of several connections at once (used when
        :attr:`batches` is True; the server calls it on the policy it serves, not on a connection's object).
        Default: each call's own :meth:`infer`. A :class:`~plugrl_env_client.errors.ProtocolError` raised here
        resyncs every connection of the batch."""
        return [call.policy.infer(call.obs, call.env_indices, call.step_ids) for call in calls]

    def feedback(self, feedback: Feedback[dict[str, Any]]) -> None:
        """A feedback of this connection (default: ignored)."""
        return None

    def disconnect(self) -> None:
        """The connection closed (default: nothing to let go of)."""
        return None

    def close(self) -> None:
        """The server shut down (default: nothing to close)."""
        return None
