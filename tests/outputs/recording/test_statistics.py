"""The statistics of obs_stats.jsonl: over finite values only, strict JSON, null when there are none."""

from __future__ import annotations

import numpy as np
from recording_rollouts import MemorySink, recorder, strict_lines

from plugrl_env_client.envs.base_env import Observation
from plugrl_env_client.outputs.recording.sinks import AppendableSink
from plugrl_env_client.records import EpisodeRecord


def test_json_lines_are_strict_when_the_episode_holds_nan_and_infinity() -> None:
    sink = MemorySink()
    assert not isinstance(sink, AppendableSink)  # so each line rewrites the file: both paths are covered
    rec = recorder(sink, k=1, num_envs=1, record_obs_stats=True, record_episode_metrics=True)
    for _ in range(2):
        rec.on_reset(Observation(states={"q": np.array([[1.0, 2.0]])}), np.array([0]), np.array([0]))
        rec.on_step(Observation(states={"q": np.array([[np.nan, -4.0]])}), np.zeros((1, 1)), np.zeros(1),
                    np.array([0]))
        rec.on_step(Observation(states={"q": np.array([[np.inf, -3.0]])}), np.zeros((1, 1)), np.zeros(1),
                    np.array([0]))
        rec.on_episode_end(EpisodeRecord(0, float("nan"), 2, None, True, False, metrics={"m": float("inf")}),
                           {"x": np.array(np.inf), "y": np.array([np.nan, 1.0])})
    assert rec.close().episodes_recorded == 2
    stats = strict_lines(sink.files["metrics/obs_stats.jsonl"])
    assert [row["completed_episode"] for row in stats] == [1, 2]
    assert [row["env_episode_id"] for row in stats] == [1, 2]
    assert stats[0]["first"]["states"]["q"] == {"shape": [2], "dtype": "float64", "mean": 1.5, "std": 0.5,
                                                "min": 1.0, "max": 2.0, "count": 2, "non_finite": 0}
    assert stats[0]["last"]["states"]["q"] == {"shape": [2], "dtype": "float64", "mean": -3.0, "std": 0.0,
                                               "min": -3.0, "max": -3.0, "count": 1, "non_finite": 1}
    assert stats[0]["last_info"] == {"x": None, "y": [None, 1.0]}
    metrics = strict_lines(sink.files["metrics/episode_metrics.jsonl"])
    assert [(row["completed_episode"], row["episode_return"], row["metrics"]) for row in metrics] == [
        (1, None, {"m": None}), (2, None, {"m": None})]
    assert [row["mean_return"] for row in metrics] == [0.0, 0.0], "a NaN return counts as 0, as in summary.json"


def test_obs_stats_of_a_key_without_finite_values_are_null() -> None:
    sink = MemorySink()
    rec = recorder(sink, k=1, num_envs=1, record_obs_stats=True)
    rec.on_reset(Observation(states={"q": np.array([[np.nan]])}), np.array([0]), np.array([0]))
    rec.on_episode_end(EpisodeRecord(0, 0.0, 0, None, True, False))
    rec.close()
    (row,) = strict_lines(sink.files["metrics/obs_stats.jsonl"])
    assert row["first"]["states"]["q"] == {"shape": [1], "dtype": "float64", "min": None, "max": None,
                                           "mean": None, "std": None, "count": 0, "non_finite": 1}
