"""Which seed each episode starts from.

Without seed groups (``--runner.group-size 1``) only the first reset is seeded: a batch whose envs are the
process's envs ``offset ..`` is reset with ``seed + offset`` (the process seed is ``--runner.seed + p * num_envs``),
and env i of the batch starts from ``seed + offset + i`` when the env follows Gymnasium's per-env convention; later
resets continue each env's generator. The recorded seed of a first episode is that per-env value.

With seed groups of G envs (``--runner.group-size G``: envs ``0..G-1`` of the process form group 0, and so on),
every episode of a group starts all its members from one seed, a new one per group episode::

    seed(group g, episode k) = SeedSequence(process seed, spawn_key=(process, g, k)).generate_state(1)[0]

where the process seed is ``--runner.seed + process * num_envs``; identical run to run (a random root when
``--runner.seed None``). Envs get them as a per-env list,
``reset(seed=[...])``, with None for envs not being reset.

:class:`GroupSeeds` derives the seeds; :class:`SeedGroups` follows the groups through a run (who waits for the rest of
its group, which envs a reset starts).
"""

from __future__ import annotations

import numpy as np


class GroupSeeds:
    """Seeds of the envs ``offset .. offset + n - 1`` of a process."""

    def __init__(self, seed: int | None, process_id: int, offset: int, n: int, group_size: int) -> None:
        if group_size < 1 or offset % group_size or n % group_size:
            raise ValueError(f"envs {offset}..{offset + n - 1} do not split into seed groups of {group_size}")
        self.seed, self.process_id, self.offset, self.n, self.size = seed, process_id, offset, n, group_size
        self._root = seed if seed is not None else int(np.random.SeedSequence().entropy % (1 << 63))  # type: ignore[operator]
        self.group_of = (offset + np.arange(n)) // group_size  # the process's seed group of each env
        self.episode = np.zeros(n, np.int64)  # the group episode each env is in (or waits for the start of)

    def initial(self) -> int | list[int | None] | None:
        """The seed argument of the first reset of every env."""
        if self.size == 1:
            return None if self.seed is None else self.seed + self.offset
        return self._seeds(np.arange(self.n), self.episode)

    def upcoming(self, rows: np.ndarray) -> list[int | None] | None:
        """The seed argument that resets ``rows`` to their group's next episode (None without seed groups)."""
        if self.size == 1:
            return None
        return self._seeds(rows, self.episode + 1)

    def advance(self, rows: np.ndarray) -> None:
        """The groups of ``rows`` have started their next episode."""
        self.episode[rows] += 1

    def complete(self, finished: np.ndarray) -> np.ndarray:
        """Per env: whether every member of its group is ``finished`` (done and waiting, or retired)."""
        by_group = finished.reshape(-1, self.size).all(axis=1)
        return np.repeat(by_group, self.size)

    def recorded(self, argument: int | list[int | None] | None, rows: np.ndarray) -> list[int | None]:
        """The seed each env of ``rows`` started from, given the seed argument of its reset."""
        if argument is None:
            return [None] * len(rows)
        if isinstance(argument, list):
            return [argument[i] for i in rows]
        return [argument + int(i) for i in rows]

    def _seeds(self, rows: np.ndarray, episodes: np.ndarray) -> list[int | None]:
        out: list[int | None] = [None] * self.n
        for i in rows:
            key = (self.process_id, int(self.group_of[i]), int(episodes[i]))
            out[i] = int(np.random.SeedSequence(self._root, spawn_key=key).generate_state(1)[0])
        return out


class SeedGroups:
    """Seed groups over time: which envs wait for the rest of their group, and which envs a reset starts.

    Without seed groups (size 1) every done env is reset at once and nobody waits. With them, a group starts its
    next episode once every member is done, all from the group's next seed; a member done early is reset to that
    start at once (so its simulator is in a valid state) and waits, its row idling, until the group starts together.
    """

    def __init__(self, seeds: GroupSeeds) -> None:
        self.seeds = seeds
        self.grouped = seeds.size > 1
        self.waiting = np.zeros(seeds.n, bool)
        """Done, and waiting for the rest of the group."""

    def restart(self, done: np.ndarray, retired: np.ndarray) -> tuple[np.ndarray, list[int | None] | None, np.ndarray]:
        """For the envs ``done`` (rows) on this step: (the rows to reset, the reset's seed argument, the rows whose
        episode starts now). ``retired``: the mask of envs that will never start one."""
        if not self.grouped:
            return done, None, done
        self.waiting[done] = True
        complete = self.seeds.complete(self.waiting | retired)
        starting = np.flatnonzero(complete & self.waiting)
        rows = np.union1d(starting, done)
        seed = self.seeds.upcoming(rows)
        self.seeds.advance(starting)
        self.waiting[starting] = False
        return rows, seed, starting

    def restarts_at_once(self, rows: np.ndarray, done: np.ndarray, retired: np.ndarray) -> bool:
        """Whether some env of ``rows``, done on this step, starts its next episode at once (rather than waiting
        for its group)."""
        if not self.grouped:
            return True
        restarting = self.seeds.complete(self.waiting | retired | done) & done
        return bool(restarting[rows].any())
