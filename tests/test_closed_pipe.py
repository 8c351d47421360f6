"""A command whose reader goes away (``| head -1``) still runs to its end, and its exit code is the run's own, never
the terminal's: a failed run exits 1 and says so in its summary; ``--help | head`` stays 0.

Each case is a real process whose output is a real pipe, closed by the test (the reader) after the first line.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from children import sigint_default

pytestmark = pytest.mark.slow


def first_line_then_close(args: list[str]) -> tuple[int, str]:
    """Run ``plugrl-run-env-client <args>`` with stdout and stderr one pipe, read one line, close the pipe; returns
    (exit code, that line). The process is killed if it has not ended 60 s after the close."""
    proc = subprocess.Popen(sigint_default([sys.executable, "-m", "plugrl_env_client", *args]),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        proc.stdout.close()  # the reader goes away, as `head -1` does
        proc.wait(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    return proc.returncode, line


def test_a_failed_run_exits_1_when_its_reader_closed_the_pipe(tmp_path: Path) -> None:
    code, line = first_line_then_close(["point-v1", "--server-port", "1", "--connect-timeout", "2",
                                        "--output-dir", str(tmp_path), "--exp-name", "run", "--no-progress"])
    assert line, "the run printed a first line"
    assert code == 1
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "failed", summary


def test_a_finished_run_exits_0_when_its_reader_closed_the_pipe(tmp_path: Path) -> None:
    code, line = first_line_then_close(["point-v1", "--local-policy", "random", "--num-episodes", "2",
                                        "--output-dir", str(tmp_path), "--exp-name", "run", "--no-progress"])
    assert code == 0, line
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["completed_episodes"] == 2 and summary["status"] == "finished", summary


def test_help_cut_short_by_its_reader_exits_0() -> None:
    code, line = first_line_then_close(["--help"])
    assert code == 0
    assert line.startswith("usage:"), line
