"""How every ``plugrl-*`` command ends: the same messages and exit codes, whichever command it is.

* 0 when the command did its job (``--help`` and ``--version`` included);
* 1 on an error the user can fix (a :class:`~plugrl_env_client.errors.PlugRLError`): one line on stderr,
  ``error: <what was wrong and what to do>``, and no traceback;
* 2 on a command line the parser refuses (tyro prints why and the usage);
* 128 + the signal's number when interrupted before the command had anything to write (130 for Ctrl-C);
* a closed pipe (``--help | head``) ends quietly.

The commands' own modules use it (the client's ``cli.py``, ``server/cli.py``, ``report/cli.py``, ``check/cli.py``),
so none of them imports another command's front.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from plugrl_env_client.errors import PlugRLError
from plugrl_env_client.version import __version__


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
    """Run a command's ``body`` and exit with the code :func:`exit_code` gives."""
    sys.exit(exit_code(body, args))
