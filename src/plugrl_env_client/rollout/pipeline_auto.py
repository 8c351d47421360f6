"""``--runner.pipeline auto``: how many pipeline groups a process uses, chosen from a short lockstep probe.

Each group is an env object and a connection, so the number is chosen once, before the run collects, and never
changed: a probe steps the whole env batch in lockstep for :data:`PROBE_BATCH_STEPS` batch steps against the run's
server and measures, per batch step, the env's step (E) and the client's own work around it (O: building, sending
and reading messages, resets), the round trip of an infer (R), and how often envs ask for actions. The rule
(:func:`estimated_s`) estimates the time per batch step of every env with K groups of m envs each:

    S = E + O * (1 + K) / 2        T(K) = S + q(m) * max(0, R - (K - 1) / K * S)

S is the stepping of all groups, each paying the client's work per step (about half of lockstep's work is per step,
half per env row, so K groups cost (1 + K) / 2 of it). While one group waits for its reply, the other K - 1 step,
which hides (K - 1) / K of S; q(m) is the chance that a group asks for actions at its step in a run's steady state.
A probe starts every env afresh, so its chunks start together and it sees fewer exchanges than a running rollout
will: once episodes have ended at different steps, chunks drift apart and each env starts one at a step with
chance p (the probe's env rows asked per env and batch step, counted from its first infer), so a group of m envs
asks with chance 1 - (1 - p)^(m / g), g being ``--runner.group-size``: the envs of one seed group restart
together and ask together, one unit of g. That is q(m) when the probe saw some envs' episodes end while others went on;
otherwise (no episode ended, or all ended together, as fixed-length episodes do) chunks stay together and every
group asks when the lockstep did.

Auto keeps lockstep unless some split saves :data:`WORTH_SPLITTING` of T(1), so a server that answers at once, or
an env so cheap that the client's own work dominates, stays in lockstep. Among the splits that do save it, auto
takes the one with the fewest groups whose T is within that share of the least: splits a probe cannot tell apart
(its estimates move by a few percent between runs) go to fewer groups, each of which is an env object and a
connection. Auto never changes ``--runner.align-chunks``: a split leaves every env's chunk schedule as it is (an env
asks when its own chunk ends), while aligning chunks would make it depend on the other envs. K is one of 1, 2, 4 (at most
:data:`MAX_GROUPS`) that divides ``--num-envs`` into whole ``--runner.group-size`` seed groups. (E is taken as
splitting evenly over the groups; a vectorised simulator's fixed cost per call counts in O.)

An env registered ``single_instance=True`` can exist only once per process and is never split.
"""

from __future__ import annotations

import collections
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
"""The share of lockstep's estimated time per batch step an option must save to be taken; also the margin by which
a simpler option is taken over a faster one (when its time times ``1 - WORTH_SPLITTING`` is at most the least)."""


@dataclasses.dataclass(frozen=True)
class Probe:
    """What a lockstep probe measured, per batch step: the env's step, the wait for actions, the client's own
    work around them; the wait per infer; how many batch steps and infers it measured. And how often its envs asked
    for actions, counted from its start (its first infer included): infers per batch step, and env rows asked per env
    and batch step (idle envs included); its envs; whether episodes ended at different steps for different envs
    (chunks drift apart in a running rollout); its seed groups' size."""

    batch_step_s: float
    wait_per_batch_step_s: float
    round_trip_s: float
    batch_steps: int
    infers: int
    overhead_s: float = 0.0
    num_envs: int = 0
    rows_per_env_step: float = 0.0
    chunks_drift: bool = False
    asks_per_batch_step: float | None = None
    """None: the measured window's infers per batch step."""
    seed_group: int = 1
    """Envs that restart together (``--runner.group-size``) and so ask for actions together: one unit of asking."""

    @classmethod
    def between(cls, before: Timing, after: Timing, wall_s: float, chunks_drift: bool = False,
                start: Timing | None = None) -> Probe:
        """The figures of a lockstep rollout's timing from ``before`` to ``after``, ``wall_s`` apart (its
        ``infer_wait_s`` is the whole wait for each reply); the asks counted from ``start`` when given (a window
        that starts after the first step leaves out the first infer, and so counts too few)."""
        steps = after.batch_steps - before.batch_steps
        infers = after.infer_calls - before.infer_calls
        env = after.env_step_s - before.env_step_s
        wait = after.infer_wait_s - before.infer_wait_s
        per = max(steps, 1)
        envs = round((after.env_steps + after.idle_env_steps - before.env_steps - before.idle_env_steps) / per)
        counted = before if start is None else start
        slots = after.env_steps + after.idle_env_steps - counted.env_steps - counted.idle_env_steps
        asks = (after.infer_calls - counted.infer_calls) / max(after.batch_steps - counted.batch_steps, 1)
        return cls(env / per, wait / per, wait / max(infers, 1), steps, infers, max(0.0, wall_s - env - wait) / per,
                   envs, (after.infer_rows - counted.infer_rows) / max(slots, 1), chunks_drift,
                   asks_per_batch_step=asks)

    @property
    def asks(self) -> float:
        """Infers per batch step of the lockstep probe (at most 1)."""
        asks = self.infers / max(self.batch_steps, 1) if self.asks_per_batch_step is None else self.asks_per_batch_step
        return min(1.0, asks)

    def asking(self, envs: float) -> float:
        """The chance that a group of ``envs`` of this probe's envs asks for actions at its step, in a run's steady
        state (the module docstring's q(m))."""
        if not self.chunks_drift or self.num_envs <= 0:
            return self.asks  # chunks stay together: every group asks when the lockstep did
        return 1.0 - (1.0 - min(1.0, self.rows_per_env_step)) ** (envs / max(self.seed_group, 1))

    def to_json(self) -> dict[str, Any]:
        return {"batch_step_ms": round(self.batch_step_s * 1e3, 3),
                "wait_per_batch_step_ms": round(self.wait_per_batch_step_s * 1e3, 3),
                "client_per_batch_step_ms": round(self.overhead_s * 1e3, 3),
                "round_trip_ms": round(self.round_trip_s * 1e3, 3),
                "batch_steps": self.batch_steps, "infers": self.infers, "num_envs": self.num_envs,
                "asks_per_batch_step": round(self.asks, 4), "rows_per_env_step": round(self.rows_per_env_step, 4),
                "chunks_drift": self.chunks_drift, "seed_group": self.seed_group}


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


