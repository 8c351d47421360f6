"""The rollout loop of one process: ask for chunks, step the envs, send feedback, reset finished envs.

Each iteration is four named steps; the loop itself only decides what happens when the server closes::

    request_actions -> step_envs -> send_feedback -> finish_episodes

Invariants the server relies on: one infer outstanding at most, strictly ``infer action feedback`` per connection,
feedback only for chunks that arrived on the current connection, rewards summed over a chunk, and the terminal
observation (not the reset one) in the feedback of a finished episode.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

import numpy as np

from plugrl_env_client.envs.base_env import BaseEnv, Observation
from plugrl_env_client.errors import EnvCrashedError
from plugrl_env_client.outputs.recorder import ProcessRecorder
from plugrl_env_client.protocol.connection import CloseAction, Closed
from plugrl_env_client.protocol.messages import FEATURE_REUSE_FEEDBACK_OBS, ServerMetadata, wire_observation
from plugrl_env_client.protocol.session import Session
from plugrl_env_client.rollout import checks
from plugrl_env_client.rollout.budget import EpisodeBudget
from plugrl_env_client.rollout.chunks import ActionPlans
from plugrl_env_client.rollout.episodes import EpisodeTracker
from plugrl_env_client.rollout.signals import deferred_interrupts

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class LoopSettings:
    env_id: str
    seed: int | None
    max_episode_steps: int | None
    replan_steps: int | None
    success_threshold: float | None
    non_finite_actions: str = "error"
    summary_period_s: float = 10.0
    reuse_feedback_obs: bool = True
    """Leave out of infers the rows the server already holds from feedback (when the server offers it)."""


@dataclasses.dataclass
class StepResult:
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    done: np.ndarray  # terminated | truncated
    info: dict[str, Any]
    chunk_ended: np.ndarray  # envs whose chunk ended on this step (they get feedback)


@dataclasses.dataclass
class LoopTiming:
    env_steps: int = 0
    batch_steps: int = 0
    env_step_s: float = 0.0
    reset_s: float = 0.0
    collect_time_s: float = 0.0


class Rollout:
    """Runs one env batch against one session until the budget is spent or the server ends the run."""

    def __init__(self, env: BaseEnv, session: Session, settings: LoopSettings, budget: EpisodeBudget, recorder: ProcessRecorder) -> None:
        self.env, self.session, self.settings = env, session, settings
        self.budget, self.recorder = budget, recorder
        self.n = env.num_envs
        self.space = checks.action_space_of(env)
        self.plans = ActionPlans(self.n, tuple(self.space.shape or ()), _plan_dtype(self.space), settings.replan_steps)
        self.tracker = EpisodeTracker(self.n, settings.success_threshold)
        self.timing = LoopTiming()
        self.reuse = False  # the current connection supports reuse-feedback-obs and we use it
        self.held = np.zeros(self.n, bool)  # env's current obs row is the one its last feedback carried
        self.obs: Observation | None = None
        self.status = "not started"
        self._started: float | None = None
        self._last_summary = time.monotonic()

    # -------------------------------------------------------------------------------------------- the loop

    def run(self) -> str:
        """Collect until done; returns the end status (also kept in ``self.status``)."""
        self._started = time.perf_counter()
        self.status = "running"
        try:
            self.status = self._run()
        finally:
            self.timing.collect_time_s = time.perf_counter() - self._started
            self._started = None
            self.session.close()
        return self.status

    def _run(self) -> str:
        opened = self.session.open()
        if isinstance(opened, Closed) and not self._recover(opened):
            return self._end_status()
        self._check_metadata(self.session.metadata)
        self.obs = self._reset(seed=self.settings.seed, options=None)
        while not self.budget.finished():
            reply = self.request_actions()
            if isinstance(reply, Closed):
                if not self._recover(reply):
                    return self._end_status()
                continue
            step = self.step_envs()
            closed = self.send_feedback(step)
            self.finish_episodes(step)
            if closed is not None and not self._recover(closed):
                return self._end_status()
            self._refresh_summary()
        return self._end_status()

    def _end_status(self) -> str:
        if self.budget.exhausted():
            return "finished"
        return "interrupted" if self.budget.stop.is_set() else "stopped by server"

    # -------------------------------------------------------------------------------------------- the steps

    def request_actions(self) -> Closed | None:
        """Infer for the envs whose chunk ran out (ascending env index) and queue their chunks."""
        need = self.plans.needing_actions()
        if need.size == 0:
            return None
        reuse = self.held[need] if self.reuse else None
        sent = need if reuse is None else need[~reuse]
        reply = self.session.infer(self._rows(sent), need, self.plans.chunk_index[need], reuse)
        if isinstance(reply, Closed):
            return reply
        actions = checks.check_actions(reply.actions, self.space, self.settings.replan_steps,
                                       self.settings.non_finite_actions)
        self.plans.load(need, actions)
        return None

    def step_envs(self) -> StepResult:
        """One batched env step with the planned actions; applies the time limit and chunk accounting."""
        actions = self.plans.next_actions()
        start = time.perf_counter()
        out = self._call_env("step", self.env.step, actions)
        self.timing.env_step_s += time.perf_counter() - start
        self.timing.batch_steps += 1
        self.timing.env_steps += self.n
        self.budget.add_env_steps(self.n)
        rewards, terminated, truncated = checks.check_step(self.n, *out)
        self.obs, info = out[0], out[4]
        self.tracker.add_step(rewards, info)
        if self.settings.max_episode_steps is not None:
            truncated = truncated | ((self.tracker.lengths >= self.settings.max_episode_steps) & ~terminated)
        done = terminated | truncated
        chunk_ended = self.plans.advance(rewards, done)
        return StepResult(rewards, terminated, truncated, done, info, chunk_ended)

    def send_feedback(self, step: StepResult) -> Closed | None:
        """Feedback for the envs whose chunk ended: chunk-summed rewards, post-step (terminal) observations."""
        rows = step.chunk_ended
        if rows.size == 0:
            return None
        info = checks.slice_info(step.info, rows, self.n)
        if step.done[rows].any():
            info["episode"] = self.tracker.episode_info(rows, step.done)
        # Known structurally: an env whose chunk ended without ending its episode asks for its next chunk with
        # exactly the observation this feedback carries, so the server can reuse the row.
        self.held[rows] = ~step.done[rows]
        return self.session.feedback(
            env_indices=rows,
            step_ids=self.plans.finish_chunks(rows, step.done),
            obs=self._rows(rows),
            rewards=self.plans.chunk_reward[rows].astype(np.float32),
            terminated=step.terminated[rows],
            truncated=step.truncated[rows],
            info=info,
        )

    def finish_episodes(self, step: StepResult) -> None:
        """Record finished episodes and reset their envs, unless the run needs no more episodes."""
        done = np.flatnonzero(step.done)
        if done.size == 0:
            return
        with deferred_interrupts():  # an episode is claimed and written as one, never half
            for record in self.tracker.finish(done, step.terminated, step.truncated):
                if self.budget.claim():
                    self.recorder.add(record)
        if self.budget.finished():
            return
        self.tracker.restart(done)
        self.obs = self._reset(seed=None, options={"reset_indices": done})

    # -------------------------------------------------------------------------------------------- helpers

    def _rows(self, rows: np.ndarray) -> dict[str, Any]:
        """Wire form of the current observation's ``rows`` (no copy when that is the whole batch, in order)."""
        whole = rows.size == self.n  # rows are ascending and unique, so this means 0..n-1
        return wire_observation(self.obs if whole else self.obs.select(rows))

    def _recover(self, closed: Closed) -> bool:
        """After a close: reconnect (dropping every chunk in flight) or report that the run ended."""
        while closed.action is CloseAction.RECONNECT and not self.budget.finished():
            self.plans.drop_all()
            self.held[:] = False  # a new connection holds nothing
            reply = self.session.reconnect(closed)
            if isinstance(reply, ServerMetadata):
                self._check_metadata(reply)
                return True
            closed = reply
        if closed.action is CloseAction.END:
            logger.info("the run ended (%s)", closed.describe())
        return False

    def _refresh_summary(self) -> None:
        """Rewrite this process's summary.json every ``summary_period_s`` so a crash loses little."""
        now = time.monotonic()
        if now - self._last_summary >= self.settings.summary_period_s:
            self._last_summary = now
            self.recorder.write_summary(self.timing_dict(), "running")

    def _check_metadata(self, meta: ServerMetadata | None) -> None:
        self.reuse = bool(self.settings.reuse_feedback_obs and meta is not None
                          and meta.supports(FEATURE_REUSE_FEEDBACK_OBS))
        horizon = meta.action_horizon if meta is not None else None
        replan = self.settings.replan_steps
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
        return checks.check_reset(self.n, result)

    def _call_env(self, name: str, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception as exc:
            raise EnvCrashedError(f"env {self.settings.env_id} raised in {name}(): {type(exc).__name__}: {exc}") from exc

    def timing_dict(self) -> dict[str, Any]:
        stats = self.session.stats
        t = self.timing
        if self._started is not None:  # a summary written while the loop runs
            t.collect_time_s = time.perf_counter() - self._started
        return {
            **dataclasses.asdict(t),
            "infer_calls": stats.infer_calls,
            "feedback_calls": stats.feedback_calls,
            "infer_wait_s": stats.infer_wait_s,
            "pack_s": stats.pack_s,
            "bytes_sent": stats.bytes_sent,
            "bytes_received": stats.bytes_received,
            "reconnects": stats.reconnects,
            "effective_fps": t.env_steps / t.collect_time_s if t.collect_time_s > 0 else 0.0,
        }


def _plan_dtype(space: Any) -> np.dtype:
    dtype = getattr(space, "dtype", None)
    return np.dtype(dtype) if dtype is not None else np.dtype(np.float32)
