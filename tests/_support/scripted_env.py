"""A batched env whose observations say exactly where each env is, for unit tests of the rollout loop.

Row i of every observation holds ``states["env"]`` (the env's id: ``first_id + i``), ``states["episode"]`` (the
episodes it has begun, 1 for the first), ``states["t"]`` (steps into the episode) and ``states["a"]`` (the first
component of the last action applied, 0 after a reset), each of shape ``[n, 1]``; with ``text=True`` also the text
``"env E episode K t T"``. So a test reads off any observation the server got which env, episode and step it is,
and which action came before it. The env also keeps a log of every call (:attr:`calls`, in order; :attr:`resets`,
:attr:`steps`) and, with a timeline, puts its calls on the server's (see ``fake_server.Timeline``).

Episode ``k`` of env ``e`` lasts ``length(e, k)`` steps and ends terminated; its rewards are ``reward(e, t, a)``,
by default ``t`` (1, 2, 3, ... within the episode), so a chunk's summed reward tells which steps it covered.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from plugrl_env_client.envs.base_env import BaseEnv, BaseEnvConfig, Observation


@dataclasses.dataclass(frozen=True, eq=False)
class Reset:
    """One ``reset`` call as the env saw it."""

    seed: Any
    options: dict[str, Any] | None
    mask: np.ndarray  # the envs it reset


@dataclasses.dataclass(frozen=True, eq=False)
class Step:
    """One ``step`` call as the env saw it."""

    actions: np.ndarray
    live: np.ndarray  # rows in an episode (not out of episodes) when the step came
    terminated: np.ndarray


def by_env(lengths: Sequence[int]) -> Callable[[int, int], int]:
    """Episode lengths that depend on the env only: env e's episodes last ``lengths[e % len(lengths)]`` steps."""
    return lambda env, episode: int(lengths[env % len(lengths)])


class ScriptedEnv(BaseEnv[BaseEnvConfig]):
    """See the module docstring. ``episodes_per_env``: after that many episodes (one count for every env, or one
    per env id) a reset gives the env none (``info["no_episode"]``, on every reset); ``instruction(env, episode)``: ``info["env_instruction"]``;
    ``per_env_seeds``: declares ``metadata["per_env_seeds"]`` (seed groups); ``finite``: declares
    ``metadata["finite_episodes"]``."""

    def __init__(self, num_envs: int, length: Callable[[int, int], int] = by_env([3, 5, 4]), first_id: int = 0,
                 reward: Callable[[int, int, float], float] | None = None,
                 episodes_per_env: int | Sequence[int] | None = None,
                 instruction: Callable[[int, int], str] | None = None, per_env_seeds: bool = False,
                 finite: bool = False, text: bool = False, action_shape: tuple[int, ...] = (1,),
                 timeline: list | None = None, name: str = "env") -> None:
        super().__init__(BaseEnvConfig(), num_envs=num_envs)
        self.single_action_space = gym.spaces.Box(-np.inf, np.inf, action_shape, np.float64)
        self.metadata = {**BaseEnv.metadata, "per_env_seeds": per_env_seeds, "finite_episodes": finite}
        self.length, self.reward_of = length, reward
        self.first_id, self.episodes_per_env, self.instruction = first_id, episodes_per_env, instruction
        self.text, self.timeline, self.name = text, timeline, name
        self.ids = first_id + np.arange(num_envs)
        self.episode = np.zeros(num_envs, np.int64)
        self.t = np.zeros(num_envs, np.int64)
        self.last_action = np.zeros(num_envs)
        self.live = np.zeros(num_envs, bool)  # in an episode (a retired env is not)
        self.seeds: list[list[int | None]] = [[] for _ in range(num_envs)]  # per env: the seed of each episode
        self.calls: list[Reset | Step] = []  # every reset and step, in order

    @property
    def resets(self) -> list[Reset]:
        return [c for c in self.calls if isinstance(c, Reset)]

    @property
    def steps(self) -> list[Step]:
        return [c for c in self.calls if isinstance(c, Step)]

    def obs(self) -> Observation:
        col = lambda a: np.asarray(a, np.float64).reshape(-1, 1).copy()  # noqa: E731
        states = {"env": col(self.ids), "episode": col(self.episode), "t": col(self.t), "a": col(self.last_action)}
        text = None
        if self.text:
            text = [f"env {e} episode {k} t {t}" for e, k, t in zip(self.ids, self.episode, self.t)]
        return Observation(states=states, text=text)

    def reset(self, *, seed: Any = None, options: dict[str, Any] | None = None) -> tuple[Observation, dict[str, Any]]:
        mask = self.reset_mask(options)
        self.calls.append(Reset(seed, options, mask.copy()))
        seeds = self.per_env_seeds(seed)
        no_episode = np.zeros(self.num_envs, bool)
        for i in np.flatnonzero(mask):
            if self.episodes_per_env is not None and self.episode[i] >= self._episodes_of(int(self.ids[i])):
                no_episode[i] = True
                self.live[i] = False
                continue
            self.episode[i] += 1
            self.t[i] = 0
            self.last_action[i] = 0.0
            self.live[i] = True
            self.seeds[i].append(seeds[i])
        info: dict[str, Any] = {}
        if self.episodes_per_env is not None:
            info["no_episode"] = no_episode
        if self.instruction is not None:
            info["env_instruction"] = [self.instruction(int(e), int(k)) for e, k in zip(self.ids, self.episode)]
        if self.timeline is not None:
            self.timeline.append(("reset", self.name, self.calls[-1]))
        return self.obs(), info

    def _episodes_of(self, env: int) -> int:
        supply = self.episodes_per_env
        assert supply is not None
        return supply if isinstance(supply, int) else int(supply[env % len(supply)])

    def step(self, actions: np.ndarray) -> tuple[Observation, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        actions = np.asarray(actions, np.float64)
        first = actions.reshape(self.num_envs, -1)[:, 0]
        live = self.live.copy()
        self.t[live] += 1
        self.last_action[live] = first[live]
        rewards = np.zeros(self.num_envs, np.float32)
        terminated = np.zeros(self.num_envs, bool)
        for i in np.flatnonzero(live):
            e, t = int(self.ids[i]), int(self.t[i])
            rewards[i] = t if self.reward_of is None else self.reward_of(e, t, float(first[i]))
            terminated[i] = t >= self.length(e, int(self.episode[i]))
        self.calls.append(Step(actions.copy(), live, terminated.copy()))
        if self.timeline is not None:
            self.timeline.append(("step", self.name, self.calls[-1]))
        return self.obs(), rewards, terminated, np.zeros(self.num_envs, bool), {"t": self.t.copy()}


def col(obs: Observation, key: str) -> np.ndarray:
    """One ``[n, 1]`` state of an observation as a flat array of ints (env, episode, t) or floats (a)."""
    values = obs.states[key][:, 0]
    return values.astype(np.int64) if key != "a" else values