def estimated_s(probe: Probe, groups: int, work_s: float | None = None) -> float:
    """Estimated seconds per batch step of every env with ``groups`` groups (the module's T(K)); ``work_s`` is the
    client's work per lockstep batch step when known better than this probe measured it."""
    work = probe.overhead_s if work_s is None else work_s
    stepping = probe.batch_step_s + work * (1 + groups) / 2
    hidden = (groups - 1) / groups * stepping
    envs = probe.num_envs / groups if probe.num_envs else 0.0
    return stepping + probe.asking(envs) * max(0.0, probe.round_trip_s - hidden)


def choose_split(probe: Probe, allowed: list[int]) -> tuple[int, str]:
    """The number of groups among ``allowed`` (ascending, starting at 1), and why, in words for the log."""
    if probe.batch_steps == 0:  # the run ended (or was stopped) before the probe stepped: nothing says to split
        return 1, "the probe took no step"
    lockstep = estimated_s(probe, 1)
    options = [(estimated_s(probe, k), k) for k in allowed]
    limit = (1 - WORTH_SPLITTING) * lockstep
    saving = [o for o in options if o[0] <= limit and o[1] != 1] if lockstep > 0 else []
    if not saving:
        if len(options) == 1:
            return 1, "no other split is allowed"
        return 1, f"no split saves {WORTH_SPLITTING:.0%} of lockstep's {lockstep * 1e3:.3g} ms per batch step"
    least, fastest = min(saving)
    best, groups = next(o for o in saving if o[0] * (1 - WORTH_SPLITTING) <= least)
    why = f"about {best * 1e3:.3g} ms per batch step instead of lockstep's {lockstep * 1e3:.3g} ms"
    if least < best:
        why += f"; {fastest} groups at {least * 1e3:.3g} ms is within {WORTH_SPLITTING:.0%}"
    return groups, why


class ProbeBudget:
    """The probe's budget: finished after :data:`PROBE_BATCH_STEPS` batch steps of ``timing`` (the probe's one
    group), after ``max_s`` seconds from the first step, or when the run's ``stop`` is set. Its episodes count for
    nothing (the run starts every env afresh after it). Asked on every loop iteration, it notes the timing after
    the first batch step and at the end: :meth:`probe` measures times between them (connecting and the first reset
    left out) and counts asks from the start. It notes at which batch step each episode ends (:meth:`claim`): some
    envs' episodes ending while others go on is what makes chunks drift apart."""

    target: int | None = None

    def __init__(self, timing: Timing, batch_steps: int = PROBE_BATCH_STEPS, max_s: float = PROBE_MAX_S,
                 stop: Any = None, seed_group: int = 1) -> None:
        self.timing, self.batch_steps, self.max_s = timing, batch_steps, max_s
        self.seed_group = seed_group
        self.ended: collections.Counter[int] = collections.Counter()  # episodes ended, by batch step
        self._start = dataclasses.replace(timing)
        self._stop = stop if stop is not None else threading.Event()
        self._first: tuple[float, Timing] | None = None
        self._last: tuple[float, Timing] | None = None

    @property
    def stop(self) -> Any:
        return self._stop

    def claim(self, process_id: int = 0) -> bool:
        self.ended[self.timing.batch_steps] += 1
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
            return Probe(0.0, 0.0, 0.0, 0, 0, seed_group=self.seed_group)
        measured = Probe.between(self._first[1], self._last[1], self._last[0] - self._first[0], start=self._start)
        drift = any(count < measured.num_envs for count in self.ended.values())
        return dataclasses.replace(measured, chunks_drift=drift, seed_group=self.seed_group)


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
