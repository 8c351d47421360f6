"""SIGHUP (a closed terminal or ssh session) ends a run as SIGTERM does: outputs written, status interrupted, exit
129; a run started with SIGHUP ignored (``nohup``) keeps running, its spawned processes too.

The client runs in a session of its own (``start_new_session``) and the hang-up goes to its whole process group, as
a terminal sends it: the rollout processes and multiprocessing's resource tracker get it too.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from children import FAULT_HANDLER, ended_or_stacks
from waiting import wait_until

pytestmark = pytest.mark.slow

NOHUP = ("import os, signal, sys; signal.signal(signal.SIGHUP, signal.SIG_IGN); "
         "signal.signal(signal.SIGINT, signal.SIG_DFL); os.execvp(sys.argv[1], sys.argv[1:])")
"""Run by ``python -E -S``: what ``nohup`` does (SIGHUP ignored, kept through exec), then the real command."""
TERMINAL = ("import os, signal, sys; signal.signal(signal.SIGHUP, signal.SIG_DFL); "
            "signal.signal(signal.SIGINT, signal.SIG_DFL); os.execvp(sys.argv[1], sys.argv[1:])")
"""The same for a command started from a terminal (whatever the shell that started the tests ignored)."""


def start(tmp_path: Path, num_procs: int, prologue: str = TERMINAL) -> subprocess.Popen:
    """``plugrl-run-env-client probe-v1`` with the embedded random policy and no episode target (it runs until
    stopped), in a new session."""
    cmd = [sys.executable, "-m", "plugrl_env_client", "probe-v1", "--num-envs", "2", "--num-procs", str(num_procs),
           "--local-policy", "random", "--output-dir", str(tmp_path), "--exp-name", "run", "--no-progress"]
    env = {**os.environ, **FAULT_HANDLER}  # a SIGABRT prints every thread's stack (see hang_up)
    return subprocess.Popen([sys.executable, "-E", "-S", "-c", prologue, *cmd], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True, env=env)


def episode_lines(run: Path) -> dict[str, int]:
    return {f.parent.name: len(f.read_text().splitlines()) for f in sorted((run / "rollout").glob("*/episodes.jsonl"))}


def hang_up(proc: subprocess.Popen) -> tuple[str, str]:
    """SIGHUP to the client's process group; its output once it has ended. One still running 60 s later fails
    the test with every thread's stack (SIGABRT, which the fault handler answers with them)."""
    try:
        os.killpg(proc.pid, signal.SIGHUP)
        return ended_or_stacks(proc, 60, group=True)
    finally:
        _kill_group(proc)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def check_interrupted(run: Path, proc: subprocess.Popen, out: str, err: str, num_procs: int) -> dict:
    assert proc.returncode == 128 + signal.SIGHUP, (out, err)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "interrupted", summary
    assert summary["process_status"] == {str(p): "interrupted" for p in range(num_procs)}, summary
    assert summary["completed_episodes"] == sum(episode_lines(run).values()), "every recorded episode is counted"
    assert "leaked semaphore" not in err, err
    assert "Traceback" not in err, err
    assert "interrupted (SIGHUP); writing outputs" in err, err
    return summary


@pytest.mark.parametrize("num_procs", [1, 2])
def test_sighup_before_any_periodic_summary_writes_the_outputs(tmp_path, num_procs):
    proc = start(tmp_path, num_procs)
    run = tmp_path / "run"
    try:
        wait_until((run / "summary.json").exists, 60, "the summary written at the start", proc=proc)
        first = json.loads((run / "summary.json").read_text())
        out, err = hang_up(proc)
    finally:
        _kill_group(proc)
    assert first["status"] in ("starting", "running") and first["completed_episodes"] == 0, first
    check_interrupted(run, proc, out, err, num_procs)


@pytest.mark.parametrize("num_procs", [1, 2])
def test_sighup_after_episodes_counts_every_recorded_episode(tmp_path, num_procs):
    proc = start(tmp_path, num_procs)
    run = tmp_path / "run"
    try:
        wait_until(lambda: len(episode_lines(run)) == num_procs and all(episode_lines(run).values()), 60,
                   "an episode in every process", proc=proc)
        out, err = hang_up(proc)
    finally:
        _kill_group(proc)
    summary = check_interrupted(run, proc, out, err, num_procs)
    assert summary["completed_episodes"] >= num_procs


@pytest.mark.parametrize("num_procs", [1, 2])
def test_a_run_started_with_sighup_ignored_keeps_running_after_it(tmp_path, num_procs):
    proc = start(tmp_path, num_procs, prologue=NOHUP)
    run = tmp_path / "run"
    try:
        wait_until(lambda: len(episode_lines(run)) == num_procs and all(episode_lines(run).values()), 60,
                   "an episode in every process", proc=proc)
        os.killpg(proc.pid, signal.SIGHUP)
        at_hangup = episode_lines(run)
        # Every process goes on collecting (a process that had died of the hang-up would record nothing more).
        wait_until(lambda: all(n > at_hangup[name] + 1 for name, n in episode_lines(run).items()), 60,
                   "more episodes in every process after the SIGHUP", proc=proc)
        os.killpg(proc.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        _kill_group(proc)
    assert proc.returncode == 128 + signal.SIGTERM, (out, err)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["process_status"] == {str(p): "interrupted" for p in range(num_procs)}, summary
    assert summary["completed_episodes"] == sum(episode_lines(run).values())
    assert "SIGHUP" not in err and "leaked semaphore" not in err, err
