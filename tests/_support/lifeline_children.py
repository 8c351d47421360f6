"""A parent process that starts one child holding a :class:`~plugrl_env_client.launch.lifeline.Lifeline`, for the
lifeline's tests: the test starts the parent (``python -c "...; parent_main(folder, how)"``), kills it, and
watches the child through the files both write in ``folder``.

Files: ``child.pid`` (the parent, once the child runs), ``armed`` (the child, once its lifeline is set up),
``stopped`` (the child, when SIGTERM stopped it in an orderly way), ``go`` (the test: the child may arm its
lifeline now, for ``how="late"``).
"""

from __future__ import annotations

import multiprocessing
import signal
import time
from pathlib import Path

from plugrl_env_client.launch import lifeline
from plugrl_env_client.rollout.signals import interrupt_handlers


def parent_main(folder: str, how: str) -> None:
    child = multiprocessing.get_context("spawn").Process(target=child_main, args=(folder, how), name="child")
    child.start()
    (Path(folder) / "child.pid").write_text(str(child.pid))
    child.join()


def child_main(folder: str, how: str) -> None:
    """``how``: ``kernel`` (the parent-death signal and the watchdog), ``watchdog`` (no parent-death signal, as
    where the OS has none), ``late`` (the lifeline is set up only once the test says ``go``: after the parent died),
    ``deaf`` (SIGTERM is ignored, as by an env stuck in C code: the watchdog ends it after its grace time)."""
    path = Path(folder)
    if how == "watchdog":
        lifeline._set_parent_death_signal = lambda signum: False  # type: ignore[assignment]
    if how == "late":
        while not (path / "go").exists():
            time.sleep(0.01)
    with interrupt_handlers():
        try:  # from the start: with how="late" the SIGTERM comes at once
            lifeline.Lifeline("child", grace_s=1.0).start()
            if how == "deaf":
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
            (path / "armed").touch()
            time.sleep(120)  # a long env step; SIGTERM cuts it short
        except KeyboardInterrupt:
            (path / "stopped").touch()
