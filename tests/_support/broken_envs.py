"""Test-only envs for the env checklist: one that keeps every rule, and one per rule that breaks exactly that rule;
and :func:`assert_caught`, the assertion the checklist's tests make on a report.

:class:`GoodEnv` is small but has what the rules look at: random starts drawn from ``self.np_random``, a step
counter ``states["t"]``, episodes that end (env i terminates after ``3 + i % 2`` steps), and a per-env info array.
Each broken env changes one thing of it. None is registered at import: tests register the ones they need with
:func:`register` inside the ``registry`` fixture (which restores the registry afterwards).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

from plugrl_env_client.check import CheckReport, CheckResult
from plugrl_env_client.envs.base_env import BaseEnv, BaseEnvConfig, Observation
from plugrl_env_client.envs.registry import register_env, register_env_config

ALL = set(range(1, 15))
NEEDS_STEPS = set(range(5, 13))  # rules that need a working step (rule 5 itself needs rules 2 and 3)


@dataclasses.dataclass
class GoodConfig(BaseEnvConfig):
    step_size: float = 0.1


class GoodEnv(BaseEnv[GoodConfig]):
    def __init__(self, config: GoodConfig | None = None, num_envs: int = 2, **kwargs: Any) -> None:
        super().__init__(config or GoodConfig(), num_envs=num_envs, **kwargs)
        self.single_action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.pos = np.zeros((num_envs, 2))
        self.t = np.zeros((num_envs, 1))
        self.length = 3 + np.arange(num_envs) % 2

    def observe(self) -> Observation:
        return Observation(states={"pos": self.pos.copy(), "t": self.t.copy()}, text="go")

    def start(self, mask: np.ndarray) -> None:
        """Draw a fresh start for the rows of ``mask``."""
        self.pos[mask] = self.np_random.uniform(-1.0, 1.0, (int(mask.sum()), 2))
        self.t[mask] = 0.0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        self.seed_rngs(seed)
        self.start(self.reset_mask(options))
        return self.observe(), {}

    def move(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Advance every row; returns (rewards float32, terminated)."""
        self.pos += self.config.step_size * np.asarray(actions, np.float64).reshape(self.num_envs, 2)
        self.t += 1.0
        distance = np.linalg.norm(self.pos, axis=1)
        return (-distance).astype(np.float32), self.t[:, 0] >= self.length

    def step(self, actions: np.ndarray) -> Any:
        rewards, terminated = self.move(actions)
        return self.observe(), rewards, terminated, np.zeros(self.num_envs, bool), self.info()

    def info(self) -> dict[str, Any]:
        return {"distance": np.linalg.norm(self.pos, axis=1)}


# ------------------------------------------------------------------------------------------------ 1. constructs


@dataclasses.dataclass
class SizedConfig(BaseEnvConfig):
    size: int = 0
    """Must be set: the default (0) cannot be built."""


class NeedsSizeEnv(GoodEnv):
    def __init__(self, config: SizedConfig, num_envs: int = 2, **kwargs: Any) -> None:
        if config.size < 1:
            raise ValueError(f"size must be >= 1, got {config.size}")
        super().__init__(GoodConfig(), num_envs=num_envs, **kwargs)


# ------------------------------------------------------------------------------------------------ 2. action space


class NoActionSpaceEnv(GoodEnv):
    def __init__(self, config: GoodConfig | None = None, num_envs: int = 2, **kwargs: Any) -> None:
        super().__init__(config, num_envs, **kwargs)
        self.__dict__.pop("_single_action_space")


class WrongActionSpaceEnv(GoodEnv):
    """Declares 3 action dims; step takes 2."""

    def __init__(self, config: GoodConfig | None = None, num_envs: int = 2, **kwargs: Any) -> None:
        super().__init__(config, num_envs, **kwargs)
        self.single_action_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)


class DictActionSpaceEnv(GoodEnv):
    """An action of two parts, as a Dict space: not one array per env."""

    def __init__(self, config: GoodConfig | None = None, num_envs: int = 2, **kwargs: Any) -> None:
        super().__init__(config, num_envs, **kwargs)
        self.single_action_space = gym.spaces.Dict({"move": gym.spaces.Box(-1.0, 1.0, (2,), np.float32),
                                                    "grip": gym.spaces.Discrete(2)})


