"""The run's signal handling in a forked child: a child forked while its parent held signals has its own."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from plugrl_env_client.rollout.signals import Interrupted, deferred_interrupts, interrupt_handlers


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
