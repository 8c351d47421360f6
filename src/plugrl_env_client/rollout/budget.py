"""How many episodes the run still needs, shared by every rollout process.

``--num-episodes N`` is a total: each finished episode claims one slot, and the run stops when N were claimed.
Claiming is atomic, so exactly N episodes are recorded even when several processes finish at once.

Two ways to split N over processes (``--runner.episode-split``):

* ``static``: process p may claim a fixed share, ``N // P`` plus one for the first ``N % P`` processes, and the
  share is split the same way over the process's envs (:func:`env_shares`; an env that ran its share retires).
  Which episodes are recorded (process, env, the env's episode number, hence its seed) then depends only on the
  flags, not on which process or env runs faster: two runs with the same flags give the same episodes (with a
  deterministic policy).
* ``shared``: first come, first served; a faster process takes more. The run ends as soon as N episodes exist.

A resumed run (``--resume``) starts its budget from the episodes each process already has on disk: the total and,
under ``static``, each process's share continue where they were, and each env runs what is left of its own share,
so the run still ends at N exactly.
"""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Sequence
from typing import Any, Literal, Protocol

Split = Literal["static", "shared"]


class StopFlag(Protocol):
    def set(self) -> None: ...

    def is_set(self) -> bool: ...


class Budget(Protocol):
    """What a rollout needs of the run's episode budget (local processes share an :class:`EpisodeBudget`; other
    launchers bring their own). ``finished`` is asked on every loop iteration, so it must be cheap."""

    target: int | None

    @property
    def stop(self) -> StopFlag:
        """The run's stop flag (read-only here: each budget brings the kind its processes can share)."""
        ...

    def claim(self, process_id: int = 0) -> bool: ...

    def exhausted(self, process_id: int = 0) -> bool: ...

    def finished(self, process_id: int = 0) -> bool: ...

    def add_env_steps(self, count: int) -> None: ...


def shares(target: int, num_procs: int) -> list[int]:
    """Per-process shares of ``target`` episodes; they differ by at most one."""
    return [target // num_procs + (1 if p < target % num_procs else 0) for p in range(num_procs)]


def env_shares(target: int, num_procs: int, process_id: int, num_envs: int) -> list[int]:
    """The static split's share of each env of process ``process_id`` (its process's share of ``target`` split over
    its ``num_envs`` envs by :func:`shares`: the first ``share % num_envs`` envs run one more). Env ``e``'s episodes
    are then its episodes ``0 .. env_shares[e] - 1``, the same in every run with these flags. Consecutive envs form
    seed groups, so every seed group but at most one gets whole group episodes."""
    return shares(shares(target, num_procs)[process_id], num_envs)


class SharedFlag:
    """A flag shared with spawned processes whose reading is one memory load: the rollout asks for it on every loop
    iteration, and multiprocessing's ``Event`` takes a lock and a semaphore for each look. It is set once and never
    cleared, so no reader can see it torn or go back."""

    def __init__(self, ctx: Any) -> None:
        self._value = ctx.RawValue("b", 0)

    def set(self) -> None:
        self._value.value = 1

    def is_set(self) -> bool:
        return bool(self._value.value)


class EpisodeBudget:
    """Shared counters of claimed episodes (with an optional target) and env steps, and the run's stop flag.
    ``done``: the episodes each process recorded before (a resumed run), counted as claimed.

    Claims take the counters' lock, so they are exact; the questions the loop asks on every iteration
    (:meth:`finished`, :meth:`exhausted`) read the counters without it (an aligned 64-bit read: a look a claim
    later is as good as the claim's own answer, which :meth:`claim` gives exactly)."""

    def __init__(self, target: int | None, ctx: Any = None, num_procs: int = 1, split: Split = "shared",
                 done: Sequence[int] = ()) -> None:
        ctx = ctx or mp.get_context("spawn")
        if split not in ("static", "shared"):
            raise ValueError(f"split must be 'static' or 'shared', got {split!r}")
        self.target = target
        self.split = split
        self.num_procs = num_procs
        if done and len(done) != num_procs:
            raise ValueError(f"done holds {len(done)} counts for {num_procs} processes")
        self._claimed = ctx.Value("q", sum(done))  # its lock guards every counter below
        self._per_process = ctx.Array("q", list(done) or num_procs, lock=False)
        self._shares = shares(target, num_procs) if (target is not None and split == "static") else None
        self._env_steps = ctx.Value("q", 0, lock=False)
        self._claimed_raw = self._claimed.get_obj()  # the same memory, read without the lock
        self.stop = SharedFlag(ctx)
        """Set when the run must end early (a process failed, the user interrupted)."""

    def claim(self, process_id: int = 0) -> bool:
        """Reserve a slot for one finished episode of ``process_id``; False once no slot is left for it."""
        with self._claimed.get_lock():
            if self._shares is not None and self._per_process[process_id] >= self._shares[process_id]:
                return False
            if self.target is not None and self._claimed.value >= self.target:
                return False
            self._claimed.value += 1
            self._per_process[process_id] += 1
            return True

    def per_process(self) -> list[int]:
        """Episodes claimed by each process so far (those of earlier segments included)."""
        with self._claimed.get_lock():
            return list(self._per_process)

    @property
    def claimed(self) -> int:
        return int(self._claimed_raw.value)

    def exhausted(self, process_id: int = 0) -> bool:
        """True when ``process_id`` can claim no more (its share is used, or the target is reached)."""
        if self.target is None:
            return False
        if self._shares is not None and self._per_process[process_id] >= self._shares[process_id]:
            return True
        return self._claimed_raw.value >= self.target

    def add_env_steps(self, count: int) -> None:
        with self._claimed.get_lock():
            self._env_steps.value += count

    @property
    def env_steps(self) -> int:
        return int(self._env_steps.value)

    def finished(self, process_id: int = 0) -> bool:
        """True when ``process_id`` should stop collecting: it needs no more episodes (:meth:`exhausted`), or a stop
        was requested. Asked on every loop iteration, so a run without a target reads the stop flag in place."""
        if self.target is None:
            return bool(self.stop._value.value)  # the flag's is_set(), one memory load
        return self.exhausted(process_id) or self.stop.is_set()
