"""Calling env code: what it raises, SystemExit and KeyboardInterrupt included, is the env's failure; only a real
signal's interrupt goes through."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from plugrl_env_client.envs.calls import call_env, is_signal, signals_marked
from plugrl_env_client.errors import EnvCrashedError, EnvExitError, PlugRLError
from plugrl_env_client.rollout.signals import Interrupted, interrupt_handlers


class Abort(BaseException):
    pass


def slow_step_interrupted() -> None:
    """A slow env step during which this process gets SIGINT (the sleep ends early: the handler raises)."""
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(30)
    raise AssertionError("the signal did not interrupt the step")


def raising(exc: BaseException):
    def call() -> None:
        raise exc
    return call


@pytest.mark.parametrize("exc, kind, message", [
    (RuntimeError("boom"), EnvCrashedError, "env E-v1 raised in step(): RuntimeError: boom"),
    (SystemExit(0), EnvExitError, "env E-v1 called sys.exit(0) in step() (an env that cannot go on should raise"),
    (SystemExit(None), EnvExitError, "env E-v1 called sys.exit() in step()"),
    (SystemExit("bye"), EnvExitError, "env E-v1 called sys.exit('bye') in step()"),
    (SystemExit(2), EnvExitError, "env E-v1 called sys.exit(2) in step() (exit code 2 is how argparse refuses"),
    (KeyboardInterrupt(), EnvExitError, "env E-v1 raised KeyboardInterrupt in step() (env code raised it: no Ctrl-C"),
    (Abort("gave up"), EnvExitError, "env E-v1 raised in step(): Abort: gave up (a BaseException, not an Exception"),
])
def test_what_env_code_raises_becomes_an_error_naming_the_env_the_call_and_the_exception(exc, kind, message):
    with pytest.raises(EnvCrashedError) as info:
        call_env("E-v1", "step", raising(exc))
    assert type(info.value) is kind
    assert str(info.value).startswith(message), str(info.value)
    assert info.value.__cause__ is exc, "the original stays chained, for the log's traceback"


def test_a_value_comes_back_and_passthrough_types_are_not_wrapped():
    assert call_env("E-v1", "reset", lambda a, b: a + b, 1, 2) == 3

    class Mine(PlugRLError):
        pass

    with pytest.raises(Mine):
        call_env("E-v1", "__init__", raising(Mine("already says what to do")), passthrough=(PlugRLError,))


def test_a_real_signal_during_an_env_call_stays_an_interruption():
    """SIGINT delivered to this process while the env runs: the run's handler raises Interrupted (with signum),
    which call_env lets through; the same KeyboardInterrupt raised by the env itself does not pass."""
    with interrupt_handlers(), pytest.raises(Interrupted) as info:
        call_env("E-v1", "step", slow_step_interrupted)
    assert info.value.signum == signal.SIGINT and is_signal(info.value)
    assert not is_signal(KeyboardInterrupt())


@pytest.fixture
def pythons_own_sigint_handler():
    """Python's own SIGINT handler for the test, whatever the tests were started with (``nohup pytest &`` starts
    them with SIGINT ignored)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_signals_marked_marks_a_ctrl_c_where_pythons_own_handler_is_in_place(pythons_own_sigint_handler):
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with pytest.raises(KeyboardInterrupt) as info, signals_marked():
        slow_step_interrupted()
    assert is_signal(info.value) and info.value.signum == signal.SIGINT
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler, "Python's handler is back"
    with interrupt_handlers():
        ours = signal.getsignal(signal.SIGINT)
        with signals_marked():
            assert signal.getsignal(signal.SIGINT) is ours, "a run's own handler stays"
