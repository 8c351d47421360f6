"""docs/robot-suites.md stays true: each suite's block installs an extra pyproject.toml has and runs Gym-v1 with
the id of its table row, and the Meta-World commands run for real.

Meta-World pins MuJoCo 3.3.0 and the venv the tests run in has MuJoCo 4 (the ``mujoco`` extra), so Meta-World,
its MuJoCo and the one dependency the venv lacks (scipy) are pip-installed into a folder of their own (``pip
install --target --no-deps``) that goes first on the import path of the client the test runs, and of nothing
else. The other suites (gym-aloha, dm_control) render a camera every step or need MuJoCo 3 as well; they were run
by hand, each in a venv of its own (the page says so). LIBERO, a family of its own, is run for real by
tests/envs/test_libero_env.py and tests/test_suite.py.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from doc_commands import Block, DocShell, bash_blocks
from pip_sites import METAWORLD, installed, python_path_with

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "robot-suites.md"
SUITES = {"Meta-World": ("metaworld", "metaworld:Meta-World/MT1"), "gym-aloha": ("aloha", "gym_aloha/AlohaInsertion-v0"),
          "dm_control through Shimmy": ("dm-control", "shimmy:dm_control/cartpole-swingup-v0")}
"""Section heading -> (extra, --env.id) of each Gym-v1 suite the page documents."""
LIBERO_RUN = "plugrl-run-env-client libero-v1 --env.suite libero_spatial --num-episodes 2 --local-policy random"
"""The LIBERO section's client run (tests/envs/test_libero_env.py runs a short one for real)."""


def suite_blocks() -> dict[str, Block]:
    """The ```bash block under each ``## <suite>`` heading."""
    lines = GUIDE.read_text().splitlines()
    out = {}
    for block in bash_blocks(GUIDE):
        heading = next(line for line in reversed(lines[:block.line]) if line.startswith("## "))
        out[heading[3:]] = block
    return out


def test_each_suite_installs_an_extra_of_the_project_and_runs_the_id_its_row_names() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    blocks = suite_blocks()
    assert set(blocks) == {*SUITES, "LIBERO"}
    rows = [line for line in GUIDE.read_text().splitlines() if line.startswith("| ") and "](#" in line]
    assert len(rows) == len(SUITES) + 1
    for name, (extra, env_id) in SUITES.items():
        texts = [c.text for c in blocks[name].commands]
        assert any(t.startswith("python3 -m venv ") for t in texts), f"{name}: a venv of its own"
        assert f'pip install -e ".[{extra}]"' in texts and extra in extras, name
        assert extra not in " ".join(extras["test"]), f"{name} pins MuJoCo 3: not in the test extra"
        runs = [t for t in texts if "plugrl-run-env-client gym-v1" in t]
        assert len(runs) == 1 and f"--env.id {env_id} " in runs[0], name
        # Gym-v1 picks the OpenGL platform before it imports the suite (tests/envs/test_gym_env.py shows it)
        assert "MUJOCO_GL" not in runs[0], f"{name}: no variable to set by hand"
        row = next(r for r in rows if r.startswith(f"| {name.split(' through')[0]}"))
        assert f"`{extra}`" in row and f"(#{_anchor(name)})" in row, row


def test_the_libero_section_installs_its_extra_and_runs_libero_v1_and_a_shipped_suite() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    texts = [c.text for c in suite_blocks()["LIBERO"].commands]
    assert any(t.startswith("python3 -m venv ") for t in texts), "a venv of its own"
    assert 'pip install -e ".[libero]"' in texts and "libero" in extras
    assert "libero" not in " ".join(extras["test"]), "LIBERO pins MuJoCo 3: not in the test extra"
    assert LIBERO_RUN in texts
    (suite,) = [t for t in texts if t.startswith("plugrl-run-suite ")]
    assert (ROOT / suite.split()[1]).is_file(), suite
    row = next(r for r in GUIDE.read_text().splitlines() if r.startswith("| LIBERO"))
    assert "`libero`" in row and "(#libero)" in row, row


def _anchor(heading: str) -> str:
    return re.sub(r"[^a-z0-9_ -]", "", heading.lower()).replace(" ", "-")


@pytest.fixture(scope="module")
def metaworld_site() -> Path:
    return installed(METAWORLD)


@pytest.mark.slow
def test_the_metaworld_commands_run(metaworld_site: Path, tmp_path: Path) -> None:
    """The page's Meta-World run, as written (the venv and install lines are what the site folder stands for):
    one 500-step episode of reach-v3 against the embedded random policy, judged by Meta-World's success flag."""
    path = python_path_with(metaworld_site)
    probe = subprocess.run([sys.executable, "-c", "import mujoco; print(mujoco.__version__)"], capture_output=True,
                           text=True, timeout=120, env={**os.environ, "PYTHONPATH": path})
    assert probe.stdout.strip() == "3.3.0", probe.stderr
    commands = [c for c in suite_blocks()["Meta-World"].commands if c.text.startswith("plugrl-run-env-client")]
    with DocShell(tmp_path / "work", tmp_path / "runs", env={"PYTHONPATH": path}, timeout_s=300) as shell:
        results = [shell.run(c) for c in commands]
    assert all(r.ok for r in results), "\n\n".join(r.describe() for r in results)
    (run,) = (tmp_path / "runs").iterdir()
    summary = json.loads((run / "rollout" / "proc_000" / "summary.json").read_text())
    assert summary["completed_episodes"] == 1 and summary["timing"]["env_steps"] == 500
    assert summary["has_success_rule"] is True and isinstance(summary["mean_success_rate"], float)
    (episode,) = [json.loads(line) for line in (run / "rollout" / "proc_000" / "episodes.jsonl").open()]
    assert episode["length"] == 500 and episode["truncated"] and isinstance(episode["success"], bool)
    config = json.loads((run / "client_config.json").read_text())
    assert config["env"]["id"] == "metaworld:Meta-World/MT1" and json.loads(config["env"]["kwargs"]) == {
        "env_name": "reach-v3"}