# ------------------------------------------------------------------------------------------------ 3. reset returns


class BareResetEnv(GoodEnv):
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        return super().reset(seed=seed, options=options)[0]


class CrashingResetEnv(GoodEnv):
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        raise RuntimeError("simulator failed to load its scene")


# ------------------------------------------------------------------------------------------------ 4. seeding


class UnseededEnv(GoodEnv):
    """Draws starts from a fresh, unseeded generator."""

    def start(self, mask: np.ndarray) -> None:
        self.pos[mask] = np.random.default_rng().uniform(-1.0, 1.0, (int(mask.sum()), 2))
        self.t[mask] = 0.0


class SeedIgnoredEnv(GoodEnv):
    """Reseeds a generator of its own with a constant on every reset, whatever the seed."""

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        mask = self.reset_mask(options)
        self.pos[mask] = np.random.default_rng(1234).uniform(-1.0, 1.0, (int(mask.sum()), 2))
        self.t[mask] = 0.0
        return self.observe(), {}


class ForgetfulResetEnv(GoodEnv):
    """Its reset forgets the step counter: a seeded reset after some steps differs from the first one."""

    def start(self, mask: np.ndarray) -> None:
        self.pos[mask] = self.np_random.uniform(-1.0, 1.0, (int(mask.sum()), 2))


class SameStartEnv(GoodEnv):
    """Draws one start and gives it to every env of the batch."""

    def start(self, mask: np.ndarray) -> None:
        self.pos[mask] = self.np_random.uniform(-1.0, 1.0, 2)
        self.t[mask] = 0.0


# ------------------------------------------------------------------------------------------------ 5. step returns


class OldGymEnv(GoodEnv):
    def step(self, actions: np.ndarray) -> Any:
        obs, rewards, terminated, truncated, info = super().step(actions)
        return obs, rewards, terminated | truncated, info


class Float64RewardEnv(GoodEnv):
    def step(self, actions: np.ndarray) -> Any:
        obs, rewards, terminated, truncated, info = super().step(actions)
        return obs, rewards.astype(np.float64), terminated, truncated, info


class IntRewardEnv(GoodEnv):
    """Integer rewards (a count): the client casts them to float32, as it does float64 ones."""

    def step(self, actions: np.ndarray) -> Any:
        obs, rewards, terminated, truncated, info = super().step(actions)
        return obs, np.rint(rewards).astype(np.int64), terminated, truncated, info


class IntFlagsEnv(GoodEnv):
    def step(self, actions: np.ndarray) -> Any:
        obs, rewards, terminated, truncated, info = super().step(actions)
        return obs, rewards, terminated.astype(np.int64), truncated, info


class IntFlagsAtEpisodeEndEnv(GoodEnv):
    """Bool flags, except on the steps that end an episode, where ``terminated`` comes as 0/1 integers: a step of
    rules 2, 4 and 5 (one step from a reset) looks right, the shared run's third step does not."""

    def step(self, actions: np.ndarray) -> Any:
        obs, rewards, terminated, truncated, info = super().step(actions)
        return obs, rewards, terminated.astype(np.int64) if terminated.any() else terminated, truncated, info


# ------------------------------------------------------------------------------------------------ 6. finite


class NanRewardEnv(GoodEnv):
    """Env 1's reward is NaN on the second step of its episodes."""

    def step(self, actions: np.ndarray) -> Any:
        obs, rewards, terminated, truncated, info = super().step(actions)
        rewards[(self.t[:, 0] == 2) & (np.arange(self.num_envs) == 1)] = np.nan
        return obs, rewards, terminated, truncated, info


class HugeRewardEnv(GoodEnv):
    """Env 0's reward is 1e39 (finite float64, beyond float32's range) on the second step of its episodes."""

    def step(self, actions: np.ndarray) -> Any:
        obs, rewards, terminated, truncated, info = super().step(actions)
        rewards = rewards.astype(np.float64)
        rewards[(self.t[:, 0] == 2) & (np.arange(self.num_envs) == 0)] = 1e39
        return obs, rewards, terminated, truncated, info


