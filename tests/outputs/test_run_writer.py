"""RunWriter: the one writer of a run's episodes and summaries, fed by what processes report."""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from plugrl_env_client.outputs.recording.summary import RecorderSummary
from plugrl_env_client.outputs.run_dir import RunDir
from plugrl_env_client.outputs.run_writer import RunWriter
from plugrl_env_client.records import EpisodeRecord, ProcessResult, ProcessStatus
from plugrl_env_client.timing import Timing


def _rec(pid: int, ret: float, length: int, success: bool | None) -> EpisodeRecord:
    return EpisodeRecord(0, ret, length, success, terminated=True, truncated=False, process_id=pid)


def _writer(tmp_path: Path, procs: int = 1, window: int = 100) -> RunWriter:
    return RunWriter(RunDir(tmp_path / "run").create(), "run", procs, metric_window=window)


def _read(tmp_path: Path, pid: int | None = None) -> dict:
    rel = "summary.json" if pid is None else f"rollout/proc_{pid:03d}/summary.json"
    return json.loads((tmp_path / "run" / rel).read_text())


def test_each_episode_is_one_flushed_line_before_any_summary(tmp_path: Path) -> None:
    writer = _writer(tmp_path)
    writer.episode(_rec(0, 2.5, 7, True))
    lines = (tmp_path / "run/rollout/proc_000/episodes.jsonl").read_text().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["return"] == 2.5
    writer.episode(_rec(0, -1.0, 3, False))
    assert len((tmp_path / "run/rollout/proc_000/episodes.jsonl").read_text().splitlines()) == 2
    writer.close()


def test_process_summary_is_a_superset_of_plugrls(tmp_path: Path) -> None:
    writer = _writer(tmp_path, procs=2)
    for r in [_rec(1, 1.0, 2, True), _rec(1, 2.0, 4, False), _rec(1, 6.0, 9, True)]:
        writer.episode(r)
    writer.progress(1, ProcessStatus.RUNNING, Timing(env_steps=15, collect_time_s=1.5))
    writer.result(ProcessResult(1, ProcessStatus.FINISHED))
    writer.close()
    s = _read(tmp_path, 1)
    assert (s["exp_name"], s["process_id"], s["total_processes"]) == ("run", 1, 2)
    assert s["completed_episodes"] == s["total_episode_count"] == 3
    assert s["metric_window"] == 100 and isinstance(s["metric_window"], int)
    assert s["mean_return"] == pytest.approx(3.0) and s["mean_success_rate"] == pytest.approx(2 / 3)
    assert s["all_episodes"]["mean_length"] == pytest.approx(5.0)
    assert s["status"] == "finished" and s["error"] is None
    assert s["timing"]["env_steps"] == 15 and s["timing"]["effective_fps"] == pytest.approx(10.0)
    idle = _read(tmp_path, 0)
    assert idle["completed_episodes"] == 0 and idle["window_episodes"] == 0
    assert idle["mean_return"] == 0.0 and idle["mean_success_rate"] == 0.0, "PlugRL's floats over no episode"
    assert idle["has_success_rule"] is False and idle["all_episodes"]["mean_return"] is None


def test_plugrls_file_has_plugrls_types_and_the_aggregate_keeps_null(tmp_path: Path) -> None:
    """An env without a success rule: PlugRL's per-process file says 0.0 with has_success_rule false beside it (a
    script reading it as a float works); our aggregate says null; an env with one says true in both."""
    writer = _writer(tmp_path, procs=2)
    for r in [_rec(0, 1.0, 2, None), _rec(0, 3.0, 4, None), _rec(1, 5.0, 6, False), _rec(1, 7.0, 8, True)]:
        writer.episode(r)
    total = writer.close()
    unjudged, judged = _read(tmp_path, 0), _read(tmp_path, 1)
    assert unjudged["mean_success_rate"] == 0.0 and type(unjudged["mean_success_rate"]) is float
    assert unjudged["has_success_rule"] is False and unjudged["mean_return"] == pytest.approx(2.0)
    assert unjudged["all_episodes"]["mean_success_rate"] is None, "all_episodes is ours"
    assert judged["mean_success_rate"] == pytest.approx(0.5) and judged["has_success_rule"] is True
    for key in ("exp_name", "process_id", "total_processes", "completed_episodes", "total_episode_count",
                "metric_window", "mean_return", "mean_success_rate"):
        assert all(s[key] is not None for s in (unjudged, judged)), key
    assert total["has_success_rule"] is True and total["mean_success_rate"] == pytest.approx(0.5)
    alone = RunWriter(RunDir(tmp_path / "alone").create(), "alone", 1)
    assert alone.write_summaries()["mean_return"] is None, "the aggregate is ours: null over nothing"
    alone.episode(_rec(0, 1.0, 2, None))
    aggregate = alone.close()
    assert aggregate["mean_success_rate"] is None and aggregate["has_success_rule"] is False


