"""Whole runs (the command line, an env file loaded with --env-path) of an env returning odd values: each is one
clear line, a warning or the run's error, and never a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ODD_ENV = str(Path(__file__).resolve().parents[1] / "_support" / "odd_envs.py")


def run_odd(tmp_path: Path, *flags: str, episodes: int = 4) -> subprocess.CompletedProcess:
    """``plugrl-run-env-client odd-v1`` with the embedded random policy, into ``tmp_path/run``."""
    args = ["odd-v1", "--env-path", ODD_ENV, "--local-policy", "random", "--num-episodes", str(episodes),
            "--no-progress", "--output-dir", str(tmp_path), "--exp-name", "run", *flags]
    return subprocess.run([sys.executable, "-m", "plugrl_env_client", *args], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)


def episodes_of(tmp_path: Path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "run/rollout/proc_000/episodes.jsonl").read_text().splitlines()]


def test_a_reward_beyond_float32_stops_the_run_saying_it_does_not_fit(tmp_path: Path) -> None:
    result = run_odd(tmp_path, "--env.reward", "1e39")
    said = ("error: process 0 failed: env Odd-v1: step() returned rewards that do not fit float32 (1e+39; float32's "
            "largest is 3.40282e+38) for envs [0]: scale the rewards into float32's range, or pass "
            "--runner.non-finite-rewards zero to replace them by 0.0")
    assert result.returncode == 1 and said in result.stderr.splitlines(), result.stderr
    assert "NaN" not in result.stderr and "Traceback" not in result.stderr


def test_a_reward_beyond_float32_is_zeroed_with_the_zero_mode_and_the_warning_says_why(tmp_path: Path) -> None:
    result = run_odd(tmp_path, "--env.reward", "1e39", "--runner.non-finite-rewards", "zero", episodes=2)
    said = ("WARNING: env Odd-v1 returned rewards that do not fit float32 (1e+39; float32's largest is 3.40282e+38) "
            "for envs [0]; replaced by 0 (--runner.non-finite-rewards zero)")
    assert result.returncode == 0, result.stderr
    assert said in result.stderr.splitlines() and "NaN" not in result.stderr
    assert [e["return"] for e in episodes_of(tmp_path)] == [0.0, 0.0]


def test_an_env_that_resets_itself_inside_step_fails_the_run_in_the_checkers_words(tmp_path: Path) -> None:
    result = run_odd(tmp_path, "--env.reset-in-step-at", "5")
    said = ("error: process 0 failed: env Odd-v1: step() called the env's reset(): do not reset inside step(): return "
            "the terminal observation with terminated or truncated set; the client calls reset(options="
            "{'reset_mask': ...}) for finished envs")
    assert result.returncode == 1 and said in result.stderr.splitlines(), result.stderr
    assert "Traceback" not in result.stderr
    assert [e["length"] for e in episodes_of(tmp_path)] == [3], "the episode before it is kept"
