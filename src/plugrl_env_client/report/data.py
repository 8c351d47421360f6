"""A run folder read into typed series: one per process, one pooled over processes, and the summaries beside them.

Everything here is plain numpy: plotting and page-writing read these series and never parse files themselves.
The reader accepts every ``episodes.jsonl`` a run can leave behind: lines from older clients without
``wall_time_s``/``env_steps`` (env steps are then estimated from cumulative episode lengths, and wall-time views
are left out), a last line cut short by a crash (skipped), and folders whose summaries are missing because the
run crashed or is still going (the episodes are then the whole record). Each fallback taken is written down in
:attr:`RunData.notes` so the page can say what it did.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from plugrl_env_client.errors import ConfigError
from plugrl_env_client.outputs.results import MAX_LINE_BYTES, read_episode_lines
from plugrl_env_client.records import EpisodeRecord, finite_or_none

PROC_DIR = re.compile(r"^proc_(\d+)$")
MIN_WINDOW = 5
MAX_WINDOW = 200


@dataclasses.dataclass(frozen=True)
class EpisodeSeries:
    """Finished episodes in the order they ended, as columns.

    ``env_steps`` is the env-step count of the series when each episode ended: the process's own count for a
    process, the run's total for the pooled series. NaN marks what an episode does not have: a return the env made
    non-finite (written as null), a success flag (envs without a success rule write null or nothing), a metric it
    did not report. Means skip them and plotting keeps only finite entries.
    """

    process_ids: np.ndarray
    returns: np.ndarray
    lengths: np.ndarray
    success: np.ndarray
    """1.0 success, 0.0 failure, NaN not judged."""
    terminated: np.ndarray
    truncated: np.ndarray
    env_steps: np.ndarray
    wall_time_s: np.ndarray | None
    metrics: dict[str, np.ndarray]
    instructions: tuple[str | None, ...]

    def __len__(self) -> int:
        return int(self.returns.size)

    @staticmethod
    def empty() -> EpisodeSeries:
        return _series_from_rows([], process_id=0, wall_times=False, steps=None)


@dataclasses.dataclass(frozen=True)
class ProcessRun:
    """One ``rollout/proc_NNN`` folder: its episodes, its summary (None when absent) and what reading them took."""

    process_id: int
    folder: Path
    episodes: EpisodeSeries
    summary: dict[str, Any] | None
    skipped_lines: int
    steps_recorded: bool
    """The lines carry ``env_steps``; otherwise env steps are cumulative episode lengths."""
    wall_time_recorded: bool
    """Every line carries ``wall_time_s``."""
    success_reported: bool
    """Some line carries a true/false ``success`` (envs without a success rule may leave it out)."""


@dataclasses.dataclass(frozen=True)
class SummaryRow:
    """One row of the page's summary table; None renders as n/a."""

    label: str
    status: str
    episodes: int
    mean_return: float | None
    success_rate: float | None
    env_steps_per_s: float | None


@dataclasses.dataclass(frozen=True)
class TimeSplit:
    """Where one process's collection time went: seconds per part, in drawing order, ``other`` last.

    ``other`` is what the named parts leave of ``collect_time_s`` (bookkeeping, episode records, and anything not
    timed); it is never negative.
    """

    process_id: int
    parts: dict[str, float]
    collect_time_s: float


@dataclasses.dataclass(frozen=True)
class RunData:
    root: Path
    config: dict[str, Any] | None
    summary: dict[str, Any] | None
    processes: list[ProcessRun]
    pooled: EpisodeSeries
    success_defined: bool
    """Some episode line carries a success flag and no summary says the success rate is undefined."""
    notes: list[str]

    @property
    def name(self) -> str:
        return self.root.name

    @property
    def env_id(self) -> str | None:
        value = (self.config or {}).get("env_id")
        return str(value) if value is not None else None

    @property
    def segments(self) -> list[dict[str, Any]]:
        """The run's segments, as its summary.json lists them (a run resumed with --resume has several; empty for
        a summary that lists none)."""
        listed = (self.summary or {}).get("segments")
        return [s for s in listed if isinstance(s, dict)] if isinstance(listed, list) else []

    @property
    def steps_recorded(self) -> bool:
        return all(p.steps_recorded for p in self.processes if len(p.episodes))


# ------------------------------------------------------------------------------------------------ numbers


