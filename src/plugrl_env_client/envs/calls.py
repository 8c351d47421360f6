"""Calling env code: whatever it raises is the env's failure, ``SystemExit`` and ``KeyboardInterrupt`` included.

An env's ``__init__``, ``reset``, ``step`` and ``close`` (and the import of its module) run code the client does
not control: simulator bindings, a library that parses ``sys.argv`` with argparse (which calls ``sys.exit(2)`` when
it dislikes the client's flags), an env that calls ``sys.exit(0)`` when its episodes run out. Left alone, such a
``SystemExit`` ends the client as if it had succeeded, with no summary, and a ``KeyboardInterrupt`` raised by env
code passes for the user's Ctrl-C. So every env call goes through :func:`call_env`, which turns anything but a
real signal into :class:`~plugrl_env_client.errors.EnvCrashedError` naming the env, the call and what it raised
(the rollout's ``env.step``, whose return goes straight on to the env contract's checks, applies the same two
functions, :func:`is_signal` and :func:`env_failure`, in place).

A real SIGINT / SIGTERM is told apart by its mark: the client's signal handler raises a ``KeyboardInterrupt`` that
carries the signal's number as ``signum`` (``rollout/signals.py``); a ``KeyboardInterrupt`` that env code raises
has none. (Where Python's own SIGINT handler is in place, :func:`signals_marked` puts that mark on a Ctrl-C.)
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from plugrl_env_client.errors import EnvCrashedError, EnvExitError

T = TypeVar("T")

ARGPARSE_EXIT = 2
"""The code argparse's ``error()`` exits with when it refuses a command line."""


def is_signal(exc: BaseException) -> bool:
    """Whether ``exc`` is the client's own interrupt from a real SIGINT / SIGTERM (it carries ``signum``)."""
    return isinstance(exc, KeyboardInterrupt) and getattr(exc, "signum", None) is not None


class SignalInterrupt(KeyboardInterrupt):
    """A Ctrl-C that arrived where Python's own SIGINT handler was in place (see :func:`signals_marked`)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = int(signum)


def _raise_marked(signum: int, _frame: Any) -> None:
    raise SignalInterrupt(signum)


@contextlib.contextmanager
def signals_marked() -> Iterator[None]:
    """Inside the block, a Ctrl-C raises a ``KeyboardInterrupt`` that :func:`is_signal` recognises, where it would
    otherwise be Python's bare one (before a run installs its own handlers: while the CLI imports env files). Other
    handlers (a run's, an ignored SIGINT) stay; so does everything outside the main thread."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield
        return
    signal.signal(signal.SIGINT, _raise_marked)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def what_it_did(exc: BaseException) -> str:
    """What env code did, for a message: ``called sys.exit(0)``, ``raised KeyboardInterrupt`` or
    ``raised <Type>: <message>``."""
    if isinstance(exc, SystemExit):
        return f"called sys.exit({'' if exc.code is None else repr(exc.code)})"
    if isinstance(exc, KeyboardInterrupt):
        return "raised KeyboardInterrupt"
    return f"raised {type(exc).__name__}: {exc}"


def why_it_matters(exc: BaseException) -> str:
    """A hint for a ``BaseException`` that is not an ``Exception``: what probably raised it and what to do."""
    if isinstance(exc, SystemExit) and exc.code == ARGPARSE_EXIT:
        return (" (exit code 2 is how argparse refuses a command line: does the env, or a library it uses, parse "
                "sys.argv? Give it its own arguments, e.g. parser.parse_args([]))")
    if isinstance(exc, SystemExit):
        return " (an env that cannot go on should raise an exception: sys.exit would end the client itself)"
    if isinstance(exc, KeyboardInterrupt):
        return " (env code raised it: no Ctrl-C or SIGTERM reached the client)"
    return " (a BaseException, not an Exception: it would end the client itself)"


def env_failure(env_id: str, call: str, exc: BaseException) -> EnvCrashedError:
    """The error for ``exc`` raised by env ``env_id``'s ``call`` (``step``, ``__init__``, ...)."""
    if isinstance(exc, Exception):
        return EnvCrashedError(f"env {env_id} raised in {call}(): {type(exc).__name__}: {exc}")
    if isinstance(exc, (SystemExit, KeyboardInterrupt)):
        return EnvExitError(f"env {env_id} {what_it_did(exc)} in {call}(){why_it_matters(exc)}")
    return EnvExitError(f"env {env_id} raised in {call}(): {type(exc).__name__}: {exc}{why_it_matters(exc)}")


def call_env(env_id: str, call: str, fn: Callable[..., T], *args: Any,
             passthrough: tuple[type[BaseException], ...] = ()) -> T:
    """``fn(*args)``, env ``env_id``'s ``call``; anything it raises except a real signal's interrupt (and the
    ``passthrough`` types) becomes :class:`~plugrl_env_client.errors.EnvCrashedError` (:class:`EnvExitError` for
    what is not an ``Exception``), chained to the original for the log's traceback."""
    try:
        return fn(*args)
    except BaseException as exc:
        if is_signal(exc) or isinstance(exc, passthrough):
            raise
        raise env_failure(env_id, call, exc) from exc


__all__ = ["call_env", "env_failure", "is_signal", "signals_marked", "what_it_did"]
