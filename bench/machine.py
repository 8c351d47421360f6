"""What every bench script prints about the machine it ran on: figures mean little without the Python, the
libraries, the usable CPUs and how loaded the machine was while they were taken."""

from __future__ import annotations

import importlib.metadata
import os
import platform

import numpy as np


def machine_line(*dists: str) -> str:
    """Python, numpy, the given distributions' versions (from their installed metadata: nothing is imported),
    the usable CPUs and the load average."""
    versions = [f"{dist} {_version(dist)}" for dist in dists]
    return (f"python {platform.python_version()} ({platform.python_implementation()}), numpy {np.__version__}, "
            + "".join(f"{v}, " for v in versions)
            + f"nproc {usable_cpus()} (cpu_count {os.cpu_count()}), {platform.system()} {platform.machine()}, "
            f"load avg {load_avg()}")


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 0


def load_avg() -> str:
    """The 1, 5 and 15 minute load averages ("n/a" where the system has none)."""
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except (AttributeError, OSError):
        return "n/a"


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "missing"
