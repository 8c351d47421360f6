"""Per-process results: one ``episodes.jsonl`` line per finished episode, and ``summary.json`` files.

Episodes are appended and flushed as they finish, so a crash loses nothing already collected. A summary carries
exact sums next to the means, which is what lets :func:`aggregate` combine processes without rounding.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections import deque
from pathlib import Path
from typing import Any, Protocol

from plugrl_env_client.outputs.run_dir import write_json_atomic

METRIC_WINDOW = 100
_SUMMED_TIMING = ("env_steps", "batch_steps", "infer_calls", "feedback_calls", "infer_wait_s", "env_step_s",
                  "pack_s", "reset_s", "bytes_sent", "bytes_received", "reconnects")


class EpisodeRecord(Protocol):
    """What the recorder needs of a finished episode (the rollout's records have it)."""

    episode_return: float
    length: int
    success: bool

    def to_json(self) -> dict[str, Any]: ...


@dataclasses.dataclass(frozen=True)
class _Episode:
    """A finished episode read back from ``episodes.jsonl``."""

    episode_return: float
    length: int
    success: bool


class EpisodeStats:
    """Exact running totals of finished episodes, plus a window of the latest ones."""

    def __init__(self) -> None:
        self.count = 0
        self.return_sum = 0.0
        self.length_sum = 0
        self.success_count = 0
        self.window: deque[EpisodeRecord | _Episode] = deque(maxlen=METRIC_WINDOW)

    def add(self, record: EpisodeRecord | _Episode) -> None:
        self.count += 1
        self.return_sum += record.episode_return
        self.length_sum += record.length
        self.success_count += int(record.success)
        self.window.append(record)

    def summary(self, process_id: int, timing: dict[str, Any], status: str) -> dict[str, Any]:
        window = list(self.window)
        return {
            "process_id": process_id,
            "status": status,
            **_means(self.count, self.return_sum, self.length_sum, self.success_count),
            "metric_window": {
                "size": len(window),
                **_means(len(window), sum(r.episode_return for r in window), sum(r.length for r in window),
                         sum(r.success for r in window)),
            },
            "totals": {"return_sum": self.return_sum, "length_sum": self.length_sum, "success_count": self.success_count},
            "timing": timing,
        }


class ProcessRecorder:
    """Writes one process's ``episodes.jsonl`` (a flushed line per episode) and its ``summary.json``."""

    def __init__(self, proc_dir: Path, process_id: int) -> None:
        self.proc_dir = proc_dir
        self.process_id = process_id
        proc_dir.mkdir(parents=True, exist_ok=True)
        self._episodes = open(proc_dir / "episodes.jsonl", "a", buffering=1)
        self.stats = EpisodeStats()

    @property
    def count(self) -> int:
        return self.stats.count

    def add(self, record: EpisodeRecord) -> None:
        self._episodes.write(json.dumps(record.to_json()) + "\n")
        self._episodes.flush()
        self.stats.add(record)

    def summary(self, timing: dict[str, Any], status: str) -> dict[str, Any]:
        return self.stats.summary(self.process_id, timing, status)

    def write_summary(self, timing: dict[str, Any], status: str) -> dict[str, Any]:
        summary = self.summary(timing, status)
        write_json_atomic(self.proc_dir / "summary.json", summary)
        return summary

    def close(self) -> None:
        self._episodes.close()


def summary_from_episodes(episodes: Path, process_id: int, status: str, timing: dict[str, Any]) -> dict[str, Any]:
    """A process summary rebuilt from its ``episodes.jsonl`` (for a process that died before writing one).

    A last line cut short by the crash is skipped.
    """
    stats = EpisodeStats()
    if episodes.exists():
        for line in episodes.read_text().splitlines():
            try:
                row = json.loads(line)
                stats.add(_Episode(float(row["return"]), int(row["length"]), bool(row["success"])))
            except (ValueError, KeyError, TypeError):
                continue
    return stats.summary(process_id, timing, status)


def _means(count: int, return_sum: float, length_sum: float, success_count: float) -> dict[str, Any]:
    n = max(count, 1)
    nan_if_empty = (lambda v: v / n) if count else (lambda v: None)
    return {
        "completed_episodes": count,
        "mean_return": nan_if_empty(return_sum),
        "mean_length": nan_if_empty(length_sum),
        "mean_success_rate": nan_if_empty(success_count),
    }


def aggregate(summaries: list[dict[str, Any]], failed: dict[int, str]) -> dict[str, Any]:
    """One summary over all processes: exact means from the per-process sums, timing summed (time: the longest)."""
    count = sum(s["completed_episodes"] for s in summaries)
    totals = {k: sum(s["totals"][k] for s in summaries) for k in ("return_sum", "length_sum", "success_count")}
    timing: dict[str, Any] = {k: sum(s["timing"].get(k, 0) for s in summaries) for k in _SUMMED_TIMING}
    collect = max((s["timing"].get("collect_time_s", 0.0) for s in summaries), default=0.0)
    timing["collect_time_s"] = collect
    timing["effective_fps"] = timing["env_steps"] / collect if collect > 0 else 0.0
    statuses = {s["process_id"]: s["status"] for s in summaries}
    statuses.update({pid: f"failed: {why}" for pid, why in failed.items()})
    return {
        "num_processes": len(statuses),
        "status": "failed" if failed else _overall(statuses),
        "failed_processes": sorted(failed),
        "process_status": {str(k): v for k, v in sorted(statuses.items())},
        **_means(count, totals["return_sum"], totals["length_sum"], totals["success_count"]),
        "totals": totals,
        "timing": {k: (round(v, 6) if isinstance(v, float) and math.isfinite(v) else v) for k, v in timing.items()},
    }


def _overall(statuses: dict[int, str]) -> str:
    values = set(statuses.values())
    if len(values) == 1:
        return values.pop()
    return "running" if values & {"running", "starting"} else "mixed"
