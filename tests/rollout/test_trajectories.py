"""An episode depends on its seed, the env and the policy: not on how the run was split.

A reactive policy that answers chunks (the same action held over 4 steps, computed from the observation it was
asked with) on an env whose rows are computed on their own (``arm_env.py``), from fixed start seeds: every split of
the run (envs per process, processes, pipeline groups, ``auto``) and a run killed with SIGKILL at seeded moments
and resumed give the same episodes as one env stepping them one after another, bit for bit (seed, return, length,
success). So an env's chunks end when its own episode says so, never because a neighbour's episode ended or it
ran out of episodes, and a resumed episode starts from its seed as the uninterrupted one did.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from children import sigint_default
from waiting import wait_until

ARM_ENV = str(Path(__file__).resolve().parents[1] / "_support" / "arm_env.py")
SEEDS = [str(s) for s in range(24)]
TIMEOUT_S = 300.0


def _args(out: Path, name: str, *flags: str) -> list[str]:
    return ["Arm2D-v1", "--env-path", ARM_ENV, "--local-policy", "arm-reach", "--local-policy-horizon", "4",
            "--runner.start-seeds", *SEEDS, "--output-dir", str(out), "--exp-name", name, "--no-progress", *flags]


def _command(args: list[str]) -> list[str]:
    return sigint_default([sys.executable, "-m", "plugrl_env_client", *args])


def _episodes(run: Path) -> dict[int, tuple[Any, ...]]:
    """seed -> (return, length, success, terminated) of every episode line of the run; a seed twice fails."""
    out: dict[int, tuple[Any, ...]] = {}
    for path in sorted(run.glob("rollout/proc_*/episodes.jsonl")):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            assert row["seed"] not in out, f"seed {row['seed']} recorded twice"
            out[row["seed"]] = (row["return"], row["length"], row["success"], row["terminated"])
    return out


def _lines(run: Path) -> int:
    return sum(f.read_bytes().count(b"\n") for f in run.glob("rollout/proc_*/episodes.jsonl"))


@pytest.fixture(scope="module")
def one_env(tmp_path_factory) -> dict[int, tuple[Any, ...]]:
    """The episodes of one env stepping every seed in turn."""
    out = tmp_path_factory.mktemp("one-env")
    done = subprocess.run(_command(_args(out, "one")), capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, done.stderr
    episodes = _episodes(out / "one")
    assert sorted(episodes) == list(range(24))
    lengths = {length for _, length, _, _ in episodes.values()}
    assert len(lengths) > 8, "episodes of many lengths: envs of a batch end at different steps"
    return episodes


@pytest.mark.slow
@pytest.mark.parametrize("flags", [
    ("--num-envs", "2"),
    ("--num-envs", "4"),
    ("--num-envs", "3", "--num-procs", "2"),
    ("--num-envs", "4", "--runner.pipeline", "2"),
    ("--num-envs", "4", "--runner.pipeline", "auto"),
    ("--num-envs", "2", "--num-procs", "2", "--runner.pipeline", "2", "--runner.episode-split", "shared"),
], ids=["envs-2", "envs-4", "envs-3-procs-2", "pipeline-2", "pipeline-auto", "procs-2-pipeline-2-shared"])
def test_every_split_gives_the_episodes_of_one_env(tmp_path: Path, one_env, flags: tuple[str, ...]) -> None:
    done = subprocess.run(_command(_args(tmp_path, "split", *flags)), capture_output=True, text=True,
                          timeout=TIMEOUT_S)
    assert done.returncode == 0, done.stderr
    got = _episodes(tmp_path / "split")
    differ = {seed: (one_env[seed], got.get(seed)) for seed in one_env if got.get(seed) != one_env[seed]}
    assert not differ, f"episodes that differ from one env's (seed: (one env, this split)): {differ}"


@pytest.mark.slow
@pytest.mark.parametrize("seed", [3, 11])
def test_a_run_killed_at_a_seeded_moment_and_resumed_gives_the_episodes_of_one_env(tmp_path: Path, one_env,
                                                                                   seed: int) -> None:
    """SIGKILL of the launcher's whole process group once a seeded number of episodes are on disk (episodes in
    flight then are lost and run again from their seeds), then ``--resume`` until the run ends."""
    at = random.Random(seed).randint(3, 18)
    args = _args(tmp_path, "killed", "--num-envs", "2", "--num-procs", "2", "--env.step-sleep-s", "0.01")
    proc = subprocess.Popen(_command(args), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    run = tmp_path / "killed"
    try:
        wait_until(lambda: _lines(run) >= at, TIMEOUT_S, f"{at} episodes in {run}", proc=proc)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.communicate(timeout=TIMEOUT_S)
    assert _lines(run) < 24, "killed before the end"
    done = subprocess.run(_command([*args, "--resume"]), capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, done.stderr
    got = _episodes(run)
    differ = {s: (one_env[s], got.get(s)) for s in one_env if got.get(s) != one_env[s]}
    assert not differ, f"episodes that differ from one env's (seed: (one env, resumed)): {differ}"