def test_manifest_has_plugrls_keys_and_the_command_line(tmp_path: Path) -> None:
    recorder = {"episode_freq": 3, "thread0_only": False, "record_video": True, "video_fps": 30,
                "record_full_rollout": False, "record_obs_stats": False, "record_episode_metrics": True,
                "metric_window": 50}
    writer = RunWriter(RunDir(tmp_path / "run").create(), "run", 2, metric_window=50, num_envs=8,
                       recorder_args=recorder, command_line=["plugrl-run-env-client", "point-v1", "--num-envs", "8"])
    writer.episode(_rec(1, 1.0, 2, True))
    writer.close()
    for pid in (0, 1):
        manifest = json.loads((tmp_path / f"run/rollout/proc_{pid:03d}/manifest.json").read_text())
        assert (manifest["num_envs"], manifest["metric_window"], manifest["process_id"]) == (8, 50, pid)
        assert manifest["args"] == {**recorder, "video_fps": 30.0}, "PlugRL's args: the recorder's settings, a map"
        assert isinstance(manifest["args"]["video_fps"], float), "PlugRL's type"
        assert (manifest["effective_episode_freq"], manifest["full_rollout_video"]) == (3, False)
        assert manifest["command_line"] == ["plugrl-run-env-client", "point-v1", "--num-envs", "8"]
        assert "episodes.jsonl" in manifest["files"] and "summary.json" in manifest["files"]
    default = RunWriter(RunDir(tmp_path / "b").create(), "b", 1)
    default.close()
    manifest = json.loads((tmp_path / "b/rollout/proc_000/manifest.json").read_text())
    assert manifest["command_line"] == sys.argv and manifest["args"] == {}
    assert manifest["effective_episode_freq"] == 0


def test_manifest_of_a_process_that_records_nothing_under_thread0_only_says_k_is_0(tmp_path: Path) -> None:
    recorder = {"episode_freq": 4, "thread0_only": True, "video_fps": 12.5}
    RunWriter(RunDir(tmp_path / "run").create(), "run", 2, recorder_args=recorder).close()
    manifests = [json.loads((tmp_path / f"run/rollout/proc_{pid:03d}/manifest.json").read_text()) for pid in (0, 1)]
    assert [m["effective_episode_freq"] for m in manifests] == [4, 0]
    assert [m["args"]["video_fps"] for m in manifests] == [12.5, 12.5]


def test_recorder_drops_are_in_each_summary_and_summed_in_the_aggregate(tmp_path: Path) -> None:
    writer = _writer(tmp_path, procs=3)
    writer.write_summaries()
    assert _read(tmp_path, 0)["recorder"] is None and _read(tmp_path)["recorder"] is None, "nothing reported yet"
    reports = {0: RecorderSummary(files=("sampled/a.png",), episodes_recorded=4, episodes_dropped=3, frames_dropped=90),
               1: RecorderSummary(episodes_recorded=2, episodes_dropped=1, frames_dropped=11, errors=("x: full",))}
    for pid, report in reports.items():
        writer.result(ProcessResult(pid, ProcessStatus.FINISHED, recorder=report.to_json()))
    writer.result(ProcessResult(2, ProcessStatus.FINISHED))  # recorded nothing
    writer.close()
    first, second = _read(tmp_path, 0)["recorder"], _read(tmp_path, 1)["recorder"]
    assert (first["episodes_recorded"], first["episodes_dropped"], first["frames_dropped"]) == (4, 3, 90)
    assert (second["episodes_dropped"], second["frames_dropped"]) == (1, 11)
    assert "files" not in first and "errors" not in second, "the lists stay in the manifest"
    assert _read(tmp_path, 2)["recorder"] is None
    total = _read(tmp_path)["recorder"]
    assert (total["episodes_recorded"], total["episodes_dropped"], total["frames_dropped"]) == (6, 4, 101)
    manifest = json.loads((tmp_path / "run/rollout/proc_000/manifest.json").read_text())
    assert manifest["recorder"]["episodes_dropped"] == 3 and manifest["recorder"]["files"] == ["sampled/a.png"]


