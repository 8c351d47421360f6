"""Live tracking (``--tracking tensorboard``): the run as TensorBoard scalars while it goes on.

Every report of every process reaches the one :class:`~plugrl_env_client.outputs.run_writer.RunWriter` of the
launching process (local processes over their queue, Ray actors through the supervisor, a lockstep process
directly), so a tracker the writer feeds sees the whole run, whatever the launcher. The writer calls it from the
rollout's thread (one local process) or from the launcher's receiving thread, so a call only notes what it got,
under a lock; a timer thread turns the notes into events every :data:`FLUSH_PERIOD_S` seconds and flushes the
event file, and :meth:`Tracker.close` does it a last time.

The scalars, one series each for the whole run, under ``runs/<exp>/tensorboard/``:

* ``episode/return``, ``episode/length``, ``episode/success`` (1 or 0; episodes the env has no success rule for
  are left out): one point per episode, its step the episode's number in the run (1, 2, ... in the order they
  reached the writer), its wall time the moment it did;
* ``episode_by_env_steps/return``, ``episode_by_env_steps/length``, ``episode_by_env_steps/success``: the same
  points with the run's env steps when the episode ended as their step, the x axis of a learning curve. The run's
  count is every process's latest episode count (each record's ``env_steps``) added up, as the report pools them:
  exact at each episode and never going back (a process whose count restarts, a Ray restart, adds from zero
  again). Episodes of several envs that end on the same batch step share a step;
* ``rollout/env_steps_per_s``: the processes' env steps per second, each process over its latest progress
  interval (about 2 s, on its own clock), added up; ``rollout/env_steps``: every process's env steps;
* ``server/infer_round_trip_ms``: the mean wait for an infer's actions (send to decoded reply: the round trip and
  the server's inference) over the processes' latest progress intervals; ``server/reconnects``: reconnects so
  far, every process's.

A resumed run (``--resume``) continues its curves: the episodes of its earlier segments (as the run's writer read
them back) count first, so its episode numbers and env steps go on from where they were, in the same folder.

The rollout and server scalars are taken at each flush that follows a progress report, their step the run's env
steps then. A value that is not finite is not written. Weights & Biases and SwanLab trackers would fit the same
interface; they need an account or a service to test against, so there are none yet.
"""

from __future__ import annotations

import abc
import dataclasses
import logging
import math
import threading
import time
from pathlib import Path
from typing import Any, Literal

from plugrl_env_client.errors import ConfigError
from plugrl_env_client.records import EpisodeRecord
from plugrl_env_client.timing import Timing

logger = logging.getLogger(__name__)

TrackingKind = Literal["none", "tensorboard"]
TENSORBOARD_INSTALL = 'pip install "plugrl-env-client[tensorboard]"'
FLUSH_PERIOD_S = 2.0
"""How often the notes become events and the event file is flushed."""
FOLDER = "tensorboard"
"""The tracker's folder in the run folder."""


class Tracker(abc.ABC):
    """Where the run's writer sends what it receives, for live views of the run. Calls never raise: a tracker
    that cannot write says so in the log and the run goes on."""

    @abc.abstractmethod
    def episode(self, record: EpisodeRecord) -> None:
        """A finished episode of some process."""

    @abc.abstractmethod
    def progress(self, process_id: int, timing: Timing) -> None:
        """A process's timing so far (its counters since it started)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Write and flush what is left; later calls do nothing."""

    @abc.abstractmethod
    def continue_from(self, earlier: list[EpisodeRecord]) -> None:
        """Count ``earlier`` (the episodes of a resumed run's earlier segments, already tracked then) before the
        episodes to come, without writing them again."""


class NoTracker(Tracker):
    """``--tracking none``."""

    def episode(self, record: EpisodeRecord) -> None:
        pass

    def progress(self, process_id: int, timing: Timing) -> None:
        pass

    def close(self) -> None:
        pass

    def continue_from(self, earlier: list[EpisodeRecord]) -> None:
        pass


def require(kind: TrackingKind) -> None:
    """A ConfigError naming the extra when ``kind``'s library is missing (checked before the run starts)."""
    if kind == "tensorboard":
        try:
            import tensorboardX  # noqa: F401
        except ImportError as exc:
            raise ConfigError(f"--tracking tensorboard needs tensorboardX ({exc}): {TENSORBOARD_INSTALL}") from None
    elif kind != "none":
        raise ConfigError(f"--tracking must be 'none' or 'tensorboard', got {kind!r}")


def make_tracker(kind: TrackingKind, run_root: Path) -> Tracker:
    """The tracker ``--tracking`` asks for, writing under ``run_root`` (started: its timer runs)."""
    require(kind)
    if kind == "tensorboard":
        return TensorBoardTracker(run_root / FOLDER)
    return NoTracker()


@dataclasses.dataclass
class _Interval:
    """One process's latest progress interval: what its counters did between its last two reports."""

    env_steps: int = 0
    collect_s: float = 0.0
    infer_calls: int = 0
    infer_wait_s: float = 0.0


