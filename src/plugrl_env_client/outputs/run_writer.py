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
timing, the recorder's counts under ``recorder`` (episodes recorded, dropped because its writer was behind, ...:
null for a process that recorded nothing or has not ended; summed over the processes in the aggregate), and the
whole aggregate ``summary.json``, whose ``mean_success_rate`` is null without a success rule.
The per-process ``manifest.json`` has PlugRL's keys too (``num_envs``, ``metric_window``, and ``args``: the
recorder's settings), and the command line that started the run.

A write the disk cannot take (full, read-only, gone) fails the run once, with one message (:attr:`RunWriter.failure`):
the callbacks given to :meth:`RunWriter.when_failed` stop the run, an episode line cut short is cut back to the
last whole one, and nothing more is appended; the run's space reserve is given back so that the summaries and
manifests, which only count what is on disk, are still written.

A run is one or more *segments*: it is started once, and each ``--resume`` after it was stopped (in any way)
continues it in a new segment. A writer made with ``resume=True`` reads what the stopped segments left
(:func:`stopped_episodes`): every episode line of each ``episodes.jsonl`` counts once, by the one rule of what an
episode line is (:func:`~plugrl_env_client.records.episode_of_line`: a blank line is none, a line that is neither
refuses the resume; a torn last line, a write a kill cut short, is cut off), and the statistics, the live tracker and the episode counts per process and per env (which tell the rollout where each env
continues) start from them; the summaries' ``timing`` adds this segment's to the earlier ones' (a killed segment's
as its last summary recorded it). ``summary.json`` and the manifests list the segments (``segments``: when each started
and ended, its episodes, how it ended; a segment whose launcher was killed before writing its outputs shows
``killed`` and the last time its summary was written).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import os
import sys
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from plugrl_env_client.errors import ConfigError, OutputError
from plugrl_env_client.outputs.recording.sinks import DirectorySink
from plugrl_env_client.outputs.results import EpisodeLines, read_episode_lines
from plugrl_env_client.outputs.run_dir import (
    RunDir,
    RunLock,
    SpaceReserve,
    describe_write_error,
    finite_json,
    with_plugrl_types,
    write_json_atomic,
    write_text_in_place,
)
from plugrl_env_client.outputs.tracking import NoTracker, Tracker
from plugrl_env_client.records import DEFAULT_METRIC_WINDOW, EpisodeRecord, EpisodeStats, ProcessResult, ProcessStatus
from plugrl_env_client.redaction import redact_argv, redact_text
from plugrl_env_client.timing import Timing

logger = logging.getLogger(__name__)

