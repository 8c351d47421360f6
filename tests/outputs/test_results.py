"""EpisodeRecord round trips, reading episodes.jsonl back, and the exact EpisodeStats accumulator."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from plugrl_env_client.outputs.results import EpisodeRecord, EpisodeStats, ProcessStatus, read_episodes


def _rec(env: int, ret: float, length: int, success: bool | None, **extra) -> EpisodeRecord:
    return EpisodeRecord(env, ret, length, success, terminated=bool(success), truncated=False, **extra)


def test_record_json_round_trip_with_every_field() -> None:
    rec = _rec(3, 2.5, 7, True, process_id=2, seed=11, wall_time_s=1.25, env_steps=140,
               metrics={"turns": 4.0}, instruction="guess")
    row = rec.to_json()
    assert row == {"env_index": 3, "return": 2.5, "length": 7, "success": True, "terminated": True,
                   "truncated": False, "process_id": 2, "seed": 11, "wall_time_s": 1.25, "env_steps": 140,
                   "metrics": {"turns": 4.0}, "instruction": "guess"}
    assert EpisodeRecord.from_json(json.loads(json.dumps(row))) == rec


def test_record_json_is_strict_and_success_may_be_unknown() -> None:
    row = _rec(0, math.nan, 3, None, metrics={"m": math.inf}).to_json()
    assert row["return"] is None and row["success"] is None and row["metrics"] == {"m": None}
    json.dumps(row, allow_nan=False)  # raises on NaN/inf


def test_old_lines_read_back_with_the_new_fields_unknown(tmp_path: Path) -> None:
    path = tmp_path / "episodes.jsonl"
    path.write_text(json.dumps({"env_index": 1, "return": 2.0, "length": 3, "success": False,
                                "terminated": True, "truncated": False}) + "\n"
                    + '{"env_index": 0, "return": 1.0, "len')  # a last line cut short by a crash
    records = list(read_episodes(path))
    assert len(records) == 1
    assert records[0].env_index == 1 and records[0].wall_time_s is None and records[0].seed is None
    assert list(read_episodes(tmp_path / "missing.jsonl")) == []


def test_stats_are_exact_means_with_a_window_of_the_latest() -> None:
    stats = EpisodeStats(window=3)
    values = [(1.0, 2, True), (2.0, 4, False), (6.0, 9, True), (10.0, 1, None)]
    for ret, length, success in values:
        stats.add(ret, length, success)
    every = stats.all_episodes()
    assert stats.count == 4
    assert every["mean_return"] == pytest.approx(19.0 / 4)
    assert every["mean_length"] == pytest.approx(16 / 4)
    assert every["mean_success_rate"] == pytest.approx(2 / 3), "unjudged episodes are left out of the rate"
    assert list(stats.recent) == [(2.0, 4, False), (6.0, 9, True), (10.0, 1, None)]


def test_stats_of_nothing_are_none_not_nan() -> None:
    every = EpisodeStats().all_episodes()
    assert every["mean_return"] is None and every["mean_length"] is None and every["mean_success_rate"] is None
    stats = EpisodeStats()
    stats.add(1.0, 1, None)
    assert stats.all_episodes()["mean_success_rate"] is None


def test_stats_average_metrics_per_episode() -> None:
    stats = EpisodeStats()
    rng = np.random.default_rng(0)
    turns = rng.integers(1, 10, size=20).astype(float)
    for t in turns:
        stats.add(0.0, 1, None, {"turns": float(t), "valid": 1.0})
    stats.add(0.0, 1, None, {"valid": 0.0})
    means = stats.metric_means()
    assert means["turns"] == pytest.approx(turns.mean())
    assert means["valid"] == pytest.approx(20 / 21)


def test_process_status_values_and_ended() -> None:
    assert ProcessStatus.FINISHED.value == "finished" and ProcessStatus.FINISHED.ended
    assert not ProcessStatus.RUNNING.ended and not ProcessStatus.STARTING.ended
    assert {s.value for s in ProcessStatus} == {"starting", "running", "finished", "stopped by server",
                                                "interrupted", "failed"}
