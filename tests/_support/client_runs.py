"""Running the client as a user does, in a subprocess, and stopping it the way a user does (Ctrl-C); checking what a
run wrote."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

from children import sigint_default
from waiting import wait_until


def interrupt_once_collecting(args: list[str], episodes: Path, sig: int = signal.SIGINT,
                              timeout_s: float = 60.0) -> subprocess.CompletedProcess:
    """Start ``plugrl-run-env-client <args>``, send ``sig`` once ``episodes`` (an episodes.jsonl) has a line, and
    return how it ended. The process is killed if it outlives the timeout; it starts with SIGINT at its default
    action, as from a terminal."""
    proc = subprocess.Popen(sigint_default([sys.executable, "-m", "plugrl_env_client", *args]), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: episodes.exists() and episodes.stat().st_size, timeout_s, f"episode in {episodes}",
                   proc=proc)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=timeout_s)
    finally:
        proc.kill()
        proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def check_run_of_one_process(run: Path, episodes: int, max_length: int) -> None:
    """A finished one-process run: ``episodes`` lines in episodes.jsonl, each at most ``max_length`` steps (the
    env's own limit), a summary whose mean length is theirs and whose step count covers them."""
    summary = json.loads((run / "summary.json").read_text())
    lengths = [json.loads(line)["length"] for line in (run / "rollout/proc_000/episodes.jsonl").read_text().splitlines()]
    assert summary["completed_episodes"] == len(lengths) == episodes
    assert abs(summary["mean_length"] - sum(lengths) / len(lengths)) < 1e-9
    assert all(1 <= n <= max_length for n in lengths), lengths
    assert summary["timing"]["env_steps"] >= sum(lengths), "every recorded step was stepped"
