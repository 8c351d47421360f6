"""Timing: one model for a process's summary and the run's aggregate."""

from __future__ import annotations

import json

import pytest

from plugrl_env_client.timing import Timing


def test_to_json_has_rates_and_fractions_of_the_collect_time() -> None:
    t = Timing(env_steps=400, env_step_s=1.0, infer_wait_s=0.5, feedback_s=0.25, infer_obs_pack_s=0.05,
               reset_s=0.2, collect_time_s=2.0)
    out = t.to_json()
    assert out["effective_fps"] == pytest.approx(200.0)
    assert out["env_step_frac"] == pytest.approx(0.5)
    assert out["infer_wait_frac"] == pytest.approx(0.25)
    assert out["feedback_frac"] == pytest.approx(0.125)
    assert out["infer_obs_pack_frac"] == pytest.approx(0.025)
    assert out["reset_frac"] == pytest.approx(0.1)
    json.dumps(out, allow_nan=False)


def test_nothing_measured_gives_zeros_not_nan() -> None:
    out = Timing().to_json()
    assert out["effective_fps"] == 0.0 and out["env_step_frac"] == 0.0
    json.dumps(out, allow_nan=False)


def test_round_trip_ignores_derived_and_unknown_keys() -> None:
    t = Timing(env_steps=7, infer_calls=3, bytes_sent=1024, infer_wait_s=0.125, collect_time_s=1.5)
    data = t.to_json() | {"something_else": 5, "env_step_s": float("nan")}
    back = Timing.from_json(data)
    assert back.env_steps == 7 and back.infer_calls == 3 and back.bytes_sent == 1024
    assert back.infer_wait_s == pytest.approx(0.125) and back.collect_time_s == pytest.approx(1.5)
    assert back.env_step_s == 0.0, "a non-finite value is not read back"
    assert isinstance(back.env_steps, int) and isinstance(back.infer_wait_s, float)


def test_total_sums_counters_and_takes_the_longest_collection() -> None:
    a = Timing(env_steps=100, infer_calls=5, feedback_calls=4, infer_wait_s=0.25, bytes_sent=1000, reconnects=1,
               collect_time_s=2.0)
    b = Timing(env_steps=300, infer_calls=7, feedback_calls=7, infer_wait_s=0.5, bytes_sent=24, collect_time_s=4.0)
    total = Timing.total([a, b])
    assert (total.env_steps, total.infer_calls, total.feedback_calls) == (400, 12, 11)
    assert total.infer_wait_s == pytest.approx(0.75) and total.bytes_sent == 1024 and total.reconnects == 1
    assert total.collect_time_s == pytest.approx(4.0)
    assert total.effective_fps == pytest.approx(100.0)
    assert Timing.total([]) == Timing()