class NanStateEnv(GoodEnv):
    """Env 0's position is NaN on the second step of its episodes."""

    def observe(self) -> Observation:
        obs = super().observe()
        obs.states["pos"][(self.t[:, 0] == 2) & (np.arange(self.num_envs) == 0)] = np.inf
        return obs


# ------------------------------------------------------------------------------------------------ 7. layout


class FloatImageEnv(GoodEnv):
    def observe(self) -> Observation:
        obs = super().observe()
        return Observation(images={"cam": np.full((self.num_envs, 4, 4, 3), 0.5, np.float32)}, states=obs.states,
                           text=obs.text)


class ChannelsFirstEnv(GoodEnv):
    def observe(self) -> Observation:
        obs = super().observe()
        return Observation(images={"cam": np.zeros((self.num_envs, 3, 8, 8), np.uint8)}, states=obs.states,
                           text=obs.text)


# ------------------------------------------------------------------------------------------------ 8. partial reset


class ResetAllEnv(GoodEnv):
    """Ignores reset_mask / reset_indices: every reset resets every row."""

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        return super().reset(seed=seed, options=None)


class ResetFirstRowsEnv(GoodEnv):
    """Resets as many rows as were asked for, but always the first ones."""

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        self.seed_rngs(seed)
        k = int(self.reset_mask(options).sum())
        mask = np.zeros(self.num_envs, bool)
        mask[:k] = True
        self.start(mask)
        return self.observe(), {}


class ResetRowsOnlyEnv(GoodEnv):
    """A partial reset returns the rows it reset, not the whole batch."""

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        obs, info = super().reset(seed=seed, options=options)
        return obs.select(self.reset_mask(options)), info


# ------------------------------------------------------------------------------------------------ 9. no reset in step


class StepCallsResetEnv(GoodEnv):
    """Calls its own reset for the rows that finished (gymnasium's same-step autoreset, by hand)."""

    def step(self, actions: np.ndarray) -> Any:
        rewards, terminated = self.move(actions)
        if terminated.any():
            obs, _ = self.reset(options={"reset_mask": terminated})
        else:
            obs = self.observe()
        return obs, rewards, terminated, np.zeros(self.num_envs, bool), self.info()


class StepRestartsRowsEnv(GoodEnv):
    """Restarts finished rows with a helper of its own, without calling reset()."""

    def step(self, actions: np.ndarray) -> Any:
        rewards, terminated = self.move(actions)
        self.start(terminated)
        return self.observe(), rewards, terminated, np.zeros(self.num_envs, bool), self.info()


class CountdownRestartEnv(StepRestartsRowsEnv):
    """Shows the steps left instead of a step counter; restarts finished rows inside step."""

    def observe(self) -> Observation:
        return Observation(states={"pos": self.pos.copy(), "left": self.length[:, None] - self.t}, text="go")


class FixedStartRestartEnv(GoodEnv):
    """Starts every episode at the origin and shows no step counter; restarts finished rows inside step."""

    def observe(self) -> Observation:
        return Observation(states={"pos": self.pos.copy()}, text="go")

    def start(self, mask: np.ndarray) -> None:
        self.pos[mask] = 0.0
        self.t[mask] = 0.0

    def step(self, actions: np.ndarray) -> Any:
        rewards, terminated = self.move(actions)
        self.start(terminated)
        return self.observe(), rewards, terminated, np.zeros(self.num_envs, bool), self.info()


class AutoresetMetadataEnv(GoodEnv):
    metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP}


# ------------------------------------------------------------------------------------------------ 10. time limit


class OwnLimitEnv(GoodEnv):
    """Never terminates; truncates every episode itself after ``limit`` steps."""

    limit = 25

    def step(self, actions: np.ndarray) -> Any:
        rewards, _ = self.move(actions)
        truncated = self.t[:, 0] >= self.limit
        return self.observe(), rewards, np.zeros(self.num_envs, bool), truncated, self.info()


class ShortLimitEnv(OwnLimitEnv):
    limit = 5


class NeverEndsEnv(GoodEnv):
    def step(self, actions: np.ndarray) -> Any:
        rewards, _ = self.move(actions)
        return self.observe(), rewards, np.zeros(self.num_envs, bool), np.zeros(self.num_envs, bool), self.info()