def test_window_means_are_over_the_latest_episodes_and_all_episodes_are_exact(tmp_path: Path) -> None:
    writer = _writer(tmp_path, window=10)
    for i in range(30):
        writer.episode(_rec(0, float(i), i + 1, i % 2 == 0))
    writer.close()
    s = _read(tmp_path, 0)
    assert s["window_episodes"] == 10
    assert s["mean_return"] == pytest.approx(np.mean(range(20, 30)))
    assert s["all_episodes"]["mean_return"] == pytest.approx(np.mean(range(30)))


def test_aggregate_is_exact_across_processes_and_written_with_them(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    writer = _writer(tmp_path, procs=3)
    records = []
    for pid, count in enumerate([1, 7, 30]):
        for _ in range(count):
            r = _rec(pid, float(rng.normal(0, 10)), int(rng.integers(1, 100)), bool(rng.random() < 0.3))
            writer.episode(r)
            records.append(r)
        writer.progress(pid, ProcessStatus.RUNNING, Timing(env_steps=100 * (pid + 1), collect_time_s=1.0 + pid))
    total = writer.write_summaries()
    assert total == _read(tmp_path)
    assert total["completed_episodes"] == 38 == sum(_read(tmp_path, p)["completed_episodes"] for p in range(3))
    every = total["all_episodes"]
    assert every["mean_return"] == pytest.approx(np.mean([r.episode_return for r in records]), rel=1e-12)
    assert every["mean_success_rate"] == pytest.approx(np.mean([r.success for r in records]), rel=1e-12)
    assert total["timing"]["env_steps"] == 600 and total["timing"]["collect_time_s"] == pytest.approx(3.0)
    assert total["status"] == "running" and total["total_processes"] == 3
    writer.close()


def test_aggregate_stage_fractions_are_shares_of_the_processes_collect_time(tmp_path: Path) -> None:
    """Two processes that each stepped for most of their collection: the aggregate's *_frac stay within [0, 1],
    each the stage's share of the two collect times added up, and the per-process fractions are their own."""
    writer = _writer(tmp_path, procs=2)
    writer.progress(0, ProcessStatus.RUNNING, Timing(env_steps=300, env_step_s=1.6, infer_wait_s=0.2, collect_time_s=2.0))
    writer.progress(1, ProcessStatus.RUNNING, Timing(env_steps=100, env_step_s=0.9, infer_wait_s=0.05, collect_time_s=1.0))
    writer.close()
    timing = _read(tmp_path)["timing"]
    assert timing["env_step_frac"] == pytest.approx(2.5 / 3.0, abs=1e-6), "not 2.5 / 2.0 (summed over the longest)"
    assert timing["infer_wait_frac"] == pytest.approx(0.25 / 3.0, abs=1e-6)
    assert all(0.0 <= timing[f"{stage}_frac"] <= 1.0 for stage in Timing.STAGES)
    assert timing["collect_time_s"] == pytest.approx(2.0) and timing["collect_time_sum_s"] == pytest.approx(3.0)
    assert timing["effective_fps"] == pytest.approx(200.0)
    assert _read(tmp_path, 0)["timing"]["env_step_frac"] == pytest.approx(0.8)
    assert _read(tmp_path, 1)["timing"]["env_step_frac"] == pytest.approx(0.9)


def test_failures_keep_the_first_reason_and_episodes_before_them(tmp_path: Path) -> None:
    writer = _writer(tmp_path, procs=3)
    writer.episode(_rec(2, 6.0, 2, True))
    writer.result(ProcessResult(0, ProcessStatus.FINISHED))
    writer.result(ProcessResult(2, ProcessStatus.FAILED, "EnvCrashedError: boom"))
    writer.result(ProcessResult(2, ProcessStatus.FAILED, "exited with code 1"))  # the launcher's later reading
    writer.result(ProcessResult(1, ProcessStatus.FAILED, "killed by signal 9"))
    total = writer.close()
    assert total["status"] == "failed" and total["failed_processes"] == [1, 2]
    assert total["process_status"] == {"0": "finished", "1": "failed", "2": "failed"}
    assert total["errors"] == {"1": "killed by signal 9", "2": "EnvCrashedError: boom"}
    assert total["completed_episodes"] == 1
    assert writer.failures() == {1: "killed by signal 9", 2: "EnvCrashedError: boom"}


def test_a_process_stopped_from_outside_becomes_a_failure(tmp_path: Path) -> None:
    writer = _writer(tmp_path)
    writer.result(ProcessResult(0, ProcessStatus.INTERRUPTED, signum=15))
    writer.result(ProcessResult(0, ProcessStatus.FAILED, "stopped by SIGTERM"))
    assert writer.close()["errors"] == {"0": "stopped by SIGTERM"}


def test_mixed_and_uniform_end_statuses(tmp_path: Path) -> None:
    writer = _writer(tmp_path, procs=2)
    writer.result(ProcessResult(0, ProcessStatus.FINISHED))
    writer.result(ProcessResult(1, ProcessStatus.STOPPED_BY_SERVER))
    assert writer.close()["status"] == "mixed"
    other = RunWriter(RunDir(tmp_path / "b").create(), "b", 2)
    for pid in (0, 1):
        other.result(ProcessResult(pid, ProcessStatus.INTERRUPTED))
    assert other.close()["status"] == "interrupted"


def test_progress_after_the_end_does_not_reopen_a_process(tmp_path: Path) -> None:
    writer = _writer(tmp_path)
    writer.result(ProcessResult(0, ProcessStatus.FINISHED))
    writer.progress(0, ProcessStatus.RUNNING, Timing(env_steps=5))
    s = writer.close()
    assert s["status"] == "finished" and s["timing"]["env_steps"] == 5


def test_concurrent_reports_and_refreshes_lose_nothing(tmp_path: Path) -> None:
    writer = _writer(tmp_path, procs=4)

    def report(pid: int) -> None:
        for i in range(200):
            writer.episode(_rec(pid, float(i), 1, None))

    threads = [threading.Thread(target=report, args=(p,)) for p in range(4)]
    for t in threads:
        t.start()
    for _ in range(20):
        writer.write_summaries()
    for t in threads:
        t.join()
    total = writer.close()
    assert total["completed_episodes"] == 800 and total["mean_success_rate"] is None
    assert sum(len((tmp_path / f"run/rollout/proc_{p:03d}/episodes.jsonl").read_text().splitlines())
               for p in range(4)) == 800


def test_a_full_disk_fails_the_run_once_keeps_every_line_whole_and_still_writes_the_summaries(tmp_path: Path) -> None:
    """Episodes until the disk is full: the line that did not fit is cut back, later ones are refused with the same
    message, the callbacks stop the run once, and with the reserve given back the summaries and manifests fit and
    count exactly the lines on disk."""
    from small_disk import small_tmpfs

    from plugrl_env_client.errors import OutputError

    with small_tmpfs(tmp_path / "disk", "96k") as disk:
        writer = RunWriter(RunDir(disk / "run").create(), "run", 2, metric_window=10)
        stopped: list[int] = []
        writer.when_failed(lambda: stopped.append(1))
        written = 0
        with pytest.raises(OutputError) as full:
            for i in range(100_000):
                writer.episode(_rec(i % 2, float(i), 3, None))
                written += 1
        assert "no space left on device in" in str(full.value) and "(writing rollout/proc_00" in str(full.value)
        with pytest.raises(OutputError, match="no space left on device"):
            writer.episode(_rec(0, 1.0, 3, None))
        assert stopped == [1] and writer.failure is not None
        writer.result(ProcessResult(0, ProcessStatus.INTERRUPTED))
        total = writer.close()
        on_disk = []
        for pid in (0, 1):
            text = (disk / f"run/rollout/proc_{pid:03d}/episodes.jsonl").read_text()
            assert text.endswith("\n")
            on_disk += [json.loads(line) for line in text.splitlines()]
            assert (disk / f"run/rollout/proc_{pid:03d}/manifest.json").exists()
        assert total["completed_episodes"] == len(on_disk) == written > 0
        assert json.loads((disk / "run/summary.json").read_text())["completed_episodes"] == written
        assert total["process_status"]["0"] == "failed", "a process stopped by the full disk failed with it"
