"""One run folder, one run: two runs started at the same moment with one --exp-name never share a folder (it is made
exclusively: one run gets it, the other is refused, naming it), and an existing folder is never reused."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from children import sigint_default

from plugrl_env_client.outputs.run_dir import RunDir


def test_of_two_threads_creating_one_run_folder_at_once_exactly_one_gets_it(tmp_path: Path) -> None:
    barrier = threading.Barrier(8)
    outcomes: list[str] = []

    def create() -> None:
        barrier.wait(timeout=30)
        try:
            RunDir(tmp_path / "out" / "run").create()
            outcomes.append("created")
        except FileExistsError:
            outcomes.append("refused")

    threads = [threading.Thread(target=create) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sorted(outcomes) == ["created"] + ["refused"] * 7
    assert (tmp_path / "out" / "run" / "logs").is_dir() and (tmp_path / "out" / "run" / "rollout").is_dir()


def test_an_existing_folder_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    from plugrl_env_client.app import run_client
    from plugrl_env_client.config import ClientConfig
    from plugrl_env_client.envs import discover_envs
    from plugrl_env_client.errors import ConfigError

    discover_envs()
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "notes.txt").write_text("mine")
    cfg = ClientConfig(output_dir=tmp_path, exp_name="run", local_policy="random", num_episodes=1, progress=False)
    with pytest.raises(ConfigError, match=r"run already exists; to continue that run where it stopped add --resume, or pick another --exp-name"):
        run_client(cfg, "point-v1")
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["notes.txt"]


@pytest.mark.slow
def test_two_runs_started_together_with_one_exp_name_exactly_one_runs(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "plugrl_env_client", "point-v1", "--local-policy", "random", "--num-episodes", "2",
           "--output-dir", str(tmp_path), "--exp-name", "same", "--no-progress"]
    procs = [subprocess.Popen(sigint_default(cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    try:
        ends = [proc.communicate(timeout=120) for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    codes = sorted(proc.returncode for proc in procs)
    assert codes == [0, 1], ends
    _, refused_err = ends[[proc.returncode for proc in procs].index(1)]
    folder = tmp_path / "same"
    assert f"error: {folder} already" in refused_err and "pick another --exp-name" in refused_err, refused_err
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["completed_episodes"] == 2 and summary["total_processes"] == 1, summary
    lines = (folder / "rollout" / "proc_000" / "episodes.jsonl").read_text().splitlines()
    assert len(lines) == 2, "only the run that got the folder wrote into it"
