"""A real small disk for tests of what a full (or read-only) disk does: a tmpfs of a few hundred KiB mounted on a
folder of the test's, unmounted when the test ends. Mounting needs root (and a kernel that lets this process mount):
elsewhere the test is skipped, saying why."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def small_tmpfs(where: Path, size: str = "200k", read_only: bool = False) -> Iterator[Path]:
    """``where`` (created) as the mount point of a tmpfs of ``size``; skips the test when it cannot be mounted."""
    if os.name != "posix" or os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    if shutil.which("mount") is None:
        pytest.skip("no mount command here")
    where.mkdir(parents=True, exist_ok=True)
    options = f"size={size}" + (",ro" if read_only else "")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True,
                             text=True, timeout=30)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True, timeout=30, check=False)
