"""How many episodes the whole run still needs, shared by every rollout process.

``--num-episodes N`` is a total: each finished episode claims one slot, and the run stops when N were claimed.
Claiming is atomic, so exactly N episodes are recorded even when several processes finish at once.
"""

from __future__ import annotations

import multiprocessing as mp
from typing import Any


class EpisodeBudget:
    """A shared counter of recorded episodes with an optional target; also counts env steps for progress."""

    def __init__(self, target: int | None, ctx: Any = None) -> None:
        ctx = ctx or mp.get_context("spawn")
        self.target = target
        self._claimed = ctx.Value("q", 0)
        self._env_steps = ctx.Value("q", 0, lock=False)
        self.stop = ctx.Event()
        """Set when the run must end early (a process failed, the user interrupted)."""

    def claim(self) -> bool:
        """Reserve a slot for one finished episode; False once the target is reached."""
        with self._claimed.get_lock():
            if self.target is not None and self._claimed.value >= self.target:
                return False
            self._claimed.value += 1
            return True

    @property
    def claimed(self) -> int:
        return int(self._claimed.value)

    def exhausted(self) -> bool:
        return self.target is not None and self.claimed >= self.target

    def add_env_steps(self, count: int) -> None:
        with self._claimed.get_lock():
            self._env_steps.value += count

    @property
    def env_steps(self) -> int:
        return int(self._env_steps.value)

    def finished(self) -> bool:
        """True when collection should end: the target is reached or a stop was requested."""
        return self.exhausted() or self.stop.is_set()
