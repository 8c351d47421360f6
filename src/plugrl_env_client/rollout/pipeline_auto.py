"""``--runner.pipeline auto``: how many pipeline groups a process uses, chosen from a short lockstep probe.

Each group is an env object and a connection, so the number is chosen once, before the run collects, and never
changed: a probe steps the whole env batch in lockstep for :data:`PROBE_BATCH_STEPS` batch steps against the run's
server and measures the env's batch step and the time the loop sat waiting for actions. The rule
(:func:`choose_groups`):

* waiting costs at most :data:`WORTH_SPLITTING` of the stepping: lockstep (one group; splitting a batch makes each
  env call cost more per env, and a server that answers at once gains nothing);
* otherwise the fewest groups K that hide the wait: while one group waits, the other K - 1 step, so K groups hide
  a wait per batch step of up to (K - 1) / K of the batch step (the wait per batch step already counts how often a
  chunk ends: a server's round trip every H steps costs 1/H of it);
* at most :data:`MAX_GROUPS`, and only K that divide ``--num-envs`` into whole ``--runner.group-size`` seed groups;
  when none hides the wait, the largest such K.

An env registered ``single_instance=True`` can exist only once per process and is never split.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any

from plugrl_env_client.records import EpisodeRecord, ProcessResult, ProcessStatus
from plugrl_env_client.timing import Timing

PROBE_BATCH_STEPS = 24
"""Batch steps of the probe: three chunks at the usual horizon of 8, so the wait per batch step counts chunk ends."""
PROBE_MAX_S = 20.0
"""The probe ends after this long even when the env or the server is slow (what it measured by then is used)."""
MAX_GROUPS = 4
"""The most groups auto picks: past it each group's batch is small and the per-group costs grow."""
WORTH_SPLITTING = 0.05
"""Waiting per batch step, as a share of the batch step, below which lockstep is kept."""


@dataclasses.dataclass(frozen=True)
class Probe:
    """What the lockstep probe measured: seconds per batch step of the env, seconds waited for actions per batch
    step and per infer, and how many batch steps and infers it took."""

    batch_step_s: float
    wait_per_batch_step_s: float
    round_trip_s: float
    batch_steps: int
    infers: int

    @classmethod
    def of(cls, timing: Timing) -> Probe:
        """The figures of a lockstep rollout's timing (its ``infer_wait_s`` is the whole wait for each reply)."""
        steps, infers = max(timing.batch_steps, 1), max(timing.infer_calls, 1)
        return cls(timing.env_step_s / steps, timing.infer_wait_s / steps, timing.infer_wait_s / infers,
                   timing.batch_steps, timing.infer_calls)

    def to_json(self) -> dict[str, float | int]:
        return {"batch_step_ms": round(self.batch_step_s * 1e3, 3),
                "wait_per_batch_step_ms": round(self.wait_per_batch_step_s * 1e3, 3),
                "round_trip_ms": round(self.round_trip_s * 1e3, 3),
                "batch_steps": self.batch_steps, "infers": self.infers}


def allowed_groups(num_envs: int, group_size: int = 1, single_instance: bool = False,
                   max_groups: int = MAX_GROUPS) -> list[int]:
    """The group counts auto may pick, ascending: 1, 2, 4, ... up to ``max_groups``, each splitting ``num_envs``
    into equal groups of whole seed groups (only 1 for a single-instance env)."""
    if single_instance:
        return [1]
    out, k = [], 1
    while k <= max_groups and k <= num_envs:
        if num_envs % k == 0 and (num_envs // k) % max(group_size, 1) == 0:
            out.append(k)
        k *= 2
    return out or [1]


def choose_groups(probe: Probe, allowed: list[int]) -> tuple[int, str]:
    """The number of groups for ``probe``'s figures among ``allowed`` (ascending, starting at 1), and why, in
    words for the log."""
    step, wait = probe.batch_step_s, probe.wait_per_batch_step_s
    share = wait / step if step > 0 else float("inf")
    if share <= WORTH_SPLITTING or len(allowed) == 1:
        why = (f"waiting is {share:.0%} of a batch step" if share <= WORTH_SPLITTING
               else "no other split of the envs is allowed")
        return 1, why
    for k in allowed[1:]:
        if wait <= (k - 1) / k * step:
            return k, f"{k} groups hide a wait of {share:.0%} of a batch step"
    return allowed[-1], f"the wait ({share:.0%} of a batch step) is more than {allowed[-1]} groups can hide"


class ProbeBudget:
    """The probe's budget: finished after :data:`PROBE_BATCH_STEPS` batch steps of ``timing`` (the probe's one
    group), after ``max_s`` seconds from the first step, or when the run's ``stop`` is set. Its episodes count for
    nothing (the run starts every env afresh after it)."""

    target: int | None = None

    def __init__(self, timing: Timing, batch_steps: int = PROBE_BATCH_STEPS, max_s: float = PROBE_MAX_S,
                 stop: Any = None) -> None:
        self.timing, self.batch_steps, self.max_s = timing, batch_steps, max_s
        self._stop = stop if stop is not None else threading.Event()
        self._deadline: float | None = None

    @property
    def stop(self) -> Any:
        return self._stop

    def claim(self, process_id: int = 0) -> bool:
        return False  # no probe episode is recorded

    def exhausted(self, process_id: int = 0) -> bool:
        return self.timing.batch_steps >= self.batch_steps

    def finished(self, process_id: int = 0) -> bool:
        if self.timing.batch_steps and self._deadline is None:
            self._deadline = time.monotonic() + self.max_s
        return (self.exhausted() or self._stop.is_set()
                or (self._deadline is not None and time.monotonic() > self._deadline))

    def add_env_steps(self, count: int) -> None:
        pass


class ProbeSink:
    """Where the probe's reports go: nowhere (its episodes are not the run's, its timing is read from the group)."""

    def episode(self, record: EpisodeRecord) -> None:
        pass

    def progress(self, process_id: int, status: ProcessStatus, timing: Timing) -> None:
        pass

    def result(self, result: ProcessResult) -> None:
        pass

    def artifacts(self, process_id: int) -> Any:
        raise RuntimeError("the pipeline probe records no files")
