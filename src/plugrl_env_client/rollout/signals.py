"""Signals as a clean end of the run: SIGINT, SIGTERM and SIGHUP become :class:`Interrupted`, raised in the main
thread.

SIGHUP is what a closed terminal or ssh session sends: the run ends as on SIGTERM, with its outputs. A SIGHUP that was
ignored when the process started (``nohup``) stays ignored, here and in every process started from here (an ignored
signal stays ignored through fork and exec). The rollout loop stops where it is, its ``finally`` blocks write the outputs, and the exit code is 128 + the signal
number. Inside :func:`deferred_interrupts` (recording a finished episode) a signal waits until the block is done,
so an episode is never half-recorded (claimed in the shared budget but missing from ``episodes.jsonl``); inside
:func:`shielded` (writing the final outputs) a further signal is ignored.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from typing import Any


class _State:
    """How deep inside held-signal blocks the main thread is, and the signal that arrived meanwhile."""

    defer_depth = 0
    pending: int | None = None
    received: int | None = None  # the last stop signal that arrived, its exception raised or not

    def reset(self) -> None:
        self.defer_depth, self.pending, self.received = 0, None, None


_state = _State()
# A child forked inside a held-signal block (the local launcher starts its children inside one, and the fork start
# method copies that) never leaves the block: its own signals must not wait for the parent's block to end.
os.register_at_fork(after_in_child=_state.reset)


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""The signals that end a run cleanly (outputs written, exit code 128 + the signal's number)."""


class Interrupted(KeyboardInterrupt):
    """SIGINT, SIGTERM or SIGHUP: stop collecting, write outputs, exit with 128 + the signal number."""

    def __init__(self, signum: int = signal.SIGINT) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = int(signum)


def _on_signal(signum: int, _frame: Any) -> None:
    _state.received = signum
    if _state.defer_depth:
        _state.pending = signum
        return
    raise Interrupted(signum)


@contextlib.contextmanager
def interrupt_handlers() -> Iterator[None]:
    """Turn SIGINT, SIGTERM and SIGHUP into :class:`Interrupted` while the block runs (main thread only); an
    ignored SIGHUP (``nohup``) stays ignored."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, _on_signal) for sig in STOP_SIGNALS
                if not (sig == signal.SIGHUP and signal.getsignal(sig) == signal.SIG_IGN)}
    _state.received = None
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _state.received = None


def raise_swallowed() -> None:
    """Raise the stop signal that arrived while its exception did not end the run: code that catches every exception
    may have swallowed it (Cython's module initialisation ignores errors while it registers its types, so a signal
    during such an import was lost). Called where a run checks in now and then (main thread only)."""
    if _state.received is not None and not _state.defer_depth \
            and threading.current_thread() is threading.main_thread():
        raise Interrupted(_state.received)


@contextlib.contextmanager
def blocked() -> Iterator[None]:
    """Block the stop signals while the block runs (main thread only); one that arrives meanwhile is raised when
    it ends. A process started inside the block inherits the mask: it starts with them blocked too, so a signal
    cannot kill it before it installs its own handlers (and it unblocks them once it has).

    The block is also held at Python's level (:func:`deferred_interrupts`): the kernel may hand a signal sent to
    the whole process to another thread, whose handler call then runs in this thread while the mask is still on,
    and it must not interrupt the block halfway (a child process half started, multiprocessing's resource tracker
    half launched)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    with deferred_interrupts():  # outside the mask: a signal the mask held, delivered as it lifts, is held too
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            yield
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)


class _HeldSignals:
    """The block of :func:`deferred_interrupts` and :func:`shielded`: a class rather than a generator, as the
    rollout enters one for every finished episode."""

    __slots__ = ("raise_when_done", "held")

    def __init__(self, raise_when_done: bool) -> None:
        self.raise_when_done, self.held = raise_when_done, False

    def __enter__(self) -> None:
        # Signals are raised in the main thread only: another thread's block must neither hold nor take them.
        if threading.current_thread() is threading.main_thread():
            self.held = True
            _state.defer_depth += 1

    def __exit__(self, *exc: object) -> None:
        if not self.held:
            return
        _state.defer_depth -= 1  # from here a new signal raises at once
        if _state.defer_depth == 0:
            pending, _state.pending = _state.pending, None
            if pending is not None and self.raise_when_done:
                raise Interrupted(pending)


def deferred_interrupts() -> contextlib.AbstractContextManager[None]:
    """Hold a signal that arrives inside the block and raise it when the block ends."""
    return _HeldSignals(raise_when_done=True)


def shielded() -> contextlib.AbstractContextManager[None]:
    """Let the block finish whatever signal arrives (the run is already ending: outputs are being written)."""
    return _HeldSignals(raise_when_done=False)
