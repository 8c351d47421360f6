"""The shared records: EpisodeRecord round trips, the exact EpisodeStats accumulator, ProcessStatus, and the
finite-or-None rule of every JSON the package writes."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest

from plugrl_env_client.records import EpisodeRecord, EpisodeStats, ProcessStatus, finite_or_none


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


@pytest.mark.parametrize("value, expected", [
    (1.5, 1.5), (3, 3.0), (True, 1.0), (np.float32(0.25), 0.25), (np.int64(7), 7.0),
    (math.nan, None), (math.inf, None), (-math.inf, None), (np.float64("nan"), None),
    (None, None), ("1.5", None), (b"2", None), ([1.0], None), ({"a": 1}, None),
])
def test_finite_or_none_keeps_finite_numbers_only(value: object, expected: float | None) -> None:
    got = finite_or_none(value)
    assert got == expected and (got is None or type(got) is float)


def test_an_episode_line_is_one_rule_blank_lines_hold_none_and_anything_else_is_refused_saying_why():
    from plugrl_env_client.records import NotAnEpisode, episode_of_line

    record = EpisodeRecord(1, -2.5, 7, None, terminated=False, truncated=True, process_id=0, seed=3)
    assert episode_of_line(json.dumps(record.to_json()) + "\n") == record
    assert episode_of_line(json.dumps(record.to_json()).encode()) == record
    assert math.isnan(episode_of_line('{"env_index": 0, "return": null, "length": 1}').episode_return)
    for blank in ("", "\n", "  \t\n", b"\r\n"):
        assert episode_of_line(blank) is None
    for line, why in [("not json\n", "not JSON"), ("[1, 2]\n", "a JSON list, not an object"),
                      ('{"return": 1.0, "length": 3}', "it has no 'env_index'"),
                      ('{"env_index": 0, "return": 1.0}', "it has no 'length'"),
                      ('{"env_index": 0, "length": 3}', "it has no 'return'"),
                      ('{"env_index": -1, "return": 1.0, "length": 3}', "its 'env_index' is -1"),
                      ('{"env_index": 0, "return": "1", "length": 3}', "its 'return' is \"1\""),
                      ('{"env_index": 0, "return": true, "length": 3}', "its 'return' is true"),
                      ('{"env_index": 0, "return": 1.0, "length": 2.5}', "its 'length' is 2.5"),
                      ('{"env_index": 0, "return": 1.0, "length": 3, "metrics": {"d": "x"}}', "ValueError"),
                      (b'{"env_index": 0, "return": 1.0, "length": 3, "\xff": 1}', "not JSON")]:
        with pytest.raises(NotAnEpisode, match=re.escape(why)):
            episode_of_line(line)
