"""Meta-World for the tests: it pins MuJoCo 3.3.0 and the test venv has MuJoCo 4 (the ``mujoco`` extra), so
Meta-World, its MuJoCo and the one dependency the venv lacks (scipy) are pip-installed into a folder of their own
(``pip install --target --no-deps``) that goes first on the import path of the client a test runs, and of nothing
else."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

METAWORLD_SITE = ("metaworld==3.1.1", "mujoco==3.3.0", "scipy")
"""Meta-World, the MuJoCo it pins, and what else it needs that the test venv does not have."""


def install_metaworld(site: Path) -> Path:
    """Install :data:`METAWORLD_SITE` into ``site``; returns it."""
    res = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--disable-pip-version-check",
                          "--no-input", "--target", str(site), *METAWORLD_SITE], capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    return site


def python_path_with(site: Path) -> str:
    """``PYTHONPATH`` for a child that imports Meta-World from ``site`` first."""
    return os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
