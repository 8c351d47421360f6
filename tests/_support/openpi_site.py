"""openpi's client and server for the tests: ``openpi-client`` requires numpy below 2 (and imports
``typing_extensions`` without declaring it) while the test venv has numpy 2, so both are pip-installed with their
dependencies into a folder of their own (``pip install --target``) that goes first on the import path of the
children a test starts, and of nothing else (see :mod:`pip_sites`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from pip_sites import python_path_with

OPENPI_SITE = ("openpi-client==0.1.2", "openpi-server==0.1.0", "numpy<2", "typing_extensions")
"""openpi's client and server as published, the numpy they need, and what the client imports undeclared."""


def install_openpi(site: Path) -> Path:
    """Install :data:`OPENPI_SITE` (with their dependencies) into ``site``; returns it."""
    res = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                          "--no-input", "--target", str(site), *OPENPI_SITE], capture_output=True, text=True,
                         timeout=600)
    assert (site / "openpi_server").is_dir() and (site / "openpi_client").is_dir(), res.stdout + res.stderr
    return site


__all__ = ["OPENPI_SITE", "install_openpi", "python_path_with"]
