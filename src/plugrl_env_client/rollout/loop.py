"""The rollout loop of one process: ask for chunks, step the envs, send feedback, reset finished envs.

Lockstep (``--runner.pipeline 1``): one :class:`EnvGroup` holds every env of the process, and each iteration is
its three named steps (``step`` steps the envs and sends their feedback)::

    request_actions(obs) -> step() -> finish_episodes(step) -> obs

Pipelined (``--runner.pipeline K``): the envs are split into K groups, each with its own env object and its own
connection. One thread does everything: a group that needs actions sends its infer and the loop goes on stepping
the groups that have theirs, picking up replies as they arrive (a poll that finds nothing costs one system call and
raises nothing); it blocks, on every connection at once, only when no group can step. So one group's stepping
overlaps the others' inference, and a server that batches by waiting for one request per connected client never
waits on us: every group either steps or has its infer on the wire. (No worker threads: Python work of a second
thread would only take turns with the stepping on the GIL, and no thread but this one reads the sockets, except a
keepalive that answers pings while one env call runs long.)

Invariants the server relies on, per connection: one infer outstanding at most, strictly ``infer action
feedback``, feedback only for chunks that arrived on the current connection, rewards summed over a chunk, and the
terminal observation (not the reset one) in the feedback of a finished episode. A closed connection is a
:class:`ConnectionLost`, handled in one place (:meth:`EnvGroup.reconnect`): the run ends, or that group's chunks
in flight are dropped and its fresh connection starts with an infer; episodes continue locally.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from plugrl_env_client.envs.base_env import Observation
from plugrl_env_client.protocol.exchange import ConnectionLost
from plugrl_env_client.records import ProcessStatus
from plugrl_env_client.rollout.budget import Budget
from plugrl_env_client.rollout.group import EnvGroup, RunEnded, StepResult
from plugrl_env_client.rollout.interfaces import ResultSink
from plugrl_env_client.rollout.settings import LoopSettings
from plugrl_env_client.rollout.signals import raise_swallowed
from plugrl_env_client.timing import Timing

logger = logging.getLogger(__name__)

__all__ = ["LoopSettings", "Rollout", "StepResult"]

ENV_STEPS_TELL_S = 0.05
"""How often the loop adds the env steps taken since the last time to the run's shared budget (the progress line's
count; a lock shared between processes each time), instead of once per batch step."""


class Rollout:
    """Runs a process's env groups until the budget is spent, every env is retired, or the server ends the run."""

    def __init__(self, groups: list[EnvGroup], settings: LoopSettings, budget: Budget, sink: ResultSink) -> None:
        self.groups, self.settings, self.budget, self.sink = groups, settings, budget, sink
        self.timings = [group.timing for group in groups]  # the process's timing is their total
        if len(groups) > 1:  # an episode record carries the process's env steps, not its group's
            timings = self.timings
            for group in groups:
                group.process_env_steps = lambda: sum(t.env_steps for t in timings)
                group.feedback_with_infer = True  # a group asks for actions right after its step
        self._started = time.perf_counter()
        self._last_progress = self._tell_at = time.monotonic()
        self._blocked_s = 0.0  # pipelined: time nothing could step, waiting for a reply
        self._steps_told = 0  # env steps already added to the budget

    def timing(self) -> Timing:
        """The process's timing: its groups' counters and stage times added up. Pipelined, the groups' round trips
        overlap each other and the stepping, so the process's ``infer_wait_s`` is the time it sat waiting for a
        reply with nothing to step (the stage shares then add up to at most 1, as in lockstep)."""
        out = Timing.total(self.timings)
        if len(self.timings) > 1:
            out.infer_wait_s = self._blocked_s
        return out

    def run(self) -> ProcessStatus:
        """Collect until done; returns how the collection ended."""
        self._started = time.perf_counter()
        for group in self.groups:
            group.started = self._started
        try:
            obs = [self._start(group) for group in self.groups]
            if len(self.groups) == 1:
                self._lockstep(self.groups[0], obs.pop())  # handed over: the loop alone holds it now
            else:
                self._pipelined(obs)
        except RunEnded:
            pass
        else:
            for group in self.groups:
                group.flush_feedback()
        finally:
            self._stamp()
            self._tell_env_steps()
            for group in self.groups:
                group.close()
        return self._end_status()

    # ------------------------------------------------------------------------------------------ the loops

    def _lockstep(self, group: EnvGroup, obs: Observation) -> None:
        while not self._done():
            try:
                group.request_actions(obs)
            except ConnectionLost as lost:
                group.reconnect(lost)
                continue
            # The step's observation replaces this one: let go of it first, so at most one batch of each is alive
            # (a batch of camera images is tens of MB).
            del obs
            step = group.step()
            obs = group.finish_episodes(step)
            del step
            if time.monotonic() >= self._tell_at:
                self._report_progress()

    def _pipelined(self, obs: list[Observation]) -> None:
        while not self._done():
            self._ask(obs)
            if not self._step_ready(obs):  # nothing could step: wait for the first reply, on every connection
                waiting = [group.session for group in self.groups if group.awaiting_actions]
                if waiting:
                    blocked = time.perf_counter()
                    waiting[0].wait(waiting[1:])
                    self._blocked_s += time.perf_counter() - blocked
            self._report_progress()

    def _ask(self, obs: list[Observation]) -> None:
        """Every group that needs actions and has no infer on the wire sends one."""
        for g in range(len(self.groups)):
            self._ask_group(g, obs[g])

    def _ask_group(self, g: int, obs: Observation) -> None:
        group = self.groups[g]
        if not group.awaiting_actions and group.needs_actions():
            self._guarded(group.ask_for_actions, g, obs)

    def _step_ready(self, obs: list[Observation]) -> bool:
        """Pick up the replies already in, and step every group that has its actions once; whether any did. A group
        asks for its next actions as soon as it has stepped, before the next group steps: its round trip then
        overlaps that step (asked only once every group had stepped, a server's latency is hidden by nothing)."""
        stepped = False
        for g, group in enumerate(self.groups):
            if group.awaiting_actions:
                self._guarded(group.take_actions, g, 0.0)
            if not group.awaiting_actions and group.can_step() and not self._done():
                step = group.step()
                obs[g] = group.finish_episodes(step)
                stepped = True
                if not self._done():
                    self._ask_group(g, obs[g])
        return stepped

    def _guarded(self, call: Callable[..., object], g: int, *args: Any) -> bool:
        """``call(*args)`` of group ``g``'s exchange; a lost connection is handled here (that group reconnects, or
        the run ends). Returns whether the call went through."""
        try:
            call(*args)
        except ConnectionLost as lost:
            self.groups[g].reconnect(lost)
            return False
        return True

    # ------------------------------------------------------------------------------------------ helpers

    def _start(self, group: EnvGroup) -> Observation:
        group.connect()
        return group.reset_all()

    def _done(self) -> bool:
        """The budget is spent or every env is retired (asked on every iteration: :meth:`_all_retired` in place)."""
        if self.budget.finished(self.settings.process_id):
            return True
        for group in self.groups:
            if not group.idle.all_retired:
                return False
        return True

    def _all_retired(self) -> bool:
        for group in self.groups:  # (a loop, not all(...): this is asked several times per group step)
            if not group.idle.all_retired:
                return False
        return True

    def _end_status(self) -> ProcessStatus:
        if self.budget.exhausted(self.settings.process_id) or self._all_retired():
            return ProcessStatus.FINISHED
        if self.budget.stop.is_set():
            return ProcessStatus.INTERRUPTED
        return ProcessStatus.STOPPED_BY_SERVER

    def _report_progress(self) -> None:
        """Add the env steps taken to the budget every :data:`ENV_STEPS_TELL_S`, and hand the run's writer this
        process's timing every ``progress_period_s`` (so a crash loses little). The lockstep loop calls it only once
        that time has come."""
        now = time.monotonic()
        if now < self._tell_at:
            return
        self._tell_at = now + ENV_STEPS_TELL_S
        raise_swallowed()  # a Ctrl-C that some library's code swallowed still ends the run
        self._tell_env_steps()
        if now - self._last_progress >= self.settings.progress_period_s:
            self._last_progress = now
            self._stamp()
            self.sink.progress(self.settings.process_id, ProcessStatus.RUNNING, self.timing())

    def _tell_env_steps(self) -> None:
        steps = sum(t.env_steps for t in self.timings)
        if steps > self._steps_told:
            self.budget.add_env_steps(steps - self._steps_told)
            self._steps_told = steps

    def _stamp(self) -> None:
        """The collection time so far, on every group's timing (the process's total takes the longest)."""
        elapsed = time.perf_counter() - self._started
        for timing in self.timings:
            timing.collect_time_s = elapsed
