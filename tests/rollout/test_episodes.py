"""EpisodeTracker: per-env returns, lengths and success when envs finish on different steps."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from plugrl_env_client.records import EpisodeRecord
from plugrl_env_client.rollout.episodes import EpisodeTracker


def _f(*values: float) -> np.ndarray:
    return np.array(values, np.float32)


def _b(*values: bool) -> np.ndarray:
    return np.array(values, bool)


def test_returns_and_lengths_per_env_with_different_finish_steps() -> None:
    tracker = EpisodeTracker(3, success_threshold=None)
    tracker.add_step(_f(1.0, 2.0, 3.0), {})
    tracker.add_step(_f(1.0, 2.0, 3.0), {})
    # env 1 finishes after 2 steps
    records = tracker.finish(np.array([1]), _b(False, True, False), _b(False, False, False), 0, 1.0, 10)
    assert records == [EpisodeRecord(1, 4.0, 2, None, True, False, process_id=0, wall_time_s=1.0, env_steps=10)]
    tracker.start(np.array([1]))
    assert tracker.returns.tolist() == [2.0, 0.0, 6.0]
    assert tracker.lengths.tolist() == [2, 0, 2]
    tracker.add_step(_f(0.5, 10.0, -1.0), {})
    # envs 0 and 2 finish on step 3 (0 truncated), env 1 is one step into its second episode
    records = tracker.finish(np.array([0, 2]), _b(False, False, True), _b(True, False, False), 0, 1.0, 10)
    assert [r.env_index for r in records] == [0, 2]
    assert records[0].episode_return == 2.5 and records[0].length == 3
    assert records[0].terminated is False and records[0].truncated is True
    assert records[1].episode_return == 5.0 and records[1].length == 3
    assert records[1].terminated is True and records[1].truncated is False
    tracker.start(np.array([0, 2]))
    tracker.add_step(_f(1.0, 1.0, 1.0), {})
    records = tracker.finish(np.array([0, 1, 2]), _b(True, True, True), _b(False, False, False), 0, 1.0, 10)
    assert [(r.episode_return, r.length) for r in records] == [(1.0, 1), (11.0, 2), (1.0, 1)]


def test_record_types_and_json() -> None:
    tracker = EpisodeTracker(1, success_threshold=None)
    tracker.add_step(_f(1.5), {})
    (record,) = tracker.finish(np.array([0]), _b(True), _b(False), 0, 1.0, 10)
    assert type(record.env_index) is int and type(record.length) is int
    assert type(record.episode_return) is float
    assert record.success is None, "no threshold and no info['success']: the env has no success rule"
    assert record.to_json() == {
        "env_index": 0, "return": 1.5, "length": 1, "success": None, "terminated": True, "truncated": False,
        "process_id": 0, "seed": None, "wall_time_s": 1.0, "env_steps": 10,
    }


def test_records_carry_the_process_time_steps_and_known_seeds() -> None:
    tracker = EpisodeTracker(2, success_threshold=None)
    tracker.start(np.array([0, 1]), [7, 7])
    tracker.add_step(_f(1, 1), {"success": _b(True, False)})
    first = tracker.finish(np.array([0, 1]), _b(True, True), _b(False, False), 3, 2.5, 40)
    assert [(r.seed, r.success, r.process_id, r.wall_time_s, r.env_steps) for r in first] == [
        (7, True, 3, 2.5, 40), (7, False, 3, 2.5, 40)]
    tracker.start(np.array([0]))  # a later reset continues the env's generator: its seed is not known
    tracker.add_step(_f(1, 1), {})
    (later,) = tracker.finish(np.array([0]), _b(True, False), _b(False, False), 3, 3.0, 42)
    assert later.seed is None and later.success is False, "info['success'] seen once: success is judged"


def test_success_by_threshold_on_any_step() -> None:
    tracker = EpisodeTracker(3, success_threshold=1.0)
    tracker.add_step(_f(0.5, 1.0, 0.99), {})
    tracker.add_step(_f(0.2, -5.0, 0.99), {})  # a later low reward does not undo env 1's success
    assert tracker.success.tolist() == [False, True, False]
    tracker.add_step(_f(2.0, 0.0, 0.0), {})
    assert tracker.success.tolist() == [True, True, False]
    records = tracker.finish(np.array([0, 1, 2]), _b(True, True, True), _b(False, False, False), 0, 1.0, 10)
    assert [r.success for r in records] == [True, True, False]


def test_no_threshold_means_no_success_from_rewards() -> None:
    tracker = EpisodeTracker(2, success_threshold=None)
    tracker.add_step(_f(1e9, -1e9), {})
    assert tracker.success.tolist() == [False, False]


def test_success_from_info_bool_array() -> None:
    tracker = EpisodeTracker(3, success_threshold=None)
    tracker.add_step(_f(0, 0, 0), {"success": _b(False, True, False)})
    tracker.add_step(_f(0, 0, 0), {"success": _b(False, False, False)})  # sticky within the episode
    assert tracker.success.tolist() == [False, True, False]
    tracker.add_step(_f(0, 0, 0), {"success": _b(False, False, True)})
    assert tracker.success.tolist() == [False, True, True]


def test_success_info_of_the_wrong_shape_or_type_is_ignored() -> None:
    tracker = EpisodeTracker(2, success_threshold=None)
    tracker.add_step(_f(0, 0), {"success": True})
    tracker.add_step(_f(0, 0), {"success": _b(True, True, True)})
    assert tracker.success.tolist() == [False, False]


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


@pytest.mark.parametrize("key, value, expected", [
    ("success", [True, False], "info['success'] is a list of 2 values; the client counts success only from a bool "
     "array of shape (2,) (one per env), so it counts none from it"),
    ("success", True, "info['success'] is a bool;"),
    ("success", _b(True, True, True), "info['success'] is an array of bool and shape (3,);"),
    ("success", np.array(["yes", "no"]), "info['success'] is an array of <U3 and shape (2,);"),
    ("metrics", [1.0, 2.0], "info['metrics'] is a list of 2 values; the client reads metrics only from a dict of "
     "metric name -> one number per env (shape (2,)), so it records none from it"),
    ("metrics", "distance=1", "info['metrics'] is a str;"),
])
def test_success_or_metrics_of_the_wrong_type_are_warned_about_once_per_key(
        caplog: pytest.LogCaptureFixture, key: str, value: object, expected: str) -> None:
    tracker = EpisodeTracker(2, success_threshold=None)
    with caplog.at_level(logging.WARNING, "plugrl_env_client"):
        for _ in range(3):
            tracker.add_step(_f(0, 0), {key: value})
    assert len(_warnings(caplog)) == 1 and _warnings(caplog)[0].startswith(expected), _warnings(caplog)
    assert tracker.success.tolist() == [False, False] and not tracker.metrics
    assert tracker.judges_success is False


def test_success_and_metrics_of_the_documented_types_are_taken_without_a_word(caplog: pytest.LogCaptureFixture) -> None:
    tracker = EpisodeTracker(2, success_threshold=None)
    with caplog.at_level(logging.WARNING, "plugrl_env_client"):
        tracker.add_step(_f(0, 0), {"success": _b(True, False), "metrics": {"d": np.array([1.0, 2.0])}})
        tracker.add_step(_f(0, 0), {"success": np.array([0, 1]), "metrics": {}})
    assert not _warnings(caplog)
    assert tracker.success.tolist() == [True, True] and set(tracker.metrics) == {"d"}


def test_episode_info_keys_dtypes_and_rows() -> None:
    tracker = EpisodeTracker(4, success_threshold=1.0)
    tracker.add_step(_f(0.5, 1.0, 2.0, 0.25), {})
    tracker.add_step(_f(0.5, 0.0, 2.0, 0.25), {})
    done = _b(False, True, False, True)
    rows = np.array([1, 2, 3])
    info = tracker.episode_info(rows, done)
    assert set(info) == {"r", "l", "s", "mask"}
    assert info["r"].dtype == np.float32 and info["r"].shape == (3,)
    assert info["l"].dtype.kind == "i" and info["l"].shape == (3,)
    assert info["s"].dtype == bool and info["s"].shape == (3,)
    assert info["mask"].dtype == bool and info["mask"].shape == (3,)
    assert info["r"].tolist() == [1.0, 4.0, 0.5]
    assert info["l"].tolist() == [2, 2, 2]
    assert info["s"].tolist() == [True, True, False]
    assert info["mask"].tolist() == [True, False, True]


def test_episode_info_is_a_copy() -> None:
    tracker = EpisodeTracker(2, success_threshold=None)
    tracker.add_step(_f(1, 1), {"success": _b(True, False)})
    done = _b(True, False)
    info = tracker.episode_info(np.array([0, 1]), done)
    tracker.start(np.array([0]))
    done[0] = False
    assert info["r"].tolist() == [1.0, 1.0]
    assert info["s"].tolist() == [True, False]
    assert info["mask"].tolist() == [True, False]


def test_restart_clears_only_the_given_envs() -> None:
    tracker = EpisodeTracker(3, success_threshold=0.5)
    tracker.add_step(_f(1, 1, 1), {})
    tracker.start(np.array([0, 2]))
    assert tracker.returns.tolist() == [0.0, 1.0, 0.0]
    assert tracker.lengths.tolist() == [0, 1, 0]
    assert tracker.success.tolist() == [False, True, False]
    tracker.add_step(_f(0, 0, 0), {})
    (record,) = tracker.finish(np.array([0]), _b(True, False, False), _b(False, False, False), 0, 1.0, 10)
    assert (record.episode_return, record.length, record.success) == (0.0, 1, False)


@pytest.mark.parametrize("mode", ["sum", "mean", "min", "max", "first", "last"])
def test_each_metric_mode_aggregates_the_steps_of_each_episode(mode: str) -> None:
    """Random metric values (NaN and inf among them) over envs that restart at different steps and one that waits
    some steps out: each finished episode's metric is its mode over the steps its env took part in."""
    from plugrl_env_client.rollout.idle import IdleEnvs

    rng = np.random.default_rng(7)
    n = 4
    idle = IdleEnvs(n)
    tracker = EpisodeTracker(n, success_threshold=None, idle=idle)
    taken: list[list[float]] = [[] for _ in range(n)]
    reduce = {"sum": sum, "mean": lambda v: sum(v) / len(v), "min": lambda v: float(np.min(v)),
              "max": lambda v: float(np.max(v)), "first": lambda v: v[0], "last": lambda v: v[-1]}[mode]
    checked = 0
    for step in range(60):
        if step == 10:
            idle.wait(np.array([3]))
        if step == 25:
            idle.start(np.array([3]))
        values = rng.normal(size=n)
        values[rng.random(n) < 0.05] = np.nan
        values[rng.random(n) < 0.05] = np.inf
        tracker.add_step(np.zeros(n, np.float32), {"metrics": {"m": values}, "metrics_agg_mode": {"m": mode}})
        for i in idle.rows().tolist():
            taken[i].append(float(values[i]))
        ended = np.flatnonzero(rng.random(n) < 0.15)
        ended = ended[np.isin(ended, idle.rows())]
        if ended.size:
            done = np.zeros(n, bool)
            done[ended] = True
            for record, i in zip(tracker.finish(ended, done, np.zeros(n, bool), 0, 1.0, step), ended.tolist()):
                expected = reduce(taken[i])
                got = record.metrics["m"]
                assert got == expected or (np.isnan(got) and np.isnan(expected)) or got == pytest.approx(expected), \
                    (mode, i, taken[i], got)
                taken[i] = []
                checked += 1
            tracker.start(ended)
    assert checked > 10
