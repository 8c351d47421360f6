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


def test_fractions_over_processes_are_shares_of_their_total_collect_time() -> None:
    """Two processes that each spent most of their collection stepping: summed stage times over the longest
    collect time would be 1.65 for env_step_frac; as shares of the processes' total collect time they are within [0, 1]."""
    a = Timing(env_steps=200, env_step_s=1.5, infer_wait_s=0.25, feedback_s=0.125, collect_time_s=2.0)
    b = Timing(env_steps=200, env_step_s=1.8, infer_wait_s=0.125, collect_time_s=2.0)
    for part in (a, b):
        assert all(0.0 <= part.fraction(stage) <= 1.0 for stage in Timing.STAGES)
    old_share = (a.env_step_s + b.env_step_s) / max(a.collect_time_s, b.collect_time_s)
    assert old_share > 1.0, "the case that exceeded 1 when divided by the longest collect time"
    run = Timing.across_processes([a, b])
    out = run.to_json()
    assert out["env_step_frac"] == pytest.approx(3.3 / 4.0)
    assert out["infer_wait_frac"] == pytest.approx(0.375 / 4.0)
    assert out["feedback_frac"] == pytest.approx(0.125 / 4.0)
    assert out["collect_time_s"] == pytest.approx(2.0) and out["collect_time_sum_s"] == pytest.approx(4.0)
    assert out["effective_fps"] == pytest.approx(200.0), "throughput stays steps over the run's wall time"
    assert sum(out[f"{stage}_frac"] for stage in Timing.STAGES) <= 1.0


def test_fractions_weigh_processes_by_how_long_they_collected() -> None:
    short = Timing(env_step_s=0.9, collect_time_s=1.0)  # 90% stepping, for 1 s
    long = Timing(env_step_s=1.0, collect_time_s=4.0)  # 25% stepping, for 4 s
    assert Timing.across_processes([short, long]).to_json()["env_step_frac"] == pytest.approx(1.9 / 5.0)


def test_one_process_writes_its_own_collect_time_as_the_sum_and_reads_back() -> None:
    one = Timing(env_step_s=0.5, collect_time_s=2.0)
    out = one.to_json()
    assert out["collect_time_sum_s"] == pytest.approx(2.0) and out["env_step_frac"] == pytest.approx(0.25)
    assert Timing.across_processes([one]).to_json() == out
    run = Timing.across_processes([Timing.from_json(out), Timing.from_json(out)])
    assert run.collect_time_sum_s == pytest.approx(4.0) and run.to_json()["env_step_frac"] == pytest.approx(0.25)


def test_groups_of_one_process_share_its_clock() -> None:
    """A process's env groups collect over the same time: their total keeps the one collect time as denominator."""
    g1 = Timing(env_step_s=0.5, collect_time_s=2.0)
    g2 = Timing(env_step_s=0.75, collect_time_s=2.0)
    out = Timing.total([g1, g2]).to_json()
    assert out["collect_time_sum_s"] == pytest.approx(2.0) and out["env_step_frac"] == pytest.approx(1.25 / 2.0)


def test_a_fraction_never_exceeds_one() -> None:
    assert Timing(env_step_s=2.000001, collect_time_s=2.0).to_json()["env_step_frac"] == 1.0
