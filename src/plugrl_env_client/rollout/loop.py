"""The rollout loop of one process: ask for chunks, step the envs, send feedback, reset finished envs.

Each iteration is four named steps, with the observation handed from one to the next::

    request_actions(obs) -> step_envs() -> send_feedback(step) -> finish_episodes(step) -> obs

Invariants the server relies on: one infer outstanding at most, strictly ``infer action feedback`` per connection,
feedback only for chunks that arrived on the current connection, rewards summed over a chunk, and the terminal
observation (not the reset one) in the feedback of a finished episode: ``send_feedback`` runs before
``finish_episodes`` resets anything.

A closed connection is a :class:`ConnectionLost` exception, handled in one place (:meth:`Rollout._reconnect`):
either the run is over, or every chunk in flight is dropped and a fresh connection starts with an infer. Episodes
continue locally through a reconnect.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any, Protocol

import gymnasium as gym
import numpy as np

from plugrl_env_client.envs.base_env import BaseEnv, Observation, observation_space_of
from plugrl_env_client.errors import EnvContractError, EnvCrashedError
from plugrl_env_client.outputs.results import EpisodeRecord, ProcessStatus
from plugrl_env_client.protocol.connection import CloseAction, Closed, ConnectionLost
from plugrl_env_client.protocol.messages import FEATURE_REUSE_FEEDBACK_OBS, ActionReply, ServerMetadata
from plugrl_env_client.rollout import checks
from plugrl_env_client.rollout.budget import Budget
from plugrl_env_client.rollout.chunks import ActionPlans
from plugrl_env_client.rollout.episodes import EpisodeTracker
from plugrl_env_client.rollout.signals import deferred_interrupts
from plugrl_env_client.timing import Timing

logger = logging.getLogger(__name__)


class ServerSession(Protocol):
    """What the rollout needs of its server connection (a :class:`~plugrl_env_client.protocol.session.Session`
    over a WebSocket, or an in-memory fake in tests). Every call may raise :class:`ConnectionLost`."""

    def open(self) -> ServerMetadata: ...

    def reconnect(self, closed: Closed) -> ServerMetadata: ...

    def infer(self, obs: Observation, env_indices: np.ndarray, step_ids: np.ndarray,
              reuse: np.ndarray | None = None) -> ActionReply: ...

    def feedback(self, env_indices: np.ndarray, step_ids: np.ndarray, obs: Observation, rewards: np.ndarray,
                 terminated: np.ndarray, truncated: np.ndarray, info: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


class ResultSink(Protocol):
    """Where a rollout reports finished episodes and its progress (the run's writer, directly or over a queue)."""

    def episode(self, record: EpisodeRecord) -> None: ...

    def progress(self, process_id: int, status: ProcessStatus, timing: Timing) -> None: ...


@dataclasses.dataclass(frozen=True)
class LoopSettings:
    env_id: str
    process_id: int
    seed: int | None
    max_episode_steps: int | None
    replan_steps: int | None
    success_threshold: float | None
    non_finite_actions: str = "error"
    non_finite_rewards: str = "error"
    non_finite_observations: str = "error"
    progress_period_s: float = 2.0
    """How often the rollout reports its timing to the run's writer."""
    reuse_feedback_obs: bool = True
    """Leave out of infers the rows the server already holds from feedback (when the server offers it)."""


@dataclasses.dataclass(frozen=True)
class StepResult:
    """One batched env step, checked, with the time limit applied and the chunks that ended on it."""

    obs: Observation
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    done: np.ndarray  # terminated | truncated
    info: dict[str, Any]
    chunk_ended: np.ndarray  # envs whose chunk ended on this step (they get feedback)


class _RunEnded(Exception):
    """The server ended the run, or the run stopped while (re)connecting."""


class Rollout:
    """Runs one env batch against one session until the budget is spent or the server ends the run."""

    def __init__(self, env: BaseEnv, session: ServerSession, settings: LoopSettings, budget: Budget,
                 sink: ResultSink, timing: Timing | None = None) -> None:
        self.env, self.session, self.settings = env, session, settings
        self.budget, self.sink = budget, sink
        self.n = env.num_envs
        self.space = checks.action_space_of(env)
        self.plans = ActionPlans(self.n, tuple(self.space.shape or ()), _plan_dtype(self.space), settings.replan_steps)
        self.tracker = EpisodeTracker(self.n, settings.success_threshold)
        self.timing = timing if timing is not None else Timing()
        self.reuse = False  # the current connection supports reuse-feedback-obs and we use it
        self.held = np.zeros(self.n, bool)  # env's current obs row is the one its last feedback carried
        self._all = np.arange(self.n)
        self._started = time.perf_counter()
        self._last_progress = time.monotonic()

    # -------------------------------------------------------------------------------------------- the loop

    def run(self) -> ProcessStatus:
        """Collect until done; returns how the collection ended."""
        self._started = time.perf_counter()
        try:
            self._connect()
            obs = self.reset_all()
            while not self.budget.finished(self.settings.process_id):
                try:
                    self.request_actions(obs)
                except ConnectionLost as lost:
                    self._reconnect(lost)
                    continue
                step = self.step_envs()
                self.send_feedback(step)
                obs = self.finish_episodes(step)
                self._report_progress()
        except _RunEnded:
            pass
        finally:
            self.timing.collect_time_s = time.perf_counter() - self._started
            self.session.close()
        return self._end_status()

    # -------------------------------------------------------------------------------------------- the steps

    def reset_all(self) -> Observation:
        """The first reset of every env, seeded with the process's seed."""
        obs = self._reset(self.settings.seed, None)
        self.tracker.start(self._all, [self.settings.seed] * self.n)
        if "_single_observation_space" not in vars(self.env):  # not declared: derived, for wrappers and recorders
            self.env.single_observation_space = observation_space_of(obs)
        return obs

    def request_actions(self, obs: Observation) -> None:
        """Infer for the envs whose chunk ran out (ascending env index) and queue their chunks."""
        need = self.plans.needing_actions()
        if need.size == 0:
            return
        reuse = self.held[need] if self.reuse else None
        sent = need if reuse is None else need[~reuse]
        reply = self.session.infer(self._rows(obs, sent), need, self.plans.chunk_index[need], reuse)
        actions = checks.check_actions(reply.actions, self.space, self.settings.replan_steps,
                                       self.settings.non_finite_actions)
        self.plans.load(need, actions)

    def step_envs(self) -> StepResult:
        """One batched env step with the planned actions; applies the time limit and chunk accounting."""
        actions = self.plans.next_actions()
        start = time.perf_counter()
        result = self._call_env("step", self.env.step, actions)
        self.timing.env_step_s += time.perf_counter() - start
        self.timing.batch_steps += 1
        self.timing.env_steps += self.n
        self.budget.add_env_steps(self.n)
        out = self._checked(checks.check_step, result, self.settings.non_finite_rewards,
                            self.settings.non_finite_observations)
        if out.zeroed_rewards.size:
            logger.warning("env %s returned NaN/inf rewards for envs %s; replaced by 0 (--runner.non-finite-rewards "
                           "zero)", self.settings.env_id, out.zeroed_rewards.tolist())
        self.tracker.add_step(out.rewards, out.info)
        truncated = out.truncated
        if self.settings.max_episode_steps is not None:
            truncated = truncated | ((self.tracker.lengths >= self.settings.max_episode_steps) & ~out.terminated)
        done = out.terminated | truncated
        chunk_ended = self.plans.advance(out.rewards, done)
        return StepResult(out.obs, out.rewards, out.terminated, truncated, done, out.info, chunk_ended)

    def send_feedback(self, step: StepResult) -> None:
        """Feedback for the envs whose chunk ended: chunk-summed rewards, post-step (terminal) observations."""
        rows = step.chunk_ended
        if rows.size == 0:
            return
        info = checks.slice_info(step.info, rows, self.n)
        if step.done[rows].any():
            info["episode"] = self.tracker.episode_info(rows, step.done)
        # Known structurally: an env whose chunk ended without ending its episode asks for its next chunk with
        # exactly the observation this feedback carries, so the server can reuse the row.
        self.held[rows] = ~step.done[rows]
        self.session.feedback(
            env_indices=rows,
            step_ids=self.plans.finish_chunks(rows, step.done),
            obs=self._rows(step.obs, rows),
            rewards=self.plans.chunk_reward[rows].astype(np.float32),
            terminated=step.terminated[rows],
            truncated=step.truncated[rows],
            info=info,
        )

    def finish_episodes(self, step: StepResult) -> Observation:
        """Record finished episodes and reset their envs (unless the run needs no more episodes); returns the
        observation the next infer starts from."""
        done = np.flatnonzero(step.done)
        if done.size == 0:
            return step.obs
        records = self.tracker.finish(done, step.terminated, step.truncated, self.settings.process_id,
                                      self._elapsed(), self.timing.env_steps)
        with deferred_interrupts():  # an episode is claimed and reported as one, never half
            for record in records:
                if self.budget.claim(self.settings.process_id):
                    self.sink.episode(record)
        if self.budget.finished(self.settings.process_id):
            return step.obs
        obs = self._reset(None, {"reset_mask": step.done.copy(), "reset_indices": done})
        self.tracker.start(done)
        return obs

    # -------------------------------------------------------------------------------------------- helpers

    def _rows(self, obs: Observation, rows: np.ndarray) -> Observation:
        """The observation's ``rows`` (no copy when that is the whole batch, in order)."""
        return obs if rows.size == self.n else obs.select(rows)  # rows are ascending and unique

    def _connect(self) -> None:
        try:
            meta = self.session.open()
        except ConnectionLost as lost:
            self._reconnect(lost)
            return
        self._check_metadata(meta)

    def _reconnect(self, lost: ConnectionLost) -> None:
        """The one place a close is handled: end the run, or drop every chunk in flight and reconnect."""
        while True:
            if lost.close.action is CloseAction.END or self.budget.finished(self.settings.process_id):
                logger.info("the run ended (%s)", lost.close.describe())
                raise _RunEnded
            self.plans.drop_all()
            self.held[:] = False  # a new connection holds nothing
            try:
                meta = self.session.reconnect(lost.close)
            except ConnectionLost as again:
                lost = again
                continue
            self._check_metadata(meta)
            return

    def _end_status(self) -> ProcessStatus:
        if self.budget.exhausted(self.settings.process_id):
            return ProcessStatus.FINISHED
        return ProcessStatus.INTERRUPTED if self.budget.stop.is_set() else ProcessStatus.STOPPED_BY_SERVER

    def _report_progress(self) -> None:
        """Hand the run's writer this process's timing every ``progress_period_s`` (so a crash loses little)."""
        now = time.monotonic()
        if now - self._last_progress >= self.settings.progress_period_s:
            self._last_progress = now
            self.timing.collect_time_s = self._elapsed()
            self.sink.progress(self.settings.process_id, ProcessStatus.RUNNING, dataclasses.replace(self.timing))

    def _elapsed(self) -> float:
        return time.perf_counter() - self._started

    def _check_metadata(self, meta: ServerMetadata) -> None:
        """What the server says about itself, checked before any env step on this connection."""
        self.reuse = bool(self.settings.reuse_feedback_obs and meta.supports(FEATURE_REUSE_FEEDBACK_OBS))
        _check_action_dim(meta.action_dim, self.space)
        horizon, replan = meta.action_horizon, self.settings.replan_steps
        if horizon is not None and replan is not None and replan > horizon:
            logger.warning(
                "--runner.replan-steps=%d exceeds the server's action_horizon=%d; a chunk shorter than the replan "
                "steps is refused, so lower --runner.replan-steps",
                replan, horizon,
            )

    def _reset(self, seed: int | None, options: dict[str, Any] | None) -> Observation:
        start = time.perf_counter()
        result = self._call_env("reset", lambda: self.env.reset(seed=seed, options=options))
        self.timing.reset_s += time.perf_counter() - start
        obs, _info = self._checked(checks.check_reset, result, self.settings.non_finite_observations)
        return obs

    def _checked(self, check: Any, result: Any, *modes: str) -> Any:
        """An env's return value through its contract check; a violation names the env."""
        try:
            return check(self.n, result, *modes)
        except EnvContractError as exc:
            raise EnvContractError(f"env {self.settings.env_id}: {exc}") from None

    def _call_env(self, name: str, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception as exc:
            raise EnvCrashedError(f"env {self.settings.env_id} raised in {name}(): {type(exc).__name__}: {exc}") from exc


def _check_action_dim(action_dim: int | None, space: Any) -> None:
    """A server that declares ``action_dim`` must match a vector action space before any env step.

    Only 1-d Box spaces are compared: for discrete policies servers use ``action_dim`` for the number of choices.
    """
    shape = getattr(space, "shape", None)
    if action_dim is None or not isinstance(space, gym.spaces.Box) or shape is None or len(shape) != 1:
        return
    if shape[0] != action_dim:
        raise EnvContractError(
            f"Expected action shape tail {tuple(shape)}, got ({action_dim},) (the server's metadata says "
            f"action_dim={action_dim}). The server's action dim (e.g. its --policy.action-dim {shape[0]}) must match "
            f"the env's single_action_space {space}."
        )


def _plan_dtype(space: Any) -> np.dtype:
    dtype = getattr(space, "dtype", None)
    return np.dtype(dtype) if dtype is not None else np.dtype(np.float32)
