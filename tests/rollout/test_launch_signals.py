"""Signals end a run cleanly: outputs written, exit 128 + signal number (SIGINT 130, SIGTERM 143)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from children import FAULT_HANDLER, ended_or_stacks, sigint_default
from waiting import wait_until


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    wait_until(lambda: path.exists() and path.read_text().strip(), timeout, f"line in {path}", proc=proc)


@pytest.mark.slow
@pytest.mark.parametrize("sig,num_procs", [(signal.SIGINT, 1), (signal.SIGTERM, 1), (signal.SIGTERM, 2)])
def test_signal_writes_outputs_and_exits_128_plus_signum(tmp_path, sig, num_procs):
    cmd = [sys.executable, "-m", "plugrl_env_client", "probe-v1", "--num-envs", "2", "--num-procs", str(num_procs),
           "--local-policy", "random", "--output-dir", str(tmp_path), "--exp-name", "run", "--no-progress"]
    proc = subprocess.Popen(sigint_default(cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **FAULT_HANDLER})
    try:
        for p in range(num_procs):  # every process is collecting episodes
            wait_for(tmp_path / "run" / "rollout" / f"proc_{p:03d}" / "episodes.jsonl", proc)
        proc.send_signal(sig)
        out, err = ended_or_stacks(proc, 60)
    finally:
        proc.kill()
    assert proc.returncode == 128 + sig, (out, err)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["completed_episodes"] > 0
    lines = sum(len(f.read_text().splitlines()) for f in (tmp_path / "run" / "rollout").glob("*/episodes.jsonl"))
    assert summary["completed_episodes"] == lines, "every recorded episode is in the summary"
    assert set(summary["process_status"].values()) == {"interrupted"}


@pytest.mark.slow
def test_ctrl_c_while_processes_start_is_a_clean_interrupt(tmp_path):
    cmd = [sys.executable, "-m", "plugrl_env_client", "probe-v1", "--num-envs", "2", "--num-procs", "2",
           "--local-policy", "random", "--output-dir", str(tmp_path), "--exp-name", "run", "--no-progress"]
    proc = subprocess.Popen(sigint_default(cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **FAULT_HANDLER})
    try:
        wait_until((tmp_path / "run" / "client_config.json").exists, 60, "client_config.json", proc=proc)
        proc.send_signal(signal.SIGINT)
        out, err = ended_or_stacks(proc, 60)
    finally:
        proc.kill()
    assert proc.returncode == 130, (out, err)
    assert "Traceback" not in err
    summary_path = tmp_path / "run" / "summary.json"
    if summary_path.exists():  # interrupted before anything ran: nothing to sum up is fine, a failure is not
        summary = json.loads(summary_path.read_text())
        assert summary["failed_processes"] == [] and set(summary["process_status"].values()) <= {"interrupted"}
