"""``--runner.pipeline auto``: how many pipeline groups a process uses, chosen from a short lockstep probe.

Each group is an env object and a connection, so the number is chosen once, before the run collects, and never
changed: a probe steps the whole env batch in lockstep for :data:`PROBE_BATCH_STEPS` batch steps against the run's
server and measures, per batch step, the env's step (E), the time the loop sat waiting for actions (W: a round trip
every chunk, so it already counts the horizon) and the client's own work around them (O: building, sending and
reading messages, resets). The rule (:func:`choose_groups`) estimates the time per batch step of every env with K
groups:

    T(1) = E + O + W        T(K) = E + K * O + max(0, W - (K - 1) / K * (E + K * O))

Each group pays the client's work once per its step (K * O), and while one group waits, the other K - 1 step, which
hides up to (K - 1) / K of the stepping. Unless ``--runner.align-chunks`` is given, a second probe runs with chunks
aligned at half the server's horizon: envs whose episodes end at different steps otherwise ask for actions at
different steps, so aligned chunks mean fewer exchanges per batch step (less W and O), and each K is estimated
both ways. Auto takes the (K, align) with the least T, but keeps plain lockstep unless it saves at least
:data:`WORTH_SPLITTING` of T(1): a server that answers at once with chunks that stay together, or an env so cheap
that the client's own work dominates, stays in lockstep. K is one of 1, 2, 4 (at most :data:`MAX_GROUPS`) that divides ``--num-envs`` into
whole ``--runner.group-size`` seed groups. (E is taken as splitting evenly over the groups; a vectorised simulator's
fixed cost per call counts in O.)

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
"""The share of lockstep's time per batch step a split must save to be taken."""


@dataclasses.dataclass(frozen=True)
class Probe:
    """What the lockstep probe measured, per batch step: the env's step, the wait for actions, the client's own
    work around them; the wait per infer; how many batch steps and infers it measured."""

    batch_step_s: float
    wait_per_batch_step_s: float
    round_trip_s: float
    batch_steps: int
    infers: int
    overhead_s: float = 0.0

    @classmethod
    def between(cls, before: Timing, after: Timing, wall_s: float) -> Probe:
        """The figures of a lockstep rollout's timing from ``before`` to ``after``, ``wall_s`` apart (its
        ``infer_wait_s`` is the whole wait for each reply)."""
        steps = after.batch_steps - before.batch_steps
        infers = after.infer_calls - before.infer_calls
        env = after.env_step_s - before.env_step_s
        wait = after.infer_wait_s - before.infer_wait_s
        per = max(steps, 1)
        return cls(env / per, wait / per, wait / max(infers, 1), steps, infers, max(0.0, wall_s - env - wait) / per)

    def to_json(self) -> dict[str, float | int]:
        return {"batch_step_ms": round(self.batch_step_s * 1e3, 3),
                "wait_per_batch_step_ms": round(self.wait_per_batch_step_s * 1e3, 3),
                "client_per_batch_step_ms": round(self.overhead_s * 1e3, 3),
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


def estimated_s(probe: Probe, groups: int) -> float:
    """Estimated seconds per batch step of every env with ``groups`` groups (the module's T(K))."""
    env, work, wait = probe.batch_step_s, probe.overhead_s, probe.wait_per_batch_step_s
    if groups == 1:
        return env + work + wait
    stepping = env + groups * work
    return stepping + max(0.0, wait - (groups - 1) / groups * stepping)


def choose_split(probe: Probe, allowed: list[int], aligned: Probe | None = None, align: int | None = None
                 ) -> tuple[int, int | None, str]:
    """The number of groups among ``allowed`` (ascending, starting at 1), the ``--runner.align-chunks`` to set
    with it (None: the flag as given), and why, in words for the log. ``aligned`` is a second probe run with chunks
    aligned at ``align``: with it each split is also estimated aligned, lockstep included (aligned chunks end
    together, so there are fewer exchanges per batch step to wait for and to do)."""
    if probe.batch_steps == 0:  # the run ended (or was stopped) before the probe stepped: nothing says to split
        return 1, None, "the probe took no step"
    lockstep = estimated_s(probe, 1)
    options: list[tuple[float, int, int | None]] = [(estimated_s(probe, k), k, None) for k in allowed]
    if aligned is not None and aligned.batch_steps and align is not None:
        options += [(estimated_s(aligned, k), k, align) for k in allowed]
    best, groups, chosen = min(options, key=lambda o: (o[0], o[1], o[2] is not None))
    if (groups, chosen) == (1, None) or best > (1 - WORTH_SPLITTING) * lockstep:
        if len(options) == 1:
            return 1, None, "no other split is allowed"
        what = "no split" if len(options) == len(allowed) else "neither a split nor aligned chunks"
        return 1, None, f"{what} saves {WORTH_SPLITTING:.0%} of lockstep's {lockstep * 1e3:.3g} ms per batch step"
    return groups, chosen, f"about {best * 1e3:.3g} ms per batch step instead of lockstep's {lockstep * 1e3:.3g} ms"


class ProbeBudget:
    """The probe's budget: finished after :data:`PROBE_BATCH_STEPS` batch steps of ``timing`` (the probe's one
    group), after ``max_s`` seconds from the first step, or when the run's ``stop`` is set. Its episodes count for
    nothing (the run starts every env afresh after it). Asked on every loop iteration, it notes the timing after
    the first batch step and at the end: :meth:`probe` measures between them (connecting and the first reset left
    out)."""

    target: int | None = None

    def __init__(self, timing: Timing, batch_steps: int = PROBE_BATCH_STEPS, max_s: float = PROBE_MAX_S,
                 stop: Any = None) -> None:
        self.timing, self.batch_steps, self.max_s = timing, batch_steps, max_s
        self._stop = stop if stop is not None else threading.Event()
        self._first: tuple[float, Timing] | None = None
        self._last: tuple[float, Timing] | None = None

    @property
    def stop(self) -> Any:
        return self._stop

    def claim(self, process_id: int = 0) -> bool:
        return False  # no probe episode is recorded

    def exhausted(self, process_id: int = 0) -> bool:
        return self.timing.batch_steps >= self.batch_steps

    def finished(self, process_id: int = 0) -> bool:
        now = time.perf_counter()
        if self.timing.batch_steps and self._first is None:
            self._first = (now, dataclasses.replace(self.timing))
        done = (self.exhausted() or self._stop.is_set()
                or (self._first is not None and now - self._first[0] > self.max_s))
        if done and self._last is None and self._first is not None:
            self._last = (now, dataclasses.replace(self.timing))
        return done

    def add_env_steps(self, count: int) -> None:
        pass

    def probe(self) -> Probe:
        """The figures from the first batch step to the end (none measured: a probe of no step)."""
        if self._first is None or self._last is None:
            return Probe(0.0, 0.0, 0.0, 0, 0)
        return Probe.between(self._first[1], self._last[1], self._last[0] - self._first[0])


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