def moving_average(values: np.ndarray, window: int) -> np.ndarray:
    """Trailing mean over the last ``window`` values; the first values average what there is so far.

    Averaging what exists (rather than starting the curve ``window`` episodes late or padding) keeps every point
    defined, so a short series still gets a curve and nothing is NaN.
    """
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        return x.copy()
    sums = np.cumsum(np.concatenate([[0.0], x]))
    ends = np.arange(1, x.size + 1)
    starts = np.maximum(ends - window, 0)
    return (sums[ends] - sums[starts]) / (ends - starts)


def default_window(num_episodes: int) -> int:
    """About 5% of the episodes, kept between 5 and 200 so short runs still smooth and long ones still move."""
    return int(min(MAX_WINDOW, max(MIN_WINDOW, round(0.05 * num_episodes))))


def step_curve(wall_time_s: np.ndarray, env_steps: np.ndarray,
               end: tuple[float, float] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """A process's cumulative env steps against time: (0, 0), each episode end, then ``end`` if later.

    Several episodes of one batch end on the same step with the same count, so equal times collapse to one point
    (the largest count); counts never go down. ``end`` is the summary's (collect_time_s, env_steps), which tells
    how far the process got after its last finished episode.
    """
    t = np.concatenate([[0.0], np.asarray(wall_time_s, np.float64)])
    s = np.concatenate([[0.0], np.asarray(env_steps, np.float64)])
    if end is not None and end[0] > t.max():
        t, s = np.append(t, end[0]), np.append(s, end[1])
    order = np.argsort(t, kind="stable")
    t, s = t[order], np.maximum.accumulate(s[order])
    last_of_each = np.append(t[1:] != t[:-1], True)
    return t[last_of_each], s[last_of_each]


def throughput(times: np.ndarray, steps: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Env steps per second in each bin between ``edges``, from a cumulative (time, steps) curve.

    The curve is interpolated linearly at the bin edges (flat after its last point: a process that ended adds
    nothing), so bins narrower than the gaps between episode ends still get a rate.
    """
    at_edges = np.interp(edges, times, steps)
    widths = np.diff(edges)
    return np.divide(np.diff(at_edges), widths, out=np.zeros(widths.size), where=widths > 0)


def throughput_edges(t_end: float, num_points: int) -> np.ndarray:
    """Bin edges over [0, t_end]: about one bin per three episode ends, between 5 and 60 bins."""
    bins = int(np.clip(num_points // 3, 5, 60))
    return np.linspace(0.0, t_end, bins + 1)


def pool(processes: Sequence[ProcessRun]) -> EpisodeSeries:
    """All processes' episodes as one series.

    Ordered by wall time when every process has it (ties: process id, then line order), otherwise by each
    process's own env-step count. The pooled env-step count is the running sum of each episode's increment of
    its own process's count, i.e. the total of every process's last reported count, which is exact at the
    reported points and never goes down.
    """
    parts = [p.episodes for p in processes if len(p.episodes)]
    if not parts:
        return EpisodeSeries.empty()
    with_time = all(s.wall_time_s is not None for s in parts)
    increments = np.concatenate([np.diff(s.env_steps, prepend=0.0) for s in parts])
    pids = np.concatenate([s.process_ids for s in parts])
    line = np.concatenate([np.arange(len(s)) for s in parts])
    times = np.concatenate([s.wall_time_s for s in parts if s.wall_time_s is not None]) if with_time else None
    key = times if times is not None else np.concatenate([s.env_steps for s in parts])
    order = np.lexsort((line, pids, key))
    names = sorted({name for s in parts for name in s.metrics})
    metrics = {n: np.concatenate([s.metrics.get(n, np.full(len(s), np.nan)) for s in parts])[order] for n in names}
    instructions = tuple(i for s in parts for i in s.instructions)
    return EpisodeSeries(
        process_ids=pids[order],
        returns=np.concatenate([s.returns for s in parts])[order],
        lengths=np.concatenate([s.lengths for s in parts])[order],
        success=np.concatenate([s.success for s in parts])[order],
        terminated=np.concatenate([s.terminated for s in parts])[order],
        truncated=np.concatenate([s.truncated for s in parts])[order],
        env_steps=np.cumsum(increments[order]),
        wall_time_s=times[order] if times is not None else None,
        metrics=metrics,
        instructions=tuple(instructions[i] for i in order),
    )


TIMING_PARTS = (("env step", "env_step_s"), ("infer wait", "infer_wait_s"), ("packing", "infer_obs_pack_s"),
                ("feedback", "feedback_s"), ("reset", "reset_s"))
"""Disjoint stages of a collection cycle in current summaries (``pack_s`` is inside packing and feedback)."""
OLD_TIMING_PARTS = (("env step", "env_step_s"), ("infer wait", "infer_wait_s"), ("packing", "pack_s"),
                    ("reset", "reset_s"))
"""The same from summaries that predate the stage timings."""


def time_split(process_id: int, timing: dict[str, Any]) -> TimeSplit | None:
    """The summary timing of one process as a split of its collection time (None without a positive total)."""
    def seconds(key: str) -> float:
        value = timing.get(key)
        return float(value) if isinstance(value, (int, float)) and math.isfinite(value) and value > 0 else 0.0

    total = seconds("collect_time_s")
    if total <= 0:
        return None
    names = TIMING_PARTS if "infer_obs_pack_s" in timing else OLD_TIMING_PARTS
    parts = {label: seconds(key) for label, key in names}
    parts["other"] = max(total - sum(parts.values()), 0.0)
    return TimeSplit(process_id, parts, total)


# ------------------------------------------------------------------------------------------------ reading


def check_run_folder(root: Path) -> None:
    """Raise ConfigError naming what is missing unless ``root`` looks like a run folder."""
    if not root.exists():
        raise ConfigError(f"{root} does not exist; give a run folder such as runs/<exp-name>")
    if not root.is_dir():
        raise ConfigError(f"{root} is a file, not a run folder; give a folder such as runs/<exp-name>")
    if not (root / "client_config.json").is_file() and not (root / "rollout").is_dir():
        raise ConfigError(
            f"{root} is not a run folder: it has no client_config.json and no rollout/ folder "
            "(give the folder plugrl-run-env-client wrote, runs/<exp-name>)"
        )


def load_run(root: Path) -> RunData:
    """Read a run folder (finished, still going or crashed) into series and summaries."""
    check_run_folder(root)
    notes: list[str] = []
    config = _read_json(root / "client_config.json", notes)
    summary = _read_json(root / "summary.json", notes)
    processes = [_load_process(pid, folder, notes) for pid, folder in _process_folders(root, config)]
    pooled = pool(processes)
    _note_fallbacks(processes, pooled, summary, notes)
    return RunData(root, config, summary, processes, pooled, _success_defined(processes, summary), notes)


def summary_rows(run: RunData) -> list[SummaryRow]:
    """A row per process (from its summary, else from its episodes) and, with several processes, one for all."""
    rows = [_process_row(p) for p in run.processes]
    if len(rows) != 1 or run.summary is not None:
        rows.append(_total_row(run))
    if not run.success_defined:
        rows = [dataclasses.replace(r, success_rate=None) for r in rows]
    return rows


def time_splits(run: RunData) -> list[TimeSplit]:
    splits = (time_split(p.process_id, p.summary.get("timing") or {}) for p in run.processes if p.summary)
    return [s for s in splits if s is not None]


def _process_folders(root: Path, config: dict[str, Any] | None) -> list[tuple[int, Path]]:
    """Every ``proc_NNN`` folder, plus the ones the config's num_procs promises but that were never made."""
    found: dict[int, Path] = {}
    rollout = root / "rollout"
    if rollout.is_dir():
        for child in rollout.iterdir():
            match = PROC_DIR.match(child.name)
            if match and child.is_dir():
                found[int(match.group(1))] = child
    num_procs = (config or {}).get("num_procs")
    if isinstance(num_procs, int) and 0 < num_procs <= 100_000:
        for pid in range(num_procs):
            found.setdefault(pid, rollout / f"proc_{pid:03d}")
    return sorted(found.items())


MAX_JSON_BYTES = 64 << 20
"""The largest summary or config file read (a run's are a few kB); a larger one is left out, with a note."""


def _read_json(path: Path, notes: list[str]) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        size = path.stat().st_size
        if size > MAX_JSON_BYTES:
            notes.append(f"{path} is {size} bytes, more than a run writes (at most {MAX_JSON_BYTES} are read); it is "
                         "left out")
            return None
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        notes.append(f"{path.name} in {path.parent} could not be read ({exc}); it is left out")
        return None
    if not isinstance(data, dict):
        notes.append(f"{path} does not hold a JSON object; it is left out")
        return None
    return data


def _load_process(pid: int, folder: Path, notes: list[str]) -> ProcessRun:
    rows, skipped = _read_episode_lines(folder / "episodes.jsonl", notes)
    wall_times = bool(rows) and all(r["wall_time_s"] is not None for r in rows)
    steps_recorded = bool(rows) and all(r["env_steps"] is not None for r in rows)
    if rows and not steps_recorded and any(r["env_steps"] is not None for r in rows):
        notes.append(f"process {pid}: only some episodes carry env_steps; its env steps are estimated for all")
    steps = np.array([r["env_steps"] for r in rows], np.float64) if steps_recorded else None
    episodes = _series_from_rows(rows, pid, wall_times, steps)
    summary = _read_json(folder / "summary.json", notes)
    success = any(r["success"] is not None for r in rows)
    return ProcessRun(pid, folder, episodes, summary, skipped, steps_recorded, wall_times, success)


def _read_episode_lines(path: Path, notes: list[str]) -> tuple[list[dict[str, Any]], int]:
    """The episodes of an ``episodes.jsonl`` (read by the one rule of what an episode line is,
    :func:`~plugrl_env_client.outputs.results.read_episode_lines`), normalized, and how many lines were skipped:
    the whole lines that hold no episode and a torn last line (blank lines are no lines to skip). A line over
    :data:`~plugrl_env_client.outputs.results.MAX_LINE_BYTES` is skipped unread, with a note naming the file and
    the line: no line makes the report hold more than that."""
    lines = read_episode_lines(path)
    if lines.too_long:
        shown = ", ".join(map(str, lines.too_long[:5])) + (
            f" and {len(lines.too_long) - 5} more" if len(lines.too_long) > 5 else "")
        notes.append(f"{path}: line{'s' if len(lines.too_long) > 1 else ''} {shown} longer than {MAX_LINE_BYTES} "
                     "bytes (an episode's line is a few hundred) skipped unread")
    return [_episode_row(record) for record in lines.records], len(lines.not_episodes) + bool(lines.torn_bytes)


def _episode_row(record: EpisodeRecord) -> dict[str, Any]:
    ret, wall, steps = (finite_or_none(v) for v in (record.episode_return, record.wall_time_s, record.env_steps))
    return {
        "return": math.nan if ret is None else ret,
        "length": record.length,
        "success": record.success,
        "terminated": record.terminated,
        "truncated": record.truncated,
        "wall_time_s": wall if wall is not None and wall >= 0 else None,
        "env_steps": steps if steps is not None and steps >= 0 else None,
        "metrics": {name: v for name, v in record.metrics.items() if finite_or_none(v) is not None},
        "instruction": record.instruction if isinstance(record.instruction, str) else None,
    }


def _series_from_rows(rows: list[dict[str, Any]], process_id: int, wall_times: bool,
                      steps: np.ndarray | None) -> EpisodeSeries:
    n = len(rows)
    lengths = np.array([r["length"] for r in rows], np.int64)
    names = sorted({name for r in rows for name in r["metrics"]})
    metrics = {name: np.array([finite_or_none(r["metrics"].get(name)) if name in r["metrics"] else np.nan
                               for r in rows], np.float64) for name in names}
    return EpisodeSeries(
        process_ids=np.full(n, process_id, np.int64),
        returns=np.array([r["return"] for r in rows], np.float64),
        lengths=lengths,
        success=np.array([np.nan if r["success"] is None else float(r["success"]) for r in rows], np.float64),
        terminated=np.array([r["terminated"] for r in rows], bool),
        truncated=np.array([r["truncated"] for r in rows], bool),
        env_steps=np.maximum.accumulate(steps) if steps is not None and n else np.cumsum(lengths).astype(np.float64),
        wall_time_s=np.array([r["wall_time_s"] for r in rows], np.float64) if wall_times else None,
        metrics=metrics,
        instructions=tuple(r["instruction"] for r in rows),
    )


def _success_defined(processes: Sequence[ProcessRun], summary: dict[str, Any] | None) -> bool:
    """Success is plotted only when the env reports it: a summary with episodes says it does not by
    ``has_success_rule: false`` (a per-process summary writes PlugRL's 0.0 rate then, not a null), and older
    summaries without that key by a null rate."""
    summaries = [s for s in [summary, *(p.summary for p in processes)] if s is not None]
    if any(_no_success_rule(s) and s.get("completed_episodes") for s in summaries):
        return False
    return any(p.success_reported for p in processes)


def _no_success_rule(summary: dict[str, Any]) -> bool:
    if "has_success_rule" in summary:
        return summary["has_success_rule"] is False
    return _overall_means(summary).get("mean_success_rate", 0) is None


def _note_fallbacks(processes: Sequence[ProcessRun], pooled: EpisodeSeries, summary: dict[str, Any] | None,
                    notes: list[str]) -> None:
    with_episodes = [p for p in processes if len(p.episodes)]
    if not with_episodes:
        notes.append("no episode has finished yet: there is nothing to plot")
    estimated = [p.process_id for p in with_episodes if not p.steps_recorded]
    if estimated:
        notes.append(f"no env_steps in the episodes of {_procs(estimated)}: env steps are estimated as cumulative "
                     "episode lengths, which leaves out the steps of episodes still running")
    no_time = [p.process_id for p in with_episodes if not p.wall_time_recorded]
    if no_time:
        notes.append(f"no wall_time_s in the episodes of {_procs(no_time)}: the plots against wall time and the "
                     "throughput over time are left out")
    elif with_episodes:
        notes.append("wall times are seconds since each process started collecting")
    skipped = {p.process_id: p.skipped_lines for p in processes if p.skipped_lines}
    if skipped:
        notes.append("unreadable episode lines skipped (a line still being written or cut short by a crash, or not "
                     "an episode): "
                     + ", ".join(f"{n} in process {pid}" for pid, n in sorted(skipped.items())))
    missing = [p.process_id for p in processes if p.summary is None]
    if missing:
        notes.append(f"no summary.json for {_procs(missing)} (the run is still going, or crashed before writing "
                     "one): the figures and table rows come from episodes.jsonl alone")
    if summary is None:
        notes.append("no summary.json for the run yet: its totals come from the episodes")
    elif isinstance(summary.get("completed_episodes"), int) and summary["completed_episodes"] != len(pooled):
        notes.append(f"summary.json counts {summary['completed_episodes']} episodes, the episodes files hold "
                     f"{len(pooled)} (summaries are refreshed periodically while a run goes on)")


def _procs(pids: Sequence[int]) -> str:
    return ("process " if len(pids) == 1 else "processes ") + ", ".join(str(p) for p in pids)


def _overall_means(summary: dict[str, Any]) -> dict[str, Any]:
    """The means over every episode: ``all_episodes`` in current summaries (whose top-level means cover only the
    latest ``metric_window`` episodes), the top level in older ones."""
    exact = summary.get("all_episodes")
    return exact if isinstance(exact, dict) else summary


def _status(summary: dict[str, Any]) -> str:
    status, error = str(summary.get("status", "unknown")), summary.get("error")
    return f"{status}: {error}" if error and str(error) not in status else status


def _summary_row(label: str, s: dict[str, Any]) -> SummaryRow:
    means = _overall_means(s)
    rate = None if _no_success_rule(s) else finite_or_none(means.get("mean_success_rate"))
    return SummaryRow(label, _status(s), int(s.get("completed_episodes") or 0), finite_or_none(means.get("mean_return")),
                      rate, finite_or_none((s.get("timing") or {}).get("effective_fps")))


def _process_row(p: ProcessRun) -> SummaryRow:
    label = f"process {p.process_id}"
    if p.summary is not None:
        return _summary_row(label, p.summary)
    return _row_from_episodes(label, "no summary", p.episodes, [p])


def _total_row(run: RunData) -> SummaryRow:
    if run.summary is not None:
        return _summary_row("all", run.summary)
    return _row_from_episodes("all", "no summary", run.pooled, run.processes)


def _row_from_episodes(label: str, status: str, episodes: EpisodeSeries, processes: Sequence[ProcessRun]) -> SummaryRow:
    """A table row from episodes alone; env-steps/s needs every process's steps and wall times."""
    ran = [p for p in processes if len(p.episodes)]
    rate: float | None = None
    if ran and all(p.steps_recorded and p.episodes.wall_time_s is not None for p in ran):
        longest = max(float(np.max(p.episodes.wall_time_s)) for p in ran if p.episodes.wall_time_s is not None)
        steps = sum(float(p.episodes.env_steps[-1]) for p in ran)
        rate = steps / longest if longest > 0 else None
    return SummaryRow(label, status, len(episodes), finite_mean(episodes.returns), finite_mean(episodes.success), rate)


def finite_mean(values: np.ndarray) -> float | None:
    """The mean of the finite entries, None when there are none."""
    finite = values[np.isfinite(values)]
    return float(finite.mean()) if finite.size else None


@dataclasses.dataclass(frozen=True)
class InstructionRow:
    instruction: str
    episodes: int
    mean_return: float | None
    success_rate: float | None


def instruction_rows(series: EpisodeSeries, success_defined: bool, limit: int) -> tuple[list[InstructionRow], int]:
    """The ``limit`` most frequent instructions with their episode count, mean return and success rate, and how
    many distinct instructions there are in all."""
    groups: dict[str, list[int]] = {}
    for i, text in enumerate(series.instructions):
        if text is not None:
            groups.setdefault(text, []).append(i)
    ranked = sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))[:limit]
    rows = [InstructionRow(text, len(idx), finite_mean(series.returns[idx]),
                           finite_mean(series.success[idx]) if success_defined else None) for text, idx in ranked]
    return rows, len(groups)
