"""ProcessRecorder, aggregate, write_json_atomic and default_exp_name."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest

from plugrl_env_client.outputs.recorder import METRIC_WINDOW, ProcessRecorder, aggregate
from plugrl_env_client.outputs.run_dir import RunDir, default_exp_name, write_json_atomic
from plugrl_env_client.rollout.episodes import EpisodeRecord


def _rec(env: int, ret: float, length: int, success: bool) -> EpisodeRecord:
    return EpisodeRecord(env, ret, length, success, terminated=not success, truncated=False)


def _timing(**values: float) -> dict[str, float]:
    base = {
        "env_steps": 0, "batch_steps": 0, "infer_calls": 0, "feedback_calls": 0, "infer_wait_s": 0.0,
        "env_step_s": 0.0, "pack_s": 0.0, "reset_s": 0.0, "bytes_sent": 0, "bytes_received": 0, "reconnects": 0,
        "collect_time_s": 0.0, "effective_fps": 0.0,
    }
    base.update(values)
    return base


# ------------------------------------------------------------------------------------------------ ProcessRecorder


def test_each_episode_is_one_json_line_readable_before_close(tmp_path: Path) -> None:
    rec = ProcessRecorder(tmp_path / "proc_000", 0)
    path = tmp_path / "proc_000" / "episodes.jsonl"
    rec.add(_rec(1, 2.5, 7, True))
    lines = path.read_text().splitlines()
    assert len(lines) == 1
    assert json.loads(lines[0]) == {
        "env_index": 1, "return": 2.5, "length": 7, "success": True, "terminated": False, "truncated": False,
    }
    rec.add(_rec(0, -1.0, 3, False))
    lines = path.read_text().splitlines()
    assert len(lines) == 2
    assert json.loads(lines[1])["return"] == -1.0
    rec.close()
    assert len(path.read_text().splitlines()) == 2


def test_summary_keys_and_means(tmp_path: Path) -> None:
    rec = ProcessRecorder(tmp_path / "p", 3)
    for r in [_rec(0, 1.0, 2, True), _rec(1, 2.0, 4, False), _rec(0, 6.0, 9, True)]:
        rec.add(r)
    timing = _timing(env_steps=15, collect_time_s=1.5)
    summary = rec.summary(timing, "finished")
    for key in ("completed_episodes", "mean_return", "mean_length", "mean_success_rate", "metric_window", "timing"):
        assert key in summary
    assert summary["process_id"] == 3
    assert summary["status"] == "finished"
    assert summary["completed_episodes"] == 3
    assert summary["mean_return"] == pytest.approx(3.0)
    assert summary["mean_length"] == pytest.approx(5.0)
    assert summary["mean_success_rate"] == pytest.approx(2 / 3)
    assert summary["metric_window"]["size"] == 3
    assert summary["metric_window"]["mean_return"] == pytest.approx(3.0)
    assert summary["totals"] == {"return_sum": 9.0, "length_sum": 15, "success_count": 2}
    assert summary["timing"] == timing
    rec.close()


def test_write_summary_writes_the_same_json(tmp_path: Path) -> None:
    rec = ProcessRecorder(tmp_path / "p", 0)
    rec.add(_rec(0, 1.0, 1, False))
    returned = rec.write_summary(_timing(env_steps=1), "running")
    assert json.loads((tmp_path / "p" / "summary.json").read_text()) == returned
    rec.close()


def test_zero_episodes_give_none_means(tmp_path: Path) -> None:
    rec = ProcessRecorder(tmp_path / "p", 0)
    summary = rec.summary(_timing(), "stopped by server")
    assert summary["completed_episodes"] == 0
    assert summary["mean_return"] is None
    assert summary["mean_length"] is None
    assert summary["mean_success_rate"] is None
    assert summary["metric_window"]["size"] == 0
    assert summary["metric_window"]["mean_return"] is None
    rec.close()
    assert (tmp_path / "p" / "episodes.jsonl").read_text() == ""


def test_metric_window_holds_the_latest_episodes_only(tmp_path: Path) -> None:
    rec = ProcessRecorder(tmp_path / "p", 0)
    total = METRIC_WINDOW + 20
    for i in range(total):
        rec.add(_rec(0, float(i), i + 1, i % 2 == 0))
    summary = rec.summary({}, "finished")
    window = list(range(20, total))
    assert summary["completed_episodes"] == total
    assert summary["mean_return"] == pytest.approx(np.mean(range(total)))
    assert summary["metric_window"]["size"] == METRIC_WINDOW
    assert summary["metric_window"]["mean_return"] == pytest.approx(np.mean(window))
    assert summary["metric_window"]["mean_length"] == pytest.approx(np.mean(window) + 1)
    assert summary["metric_window"]["mean_success_rate"] == pytest.approx(np.mean([i % 2 == 0 for i in window]))
    rec.close()


# ------------------------------------------------------------------------------------------------ aggregate


def test_aggregate_means_are_exact_across_processes_with_different_counts(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    counts = [1, 7, 30]
    all_records: list[EpisodeRecord] = []
    summaries = []
    for pid, count in enumerate(counts):
        rec = ProcessRecorder(tmp_path / f"p{pid}", pid)
        for _ in range(count):
            r = _rec(0, float(rng.normal(0, 10)), int(rng.integers(1, 100)), bool(rng.random() < 0.3))
            rec.add(r)
            all_records.append(r)
        summaries.append(rec.summary(_timing(env_steps=100 * (pid + 1), collect_time_s=1.0 + pid), "finished"))
        rec.close()
    out = aggregate(summaries, {})
    assert out["completed_episodes"] == sum(counts) == len(all_records)
    assert out["mean_return"] == pytest.approx(np.mean([r.episode_return for r in all_records]), rel=1e-12)
    assert out["mean_length"] == pytest.approx(np.mean([r.length for r in all_records]), rel=1e-12)
    assert out["mean_success_rate"] == pytest.approx(np.mean([r.success for r in all_records]), rel=1e-12)
    # the mean of per-process means would be a different (wrong) number here
    naive = np.mean([s["mean_return"] for s in summaries])
    assert out["mean_return"] != pytest.approx(naive, rel=1e-6)
    assert out["status"] == "finished"
    assert out["num_processes"] == 3
    assert out["failed_processes"] == []


def test_aggregate_timing_sums_and_takes_the_longest_collect_time() -> None:
    a = {"process_id": 0, "status": "finished", "completed_episodes": 0,
         "totals": {"return_sum": 0.0, "length_sum": 0, "success_count": 0},
         "timing": _timing(env_steps=100, infer_calls=5, feedback_calls=4, infer_wait_s=0.25, bytes_sent=1000,
                           reconnects=1, collect_time_s=2.0)}
    b = {"process_id": 1, "status": "finished", "completed_episodes": 0,
         "totals": {"return_sum": 0.0, "length_sum": 0, "success_count": 0},
         "timing": _timing(env_steps=300, infer_calls=7, feedback_calls=7, infer_wait_s=0.5, bytes_sent=24,
                           reconnects=0, collect_time_s=4.0)}
    out = aggregate([a, b], {})
    t = out["timing"]
    assert t["env_steps"] == 400
    assert t["infer_calls"] == 12
    assert t["feedback_calls"] == 11
    assert t["infer_wait_s"] == pytest.approx(0.75)
    assert t["bytes_sent"] == 1024
    assert t["reconnects"] == 1
    assert t["collect_time_s"] == pytest.approx(4.0)
    assert t["effective_fps"] == pytest.approx(100.0)
    assert out["mean_return"] is None and out["completed_episodes"] == 0


def test_aggregate_lists_failed_processes_and_statuses() -> None:
    ok = {"process_id": 0, "status": "finished", "completed_episodes": 2,
          "totals": {"return_sum": 3.0, "length_sum": 10, "success_count": 1}, "timing": _timing(collect_time_s=1.0)}
    partial = {"process_id": 2, "status": "running", "completed_episodes": 1,
               "totals": {"return_sum": 6.0, "length_sum": 2, "success_count": 1}, "timing": _timing()}
    out = aggregate([ok, partial], {2: "EnvCrashedError: boom", 1: "exit code -9"})
    assert out["status"] == "failed"
    assert out["failed_processes"] == [1, 2]
    assert out["num_processes"] == 3
    assert out["process_status"] == {"0": "finished", "1": "failed: exit code -9", "2": "failed: EnvCrashedError: boom"}
    # episodes a failed process recorded before failing still count
    assert out["completed_episodes"] == 3
    assert out["mean_return"] == pytest.approx(3.0)
    json.dumps(out)  # serialisable as is


def test_aggregate_mixed_statuses() -> None:
    def s(pid: int, status: str) -> dict:
        return {"process_id": pid, "status": status, "completed_episodes": 0,
                "totals": {"return_sum": 0.0, "length_sum": 0, "success_count": 0}, "timing": {}}

    assert aggregate([s(0, "finished"), s(1, "stopped by server")], {})["status"] == "mixed"
    assert aggregate([s(0, "interrupted"), s(1, "interrupted")], {})["status"] == "interrupted"


# ------------------------------------------------------------------------------------------------ run dir helpers


def test_write_json_atomic_replaces_content_and_leaves_no_temp_files(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "summary.json"
    write_json_atomic(target, {"a": 1, "b": [1, 2]})
    assert json.loads(target.read_text()) == {"a": 1, "b": [1, 2]}
    write_json_atomic(target, {"c": np.float32(0.5), "d": np.int64(3), "e": np.bool_(True)})
    assert json.loads(target.read_text()) == {"c": 0.5, "d": 3, "e": True}
    assert sorted(p.name for p in target.parent.iterdir()) == ["summary.json"]


def test_write_json_atomic_keeps_the_old_file_when_encoding_fails(tmp_path: Path) -> None:
    target = tmp_path / "summary.json"
    write_json_atomic(target, {"ok": True})

    class Boom:
        def __repr__(self) -> str:
            raise RuntimeError("cannot encode")

    with pytest.raises(RuntimeError, match="cannot encode"):
        write_json_atomic(target, {"bad": Boom()})
    assert json.loads(target.read_text()) == {"ok": True}
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]


def test_write_json_atomic_encodes_arrays_as_lists(tmp_path: Path) -> None:
    target = tmp_path / "config.json"
    write_json_atomic(target, {"one": np.array([5]), "grid": np.arange(4).reshape(2, 2), "s": {3}})
    assert json.loads(target.read_text()) == {"one": [5], "grid": [[0, 1], [2, 3]], "s": [3]}


def test_write_json_atomic_files_follow_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        write_json_atomic(tmp_path / "summary.json", {})
    finally:
        os.umask(old)
    assert (tmp_path / "summary.json").stat().st_mode & 0o777 == 0o644


def test_default_exp_name_format() -> None:
    name = default_exp_name("Point-V1", 8)
    assert re.fullmatch(r"point-v1-nenv8-\d{8}-\d{6}-[0-9a-f]{8}", name), name
    assert default_exp_name("Point-V1", 8) != name  # random suffix


def test_run_dir_layout(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "exp").create()
    assert (tmp_path / "exp" / "logs").is_dir() and (tmp_path / "exp" / "rollout").is_dir()
    assert run.proc_dir(7) == tmp_path / "exp" / "rollout" / "proc_007"
    assert run.summary == tmp_path / "exp" / "summary.json"
    assert run.client_config == tmp_path / "exp" / "client_config.json"
    assert run.log_file == tmp_path / "exp" / "logs" / "client.log"
