"""Whole runs (the command line, an env file loaded with --env-path) of an env returning odd values: each is one
clear line, a warning or the run's error, and never a traceback."""

from __future__ import annotations

import json
import re
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


def assert_strict_json_lines(path: Path) -> list[dict]:
    """Every line of ``path`` is strict UTF-8 JSON: it encodes as UTF-8 and has no ``\\ud800``-``\\udfff`` escape,
    which strict readers (Go, Rust, jq) refuse unless two form a pair (none of our writers pairs them)."""
    rows = []
    for line in path.read_bytes().decode("utf-8", "strict").splitlines():
        line.encode("utf-8", "strict")
        assert not re.search(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}", line), line
        rows.append(json.loads(line))
    return rows


def test_lone_surrogates_in_text_instruction_and_metric_names_become_u_fffd(tmp_path: Path) -> None:
    result = run_odd(tmp_path, "--env.surrogate", "--recorder.episode-freq", "1",
                     "--recorder.record-episode-metrics", episodes=2)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    for field in ("the observation's text", "info['env_instruction']", "a key of info['metrics']"):
        said = (f"WARNING: env Odd-v1 returned a lone surrogate (half of a UTF-16 pair, which no UTF-8 file or message "
                f"can hold) in {field}; each one is replaced by U+FFFD")
        assert lines.count(said) == 1, (field, result.stderr)
    proc = tmp_path / "run/rollout/proc_000"
    episodes = assert_strict_json_lines(proc / "episodes.jsonl")
    assert [(e["instruction"], e["metrics"]) for e in episodes] == [("go\ufffd", {"score\ufffd": 1.0})] * 2
    assert_strict_json_lines(proc / "metrics/episode_metrics.jsonl")
    for path in [proc / "summary.json", proc / "manifest.json", tmp_path / "run/summary.json"]:
        text = path.read_bytes().decode("utf-8", "strict")
        assert not re.search(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}", text) and json.loads(text), path
    samples = sorted(proc.glob("sampled/ep_*/env_*/obs/*/text.txt"))
    assert len(samples) == 4, "first and last text of both episodes"
    assert all("\ufffd" in p.read_text("utf-8") for p in samples)


def test_states_of_another_dtype_than_declared_warn_once(tmp_path: Path) -> None:
    result = run_odd(tmp_path, "--env.states-dtype", "float64", episodes=3)
    said = ("WARNING: env Odd-v1: states['pos'] is float64 where the space declares float32: declare the dtypes the env "
            "returns (observation_space(states={'pos': np.zeros(2, np.float32)}) takes an example array's shape and "
            "dtype) or return the declared ones")
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines().count(said) == 1, result.stderr
    (tmp_path / "same").mkdir()
    assert "declares" not in run_odd(tmp_path / "same", episodes=1).stderr, "the declared dtype: no warning"