class TimeoutAsTerminationEnv(GoodEnv):
    """Ends every episode after 10 steps, reporting the time-out as a termination."""

    def step(self, actions: np.ndarray) -> Any:
        rewards, _ = self.move(actions)
        terminated = self.t[:, 0] >= 10
        return self.observe(), rewards, terminated, np.zeros(self.num_envs, bool), self.info()


# ------------------------------------------------------------------------------------------------ 11. info


class ScalarInfoEnv(GoodEnv):
    def info(self) -> dict[str, Any]:
        distance = np.linalg.norm(self.pos, axis=1)
        return {"distance": distance, "mean_distance": float(distance.mean()), "success": bool(distance.min() < 0.1)}


# ------------------------------------------------------------------------------------------------ 12. metric keys


class UnstableMetricsEnv(GoodEnv):
    """Reports ``metrics["near"]`` only on some steps."""

    def info(self) -> dict[str, Any]:
        distance = np.linalg.norm(self.pos, axis=1)
        metrics = {"distance": distance}
        if self.t[0, 0] == 2:
            metrics["near"] = distance < 0.5
        return {"metrics": metrics, "metrics_agg_mode": {"distance": "mean", "near": "last"}}


class MetricsEnv(GoodEnv):
    """Reports the same metrics on every step (passes rule 12)."""

    def info(self) -> dict[str, Any]:
        distance = np.linalg.norm(self.pos, axis=1)
        return {"metrics": {"distance": distance, "near": distance < 0.5},
                "metrics_agg_mode": {"distance": "mean", "near": "last"}}


# ------------------------------------------------------------------------------------------------ 13. close


class CloseTwiceFailsEnv(GoodEnv):
    def __init__(self, config: GoodConfig | None = None, num_envs: int = 2, **kwargs: Any) -> None:
        super().__init__(config, num_envs, **kwargs)
        self.handle: object | None = object()

    def close(self, **kwargs: Any) -> None:
        if self.handle is None:
            raise RuntimeError("simulator handle already released")
        self.handle = None


# ------------------------------------------------------------------------------------------------ 14. rollout


class LeakyEnv(GoodEnv):
    """Holds a process-wide simulator slot that close() forgets to release, so a second instance cannot start."""

    slot_taken = False

    def __init__(self, config: GoodConfig | None = None, num_envs: int = 2, **kwargs: Any) -> None:
        if LeakyEnv.slot_taken:
            raise RuntimeError("the simulator is already running in this process")
        LeakyEnv.slot_taken = True
        super().__init__(config, num_envs, **kwargs)


# ------------------------------------------------------------------------------------------------ crashes


class CrashingStepEnv(GoodEnv):
    """Raises on the 6th step() call of its life (the 3rd step of the checker's shared run), and only then."""

    def __init__(self, config: GoodConfig | None = None, num_envs: int = 2, **kwargs: Any) -> None:
        super().__init__(config, num_envs, **kwargs)
        self.calls = 0

    def step(self, actions: np.ndarray) -> Any:
        self.calls += 1
        if self.calls == 6:
            raise FloatingPointError("solver diverged")
        return super().step(actions)


def register(uid: str, cls: type[BaseEnv], config_cls: type[BaseEnvConfig] = GoodConfig, **kwargs: Any) -> str:
    """Register ``cls`` (and its config) under ``uid``; use inside the ``registry`` fixture."""
    register_env_config(uid, override=True)(config_cls)
    register_env(uid, override=True, **kwargs)(cls)
    return uid


# ------------------------------------------------------------------------------------------------ asserting on reports


def assert_caught(report: CheckReport, rule: int, status: str, *words: str,
                  skipped: set[int] | frozenset[int] = frozenset({14})) -> CheckResult:
    """Rule ``rule`` has ``status`` and says each of ``words``; the others pass, except ``skipped``, which skip."""
    result = report.result(rule)
    assert result.status == status, report.render(details=True)
    for word in words:
        assert word in f"{result.seen} | {result.fix}", f"{word!r} not in rule {rule}:\n{report.render()}"
    others = {r.number: r.status for r in report.results if r.number != rule}
    expected = {n: "skip" if n in skipped else "pass" for n in others}
    assert others == expected, report.render(details=True)
    return result


def statuses(report: CheckReport) -> dict[int, str]:
    return {r.number: r.status for r in report.results}
