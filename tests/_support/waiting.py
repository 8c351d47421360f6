"""Waiting in a test for something another thread or process does: for the event itself, never for a time.

A fixed sleep is too short on a loaded machine (the test flakes) and too long on an idle one (the suite crawls).
:func:`wait_until` returns as soon as its condition holds; its timeout only keeps a broken run from hanging the
suite, and when it runs out the failure names what did not happen.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable


def wait_until(condition: Callable[[], object], timeout_s: float, what: str,
               proc: subprocess.Popen | None = None, poll_s: float = 0.01) -> None:
    """Return once ``condition()`` is true; fail, naming ``what``, after ``timeout_s`` seconds. With ``proc``, fail
    at once (with its output, when it was piped) if that process ends first."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if proc is not None and proc.poll() is not None:
            output = proc.communicate() if proc.stdout is not None or proc.stderr is not None else ()
            raise AssertionError(f"the process ended (code {proc.returncode}) before {what}", *output)
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {timeout_s:g} s")
        time.sleep(poll_s)


def threads_started_by(start: Callable[[], object]) -> set[threading.Thread]:
    """The threads ``start()`` started: a test that stops them asks whether they ended (joined, nothing more can
    come from them) instead of sleeping to see that nothing more came."""
    before = set(threading.enumerate())
    start()
    return set(threading.enumerate()) - before