_EPISODE_LINE = json.JSONEncoder(allow_nan=False)
"""Writes an episode's line (``json.dumps(..., allow_nan=False)`` would build an encoder for each one)."""


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
        self.episodes = run_dir.episodes_file(process_id)
        self._fd: int | None = None
        self._size = 0  # bytes of whole lines in episodes.jsonl
        self.env_episodes: dict[int, int] = {}
        """Episodes of each env index in earlier segments of a resumed run."""
        self.timing_before = Timing()
        """The timing of earlier segments of a resumed run (a killed one's as its summary last recorded it)."""

    def run_timing(self) -> Timing:
        """The process's timing over the whole run: earlier segments' and this one's."""
        return Timing.in_sequence([self.timing_before, self.timing])

    def load(self, num_envs: int | None) -> list[EpisodeRecord]:
        """The episodes earlier segments wrote (:func:`stopped_episodes`, in order), into the statistics; a torn
        last line is cut off the file."""
        with contextlib.suppress(OSError, ValueError, AttributeError):
            self.timing_before = Timing.from_json(json.loads((self.dir / "summary.json").read_text()).get("timing"))
        lines = stopped_episodes(self.episodes, self.process_id, num_envs)
        if lines.torn_bytes:
            os.truncate(self.episodes, self.episodes.stat().st_size - lines.torn_bytes)
            logger.info("%s: cut its torn last line (%d bytes a stop cut short)", self.episodes, lines.torn_bytes)
        records = lines.records
        for record in records:
            self.stats.add_record(record)
            self.env_episodes[record.env_index] = self.env_episodes.get(record.env_index, 0) + 1
        return records

    def append(self, line: str) -> None:
        """``line`` at the end of episodes.jsonl, whole or not at all: a write the disk cannot take is cut back to
        the last whole line (which needs no space), and raises."""
        data = (line + "\n").encode()
        if self._fd is None:
            self.dir.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.episodes, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
            self._size = os.fstat(self._fd).st_size
        try:
            written = 0
            while written < len(data):
                written += os.write(self._fd, data[written:])
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, self._size)
            raise
        self._size += len(data)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def stopped_episodes(path: Path, process_id: int, num_envs: int | None) -> EpisodeLines:
    """What a stopped run left in process ``process_id``'s ``episodes.jsonl`` (``path``), read by the one rule of
    what an episode line is (:func:`~plugrl_env_client.outputs.results.read_episode_lines`); changes nothing. A
    whole line that holds no episode, or an episode of another process or of an env the run does not have (of
    ``num_envs``, when given), is a :class:`ConfigError` naming the line: a run is resumed only from episodes it
    can count."""
    lines = read_episode_lines(path)
    if lines.not_episodes:
        number, why = lines.not_episodes[0]
        raise ConfigError(f"cannot resume: line {number} of {path} is not an episode record ({why}); delete that "
                          "line, then --resume again")
    for number, record in lines.episodes:
        if record.process_id != process_id or (num_envs is not None and not 0 <= record.env_index < num_envs):
            raise ConfigError(f"cannot resume: line {number} of {path} is an episode of process "
                              f"{record.process_id}, env {record.env_index}, which this run does not have; delete "
                              "that line, then --resume again")
    return lines


