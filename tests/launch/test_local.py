"""The local launcher's way home for spawned processes: one queue of reports, delivered in order by a listener
thread that outlives a report it cannot read; and the processes' log lines in the run's log, named after them."""

from __future__ import annotations

import json
import logging
import multiprocessing as mp
from pathlib import Path

import pytest

from plugrl_env_client.app import run_client
from plugrl_env_client.config import ClientConfig, RunnerConfig
from plugrl_env_client.envs import discover_envs
from plugrl_env_client.launch.local import ReportListener
from plugrl_env_client.launch.reports import EpisodeReport
from plugrl_env_client.outputs.run_dir import RunDir
from plugrl_env_client.outputs.run_writer import RunWriter
from plugrl_env_client.records import EpisodeRecord

discover_envs()
from faulty_env import FaultyConfig  # noqa: E402


def _unreadable() -> None:
    raise ValueError("this report was written by another version")


class _Unreadable:
    """Pickles, but fails to unpickle (as a report of a class the listener's process does not know would)."""

    def __reduce__(self) -> tuple:
        return _unreadable, ()


def _episode(length: int) -> EpisodeReport:
    return EpisodeReport(EpisodeRecord(0, 1.0, length, None, terminated=True, truncated=False))


def test_a_report_that_cannot_be_read_is_logged_and_the_ones_after_it_still_count(tmp_path: Path,
                                                                                  caplog: pytest.LogCaptureFixture):
    writer = RunWriter(RunDir(tmp_path / "run").create(), "run", 1)
    queue = mp.get_context("spawn").SimpleQueue()
    listener = ReportListener(queue, writer)
    listener.start()
    queue.put(_episode(3))
    queue.put(_Unreadable())
    queue.put(_episode(5))
    assert listener.finish(timeout=30), "the listener delivered what was queued and stopped"
    lengths = [json.loads(line)["length"] for line in
               (tmp_path / "run" / "rollout" / "proc_000" / "episodes.jsonl").read_text().splitlines()]
    assert lengths == [3, 5], "both readable episodes, in the order they were put"
    assert any("could not read a report" in r.getMessage() and r.levelno == logging.ERROR for r in caplog.records)


@pytest.mark.slow
def test_a_spawned_processs_log_lines_land_in_the_run_log_under_its_name(tmp_path: Path):
    """Process 1 crashes in its env: the run's log has its line, named after it, with the traceback under it."""
    cfg = ClientConfig(output_dir=tmp_path, exp_name="run", progress=False, num_envs=2, num_procs=2,
                       env=FaultyConfig(fail_process=1, fail_at_step=3), local_policy="random",
                       runner=RunnerConfig(pass_proc_id=True))
    assert run_client(cfg, "Faulty-v1") == 1
    log = (tmp_path / "run" / "logs" / "client.log").read_text()
    line = next((ln for ln in log.splitlines() if "process 1 failed" in ln and "[proc_001]" in ln), None)
    assert line is not None, log
    assert " plugrl_env_client.launch.process: process 1 failed: " in line
    after = log[log.index(line) + len(line):]
    assert after.startswith("\nTraceback (most recent call last):"), "the child's traceback follows its line"
    assert "simulated simulator crash" in after
