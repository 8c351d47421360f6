"""What every bench script prints about the machine it ran on: figures mean little without the Python, the
libraries, the usable CPUs and how loaded the machine was while they were taken."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import socket
import subprocess
import sys
import time
from collections.abc import Sequence

import numpy as np


def machine_line(*dists: str) -> str:
    """Python, numpy, the given distributions' versions (from their installed metadata: nothing is imported),
    whether the package's frames are written by its compiled framer, the usable CPUs and the load average."""
    versions = [f"{dist} {_version(dist)}" for dist in dists]
    return (f"python {platform.python_version()} ({platform.python_implementation()}), numpy {np.__version__}, "
            + "".join(f"{v}, " for v in versions)
            + f"framer {framer()}, nproc {usable_cpus()} (cpu_count {os.cpu_count()}), {platform.system()} {platform.machine()}, "
            f"load avg {load_avg()}")


def framer() -> str:
    """Which way the client writes small frames: ``compiled`` (protocol/_frames.c was built) or ``Python``."""
    try:
        built = importlib.util.find_spec("plugrl_env_client.protocol._frames") is not None
    except ModuleNotFoundError:  # the package is not importable from here
        built = False
    return "compiled" if built else "Python"


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


def free_port() -> int:
    """A port no one listens on now, on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ReferenceServer:
    """``plugrl-run-policy-server`` (random policy, seed 0) in a subprocess on a free loopback port, for the length
    of a ``with`` block; ``flags`` are more of its flags, ``cores`` the CPUs it may run on (None: any)."""

    def __init__(self, flags: Sequence[str] = (), cores: set[int] | None = None) -> None:
        self.port = free_port()
        cmd = [sys.executable, "-c", "from plugrl_env_client.server.cli import main; main()", "--port", str(self.port),
               "--policy.seed", "0", *flags]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     preexec_fn=(lambda: os.sched_setaffinity(0, cores)) if cores else None)

    def __enter__(self) -> ReferenceServer:
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if "listening" not in line:
            self.proc.kill()
            self.proc.wait()
            raise RuntimeError(f"the reference server did not start: {line}")
        return self

    def __exit__(self, *exc: object) -> None:
        stop(self.proc)


def stop(proc: subprocess.Popen) -> None:
    """End a server process: SIGTERM, then SIGKILL if it has not ended within 10 s."""
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class StepClock:
    """Env steps and the wall clock of the first and the last one, for the rate of one run."""

    def __init__(self) -> None:
        self.steps, self.first, self.last = 0, 0.0, 0.0

    def tick(self, num_envs: int) -> None:
        now = time.perf_counter()
        if not self.steps:
            self.first = now
        self.steps += num_envs
        self.last = now

    def rate(self) -> float:
        return self.steps / (self.last - self.first) if self.last > self.first else 0.0