class RunWriter:
    """Collects what every process of a run reports and writes ``runs/<exp>/`` from it. Thread-safe.

    It is the rollout's :class:`~plugrl_env_client.rollout.interfaces.ResultSink`: a process in this one reports
    to it directly, others through the launcher that delivers their reports to it.

    ``num_envs`` (each process's env count), ``recorder_args`` (the recorder's settings, by PlugRL's names) and
    ``command_line`` (default: this process's ``sys.argv``; its secrets redacted) go into each process's
    ``manifest.json``. ``tracker``
    (live tracking, :mod:`~plugrl_env_client.outputs.tracking`) gets every episode and progress report as it comes,
    and is closed with the writer. ``resume``: continue the run the folder holds (see the module docstring).
    ``lock``: the run folder's :class:`~plugrl_env_client.outputs.run_dir.RunLock`, released when the writer closes.
    """

    def __init__(self, run_dir: RunDir, exp_name: str, num_procs: int,
                 metric_window: int = DEFAULT_METRIC_WINDOW, *, num_envs: int | None = None,
                 recorder_args: Mapping[str, Any] | None = None, command_line: Sequence[str] | None = None,
                 tracker: Tracker | None = None, resume: bool = False, lock: RunLock | None = None) -> None:
        self.run_dir = run_dir
        self.exp_name = exp_name
        self.notes: dict[str, Any] = {}
        """Choices the run made as it started (``pipeline``: what ``--runner.pipeline auto`` chose), written into
        the run's summary."""
        self.num_procs = num_procs
        self.metric_window = metric_window
        self.num_envs = num_envs
        self.recorder_args = dict(recorder_args or {})
        self.command_line = redact_argv(sys.argv if command_line is None else command_line)
        self.tracker: Tracker = tracker or NoTracker()
        self._lock = threading.RLock()
        self._procs = {pid: _ProcessState(run_dir, pid, metric_window) for pid in range(num_procs)}
        self._failure: str | None = None
        self._on_failure: list[Callable[[], object]] = []
        self._reserve = SpaceReserve(run_dir.root / RESERVE_NAME, reserve_bytes(num_procs))
        self._run_lock = lock
        earlier: list[EpisodeRecord] = []
        for state in self._procs.values():  # every process has its files from the start, episodes or not
            state.dir.mkdir(parents=True, exist_ok=True)
            if resume:
                earlier += state.load(num_envs)
            state.episodes.touch()
        self._before = len(earlier)  # episodes of earlier segments
        self._segments = self._earlier_segments() if resume else []
        self._segments.append({"segment": len(self._segments) + 1, "started": _now(), "ended": None,
                               "status": ProcessStatus.STARTING.value, "episodes": 0, "updated": _now()})
        if earlier:
            self.tracker.continue_from(earlier)
        self._reserve.create()

    def _earlier_segments(self) -> list[dict[str, Any]]:
        """The segments the stopped run's ``summary.json`` lists (one of unknown times for a folder whose summary
        lists none), the last one's episodes counted from the lines on disk, and marked ``killed`` when its
        launcher died before writing its outputs."""
        try:
            listed = json.loads(self.run_dir.summary.read_text(encoding="utf-8")).get("segments")
        except (OSError, ValueError, AttributeError):
            listed = None
        segments = [dict(s) for s in listed if isinstance(s, dict)] if isinstance(listed, list) else []
        if not segments:
            segments = [{"segment": 1, "started": None, "ended": None, "status": "killed", "episodes": 0,
                         "updated": None}]
        last = segments[-1]
        if last.get("ended") is None:
            last["ended"], last["status"] = last.get("updated"), "killed"
        earlier = sum(int(s.get("episodes") or 0) for s in segments[:-1])
        last["episodes"] = max(0, self._before - earlier)
        return segments

    # ------------------------------------------------------------------------------ what processes report

    def episode(self, record: EpisodeRecord) -> None:
        """One finished episode: a line of its process's ``episodes.jsonl``, and into the statistics. Raises
        :class:`~plugrl_env_client.errors.OutputError` once the run folder cannot be written (the episode is not
        counted: the summaries count what is on disk)."""
        line = _EPISODE_LINE.encode(record.to_json())
        with self._lock:
            if self._failure is not None:
                raise OutputError(self.failure_message())
            state = self._procs[record.process_id]
            try:
                state.append(line)
            except OSError as exc:
                raise self._fail(exc, state.episodes) from None
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

    def artifacts(self, process_id: int) -> _GuardedFiles:
        """The process's folder, for its recorder's files (written whole and atomically, or appended; a file the
        disk cannot take fails the run as an episode line would)."""
        return _GuardedFiles(self._procs[process_id].artifacts, self)

    def result(self, result: ProcessResult) -> None:
        """How a process ended: its own report, or the launcher's reading of its exit. A failure already reported
        with its reason stays (the launcher's "exited with code 1" says less than the process's own message)."""
        with self._lock:
            state = self._procs[result.process_id]
            if result.recorder is not None:
                state.recorder = result.recorder
            if state.status is ProcessStatus.FAILED and state.error:
                return
            # An error's text may come from any library (a header it quotes, a URL): no secret reaches the files.
            state.status, state.error = result.status, None if result.error is None else redact_text(result.error)
            if self._failure is not None and result.status is not ProcessStatus.FAILED:  # stopped by the failure
                state.status, state.error = ProcessStatus.FAILED, self.failure_message()

    # ------------------------------------------------------------------------------ a folder that cannot be written

    @property
    def failure(self) -> str | None:
        """What made the run folder unwritable ("no space left on device in <folder> (writing <file>)"), if
        something did."""
        return self._failure

    def failure_message(self) -> str:
        return (f"{self._failure}: the run stopped there; every episode written before is whole in its "
                "episodes.jsonl and counted in summary.json. Free some space or pick another --output-dir, and start "
                "a new run")

    def when_failed(self, callback: Callable[[], object]) -> None:
        """Call ``callback`` (once, from the thread that hit it) when the run folder cannot be written."""
        self._on_failure.append(callback)

    def _fail(self, exc: OSError, path: Path) -> OutputError:
        """Note the first failure, give the space reserve back for the summaries, stop the run; the error to
        raise. Called with the lock held."""
        if self._failure is None:
            self._failure = describe_write_error(exc, self.run_dir.root, path)
            self._reserve.release()
            logger.debug("the run folder cannot be written: %s", self._failure, exc_info=exc)
            for callback in self._on_failure:
                try:
                    callback()
                except Exception:  # stopping is best effort here; the failure is recorded whatever happens
                    logger.debug("a failure callback raised", exc_info=True)
        return OutputError(self.failure_message())

    def guarded(self, write: Callable[[], None], path: Path) -> None:
        """``write()`` of a file of the run folder: refused once it failed, and its failure is the run's."""
        with self._lock:
            if self._failure is not None:
                raise OutputError(self.failure_message())
        try:
            write()
        except OSError as exc:
            with self._lock:
                raise self._fail(exc, path) from None

    # ------------------------------------------------------------------------------ files

    @property
    def completed_episodes(self) -> int:
        with self._lock:
            return sum(s.stats.count for s in self._procs.values())

    def episodes_per_process(self) -> list[int]:
        """Episodes each process has on disk (those of earlier segments, for a resumed run, at its start)."""
        with self._lock:
            return [s.stats.count for s in self._procs.values()]

    def episodes_per_env(self, process_id: int) -> tuple[int, ...]:
        """Episodes each env of ``process_id`` completed in earlier segments: where its episode numbering (and so
        its seeds) continues. Empty for a run that is not resumed or whose envs have none yet."""
        counts = self._procs[process_id].env_episodes
        if not counts:
            return ()
        return tuple(counts.get(i, 0) for i in range(max(self.num_envs or 0, max(counts) + 1)))

    @property
    def segments(self) -> list[dict[str, Any]]:
        """The run's segments so far, this one last (copies)."""
        with self._lock:
            return [dict(s) for s in self._segments]

    def write_summaries(self) -> dict[str, Any]:
        """Write every process's ``summary.json`` and the aggregate, from the same numbers; returns the aggregate."""
        with self._lock:
            per_process = [self._process_summary(s) for s in self._procs.values()]
            for state, summary in zip(self._procs.values(), per_process):
                self._write_json(state.dir / "summary.json", summary)
            aggregate = self._aggregate(list(self._procs.values()))
            current = self._segments[-1]
            current.update(status=aggregate["status"], updated=_now(),
                           episodes=aggregate["completed_episodes"] - self._before)
            aggregate["segments"] = [dict(s) for s in self._segments]
            self._write_json(self.run_dir.summary, aggregate)
        return aggregate

    def close(self) -> dict[str, Any]:
        """Write the final summaries and each process's ``manifest.json``, close the episode files, give the space
        reserve back, release the run folder's lock; returns the aggregate."""
        with self._lock:
            self._segments[-1]["ended"] = _now()
        summary = self.write_summaries()
        with self._lock:
            for state in self._procs.values():
                state.close()
                self._write_json(state.dir / "manifest.json", self._manifest(state))
            self._reserve.release()
        self.tracker.close()  # live tracking: its last events
        if self._run_lock is not None:
            self._run_lock.release()
        return summary

    def _write_json(self, path: Path, data: Any) -> bool:
        """``data`` to ``path`` atomically; when the disk cannot take it, once more with the reserve given back,
        then in place (if it fits the file's blocks). Whether it was written. Called with the lock held."""
        try:
            write_json_atomic(path, data)
            return True
        except OSError as exc:
            self._fail(exc, path)
        text = json.dumps(finite_json(data), indent=2, allow_nan=False) + "\n"
        for attempt in (lambda: write_json_atomic(path, data), lambda: write_text_in_place(path, text)):
            try:
                attempt()
                return True
            except OSError:
                continue
        logger.debug("could not write %s", path, exc_info=True)
        return False

    def _manifest(self, state: _ProcessState) -> dict[str, Any]:
        """The files the process wrote (relative to its folder), the recorder's report, and what PlugRL's manifest
        holds: the process's env count, the metric window, the recorder's settings (``args``, ``video_fps`` a float
        as PlugRL has it), ``effective_episode_freq`` (the K this process recorded with: 0 when it records nothing,
        as with ``thread0_only`` in a process other than 0) and ``full_rollout_video`` (false: the client writes
        a video per recorded episode, never PlugRL's one video of every env of the whole rollout)."""
        files = sorted(str(p.relative_to(state.dir)) for p in state.dir.rglob("*")
                       if p.is_file() and not p.name.startswith(".") and p.name != "manifest.json")
        args = dict(self.recorder_args)
        if isinstance(args.get("video_fps"), (int, float)):
            args["video_fps"] = float(args["video_fps"])
        silent = bool(args.get("thread0_only")) and state.process_id != 0
        effective = 0 if silent else int(args.get("episode_freq") or 0)
        return {"exp_name": self.exp_name, "process_id": state.process_id, "total_processes": self.num_procs,
                "num_envs": self.num_envs, "metric_window": self.metric_window, "args": args,
                "effective_episode_freq": effective, "full_rollout_video": False,
                "command_line": self.command_line, "files": [*files, "manifest.json"], "recorder": state.recorder,
                "segments": [dict(s) for s in self._segments]}

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
            **with_plugrl_types(_statistics(self.metric_window, [state.stats])),
            "timing": state.run_timing().to_json(),
            "recorder": recorder_counts(state.recorder),
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
            "timing": Timing.across_processes(s.run_timing() for s in states).to_json(),
            "recorder": _summed([c for s in states if (c := recorder_counts(s.recorder)) is not None]),
            **self.notes,
        }


