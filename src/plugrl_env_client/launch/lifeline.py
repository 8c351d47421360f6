"""A spawned process ends with the process that started it, whatever killed that one.

A launcher that dies without a word (SIGKILL from a scheduler's preemption, the OOM killer) cannot stop its
children, and nothing else would: they go on stepping and reconnecting to a server that may have died with it
(the embedded one is a thread of the launcher), or sending experience to an external one whose results nobody
records. So each child holds a lifeline, set up first thing:

* on Linux, a parent-death signal (``prctl(PR_SET_PDEATHSIG, SIGTERM)``): the kernel sends SIGTERM when the
  parent dies, which the child answers as it answers any SIGTERM, by stopping after its current step and closing
  its env and connection. The signal comes when the *thread* that started the child ends; the launcher starts its
  children from the thread that then waits for them, so that thread ends only with the launcher;
* everywhere, a watchdog thread that waits on the parent's sentinel (``multiprocessing.parent_process()``: a pipe
  the parent holds open, at end of file once the parent is gone) and compares the parent's pid (with the fork
  start method later siblings hold the sentinel open too). Its first look comes right after the signal is armed,
  so a parent that died before (it raced the child's start, and the signal will never come) is caught. It sends
  the main thread a SIGTERM of its own (the kernel's may land in another thread, which does not wake the main
  thread where it blocks), and ends the process with :func:`os._exit` if it is still there ``grace_s`` later (an
  env deaf to SIGTERM, a non-daemon thread an env left behind, a report blocked on a pipe nobody reads).

Once orphaned, what the child would send home is dropped (:meth:`Lifeline.guarded`): its finished episodes were
sent as they finished, and the launcher that would write the rest is gone; a ``put`` must not block the exit on a
pipe that only siblings still hold. The spawn resource tracker needs nothing of its own: it exits when the last
process holding its pipe (the launcher and each child) is gone.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import threading
import time
from typing import Any

PR_SET_PDEATHSIG = 1
"""prctl(2) option: the signal this process gets when its parent dies (Linux)."""
GRACE_S = 3.0
"""How long an orphaned child may take to stop (close its env and connection) before it is ended."""
CHECK_PERIOD_S = 0.25
"""How often the watchdog also compares the parent's pid (a sentinel that siblings hold open never ends)."""
EXIT_ORPHANED = 128 + signal.SIGTERM
"""The exit code of a child ended by its lifeline (as if stopped by SIGTERM: nobody is left to read it)."""


class Lifeline:
    """In a spawned process: stop soon after the parent dies, and drop what would go home from then on."""

    def __init__(self, name: str, grace_s: float = GRACE_S) -> None:
        self.name = name
        self.grace_s = grace_s
        self.orphaned = threading.Event()
        self._sigterm_seen = False  # a SIGTERM reached the process's handler (a plain flag: set in the handler)

    def start(self) -> Lifeline:
        """Arm the parent-death signal and start the watchdog; call it in the main thread, with the process's
        SIGTERM handler in place. Nothing happens in a process that has no parent process."""
        parent = multiprocessing.parent_process()
        if parent is None or threading.current_thread() is not threading.main_thread():
            return self
        self._watch_sigterm()
        # With forkserver the parent is the fork server, which lives as long as its children: no use waiting on it.
        forkserver = multiprocessing.get_start_method(allow_none=True) == "forkserver"
        if not forkserver:
            _set_parent_death_signal(signal.SIGTERM)
        # The watchdog's first look comes right away: a parent that died before the signal was armed (it raced the
        # child's start: the signal would never come) is caught there, by its sentinel or its pid.
        threading.Thread(target=self._watch, args=(parent, None if forkserver else parent.pid),
                         name="plugrl-lifeline", daemon=True).start()
        return self

    def guarded(self, queue: Any) -> _Guarded:
        """``queue`` whose ``put`` does nothing once the parent is gone."""
        return _Guarded(queue, self.orphaned)

    def _watch_sigterm(self) -> None:
        """Pass the first SIGTERM on to the process's handler, and no other: the first one stops the process, and a
        second interrupt would only cut its cleanup short. More than one comes when the parent dies: the kernel
        sends the parent-death signal again as each of the parent's threads dies (the child is handed from one to
        the next), and the watchdog sends its own."""
        handler = signal.getsignal(signal.SIGTERM)
        if not callable(handler):  # default or ignored: nothing to pass on, and nothing to note
            return

        def on_sigterm(signum: int, frame: Any) -> None:  # no locks here: a second signal may run it inside itself
            again, self._sigterm_seen = self._sigterm_seen, True
            if not again:
                handler(signum, frame)

        signal.signal(signal.SIGTERM, on_sigterm)

    def _watch(self, parent: Any, ppid: int | None) -> None:
        while not (multiprocessing.connection.wait([parent.sentinel], CHECK_PERIOD_S)
                   or (ppid is not None and os.getppid() != ppid)):
            pass
        self.orphaned.set()
        _say(f"{self.name}: the process that started it (pid {parent.pid}) is gone; stopping")
        if not self._sigterm_seen:
            # The kernel's SIGTERM may be on its way, or may have landed in another thread, which leaves the main
            # thread blocked where it waits (a lock, a handshake) until that wait times out: this one wakes it. The
            # handler runs once for both (Python runs a handler once for the arrivals it has not run it for yet).
            signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGTERM)
        # Still here after the grace time: end it. (A daemon thread: a process that ended by itself took this one
        # along before the time is up.)
        time.sleep(self.grace_s)
        _say(f"{self.name}: did not stop within {self.grace_s:g} s of losing its parent; ending it")
        os._exit(EXIT_ORPHANED)


class _Guarded:
    def __init__(self, queue: Any, orphaned: threading.Event) -> None:
        self._put, self._orphaned = queue.put, orphaned

    def put(self, item: Any) -> None:
        if not self._orphaned.is_set():
            self._put(item)


def _set_parent_death_signal(signum: int) -> bool:
    """Ask the kernel for ``signum`` when the parent dies; whether it will come (Linux only)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0) == 0
    except (OSError, AttributeError):  # no prctl to call: the watchdog alone
        return False


def _say(line: str) -> None:
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):  # no terminal left to say it on
        pass


__all__ = ["GRACE_S", "Lifeline"]
