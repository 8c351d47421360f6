"""One env batch and its server connection: the named steps of a rollout.

An :class:`EnvGroup` owns one env object (``num_envs`` copies), one session, the envs' action plans and episode
totals. Its steps, in the order a rollout calls them::

    request_actions(obs) -> step() -> finish_episodes(step) -> obs

``step`` is a pipe: ``step_envs`` calls ``env.step``, hands what it returned to the env contract's one pass
(:class:`~plugrl_env_client.envs.contract.EnvChecks`) and does the step's accounting, then ``send_feedback`` cuts
the feedback's rows and hands it to the session, which writes it to the socket. From ``env.step``'s return to the
socket the observation crosses this module, ``envs/contract.py`` and then the wire's (``protocol/``): it does not go
back to the loop on the way, and the helpers below get index arrays and masks, never the observation (the hooks,
a recorder, get it when there are any; ``bench/walk.py`` lists the walk). ``send_feedback`` runs before
``finish_episodes`` resets anything, so a finished episode's feedback carries its terminal observation.

A lockstep rollout drives one group; a pipelined one drives several, each with its own env object and connection, so
one group's stepping overlaps the others' inference (``request_actions`` is then split in two: ``ask_for_actions``
sends the infer, ``take_actions`` picks its reply up).

The steps hold no feature flags: each optional feature is a small object they call at one point, and does nothing
when it is off. Seed groups (:class:`~plugrl_env_client.rollout.seeds.SeedGroups`), retirement
(:class:`~plugrl_env_client.rollout.idle.IdleEnvs`) and instructions
(:class:`~plugrl_env_client.rollout.episodes.Instructions`) act when episodes end and start; align
(:class:`~plugrl_env_client.rollout.chunks.ChunkEnds`) chooses a feedback's rows; a feedback no infer surely follows
waits (:class:`~plugrl_env_client.rollout.chunks.PendingFeedback`); the rows the server holds
(:class:`~plugrl_env_client.rollout.chunks.HeldRows`) shape an infer.

An env's chunks end only when used up or when its episode ends (or, with ``--runner.align-chunks``, when nearly
used up as another env's ends), so without align an env's schedule, and what a reactive policy sees of it and
when, depends on its own episode alone: not on the other envs of its batch, the split into groups or processes,
or a resume.

Env ids: a group's envs are the process's envs ``offset .. offset + num_envs - 1`` (the ids in episodes.jsonl and
the recorder); on the wire each connection numbers its own envs from 0. The first reset is seeded with the process
seed plus the offset, so a group's env i starts as env ``offset + i`` of a lockstep batch would (for envs that seed
env i with seed + i, as Gymnasium's vector envs do); later resets pass each env's derived seed
(:mod:`~plugrl_env_client.rollout.seeds`), which depends on its process env id, not on the group it is in.

Some envs take no part in a step: an env retired because its reset had no episode for it (``info["no_episode"]``)
or because it ran its share of the run's episodes (the static split, listed start seeds), and, with
``--runner.group-size``, an env waiting for the rest of its group to finish. The batched ``env.step`` still steps
their rows (with a placeholder action); their results are not counted, fed back or recorded, and a retired env's row
that the env says ended is reset (without a seed), as an env may refuse to step a row that ended. One object,
:attr:`EnvGroup.idle` (:class:`~plugrl_env_client.rollout.idle.IdleEnvs`), keeps who is idle; the steps and their
collaborators read the mask only through it.

Every env call (reset, step) runs inside ``guard`` (the process's
:class:`~plugrl_env_client.websocket.keepalive.Keepalive`): a call that lasts long has the server's pings answered
for it, and between calls the sockets are serviced (SPEC C2).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

from plugrl_env_client.envs import contract
from plugrl_env_client.envs.base_env import BaseEnv, Observation, observation_space_of
from plugrl_env_client.envs.calls import call_env, env_failure, is_signal
from plugrl_env_client.envs.contract import EnvChecks, slice_info, undeclared_dtypes
from plugrl_env_client.errors import ConfigError, EnvContractError
from plugrl_env_client.protocol.exchange import CloseAction, ConnectionLost
from plugrl_env_client.protocol.messages import (
    FEATURE_REUSE_FEEDBACK_OBS,
    ActionReply,
    Feedback,
    InferRequest,
    ServerMetadata,
)
from plugrl_env_client.rollout.actions import check_actions
from plugrl_env_client.rollout.budget import Budget
from plugrl_env_client.rollout.chunks import ActionPlans, ChunkEnds, HeldRows, PendingFeedback
from plugrl_env_client.rollout.episodes import EpisodeTracker, Instructions
from plugrl_env_client.rollout.idle import IdleEnvs
from plugrl_env_client.rollout.interfaces import NO_HOOKS, EpisodeHooks, ResultSink, ServerSession
from plugrl_env_client.rollout.seeds import GroupSeeds, SeedGroups
from plugrl_env_client.rollout.settings import LoopSettings
from plugrl_env_client.rollout.signals import deferred_interrupts
from plugrl_env_client.timing import Timing

logger = logging.getLogger(__name__)


_NO_ROWS = np.zeros(0, np.intp)
_NONE = slice(0, 0)
_EVERY = slice(None)
_TAKEN = Observation(states={"taken": np.zeros((0, 0), np.float32)})
"""What a :class:`StepResult` holds once its observation was taken: an empty batch (a use after the hand-over shows
as a batch of 0 envs rather than as stale rows)."""


@dataclasses.dataclass
class StepResult:
    """One batched env step, checked, with the time limit applied and the chunks that ended on it.

    Flags and rewards of envs that took no part in the step (idle: retired or waiting) are False and 0. Its observation
    is handed on once, by :meth:`EnvGroup.finish_episodes`, after the feedback has been sent: the result no longer
    holds it afterwards, so whoever takes it decides how long it lives (a batch of camera images is tens of MB, and a
    reset that follows returns a whole new batch).
    """

    obs: Observation
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    done: np.ndarray  # terminated | truncated, active envs only
    info: dict[str, Any]
    chunk_ended: np.ndarray  # envs whose chunk ended on this step (they get feedback)
    idle_ended: np.ndarray  # retired envs whose row the env says ended (reset quietly; usually none)


class RunEnded(Exception):
    """The server ended the run, or the run stopped while (re)connecting."""


class EnvGroup:
    """One env object, its session, and the state of its envs between steps."""

    def __init__(self, env: BaseEnv, session: ServerSession, settings: LoopSettings, budget: Budget,
                 sink: ResultSink, timing: Timing, offset: int = 0, hooks: EpisodeHooks | None = None,
                 guard: contextlib.AbstractContextManager[Any] | None = None) -> None:
        self.env, self.session, self.settings = env, session, settings
        self.budget, self.sink, self.timing = budget, sink, timing
        self.hooks: EpisodeHooks = hooks if hooks is not None else NO_HOOKS
        self.guard = guard if guard is not None else contextlib.nullcontext()
        self.n = n = env.num_envs
        self.offset = offset
        self.ids = np.arange(offset, offset + n)  # the process's env ids of this group's envs
        self.space = contract.action_space_of(env)
        if settings.group_size > 1 and not env.metadata.get("per_env_seeds", False):
            raise ConfigError(
                f"--runner.group-size {settings.group_size} starts the envs of a group from one seed, but env "
                f"{settings.env_id} does not take per-env seeds (reset(seed=[...]) with metadata['per_env_seeds'] = "
                "True); use an env that does (Gym-v1, GEM-v1, GuessNumber-v1) or --runner.group-size 1"
            )
        if settings.start_seeds and not env.metadata.get("per_env_seeds", False):
            raise ConfigError(
                f"fixed start seeds (--runner.start-seeds, a suite's seeds) start each episode from a seed of its own, "
                f"but env {settings.env_id} does not take per-env seeds (reset(seed=[...]) with "
                "metadata['per_env_seeds'] = True); leave the seeds out, or use an env that does (e.g. MuJoCo-v1 "
                "with --env.backend gymnasium)"
            )
        self.idle = IdleEnvs(n, settings.env_id, offset, bool(env.metadata.get("finite_episodes", False)))
        """Who takes no part in steps (retired, or waiting for their seed group)."""
        self.plans = ActionPlans(n, tuple(self.space.shape or ()), _plan_dtype(self.space), settings.replan_steps,
                                 self.idle)
        self.tracker = EpisodeTracker(n, settings.success_threshold, self.idle)
        self.checks = EnvChecks(settings.env_id, n, settings.check_partial_reset, settings.non_finite_rewards,
                                settings.non_finite_observations)
        """The env contract, each value and across calls, applied to every reset and step in one pass."""
        self.held = HeldRows(n, settings.reuse_feedback_obs)
        self.seed_groups = SeedGroups(GroupSeeds(settings.seed, settings.process_id, offset, n, settings.group_size,
                                                 bool(env.metadata.get("per_env_seeds", False)),
                                                 start=settings.first_episodes[offset:offset + n],
                                                 listed=settings.start_seeds, stride=settings.process_envs,
                                                 shares=settings.env_shares[offset:offset + n]), self.idle)
        self.instructions = Instructions(n, settings.instruction)
        self.ends = ChunkEnds(self.plans, settings.align_chunks)
        self.pending = PendingFeedback()
        self._all = np.arange(n)
        self.started = time.perf_counter()
        self.process_env_steps: Callable[[], int] = lambda: self.timing.env_steps
        """The process's env steps so far (its groups' total when the rollout runs several), for episode records."""
        self.feedback_with_infer = False
        """A feedback that an infer surely follows goes out with that infer, in one write: set for a pipelined
        rollout, whose other groups step while the server reads both. Lockstep sends it at once, so the server
        reads it while the envs reset."""

    # ------------------------------------------------------------------------------------------ connection

    @property
    def awaiting_actions(self) -> bool:
        """An infer of this group is on the wire (the session is the one that knows)."""
        return self.session.awaiting

    def connect(self) -> None:
        """The first connection (reconnecting, or ending the run, as the server's closes say)."""
        try:
            meta = self.session.open()
        except ConnectionLost as lost:
            self.reconnect(lost)
            return
        self._check_metadata(meta)

    def reconnect(self, lost: ConnectionLost) -> None:
        """The one place a close is handled: end the run, or drop every chunk in flight and reconnect."""
        while True:
            if lost.close.action is CloseAction.END or self.budget.finished(self.settings.process_id):
                logger.info("the run ended (%s)", lost.close.describe())
                raise RunEnded
            self.plans.drop_all()
            self.pending.drop()
            try:
                meta = self.session.reconnect(lost.close)
            except ConnectionLost as again:
                lost = again
                continue
            self._check_metadata(meta)
            return

    def flush_feedback(self) -> None:
        """Send the feedback still held (:class:`PendingFeedback`): the rollout ends, so no infer will follow it."""
        held = self.pending.take()
        if held is not None:
            self.session.feedback(held)

    def close(self) -> None:
        self.session.close()

    # ------------------------------------------------------------------------------------------ the steps

    def reset_all(self) -> Observation:
        """The first reset of every env: seeded with the process seed plus this group's offset (or, with seed
        groups, each group's first seed)."""
        seed = self.seed_groups.seeds.initial()
        obs, info = self._reset(seed, None)
        if "_single_observation_space" not in vars(self.env):  # not declared: derived, for wrappers and recorders
            self.env.single_observation_space = observation_space_of(obs)
        elif self.offset == 0 and (odd := undeclared_dtypes(self.env.single_observation_space, obs)):
            logger.warning("env %s: %s: declare the dtypes the env returns (observation_space(states={'pos': "
                           "np.zeros(2, np.float32)}) takes an example array's shape and dtype) or return the "
                           "declared ones", self.settings.env_id, "; ".join(odd))
        return self._started_episodes(obs, info, self._all, seed)

    def needs_actions(self) -> bool:
        """Whether some active env has no action for the next step (its chunk is used up or was dropped)."""
        return bool(np.count_nonzero(self.idle.only(self.plans.needing)))

    def can_step(self) -> bool:
        """Every active env has an action, and some env is active."""
        return self.idle.count > 0 and not self.needs_actions()

    def request_actions(self, obs: Observation) -> None:
        """Infer for the active envs whose chunk ran out (ascending env index) and queue their chunks (lockstep:
        one blocking exchange)."""
        request = self._infer_request(obs)
        if request is not None:
            if self.pending.held is not None:
                self.flush_feedback()
            self._load(self.session.infer(request))

    def ask_for_actions(self, obs: Observation) -> None:
        """Send the infer of :meth:`request_actions` without waiting for its reply (nothing to send: no infer)."""
        request = self._infer_request(obs)
        if request is not None:
            self.flush_feedback()
            self.session.send_infer(request)

    def take_actions(self, timeout: float | None = 0.0) -> bool:
        """Queue the chunks answering the infer on the wire, if they arrive within ``timeout`` s (0: if they are
        in already; None: wait for them). Returns whether they did."""
        reply = self.session.receive_actions(timeout)
        if reply is None:
            return False
        self._load(reply)
        return True

    def step(self) -> StepResult:
        """One batched env step (:meth:`step_envs`) and its feedback (:meth:`send_feedback`): the step's
        observation goes from the env to the socket without coming back to the loop."""
        step = self.step_envs()
        self.send_feedback(step)
        return step

    def step_envs(self) -> StepResult:
        """One batched env step with the planned actions; applies the time limit and chunk accounting."""
        actions = self.plans.next_actions()
        idle = self.idle
        start = time.perf_counter()
        env = self.env
        env.in_step = True  # the env's own reset() notices it is called inside step()
        try:
            with self.guard:
                try:
                    result = env.step(actions)
                except BaseException as exc:  # the env's failure, as call_env words it (a real signal passes)
                    if is_signal(exc):
                        raise
                    raise env_failure(self.settings.env_id, "step", exc) from exc
        finally:
            env.in_step = False
        timing = self.timing
        timing.env_step_s += time.perf_counter() - start
        timing.batch_steps += 1
        steps = idle.count
        timing.env_steps += steps  # the rollout adds them to the run's budget now and then
        timing.idle_env_steps += self.n - steps
        if getattr(env, "reset_in_step", False):
            raise EnvContractError(f"env {self.settings.env_id}: {contract.RESET_IN_STEP.message}")
        out = self.checks.step(result)
        info = out.info
        if out.zeroed_rewards.size:
            logger.warning("env %s returned %s for envs %s; replaced by 0 (--runner.non-finite-rewards zero)",
                           self.settings.env_id, out.zeroed_why, (self.offset + out.zeroed_rewards).tolist())
        rewards, terminated, truncated, idle_ended = idle.leave_out(out.rewards, out.terminated, out.truncated)
        self.tracker.add_step(rewards, info)
        limit = self.settings.max_episode_steps
        if limit is not None:
            reached = self.tracker.lengths >= limit
            if np.count_nonzero(reached):  # (none on most steps)
                truncated = truncated | idle.only(reached & ~terminated)
        done = terminated | truncated
        chunk_ended = self.plans.advance(rewards, done)
        if self.hooks is not NO_HOOKS:
            self.hooks.on_step(out.obs, actions, rewards, self.ids)
        return StepResult(out.obs, rewards, terminated, truncated, done, info, chunk_ended, idle_ended)

    def send_feedback(self, step: StepResult) -> None:
        """Feedback for the envs whose chunk ended (and those :class:`ChunkEnds` adds): chunk-summed rewards,
        post-step (terminal) observations. Sent now, with any feedback held before, when an infer surely follows;
        held otherwise (:class:`PendingFeedback`). A connection that is gone already is not an error here: it
        surfaces at the next infer."""
        rows = self.ends.rows(step.chunk_ended, step.done)
        if rows.size == 0:
            return
        done = step.done
        ended = done[rows]  # the feedback's rows whose episode ended
        ending = np.count_nonzero(ended)
        if rows.size == self.n:  # every env: the whole batch as it is
            index: np.ndarray | slice = _EVERY
            obs = step.obs
        else:
            index = _run_or_rows(rows)  # a slice when the rows form a run: views of the arrays, no copies
            obs = step.obs.select(index)
        info = slice_info(step.info, index, self.n)
        # (a held feedback's rows are done: merged with it, every row says its own)
        if ending or self.pending.held is not None:
            self.tracker.add_to_feedback(info, rows, done)
        feedback = Feedback(
            env_indices=rows,
            step_ids=self.plans.finish_chunks(rows, done),
            obs=obs,
            rewards=self.plans.chunk_reward[rows].astype(np.float32),
            terminated=step.terminated[rows],
            truncated=step.truncated[rows],
            info=info,
        )
        self.held.fed_back(rows, done)
        # Held unless an infer surely follows: some env of it asks for actions next, one whose chunk ended without
        # ending its episode, or a done one that starts its next episode at once (it may not if the env may retire
        # it, if it ran the last episode of its share, or if it waits for its seed group).
        if ending == rows.size and (self.idle.may_retire or not self.seed_groups.restarts_at_once(rows, done)):
            self.pending.hold(feedback)
            return
        if self.pending.held is not None:
            merged = self.pending.take(feedback)
            assert merged is not None
            feedback = merged
        self.session.feedback(feedback, self.feedback_with_infer)

    def finish_episodes(self, step: StepResult) -> Observation:
        """Record finished episodes and start the next ones (unless the run needs no more episodes); returns the
        observation the next infer starts from."""
        obs, step.obs = step.obs, _TAKEN  # handed on: the step result no longer holds it
        done, idle = step.done.nonzero()[0], step.idle_ended
        if done.size == 0 and idle.size == 0:
            return obs
        if done.size:
            self._record(done, step)
        if self.budget.finished(self.settings.process_id):
            return obs
        del obs  # the reset returns the whole batch: the step's observation need not stay alive while it runs
        rows, seed, starting = (self.seed_groups.restart(done) if done.size
                                else (_NO_ROWS, None, _NO_ROWS))
        if idle.size:  # retired envs' rows that ended: reset without a seed (an env may refuse to step them)
            rows = np.union1d(rows, idle)
        mask = np.zeros(self.n, bool)
        mask[rows] = True
        obs, info = self._reset(seed, {"reset_mask": mask, "reset_indices": rows})
        return self._started_episodes(obs, info, starting, seed)

    def _record(self, done: np.ndarray, step: StepResult) -> None:
        """Claim and report the episodes that ended on ``step`` (rows ``done``)."""
        records = self.tracker.finish(done, step.terminated, step.truncated, self.settings.process_id,
                                      time.perf_counter() - self.started, self.process_env_steps(), self.offset)
        with self.guard, deferred_interrupts():  # an episode is claimed and reported as one, never half
            watched = self.hooks is not NO_HOOKS  # only a watcher needs each episode's part of the last info
            for record in records:
                if self.budget.claim(self.settings.process_id):
                    self.sink.episode(record)
                    if watched:
                        row = np.array(record.env_index - self.offset)
                        self.hooks.on_episode_end(record, slice_info(step.info, row, self.n))

    # ------------------------------------------------------------------------------------------ helpers

    def _infer_request(self, obs: Observation) -> InferRequest[Observation] | None:
        """The infer for the active envs without actions (the rows sent, env indices, step ids, reuse); None when
        every active env has its actions."""
        need = self.idle.only(self.plans.needing).nonzero()[0]
        if need.size == 0:
            return None
        reuse = self.held.reuse(need)
        sent = need if reuse is None else need[~reuse]
        # (no copy: the whole batch, a run of it, or none of it when the server reuses every row)
        rows = obs if sent.size == self.n else obs.select(_run_or_rows(sent) if sent.size else _NONE)
        return InferRequest(rows, need, self.plans.chunk_index[need], reuse)

    def _load(self, reply: ActionReply) -> None:
        """Queue a reply's chunks for the envs it names (the session checked they are the infer's)."""
        actions = check_actions(reply.actions, self.space, self.settings.replan_steps,
                                       self.settings.non_finite_actions)
        self.plans.load(reply.env_ids, actions)

    def _started_episodes(self, obs: Observation, info: dict[str, Any], started: np.ndarray,
                          seed: int | list[int | None] | None) -> Observation:
        """Bookkeeping for episodes that start at ``started`` after a reset with ``seed``: retire the envs that got
        none, note the instructions, and tell the hooks."""
        seeds = self.seed_groups.seeds.recorded(seed, started)
        kept = self.idle.retire_without_episode(info, started, self.seed_groups.seeds.exhausted())
        if kept.size != started.size:
            seeds = [s for s, keep in zip(seeds, np.isin(started, kept)) if keep]
            started = kept
        obs, instructions = self.instructions.note_reset(obs, info, started)
        self.tracker.start(started, seeds, instructions)
        if started.size:
            self.hooks.on_reset(obs, self.ids[started], started)
        return obs

    def _check_metadata(self, meta: ServerMetadata) -> None:
        """What the server says about itself, checked before any env step on this connection."""
        self.held.connected(meta.supports(FEATURE_REUSE_FEEDBACK_OBS))
        _check_action_dim(meta.action_dim, self.space)
        horizon, replan = meta.action_horizon, self.settings.replan_steps
        if horizon is not None and replan is not None and replan > horizon:
            logger.warning(
                "--runner.replan-steps=%d exceeds the server's action_horizon=%d; a chunk shorter than the replan "
                "steps is refused, so lower --runner.replan-steps",
                replan, horizon,
            )

    def _reset(self, seed: int | list[int | None] | None, options: dict[str, Any] | None
               ) -> tuple[Observation, dict[str, Any]]:
        self.checks.before_reset(options)
        start = time.perf_counter()
        result = self._call_env("reset", lambda: self.env.reset(seed=seed, options=options))  # type: ignore[arg-type]
        self.timing.reset_s += time.perf_counter() - start
        return self.checks.reset(result)

    def _call_env(self, name: str, fn: Any, *args: Any) -> Any:
        """Every env call goes through here: inside the guard (the keepalive), its failure the env's (also a
        ``sys.exit`` or a ``KeyboardInterrupt`` of the env's own: :func:`call_env`)."""
        with self.guard:
            return call_env(self.settings.env_id, name, fn, *args)


def _run_or_rows(rows: np.ndarray) -> np.ndarray | slice:
    """Ascending, unique ``rows`` (at least one) as a slice when they form one run (indexing by it makes views, not
    copies)."""
    first, last = int(rows[0]), int(rows[-1])
    return slice(first, last + 1) if last - first + 1 == rows.size else rows


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