def _now() -> str:
    """The wall time now, UTC, ISO 8601 to the second (segments' times)."""
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


RESERVE_NAME = ".plugrl-space-reserve"
"""The run's space reserve, in its folder (deleted when the run ends, or when the disk fills)."""


def reserve_bytes(num_procs: int) -> int:
    """Space enough to write every summary and manifest once more with the disk full: a few blocks per file."""
    return (8 + 4 * num_procs) * 4096


class _GuardedFiles:
    """A process's folder for its recorder's files, through the writer's guard."""

    def __init__(self, files: DirectorySink, writer: RunWriter) -> None:
        self._files, self._writer = files, writer

    def write_bytes(self, relpath: str, data: bytes) -> None:
        self._writer.guarded(lambda: self._files.write_bytes(relpath, data), self._files.path(relpath))

    def append_bytes(self, relpath: str, data: bytes) -> None:
        self._writer.guarded(lambda: self._files.append_bytes(relpath, data), self._files.path(relpath))


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


def recorder_counts(report: Mapping[str, Any] | None) -> dict[str, int] | None:
    """The counts of a process's recorder report (``episodes_recorded``, ``episodes_dropped`` because its writer was
    behind, ...) for the summaries, which keep the numbers and leave the file list to the manifest; None for a
    process that recorded nothing or has not ended yet (the report comes with how it ended)."""
    if report is None:
        return None
    return {k: v for k, v in report.items() if isinstance(v, int) and not isinstance(v, bool)}


def _summed(counts: list[dict[str, int]]) -> dict[str, int] | None:
    """Each count added up over the processes that have one; None when none has."""
    if not counts:
        return None
    total: dict[str, int] = {}
    for part in counts:
        for key, value in part.items():
            total[key] = total.get(key, 0) + value
    return total


def _overall(statuses: Iterable[ProcessStatus]) -> str:
    values = set(statuses)
    if len(values) == 1:
        return values.pop().value
    if values & {ProcessStatus.RUNNING, ProcessStatus.STARTING}:
        return ProcessStatus.RUNNING.value
    return "mixed"