class TensorBoardTracker(Tracker):
    """The scalars of the module docstring, written with tensorboardX (extra ``tensorboard``) into ``folder``."""

    def __init__(self, folder: Path, flush_period_s: float = FLUSH_PERIOD_S) -> None:
        from tensorboardX import SummaryWriter

        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        # tensorboardX writes its queue from a thread of its own and flushes that every flush_secs; the queue is
        # large enough that a flush's events never wait for room.
        # An event file of its own, named after the earlier ones (a resumed run's next segment writes beside them,
        # and TensorBoard reads a folder's files in name order; the names hold the second they were made, and two
        # of one second must be two files, in the order they were made).
        self._writer = SummaryWriter(str(folder), max_queue=10_000, flush_secs=max(1, round(flush_period_s)),
                                     filename_suffix=f".{time.time_ns():020d}")
        self._lock = threading.Lock()
        self._episodes: list[tuple[float, EpisodeRecord, int | None]] = []
        self._count = 0
        self._episode_steps: dict[int, int] = {}  # each process's env steps at its latest episode
        self._run_steps = 0  # the run's env steps: those counts added up
        self._steps_before = 0  # env steps of a resumed run's earlier segments
        self._latest: dict[int, Timing] = {}
        self._intervals: dict[int, _Interval] = {}
        self._new_progress = False
        self._skipped = 0
        self._closed = False
        self._failed = False
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._tick, args=(flush_period_s,), name="plugrl-tracking",
                                        daemon=True)
        self._thread.start()

    # ---------------------------------------------------------------------------------- the writer's calls

    def episode(self, record: EpisodeRecord) -> None:
        with self._lock:
            if not self._closed:
                self._episodes.append((time.time(), record, self._count_steps(record)))

    def _count_steps(self, record: EpisodeRecord) -> int | None:
        """The run's env steps when ``record`` ended (None for a record without a count). Called with the lock."""
        if record.env_steps is None:
            return None
        before = self._episode_steps.get(record.process_id, 0)
        self._run_steps += record.env_steps - before if record.env_steps >= before else record.env_steps
        self._episode_steps[record.process_id] = record.env_steps
        return self._run_steps

    def continue_from(self, earlier: list[EpisodeRecord]) -> None:
        with self._lock:
            for record in earlier:
                self._count_steps(record)
            self._count += len(earlier)
            self._episode_steps = {}  # every process of the new segment counts its env steps from zero again
            self._steps_before = self._run_steps

    def progress(self, process_id: int, timing: Timing) -> None:
        with self._lock:
            if self._closed:
                return
            before = self._latest.get(process_id, Timing())
            if timing.env_steps < before.env_steps or timing.collect_time_s < before.collect_time_s:
                before = Timing()  # counters that went back: a process started again (a Ray restart)
            self._latest[process_id] = timing
            self._intervals[process_id] = _Interval(
                timing.env_steps - before.env_steps, timing.collect_time_s - before.collect_time_s,
                timing.infer_calls - before.infer_calls, timing.infer_wait_s - before.infer_wait_s)
            self._new_progress = True

    def close(self) -> None:
        self._done.set()
        if self._thread.is_alive():
            self._thread.join()
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self.flush()
        try:
            self._writer.close()
        except Exception:  # the run's results are safe; a tracker that cannot close is worth a log line
            logger.warning("tracking: could not close the TensorBoard event file in %s", self.folder, exc_info=True)
        if self._skipped:
            logger.info("tracking: %d values that were not finite were left out", self._skipped)

    # ---------------------------------------------------------------------------------- events

    def flush(self) -> None:
        """Turn the notes taken since the last flush into events and flush the event file."""
        with self._lock:
            episodes, self._episodes = self._episodes, []
            first = self._count + 1
            self._count += len(episodes)
            snapshot = self._snapshot() if self._new_progress else None
            self._new_progress = False
        if self._failed:
            return
        try:
            for number, (when, record, run_steps) in enumerate(episodes, start=first):
                values = {"return": record.episode_return, "length": record.length}
                if record.success is not None:
                    values["success"] = float(record.success)
                for name, value in values.items():
                    self._scalar(f"episode/{name}", value, number, when)
                    if run_steps is not None:
                        self._scalar(f"episode_by_env_steps/{name}", value, run_steps, when)
            if snapshot is not None:
                when, step, values = snapshot
                for tag, value in values.items():
                    self._scalar(tag, value, step, when)
            self._writer.flush()
        except Exception as exc:  # a full disk, a folder gone: the run goes on without live tracking
            self._failed = True
            logger.warning("tracking: could not write TensorBoard events to %s (%s: %s); the run goes on without "
                           "them", self.folder, type(exc).__name__, exc)

    def _snapshot(self) -> tuple[float, int, dict[str, float]]:
        """(wall time, run's env steps, the rollout and server scalars) from the processes' latest reports."""
        intervals = list(self._intervals.values())
        steps_per_s = sum(i.env_steps / i.collect_s for i in intervals if i.collect_s > 0 and i.env_steps >= 0)
        calls = sum(i.infer_calls for i in intervals if i.infer_calls > 0 and i.infer_wait_s >= 0)
        wait = sum(i.infer_wait_s for i in intervals if i.infer_calls > 0 and i.infer_wait_s >= 0)
        total = Timing.across_processes(self._latest.values())
        values: dict[str, float] = {"rollout/env_steps_per_s": steps_per_s,
                                    "rollout/env_steps": self._steps_before + total.env_steps,
                                    "server/reconnects": total.reconnects}
        if calls:
            values["server/infer_round_trip_ms"] = 1e3 * wait / calls
        return time.time(), self._steps_before + total.env_steps, values

    def _scalar(self, tag: str, value: Any, step: int, when: float) -> None:
        value = float(value)
        if not math.isfinite(value):
            self._skipped += 1
            return
        self._writer.add_scalar(tag, value, global_step=step, walltime=when)

    def _tick(self, period: float) -> None:
        while not self._done.wait(period):
            self.flush()
