"""The processes a process started, read from ``/proc`` (Linux): to check that none outlives it.

A process is named by its pid and its start time (field 22 of ``/proc/<pid>/stat``), so a pid the kernel reuses
for another process does not count as the old one still running; a zombie (its parent never reaped it, as an
orphan's new parent in a container may not) counts as gone.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

Process = tuple[int, int]  # (pid, start time in clock ticks since boot)


def _stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (state first), or None without the process."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()


def descendants(pid: int) -> set[Process]:
    """Every living process below ``pid`` (children, their children, ...)."""
    children: dict[int, list[int]] = {}
    starts: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (fields := _stat(int(entry))) is not None and fields[0] not in "ZX":
            children.setdefault(int(fields[1]), []).append(int(entry))
            starts[int(entry)] = int(fields[19])
    found: set[Process] = set()
    todo = list(children.get(pid, ()))
    while todo:
        child = todo.pop()
        found.add((child, starts[child]))
        todo.extend(children.get(child, ()))
    return found


def alive(process: Process) -> bool:
    fields = _stat(process[0])
    return fields is not None and fields[0] not in "ZX" and int(fields[19]) == process[1]


def command_line(process: Process) -> str:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{process[0]}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    return "?"


def wait_all_gone(processes: set[Process], timeout_s: float) -> tuple[float, set[Process]]:
    """Wait until none of ``processes`` is alive, at most ``timeout_s``; (seconds waited, those still alive)."""
    start = time.monotonic()
    left = {p for p in processes if alive(p)}
    while left and time.monotonic() - start < timeout_s:
        time.sleep(0.05)
        left = {p for p in left if alive(p)}
    return time.monotonic() - start, left


def kill_all(processes: set[Process]) -> None:
    """SIGKILL what is left of ``processes`` (a failed test's leftovers, so they do not outlive it)."""
    for process in processes:
        if alive(process):
            with contextlib.suppress(OSError):
                os.kill(process[0], signal.SIGKILL)
