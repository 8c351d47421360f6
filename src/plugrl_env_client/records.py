"""The records every layer shares: a finished episode, running statistics over episodes, how a process ended.

Plain types at the bottom of the package (they import nothing of it): the rollout makes :class:`EpisodeRecord`
values, the launchers pass them on, the run's writer (``outputs/run_writer.py``) writes them to ``episodes.jsonl``;
both the client's summaries and the reference server's episode log accumulate them in an :class:`EpisodeStats`; a
rollout process ends with a :class:`ProcessResult`. :func:`finite_or_none` is the rule every JSON file the package
writes follows for numbers.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any

DEFAULT_METRIC_WINDOW = 100


@dataclasses.dataclass(frozen=True)
class EpisodeRecord:
    """One finished episode, as one line of ``episodes.jsonl``.

    ``success`` is None when the env has no success rule (no ``best_reward_threshold_for_success`` and no
    ``info["success"]``): such episodes are left out of success rates instead of counting as failures.
    """

    env_index: int
    episode_return: float
    length: int
    success: bool | None
    terminated: bool
    truncated: bool
    process_id: int = 0
    seed: int | None = None
    """The seed the episode started from, when known (every episode of an env that takes per-env seeds; an env's
    first episode otherwise)."""
    wall_time_s: float | None = None
    """Seconds since the process started collecting, when the episode ended."""
    env_steps: int | None = None
    """The process's env-step count when the episode ended (the x axis of a learning curve)."""
    metrics: Mapping[str, float] = dataclasses.field(default_factory=dict)
    """Per-episode aggregates of the env's ``info["metrics"]``."""
    instruction: str | None = None
    """The env's ``env_instruction`` for this episode, when it gave one."""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "env_index": self.env_index,
            "return": finite_or_none(self.episode_return),
            "length": self.length,
            "success": self.success,
            "terminated": self.terminated,
            "truncated": self.truncated,
            "process_id": self.process_id,
            "seed": self.seed,
            "wall_time_s": None if self.wall_time_s is None else round(self.wall_time_s, 6),
            "env_steps": self.env_steps,
        }
        if self.metrics:
            out["metrics"] = {k: finite_or_none(v) for k, v in self.metrics.items()}
        if self.instruction is not None:
            out["instruction"] = self.instruction
        return out

    @classmethod
    def from_json(cls, row: Mapping[str, Any]) -> EpisodeRecord:
        """Read back a line of ``episodes.jsonl`` (older lines lack the later fields; they come back as None)."""
        success = row.get("success")
        return cls(
            env_index=int(row["env_index"]),
            episode_return=float(row["return"]) if row["return"] is not None else math.nan,
            length=int(row["length"]),
            success=None if success is None else bool(success),
            terminated=bool(row.get("terminated", False)),
            truncated=bool(row.get("truncated", False)),
            process_id=int(row.get("process_id") or 0),
            seed=row.get("seed"),
            wall_time_s=row.get("wall_time_s"),
            env_steps=row.get("env_steps"),
            metrics={str(k): float(v) for k, v in (row.get("metrics") or {}).items() if v is not None},
            instruction=row.get("instruction"),
        )


class NotAnEpisode(ValueError):
    """A line of ``episodes.jsonl`` that holds no episode record; the message says what is wrong with it."""


def episode_of_line(line: str | bytes) -> EpisodeRecord | None:
    """The episode a whole line of ``episodes.jsonl`` holds: the one rule of what an episode line is, followed by
    everything that reads or counts the file's episodes (a resumed run's loader and its finished check, the
    summaries built from them, the report). A blank line holds none (None); any other line must be a JSON object
    with an ``env_index`` (an int >= 0), a ``return`` (a number, or null for one the env made non-finite) and a
    ``length`` (an int >= 0), and whatever else it has must read back as :meth:`EpisodeRecord.from_json` reads it,
    or it is :class:`NotAnEpisode` (garbage, a line of another file, a line cut short and joined to the next)."""
    if not line.strip():
        return None
    try:
        row = json.loads(line)
    except ValueError as exc:  # not JSON (UnicodeDecodeError included)
        raise NotAnEpisode(f"not JSON: {exc}") from None
    if not isinstance(row, dict):
        raise NotAnEpisode(f"a JSON {type(row).__name__}, not an object")
    for key in ("env_index", "return", "length"):
        if key not in row:
            raise NotAnEpisode(f"it has no {key!r}")
        value = row[key]
        if key == "return":
            wrong = value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)))
        else:
            wrong = isinstance(value, bool) or not isinstance(value, int) or value < 0
        if wrong:
            raise NotAnEpisode(f"its {key!r} is {json.dumps(value)}")
    try:
        return EpisodeRecord.from_json(row)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise NotAnEpisode(f"{type(exc).__name__}: {exc}") from None


