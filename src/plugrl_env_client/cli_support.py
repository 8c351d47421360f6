"""How every ``plugrl-*`` command ends: the same messages and exit codes, whichever command it is.

* 0 when the command did its job (``--help`` and ``--version`` included);
* 1 on an error the user can fix (a :class:`~plugrl_env_client.errors.PlugRLError`): one line on stderr,
  ``error: <what was wrong and what to do>``, and no traceback;
* 2 on a command line the parser refuses (tyro prints why and the usage);
* 128 + the signal's number when interrupted before the command had anything to write (130 for Ctrl-C);
* a closed pipe (``--help | head``) ends quietly;
* a thread left running (an env's simulator worker nobody stops) does not keep a finished command alive: the
  interpreter waits :data:`EXIT_GRACE_S` for the threads still running when it ends, then one warning names them and
  the process ends with the command's code (:func:`end_despite_threads`).

The commands' own modules use it (the client's ``cli.py``, ``server/cli.py``, ``report/cli.py``, ``check/cli.py``),
so none of them imports another command's front.
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import NoReturn

from plugrl_env_client.errors import PlugRLError
from plugrl_env_client.version import __version__

logger = logging.getLogger(__name__)

EXIT_GRACE_S = 2.0
"""How long a process that is ending waits for the non-daemon threads still running before it ends without them."""


def exit_code(body: Callable[[], int], args: Sequence[str] | None = None) -> int:
    """Run a command's ``body`` (which returns its exit code) and return the exit code the command ends with."""
    if "--version" in (sys.argv[1:] if args is None else args):
        print(f"plugrl-env-client {__version__}")
        return 0
    try:
        try:
            code = body()
        except PlugRLError as exc:
            print(f"error: {exc}", file=sys.stderr)
            code = 1
        except KeyboardInterrupt as exc:  # before the command had anything to write
            print("interrupted", file=sys.stderr)
            code = 128 + getattr(exc, "signum", signal.SIGINT)
        except SystemExit as exc:  # tyro after --help or a usage error
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away (``--help | head``): silence the interpreter's own flush at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        code = 0
    return code


def run_cli(body: Callable[[], int], args: Sequence[str] | None = None) -> NoReturn:
    """Run a command's ``body`` and exit with the code :func:`exit_code` gives, whatever threads it left running."""
    before = set(threading.enumerate())
    code = exit_code(body, args)
    end_despite_threads(code, [t for t in lingering_threads() if t not in before])
    sys.exit(code)


def lingering_threads() -> list[threading.Thread]:
    """The non-daemon threads still running besides the main thread: the ones the interpreter waits for at exit."""
    main = threading.main_thread()
    return [t for t in threading.enumerate() if t is not main and not t.daemon and t.is_alive()]


def end_despite_threads(code: int, threads: Sequence[threading.Thread] | None = None,
                        grace_s: float = EXIT_GRACE_S) -> None:
    """Make sure this process ends with ``code`` once its main thread has, even if ``threads`` (default: every
    :func:`lingering_threads`) never end. Call it when the outputs are written, just before exiting.

    Without threads left, nothing changes. Otherwise a daemon watchdog waits for the main thread to end (the
    interpreter ends it, and then waits for its non-daemon threads, before its ``atexit`` functions run), gives the
    threads ``grace_s`` more, and if some are still running warns once, naming them, flushes the log and the standard
    streams and ends the process with ``code`` (``os._exit``: nothing else is left to write). A process whose main
    thread goes on (a test calling a command's ``main()``) is left alone for as long as it does.
    """
    threads = lingering_threads() if threads is None else [t for t in threads if t.is_alive()]
    if not threads:
        return
    threading.Thread(target=_end_after_main, args=(code, threads, grace_s), name="plugrl-exit-watchdog",
                     daemon=True).start()


def _end_after_main(code: int, threads: Sequence[threading.Thread], grace_s: float) -> None:
    threading.main_thread().join()  # the interpreter is ending: it waits for the non-daemon threads now
    deadline = time.monotonic() + grace_s
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    left = [t for t in threads if t.is_alive()]
    if not left:
        return
    logger.warning("threads still running at exit: %s; the outputs are written, so the process ends without them "
                   "(a thread an env starts should be a daemon thread, or end in the env's close())",
                   ", ".join(repr(t.name) for t in left))
    gc.collect()  # what the run no longer holds lets go of its resources now (multiprocessing's semaphores, files)
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed or broken: nothing more can reach it
            pass
    os._exit(code)
