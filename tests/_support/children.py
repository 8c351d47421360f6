"""Child processes that react to Ctrl-C and a closed terminal as they would in a terminal, whatever the shell that
started the tests did.

A shell without job control starts a background command with SIGINT ignored (``nohup pytest &``, a script's
``pytest &``; ``nohup`` ignores SIGHUP too), and an ignored signal stays ignored through fork and exec. A Python child then installs no
KeyboardInterrupt handler, and a policy server or a client that a test stops with SIGINT would not stop. exec
resets a signal that has a handler to its default action, but not an ignored one, and ``subprocess`` has no option
for it (``restore_signals`` covers SIGPIPE, SIGXFZ and SIGXFSZ only; ``preexec_fn`` is unsafe in a process with
threads, which the tests that run several shells at once are). So such a child starts as a bare interpreter that
sets SIGINT and SIGHUP to their default actions and execs the real command: the same process id, with Ctrl-C and
a hang-up working.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Sequence

import pytest

PROLOGUE = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
            "signal.signal(signal.SIGHUP, signal.SIG_DFL); os.execvp(sys.argv[1], sys.argv[1:])")
"""Run by ``python -E -S`` (no site packages, no PYTHON* variables: a start of a few milliseconds); the command it
execs gets the environment as given (``execvp`` finds it on that ``PATH``)."""


def sigint_default(argv: Sequence[str]) -> list[str]:
    """``argv`` as a command that starts with SIGINT and SIGHUP at their default actions (pass it to
    ``subprocess.Popen``)."""
    return [sys.executable, "-E", "-S", "-c", PROLOGUE, *argv]


FAULT_HANDLER = {"PYTHONFAULTHANDLER": "1"}
"""Environment for a child whose stacks :func:`ended_or_stacks` may need: Python's fault handler prints every
thread's stack on SIGABRT."""


def ended_or_stacks(proc: subprocess.Popen, timeout: float, group: bool = False) -> tuple[str, str]:
    """``proc.communicate(timeout=timeout)``; a child still running by then (started with :data:`FAULT_HANDLER` in
    its environment) gets SIGABRT, and the test fails with every thread's stack, so a hang says where it is.
    ``group``: the child leads a session of its own, and its whole process group gets the SIGABRT."""
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        (os.killpg if group else os.kill)(proc.pid, signal.SIGABRT)
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            err = "(no stacks: it did not answer SIGABRT within 30 s)"
        pytest.fail(f"still running {timeout:g} s later; its stacks:\n{err}")