class EpisodeStats:
    """Exact running totals over finished episodes, plus a window of the latest ``window`` of them.

    Means are exact (sums, not running averages), so processes combine without rounding; a mean of nothing, or a
    success rate over episodes that have no success rule, is None (written as JSON null).
    """

    def __init__(self, window: int = DEFAULT_METRIC_WINDOW) -> None:
        self.window = max(int(window), 1)
        self.count = 0
        self.return_sum = 0.0
        self.length_sum = 0
        self.success_count = 0
        self.success_judged = 0
        self.metric_sums: dict[str, float] = {}
        self.metric_counts: dict[str, int] = {}
        self.recent: deque[tuple[float, int, bool | None]] = deque(maxlen=self.window)

    def add(self, episode_return: float, length: int, success: bool | None,
            metrics: Mapping[str, float] | None = None) -> None:
        """Account one finished episode. A non-finite return or metric adds nothing to the sums but the episode
        still counts, so means treat it as 0 (the env checks stop such values before they get here)."""
        self.count += 1
        if math.isfinite(episode_return):
            self.return_sum += episode_return
        self.length_sum += int(length)
        if success is not None:
            self.success_judged += 1
            self.success_count += int(success)
        for name, value in (metrics or {}).items():
            if math.isfinite(value):
                self.metric_sums[name] = self.metric_sums.get(name, 0.0) + value
                self.metric_counts[name] = self.metric_counts.get(name, 0) + 1
        self.recent.append((episode_return, int(length), success))

    def judge_later(self, failures: int) -> None:
        """Count ``failures`` episodes already added with success None as judged failures after all: for a
        producer that learns only later that their env has a success rule (the reference server, which cannot
        tell a False success flag from an env without a rule until a success shows the rule). The window keeps
        them as unjudged."""
        self.success_judged += max(int(failures), 0)

    @classmethod
    def pooled(cls, parts: Iterable[EpisodeStats], window: int) -> EpisodeStats:
        """Several processes' statistics as one: the sums added, and every part's window kept (the pooled window
        holds each process's latest ``window`` episodes, as PlugRL pools them)."""
        parts = list(parts)
        out = cls(window)
        out.recent = deque(maxlen=max(1, out.window * len(parts)))
        for part in parts:
            out.count += part.count
            out.return_sum += part.return_sum
            out.length_sum += part.length_sum
            out.success_count += part.success_count
            out.success_judged += part.success_judged
            for name, value in part.metric_sums.items():
                out.metric_sums[name] = out.metric_sums.get(name, 0.0) + value
                out.metric_counts[name] = out.metric_counts.get(name, 0) + part.metric_counts[name]
            out.recent.extend(part.recent)
        return out

    def window_means(self) -> dict[str, float | None]:
        """Mean return, length and success rate over the window (PlugRL's ``mean_*``); None over nothing."""
        judged = [s for _, _, s in self.recent if s is not None]
        return {
            "mean_return": _ratio(sum(r for r, _, _ in self.recent if math.isfinite(r)), len(self.recent)),
            "mean_length": _ratio(sum(length for _, length, _ in self.recent), len(self.recent)),
            "mean_success_rate": _ratio(sum(bool(s) for s in judged), len(judged)),
        }

    def add_record(self, record: EpisodeRecord) -> None:
        self.add(record.episode_return, record.length, record.success, record.metrics)

    def all_episodes(self) -> dict[str, Any]:
        """Exact means over every episode, and the sums they come from."""
        return {
            "mean_return": _ratio(self.return_sum, self.count),
            "mean_length": _ratio(self.length_sum, self.count),
            "mean_success_rate": _ratio(self.success_count, self.success_judged),
            "return_sum": finite_or_none(self.return_sum),
            "length_sum": self.length_sum,
            "success_count": self.success_count,
            "success_judged": self.success_judged,
        }

    def metric_means(self) -> dict[str, float | None]:
        return {name: _ratio(self.metric_sums[name], self.metric_counts[name]) for name in sorted(self.metric_sums)}


class ProcessStatus(str, enum.Enum):
    """Where a rollout process is, or how it ended."""

    STARTING = "starting"
    RUNNING = "running"
    FINISHED = "finished"  # the episode target was reached
    STOPPED_BY_SERVER = "stopped by server"  # the server ended the run
    INTERRUPTED = "interrupted"  # Ctrl-C / SIGTERM, or stopped because another process failed
    FAILED = "failed"

    @property
    def ended(self) -> bool:
        return self not in (ProcessStatus.STARTING, ProcessStatus.RUNNING)


@dataclasses.dataclass(frozen=True)
class ProcessResult:
    """What a rollout process reports to the launcher when it ends."""

    process_id: int
    status: ProcessStatus
    error: str | None = None
    """The user-facing message of a failure (the traceback is in the log file)."""
    signum: int | None = None
    """The signal that interrupted the process, if one did."""
    recorder: dict[str, Any] | None = None
    """What the episode recorder wrote and dropped (its report), when it recorded."""


def _ratio(total: float, count: int) -> float | None:
    if count <= 0:
        return None
    value = total / count
    return value if math.isfinite(value) else None


def finite_or_none(value: object) -> float | None:
    """``value`` as a float when it is a finite real number (a bool counts as 0 or 1), else None.

    What every JSON the package writes holds in place of NaN, Infinity, or something that is no number at all
    (a line of ``episodes.jsonl`` read back, a summary written by another version).
    """
    if value is None or isinstance(value, (str, bytes)):
        return None
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None
