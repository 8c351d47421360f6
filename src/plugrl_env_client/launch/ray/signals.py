"""SIGINT / SIGTERM / SIGHUP around Ray's calls: the run's handlers (an orderly stop) stay in place, and an interrupt keeps
the name of the signal that caused it."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

from plugrl_env_client.rollout.signals import STOP_SIGNALS, Interrupted


@contextlib.contextmanager
def handlers_kept() -> Iterator[None]:
    """``ray.init`` installs its own SIGTERM handler; the run's (an orderly stop) must stay."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    kept = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in kept.items():
            if handler is not None:
                signal.signal(sig, handler)


class Signals:
    """Which stop signal (SIGINT, SIGTERM, SIGHUP) arrived last (None: neither)."""

    last: int | None = None

    def named(self, exc: KeyboardInterrupt) -> KeyboardInterrupt:
        """The interrupt with the signal that caused it (Ray turns one that arrives inside its calls into a plain
        KeyboardInterrupt, which would make a SIGTERM exit as a SIGINT)."""
        if getattr(exc, "signum", None) is not None or self.last is None:
            return exc
        return Interrupted(self.last)


@contextlib.contextmanager
def signals_remembered() -> Iterator[Signals]:
    """Note which stop signal arrived, then let the run's own handler act on it."""
    signals = Signals()
    if threading.current_thread() is not threading.main_thread():
        yield signals
        return
    previous = {sig: handler for sig in STOP_SIGNALS
                if callable(handler := signal.getsignal(sig))}  # a default or ignored signal stays as it is

    def note(signum: int, frame: Any) -> None:
        signals.last = signum
        previous[signal.Signals(signum)](signum, frame)

    for sig in previous:
        signal.signal(sig, note)
    try:
        yield signals
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
