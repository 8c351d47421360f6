"""The data layer: moving averages, throughput from cumulative counts, pooling processes, reading every line form."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from plugrl_env_client.errors import ConfigError
from plugrl_env_client.report.data import (
    check_run_folder,
    default_window,
    instruction_rows,
    load_run,
    moving_average,
    pool,
    step_curve,
    summary_rows,
    throughput,
    throughput_edges,
    time_split,
)


def write_episodes(root: Path, pid: int, rows: list[dict], tail: str = "") -> None:
    folder = root / "rollout" / f"proc_{pid:03d}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "episodes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + tail)


def ep(ret: float, length: int, **extra) -> dict:
    return {"env_index": 0, "return": ret, "length": length, "success": False, "terminated": True,
            "truncated": False, **extra}


# ------------------------------------------------------------------------------------------------ numbers


def test_moving_average_is_trailing_and_averages_what_there_is_at_the_start():
    values = np.array([1.0, 2.0, 3.0, 4.0, 10.0])
    np.testing.assert_allclose(moving_average(values, 3), [1.0, 1.5, 2.0, 3.0, 17 / 3])
    np.testing.assert_allclose(moving_average(values, 1), values)
    np.testing.assert_allclose(moving_average(values, 100), np.cumsum(values) / np.arange(1, 6))
    assert moving_average(np.array([]), 5).size == 0
    with pytest.raises(ValueError):
        moving_average(values, 0)


def test_moving_average_matches_a_direct_mean_on_random_data():
    x = np.random.default_rng(1).normal(size=500)
    ma = moving_average(x, 20)
    for i in (0, 7, 19, 20, 250, 499):
        assert ma[i] == pytest.approx(x[max(0, i - 19): i + 1].mean())


@pytest.mark.parametrize("n,k", [(0, 5), (30, 5), (100, 5), (400, 20), (1000, 50), (10_000, 200), (10**6, 200)])
def test_default_window(n, k):
    assert default_window(n) == k


def test_step_curve_starts_at_zero_collapses_equal_times_and_adds_the_summary_end():
    times = np.array([0.5, 0.5, 1.0, 2.0])
    steps = np.array([40.0, 40.0, 80.0, 160.0])
    t, s = step_curve(times, steps)
    np.testing.assert_allclose(t, [0.0, 0.5, 1.0, 2.0])
    np.testing.assert_allclose(s, [0.0, 40.0, 80.0, 160.0])
    t, s = step_curve(times, steps, end=(3.0, 250.0))
    assert (t[-1], s[-1]) == (3.0, 250.0)
    t, s = step_curve(times, steps, end=(1.5, 120.0))  # a summary older than the last episode adds nothing
    assert t[-1] == 2.0 and s[-1] == 160.0


def test_throughput_of_a_steady_process_is_its_rate():
    times = np.linspace(0.1, 10.0, 100)
    t, s = step_curve(times, 250.0 * times)
    edges = throughput_edges(10.0, 100)
    assert edges.size - 1 == 33 and edges[0] == 0.0 and edges[-1] == 10.0
    np.testing.assert_allclose(throughput(t, s, edges), 250.0)


def test_throughput_is_zero_after_a_process_ends_and_sums_across_processes():
    edges = np.array([0.0, 1.0, 2.0, 3.0, 4.0])
    fast = step_curve(np.array([1.0, 2.0]), np.array([100.0, 200.0]))
    slow = step_curve(np.array([2.0, 4.0]), np.array([50.0, 100.0]))
    np.testing.assert_allclose(throughput(*fast, edges), [100.0, 100.0, 0.0, 0.0])
    np.testing.assert_allclose(throughput(*slow, edges), [25.0, 25.0, 25.0, 25.0])
    assert throughput(*fast, np.array([0.0, 0.0])).tolist() == [0.0], "a zero-width bin has no rate, not NaN"


@pytest.mark.parametrize("points,bins", [(0, 5), (10, 5), (90, 30), (10_000, 60)])
def test_throughput_edges_bin_count(points, bins):
    assert throughput_edges(5.0, points).size == bins + 1


def test_time_split_current_and_old_summaries():
    new = time_split(3, {"collect_time_s": 10.0, "env_step_s": 4.0, "infer_wait_s": 3.0, "infer_obs_pack_s": 1.0,
                         "feedback_s": 0.5, "reset_s": 0.5, "pack_s": 1.2})
    assert new is not None and new.process_id == 3
    assert new.parts == {"env step": 4.0, "infer wait": 3.0, "packing": 1.0, "feedback": 0.5, "reset": 0.5,
                         "other": 1.0}
    old = time_split(0, {"collect_time_s": 2.0, "env_step_s": 0.5, "infer_wait_s": 1.0, "pack_s": 0.25,
                         "reset_s": 0.05})
    assert old is not None and list(old.parts) == ["env step", "infer wait", "packing", "reset", "other"]
    assert old.parts["other"] == pytest.approx(0.2)
    over = time_split(0, {"collect_time_s": 1.0, "env_step_s": 0.8, "infer_wait_s": 0.8})
    assert over is not None and over.parts["other"] == 0.0, "overlapping parts never make other negative"
    assert time_split(0, {}) is None and time_split(0, {"collect_time_s": 0}) is None
    assert time_split(0, {"collect_time_s": math.nan}) is None


# ------------------------------------------------------------------------------------------------ pooling


def test_pool_orders_by_wall_time_and_sums_the_processes_counts(tmp_path):
    write_episodes(tmp_path, 0, [ep(1, 10, wall_time_s=1.0, env_steps=40), ep(2, 10, wall_time_s=3.0, env_steps=80)])
    write_episodes(tmp_path, 1, [ep(10, 5, wall_time_s=0.5, env_steps=20), ep(20, 5, wall_time_s=2.0, env_steps=60),
                                 ep(30, 5, wall_time_s=3.0, env_steps=100)])
    run = load_run(tmp_path)
    pooled = run.pooled
    assert pooled.returns.tolist() == [10, 1, 20, 2, 30], "by wall time; a tie goes to the lower process id"
    assert pooled.process_ids.tolist() == [1, 0, 1, 0, 1]
    assert pooled.wall_time_s is not None and pooled.wall_time_s.tolist() == [0.5, 1.0, 2.0, 3.0, 3.0]
    # each point is the sum of every process's last reported count: 20, 20+40, 60+40, 60+80, 100+80
    assert pooled.env_steps.tolist() == [20, 60, 100, 140, 180]
    assert run.steps_recorded


def test_pool_without_wall_times_orders_by_each_processes_own_steps(tmp_path):
    write_episodes(tmp_path, 0, [ep(1, 30), ep(2, 30)])
    write_episodes(tmp_path, 1, [ep(10, 10), ep(20, 10), ep(30, 40)])
    run = load_run(tmp_path)
    assert run.processes[1].episodes.env_steps.tolist() == [10, 20, 60], "estimated: cumulative lengths"
    assert run.pooled.returns.tolist() == [10, 20, 1, 2, 30], "a tie at 60 steps goes to the lower process id"
    assert run.pooled.env_steps.tolist() == [10, 20, 50, 80, 120]
    assert run.pooled.wall_time_s is None and not run.steps_recorded
    assert any("estimated as cumulative episode lengths" in n for n in run.notes)
    assert any("no wall_time_s in the episodes of processes 0, 1" in n for n in run.notes)


def test_pool_of_nothing_is_empty():
    assert len(pool([])) == 0


# ------------------------------------------------------------------------------------------------ reading


def test_reading_skips_a_cut_line_and_keeps_null_returns(tmp_path):
    rows = [ep(1.5, 10, success=True), ep(None, 12), ep(2.5, 14, success=None, metrics={"d": 1.0, "bad": None})]
    write_episodes(tmp_path, 0, rows, tail='{"env_index": 0, "return": 3.0, "len')
    run = load_run(tmp_path)
    p = run.processes[0]
    assert p.skipped_lines == 1 and len(p.episodes) == 3
    assert p.episodes.returns[0] == 1.5 and math.isnan(p.episodes.returns[1])
    assert p.episodes.success[:2].tolist() == [1.0, 0.0] and math.isnan(p.episodes.success[2])
    assert list(p.episodes.metrics) == ["d"], "a metric that is only ever null is no metric"
    assert any("1 in process 0" in n for n in run.notes)
    assert run.success_defined


def test_lines_that_are_not_episodes_are_skipped(tmp_path):
    write_episodes(tmp_path, 0, [ep(1, 10), {"return": 1.0}, {"length": 3}], tail="[1, 2]\nnot json\n\n")
    p = load_run(tmp_path).processes[0]
    assert len(p.episodes) == 1 and p.skipped_lines == 4


def test_success_is_undefined_when_no_line_judges_it(tmp_path):
    write_episodes(tmp_path, 0, [{k: v for k, v in ep(1, 10).items() if k != "success"}, ep(2, 10, success=None)])
    run = load_run(tmp_path)
    assert not run.success_defined
    assert all(r.success_rate is None for r in summary_rows(run))


def test_a_summary_with_a_null_success_rate_makes_success_undefined(tmp_path):
    write_episodes(tmp_path, 0, [ep(1, 10)])
    (tmp_path / "summary.json").write_text(json.dumps({"completed_episodes": 1, "mean_success_rate": 0.0,
                                                       "all_episodes": {"mean_success_rate": None}}))
    assert not load_run(tmp_path).success_defined


def test_a_plugrl_typed_summary_says_no_success_rule_by_its_flag_not_by_a_null(tmp_path):
    """A per-process summary writes PlugRL's 0.0 rate without a success rule; its has_success_rule decides,
    whatever the episode lines carry, and the table shows no rate."""
    write_episodes(tmp_path, 0, [ep(1, 10), ep(2, 10)])
    plugrl_typed = {"completed_episodes": 2, "mean_return": 1.5, "mean_success_rate": 0.0, "has_success_rule": False,
                    "timing": {}}
    (tmp_path / "rollout/proc_000/summary.json").write_text(json.dumps(plugrl_typed))
    run = load_run(tmp_path)
    assert not run.success_defined and [r.success_rate for r in summary_rows(run)] == [None]
    (tmp_path / "rollout/proc_000/summary.json").write_text(json.dumps({**plugrl_typed, "has_success_rule": True}))
    assert load_run(tmp_path).success_defined and summary_rows(load_run(tmp_path))[0].success_rate == 0.0


def test_success_is_undefined_in_a_run_the_writer_wrote_without_a_success_rule(tmp_path):
    from plugrl_env_client.outputs.results import EpisodeRecord
    from plugrl_env_client.outputs.run_dir import RunDir
    from plugrl_env_client.outputs.run_writer import RunWriter

    tmp_path = tmp_path / "run"  # the writer's folder is made fresh
    writer = RunWriter(RunDir(tmp_path).create(), "run", 1)
    for k in range(3):
        writer.episode(EpisodeRecord(0, float(k), 5, None, terminated=True, truncated=False))
    writer.close()
    assert json.loads((tmp_path / "rollout/proc_000/summary.json").read_text())["mean_success_rate"] == 0.0
    run = load_run(tmp_path)
    assert not run.success_defined and all(r.success_rate is None for r in summary_rows(run))


def test_some_lines_without_env_steps_estimate_all_and_say_so(tmp_path):
    write_episodes(tmp_path, 0, [ep(1, 10, env_steps=40), ep(1, 10)])
    run = load_run(tmp_path)
    assert run.processes[0].episodes.env_steps.tolist() == [10, 20]
    assert any("only some episodes carry env_steps" in n for n in run.notes)


def test_processes_promised_by_the_config_are_listed(tmp_path):
    (tmp_path / "client_config.json").write_text(json.dumps({"env_id": "X-v1", "num_procs": 3}))
    write_episodes(tmp_path, 1, [ep(1, 10)])
    run = load_run(tmp_path)
    assert [p.process_id for p in run.processes] == [0, 1, 2]
    assert all(p.summary is None for p in run.processes) and run.env_id == "X-v1"
    assert any("no summary.json for processes 0, 1, 2" in n for n in run.notes)


def test_rows_from_episodes_alone(tmp_path):
    write_episodes(tmp_path, 0, [ep(1, 10, success=True, wall_time_s=1.0, env_steps=100),
                                 ep(3, 10, success=False, wall_time_s=2.0, env_steps=300)])
    write_episodes(tmp_path, 1, [ep(5, 10, success=True, wall_time_s=4.0, env_steps=500)])
    rows = summary_rows(load_run(tmp_path))
    assert [r.label for r in rows] == ["process 0", "process 1", "all"]
    p0, p1, total = rows
    assert (p0.status, p0.episodes, p0.mean_return, p0.success_rate, p0.env_steps_per_s) == \
        ("no summary", 2, 2.0, 0.5, 150.0)
    assert p1.env_steps_per_s == 125.0
    assert total.episodes == 3 and total.mean_return == 3.0 and total.success_rate == pytest.approx(2 / 3)
    assert total.env_steps_per_s == 200.0, "every process's last count over the longest wall time"


def test_rows_from_summaries_prefer_the_means_over_every_episode(tmp_path):
    write_episodes(tmp_path, 0, [ep(1, 10)])
    summary = {"status": "failed", "error": "env crashed", "completed_episodes": 7, "mean_return": 9.0,
               "mean_success_rate": None, "all_episodes": {"mean_return": 4.0, "mean_success_rate": 0.25},
               "timing": {"effective_fps": 321.0}}
    (tmp_path / "rollout/proc_000/summary.json").write_text(json.dumps(summary))
    row = summary_rows(load_run(tmp_path))[0]
    assert (row.status, row.episodes, row.mean_return, row.success_rate, row.env_steps_per_s) == \
        ("failed: env crashed", 7, 4.0, 0.25, 321.0)
    old = {"status": "failed: no summary written", "completed_episodes": 1, "mean_return": 2.0,
           "mean_success_rate": 0.0, "timing": {}}
    (tmp_path / "rollout/proc_000/summary.json").write_text(json.dumps(old))
    row = summary_rows(load_run(tmp_path))[0]
    assert (row.status, row.mean_return, row.success_rate, row.env_steps_per_s) == \
        ("failed: no summary written", 2.0, 0.0, None)


def test_an_unreadable_summary_is_noted_and_left_out(tmp_path):
    write_episodes(tmp_path, 0, [ep(1, 10)])
    (tmp_path / "summary.json").write_text("{not json")
    run = load_run(tmp_path)
    assert run.summary is None and any("could not be read" in n for n in run.notes)


def test_instruction_rows_rank_by_count(tmp_path):
    rows = [ep(1, 5, instruction="a", success=True), ep(3, 5, instruction="b"), ep(5, 5, instruction="a"),
            ep(7, 5)]
    write_episodes(tmp_path, 0, rows)
    run = load_run(tmp_path)
    ranked, distinct = instruction_rows(run.pooled, run.success_defined, limit=1)
    assert distinct == 2 and len(ranked) == 1
    assert (ranked[0].instruction, ranked[0].episodes, ranked[0].mean_return, ranked[0].success_rate) == \
        ("a", 2, 3.0, 0.5)


def test_check_run_folder(tmp_path):
    with pytest.raises(ConfigError, match="no client_config.json and no rollout/"):
        check_run_folder(tmp_path)
    (tmp_path / "rollout").mkdir()
    check_run_folder(tmp_path)


def test_a_line_over_the_bound_is_skipped_unread_with_a_note_naming_file_and_line(tmp_path):
    """An episodes.jsonl with a 3 MiB line of garbage, an episode after it, and a 2 GiB hole at its end (sparse: no
    disk used): the episodes around them are read, both over-long lines are skipped and named, and the reader never
    holds more than a bounded line."""
    import tracemalloc

    write_episodes(tmp_path, 0, [ep(1.0, 10)], tail="x" * (3 << 20) + "\n" + json.dumps(ep(2.0, 12)) + "\n")
    path = tmp_path / "rollout" / "proc_000" / "episodes.jsonl"
    with open(path, "r+b") as f:
        f.truncate(2 * 2**30)
    tracemalloc.start()
    try:
        run = load_run(tmp_path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    p = run.processes[0]
    assert p.episodes.returns.tolist() == [1.0, 2.0] and p.skipped_lines == 2
    assert f"{path}: lines 2, 4 longer than 1048576 bytes (an episode's line is a few hundred) skipped unread" in run.notes
    assert peak < 16 << 20


def test_a_summary_larger_than_a_run_writes_is_left_out_with_a_note(tmp_path):
    write_episodes(tmp_path, 0, [ep(1.0, 10)])
    with open(tmp_path / "summary.json", "wb") as f:
        f.truncate(65 << 20)
    run = load_run(tmp_path)
    assert run.summary is None
    assert any(n.startswith(f"{tmp_path / 'summary.json'} is {65 << 20} bytes") for n in run.notes), run.notes
