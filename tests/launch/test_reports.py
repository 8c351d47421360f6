"""Reports: what a process away from the writer sends home. Each crosses pickled, and delivering it makes the very
call the process would have made on the writer, so a run folder is the same whichever way its reports came."""

from __future__ import annotations

import dataclasses
import logging
import pickle
import sys
from pathlib import Path
from typing import Any

import pytest

from plugrl_env_client.launch.reports import EpisodeReport, LogReporter, Report, Reporter
from plugrl_env_client.outputs.run_dir import RunDir
from plugrl_env_client.outputs.run_writer import RunWriter
from plugrl_env_client.records import EpisodeRecord, ProcessResult, ProcessStatus
from plugrl_env_client.rollout.interfaces import ResultSink
from plugrl_env_client.timing import Timing


def _report_a_run(sink: ResultSink) -> None:
    """Two processes' worth of every call a process makes on its sink."""
    sink.progress(0, ProcessStatus.RUNNING, Timing(env_steps=4, collect_time_s=0.5))
    sink.episode(EpisodeRecord(0, 1.5, 4, True, terminated=True, truncated=False, process_id=0, seed=3,
                               metrics={"dist": 0.25}))
    files = sink.artifacts(1)
    files.write_bytes("sampled/ep000000_env000_first_cam.png", b"\x89PNG not really")
    files.append_bytes("metrics/episode_metrics.jsonl", b'{"episode": 0}\n')
    files.append_bytes("metrics/episode_metrics.jsonl", b'{"episode": 1}\n')
    sink.episode(EpisodeRecord(1, -2.0, 7, None, terminated=False, truncated=True, process_id=1, env_steps=7))
    sink.progress(1, ProcessStatus.RUNNING, Timing(env_steps=7, collect_time_s=1.0))
    sink.progress(0, ProcessStatus.FINISHED, Timing(env_steps=9, collect_time_s=1.5))
    sink.result(ProcessResult(0, ProcessStatus.FINISHED))
    sink.result(ProcessResult(1, ProcessStatus.FAILED, "env Faulty-v1 raised in step()",
                              recorder={"episodes_recorded": 2}))


def _files(root: Path) -> dict[str, bytes]:
    return {str(f.relative_to(root)): f.read_bytes() for f in sorted(root.rglob("*")) if f.is_file()}


def test_reports_sent_home_write_the_same_run_folder_as_direct_calls(tmp_path: Path) -> None:
    direct = RunWriter(RunDir(tmp_path / "direct").create(), "run", 2)
    _report_a_run(direct)
    direct.close()

    sent: list[Report] = []
    _report_a_run(Reporter(sent.append))
    assert len(sent) == 10, "one report per call"
    home = RunWriter(RunDir(tmp_path / "home").create(), "run", 2)
    for report in sent:
        pickle.loads(pickle.dumps(report)).deliver(home)
    home.close()

    expected = _files(tmp_path / "direct")
    assert "rollout/proc_001/metrics/episode_metrics.jsonl" in expected and "summary.json" in expected
    assert _files(tmp_path / "home") == expected


def test_a_report_cannot_be_changed_on_its_way() -> None:
    report = EpisodeReport(EpisodeRecord(0, 1.0, 1, None, terminated=True, truncated=False))
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.record = EpisodeRecord(0, 2.0, 1, None, terminated=True, truncated=False)  # type: ignore[misc]


class _Queue:
    def __init__(self) -> None:
        self.items: list[Any] = []

    def put(self, item: Any) -> None:
        self.items.append(item)


def test_a_log_report_is_written_by_the_receiving_processs_handlers(tmp_path: Path,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    """A log line of a process goes home as a report among its others and is handled there as if logged there,
    under the sending process's name and with its traceback."""
    queue = _Queue()
    handler = LogReporter(queue)
    try:
        raise RuntimeError("env exploded")
    except RuntimeError:
        record = logging.LogRecord("plugrl_env_client.launch.process", logging.ERROR, __file__, 1,
                                   "process %d crashed", (4,), sys.exc_info())
    record.processName = "proc_004"
    handler.handle(record)
    (report,) = queue.items
    caplog.set_level(logging.DEBUG)
    pickle.loads(pickle.dumps(report)).deliver(RunWriter(RunDir(tmp_path / "run").create(), "run", 1))
    (got,) = [r for r in caplog.records if r.name == "plugrl_env_client.launch.process"]
    assert got.getMessage() == "process 4 crashed" and got.processName == "proc_004"
    assert "RuntimeError: env exploded" in got.exc_text
