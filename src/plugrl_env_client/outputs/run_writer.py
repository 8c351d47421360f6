"""The one writer of a run folder's results: episodes, per-process summaries and the aggregate.

Rollout processes do not write summaries themselves: they hand finished episodes and periodic timing snapshots to
the process that started them (directly when it is the same process, over a queue otherwise, over Ray from other
machines), and this writer turns them into files. So the per-process ``summary.json`` files and the aggregate
``summary.json`` are always written together, from the same numbers; and a process that crashes loses nothing it
already reported: its episodes are on disk and its statistics live here.

A per-process ``summary.json`` is PlugRL's file: a superset of PlugRL's client's, and PlugRL's keys keep PlugRL's
types, so a script written for PlugRL's file reads ours (``exp_name``, ``process_id``, ``total_processes``,
``completed_episodes``, ``total_episode_count``, ``metric_window`` as ints, and ``mean_return`` /
``mean_success_rate`` over the latest ``metric_window`` episodes as floats: 0.0 over no episode, and a success rate
of 0.0 when no episode was judged by a success rule, with ``has_success_rule`` beside it to tell which). Our own
keys follow our rule, null for what is undefined: exact means over every episode under ``all_episodes``, the
timing, and the whole aggregate ``summary.json``, whose ``mean_success_rate`` is null without a success rule.
The per-process ``manifest.json`` has PlugRL's keys too (``num_envs``, ``metric_window``, and ``args``: the
recorder's settings), and the command line that started the run.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import IO, Any

from plugrl_env_client.outputs.recorder import DirectorySink
from plugrl_env_client.outputs.run_dir import RunDir, write_json_atomic
from plugrl_env_client.outputs.tracking import NoTracker, Tracker
from plugrl_env_client.records import DEFAULT_METRIC_WINDOW, EpisodeRecord, EpisodeStats, ProcessResult, ProcessStatus
from plugrl_env_client.timing import Timing

logger = logging.getLogger(__name__)


class _ProcessState:
    """What the writer knows about one rollout process."""

    def __init__(self, run_dir: RunDir, process_id: int, window: int) -> None:
        self.process_id = process_id
        self.dir = run_dir.proc_dir(process_id)
        self.stats = EpisodeStats(window)
        self.timing = Timing()
        self.status = ProcessStatus.STARTING
        self.error: str | None = None
        self.recorder: dict[str, Any] | None = None
        self.artifacts = DirectorySink(self.dir)
        self._episodes: IO[str] | None = None

    def append(self, line: str) -> None:
        if self._episodes is None:
            self.dir.mkdir(parents=True, exist_ok=True)
            self._episodes = open(self.dir / "episodes.jsonl", "a", buffering=1)
        self._episodes.write(line + "\n")
        self._episodes.flush()

    def close(self) -> None:
        if self._episodes is not None:
            self._episodes.close()
            self._episodes = None


class RunWriter:
    """Collects what every process of a run reports and writes ``runs/<exp>/`` from it. Thread-safe.

    It is the rollout's :class:`~plugrl_env_client.rollout.interfaces.ResultSink`: a process in this one reports
    to it directly, others through the launcher that delivers their reports to it.

    ``num_envs`` (each process's env count), ``recorder_args`` (the recorder's settings, by PlugRL's names) and
    ``command_line`` (default: this process's ``sys.argv``) go into each process's ``manifest.json``. ``tracker``
    (live tracking, :mod:`~plugrl_env_client.outputs.tracking`) gets every episode and progress report as it comes,
    and is closed with the writer.
    """

    def __init__(self, run_dir: RunDir, exp_name: str, num_procs: int,
                 metric_window: int = DEFAULT_METRIC_WINDOW, *, num_envs: int | None = None,
                 recorder_args: Mapping[str, Any] | None = None, command_line: Sequence[str] | None = None,
                 tracker: Tracker | None = None) -> None:
        self.run_dir = run_dir
        self.exp_name = exp_name
        self.num_procs = num_procs
        self.metric_window = metric_window
        self.num_envs = num_envs
        self.recorder_args = dict(recorder_args or {})
        self.command_line = list(sys.argv if command_line is None else command_line)
        self.tracker: Tracker = tracker or NoTracker()
        self._lock = threading.Lock()
        self._procs = {pid: _ProcessState(run_dir, pid, metric_window) for pid in range(num_procs)}
        for state in self._procs.values():  # every process has its files from the start, episodes or not
            state.dir.mkdir(parents=True, exist_ok=True)
            (state.dir / "episodes.jsonl").touch()

    # ------------------------------------------------------------------------------ what processes report

    def episode(self, record: EpisodeRecord) -> None:
        """One finished episode: a flushed line of its process's ``episodes.jsonl``, and into the statistics."""
        line = json.dumps(record.to_json(), allow_nan=False)
        with self._lock:
            state = self._procs[record.process_id]
            state.append(line)
            state.stats.add_record(record)
        self.tracker.episode(record)  # live tracking: a note, written by the tracker's own thread

    def progress(self, process_id: int, status: ProcessStatus, timing: Timing) -> None:
        """A process's latest timing, and its status while it runs (how it ended comes with :meth:`result`)."""
        with self._lock:
            state = self._procs[process_id]
            state.timing = timing
            if not status.ended and not state.status.ended:
                state.status = status
        self.tracker.progress(process_id, timing)  # live tracking

    def artifacts(self, process_id: int) -> DirectorySink:
        """The process's folder, for its recorder's files (written whole and atomically, or appended)."""
        return self._procs[process_id].artifacts

    def result(self, result: ProcessResult) -> None:
        """How a process ended: its own report, or the launcher's reading of its exit. A failure already reported
        with its reason stays (the launcher's "exited with code 1" says less than the process's own message)."""
        with self._lock:
            state = self._procs[result.process_id]
            if result.recorder is not None:
                state.recorder = result.recorder
            if state.status is ProcessStatus.FAILED and state.error:
                return
            state.status, state.error = result.status, result.error

    # ------------------------------------------------------------------------------ files

    @property
    def completed_episodes(self) -> int:
        with self._lock:
            return sum(s.stats.count for s in self._procs.values())

    def write_summaries(self) -> dict[str, Any]:
        """Write every process's ``summary.json`` and the aggregate, from the same numbers; returns the aggregate."""
        with self._lock:
            per_process = [self._process_summary(s) for s in self._procs.values()]
            for state, summary in zip(self._procs.values(), per_process):
                write_json_atomic(state.dir / "summary.json", summary)
            aggregate = self._aggregate(list(self._procs.values()))
            write_json_atomic(self.run_dir.summary, aggregate)
        return aggregate

    def close(self) -> dict[str, Any]:
        """Write the final summaries and each process's ``manifest.json``, close the episode files; returns the
        aggregate."""
        summary = self.write_summaries()
        with self._lock:
            for state in self._procs.values():
                state.close()
                write_json_atomic(state.dir / "manifest.json", self._manifest(state))
        self.tracker.close()  # live tracking: its last events
        return summary

    def _manifest(self, state: _ProcessState) -> dict[str, Any]:
        """The files the process wrote (relative to its folder), the recorder's report, and what PlugRL's manifest
        holds: the process's env count, the metric window and the recorder's settings (``args``)."""
        files = sorted(str(p.relative_to(state.dir)) for p in state.dir.rglob("*")
                       if p.is_file() and not p.name.startswith(".") and p.name != "manifest.json")
        return {"exp_name": self.exp_name, "process_id": state.process_id, "total_processes": self.num_procs,
                "num_envs": self.num_envs, "metric_window": self.metric_window, "args": self.recorder_args,
                "command_line": self.command_line, "files": [*files, "manifest.json"], "recorder": state.recorder}

    def unfinished(self) -> list[int]:
        """Processes that have not reported how they ended."""
        with self._lock:
            return [pid for pid, s in self._procs.items() if not s.status.ended]

    def failures(self) -> dict[int, str]:
        with self._lock:
            return {pid: s.error or "failed" for pid, s in self._procs.items() if s.status is ProcessStatus.FAILED}

    # ------------------------------------------------------------------------------ summaries

    def _process_summary(self, state: _ProcessState) -> dict[str, Any]:
        return {
            "exp_name": self.exp_name,
            "process_id": state.process_id,
            "total_processes": self.num_procs,
            "status": state.status.value,
            "error": state.error,
            **_with_plugrl_types(_statistics(self.metric_window, [state.stats])),
            "timing": state.timing.to_json(),
        }

    def _aggregate(self, states: list[_ProcessState]) -> dict[str, Any]:
        statuses = {s.process_id: s.status for s in states}
        failed = sorted(pid for pid, status in statuses.items() if status is ProcessStatus.FAILED)
        return {
            "exp_name": self.exp_name,
            "total_processes": self.num_procs,
            "status": ProcessStatus.FAILED.value if failed else _overall(statuses.values()),
            "failed_processes": failed,
            "process_status": {str(pid): status.value for pid, status in sorted(statuses.items())},
            "errors": {str(s.process_id): s.error for s in states if s.error},
            **_statistics(self.metric_window, [s.stats for s in states]),
            "timing": Timing.across_processes(s.timing for s in states).to_json(),
        }


def _statistics(window: int, parts: list[EpisodeStats]) -> dict[str, Any]:
    """Episode statistics of one process (one part) or pooled over processes: exact sums, then means.

    ``mean_return`` / ``mean_length`` / ``mean_success_rate`` are over the latest ``metric_window`` episodes of each
    process (pooled for the aggregate), as PlugRL's client reports them; ``all_episodes`` holds the exact means over
    every episode and the sums they come from; ``metrics`` the mean of each per-episode metric;
    ``has_success_rule`` whether some episode was judged by a success rule (false until one is).
    """
    pooled = EpisodeStats.pooled(parts, window)
    return {
        "completed_episodes": pooled.count,
        "total_episode_count": pooled.count,
        "metric_window": window,
        "window_episodes": len(pooled.recent),
        **pooled.window_means(),
        "has_success_rule": pooled.success_judged > 0,
        "all_episodes": pooled.all_episodes(),
        "metrics": pooled.metric_means(),
    }


PLUGRL_FLOATS = ("mean_return", "mean_success_rate")
"""The means PlugRL's client writes as floats whatever the episodes were (0.0 over none)."""


def _with_plugrl_types(statistics: dict[str, Any]) -> dict[str, Any]:
    """``statistics`` for PlugRL's file: PlugRL's means as floats, 0.0 where ours are null (``completed_episodes``
    and ``has_success_rule`` say which 0.0 means nothing to average)."""
    return {k: (0.0 if v is None else v) if k in PLUGRL_FLOATS else v for k, v in statistics.items()}


def _overall(statuses: Iterable[ProcessStatus]) -> str:
    values = set(statuses)
    if len(values) == 1:
        return values.pop().value
    if values & {ProcessStatus.RUNNING, ProcessStatus.STARTING}:
        return ProcessStatus.RUNNING.value
    return "mixed"
