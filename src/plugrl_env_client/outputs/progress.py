"""Progress a user can see: a one-line bar on a terminal, periodic log lines otherwise, a table at the end."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol, TextIO


class Periodic:
    """Call ``fn`` every ``period`` seconds from a daemon thread until :meth:`stop`."""

    def __init__(self, period: float, fn: Callable[[], Any], name: str = "plugrl-periodic") -> None:
        self.period, self.fn = period, fn
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> Periodic:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop ticking (a call in progress finishes first)."""
        self._done.set()
        if self._thread.is_alive():
            self._thread.join()  # a call in progress finishes: nothing it writes can land after what follows

    def _run(self) -> None:
        while not self._done.wait(self.period):
            self.fn()


class Counters(Protocol):
    """Run-wide counters progress is drawn from (the rollout's shared episode budget has them)."""

    target: int | None

    @property
    def claimed(self) -> int: ...

    @property
    def env_steps(self) -> int: ...


class TerminalLine:
    """The line a progress bar redraws in place. Anything else written to the terminal clears it first (under the
    same lock), so a warning never lands on the bar's line; the bar comes back on its next tick."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.width = 0  # characters of the bar now on screen (0: none)

    def draw(self, stream: TextIO, text: str, final: bool = False) -> None:
        with self.lock:
            # pad to the last line's length: a shorter line must overwrite the old one's tail
            stream.write("\r" + text.ljust(self.width) + ("\n" if final else ""))
            self.width = 0 if final else len(text)
            stream.flush()

    def clear(self, stream: TextIO) -> None:
        with self.lock:
            if self.width:
                stream.write("\r" + " " * self.width + "\r")
                self.width = 0


BAR_LINE = TerminalLine()


class Progress:
    """Reads the shared budget counters from a thread and redraws every ``period`` seconds."""

    def __init__(self, budget: Counters, stream: TextIO | None = None, period: float | None = None) -> None:
        self.budget = budget
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.period = period if period is not None else (0.5 if self.tty else 10.0)
        self._ticker = Periodic(self.period, self._draw, name="plugrl-progress")
        self._start = time.perf_counter()

    def start(self) -> Progress:
        self._ticker.start()
        return self

    def stop(self) -> None:
        self._ticker.stop()
        self._draw(final=True)

    def line(self) -> str:
        elapsed = max(time.perf_counter() - self._start, 1e-9)
        done, target = self.budget.claimed, self.budget.target
        rate = self.budget.env_steps / elapsed
        if target:
            width = 24
            filled = int(width * min(done / target, 1.0))
            bar = "#" * filled + "-" * (width - filled)
            return f"[{bar}] {done}/{target} episodes | {rate:,.0f} env-steps/s | {elapsed:,.0f}s"
        return f"{done} episodes | {rate:,.0f} env-steps/s | {elapsed:,.0f}s"

    def _draw(self, final: bool = False) -> None:
        if self.tty:
            BAR_LINE.draw(self.stream, self.line(), final)
        elif not final:
            self.stream.write("progress: " + self.line() + "\n")
            self.stream.flush()


def summary_table(summary: dict[str, Any]) -> str:
    """A short human-readable table of an aggregated summary (means over every episode of the run)."""
    timing = summary.get("timing", {})
    every = summary.get("all_episodes", {})

    def fmt(value: Any, spec: str) -> str:
        return "n/a" if value is None else format(value, spec)

    rows = [
        ("status", summary.get("status")),
        ("episodes", summary.get("completed_episodes")),
        ("mean return", fmt(every.get("mean_return"), ".4f")),
        ("mean length", fmt(every.get("mean_length"), ".1f")),
        ("success rate", fmt(every.get("mean_success_rate"), ".3f")),
        ("env steps", timing.get("env_steps")),
        ("env-steps/s", fmt(timing.get("effective_fps"), ",.0f")),
        ("infer calls", timing.get("infer_calls")),
        ("infer wait s", fmt(timing.get("infer_wait_s"), ".3f")),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"  {k.ljust(width)}  {v}" for k, v in rows)
