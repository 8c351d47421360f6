"""The run's signal handling: held blocks in the main thread, other threads, and a forked child."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import pytest

from plugrl_env_client.rollout.signals import (
    Interrupted,
    blocked,
    deferred_interrupts,
    interrupt_handlers,
    raise_swallowed,
)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_child_forked_inside_a_held_block_is_interrupted_by_its_own_sigterm():
    """The local launcher starts its children inside deferred_interrupts(); with the fork start method a child
    used to inherit that block for good, so SIGTERM (a stop, or its parent's death) never interrupted it."""
    with interrupt_handlers(), deferred_interrupts():
        pid = os.fork()
        if pid == 0:  # the child: 0 when its SIGTERM interrupted its (slow) step at once
            code = 1
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(30)
            except Interrupted as exc:
                code = 0 if exc.signum == signal.SIGTERM else 2
            finally:
                sys.stdout.flush()
                os._exit(code)
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_signal_handled_while_blocked_is_raised_when_the_block_ends_not_inside_it():
    """A signal sent to the process while the main thread blocks it goes to another thread; Python still runs its
    handler in the main thread, which must hold it until the block ends (not interrupt what the block protects)."""
    idle, stop = threading.Event(), threading.Event()
    other = threading.Thread(target=lambda: (idle.set(), stop.wait(30)))  # started before the block: not blocking
    with interrupt_handlers():
        other.start()
        idle.wait(10)
        inside = None
        try:
            with pytest.raises(Interrupted) as info:
                with blocked():
                    os.kill(os.getpid(), signal.SIGTERM)
                    try:
                        for _ in range(100):  # ample time for the other thread's delivery and the handler's call
                            time.sleep(0.005)
                    except Interrupted as exc:
                        inside = exc
        finally:
            stop.set()
            other.join(10)
    assert inside is None, "interrupted inside the block"
    assert info.value.signum == signal.SIGTERM


def test_another_threads_held_block_neither_holds_nor_takes_the_main_threads_signal():
    entered, release = threading.Event(), threading.Event()
    raised_in_thread: list[BaseException] = []

    def hold() -> None:
        try:
            with deferred_interrupts():
                entered.set()
                release.wait(30)
        except BaseException as exc:
            raised_in_thread.append(exc)

    thread = threading.Thread(target=hold)
    with interrupt_handlers():
        thread.start()
        try:
            assert entered.wait(10)
            with pytest.raises(Interrupted):
                os.kill(os.getpid(), signal.SIGTERM)
                for _ in range(400):  # interrupted at once, well before the loop ends
                    time.sleep(0.005)
        finally:
            release.set()
            thread.join(10)
    assert raised_in_thread == []


def test_a_signal_whose_exception_a_library_swallowed_is_raised_at_the_next_check_in():
    """Code that catches every exception (Cython's module initialisation, while it registers its types) can eat the
    signal's exception; the run's next check-in raises it again. Outside a run nothing is left over."""
    with interrupt_handlers():
        raise_swallowed()  # nothing arrived yet
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(400):  # interrupted at once
                time.sleep(0.005)
        except BaseException:  # what such a library does
            pass
        with pytest.raises(Interrupted) as info:
            raise_swallowed()
        assert info.value.signum == signal.SIGTERM
    raise_swallowed()  # the run is over: nothing to raise
    with interrupt_handlers():
        raise_swallowed()  # a new run starts clean
