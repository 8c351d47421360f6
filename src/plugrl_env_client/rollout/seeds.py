"""Which seed each episode starts from.

Every episode's start seed is derived from the run seed and the episode's place, so an episode starts the same
whatever the episodes before it did (how long they lasted, which actions they got). Envs form seed groups of G
(``--runner.group-size G``, default 1): envs ``0..G-1`` of the process form group 0, and so on; with G = 1 each env
is its own group, ``g`` is its env index in the process. Group ``g``'s ``k``-th episode (``k`` from 0) starts from::

    seed(process p, group g, episode k) = SeedSequence(process seed, spawn_key=(p, g, k)).generate_state(1)[0]

where the process seed is ``--runner.seed + p * num_envs``: a uint32, identical run to run. The one exception is
the first episode without seed groups (G = 1, k = 0): the first reset passes the int ``process seed + offset``, and
env ``i`` of that batch starts from ``process seed + offset + i`` (Gymnasium's convention for vector envs, the
value ``--runner.seed`` has always given a run's first episodes). With ``--runner.seed None`` the first reset is
unseeded (its seeds are recorded as null) and the derived seeds come from a random process seed.

Envs get the derived seeds as a per-env list, ``reset(seed=[...])``, with None for envs not being reset. Only an
env that declares ``metadata["per_env_seeds"] = True`` can start env i from ``seed[i]``; the others get
``seed=None`` after their first reset, as before: their later episodes continue each env's generator, so they
depend on the episodes before them, and their seeds are recorded as null. (Seed groups need per-env seeds.)

A resumed run (``--resume``) continues each env's numbering: an env that completed ``k`` episodes before the stop
starts from its episode ``k`` (the episode it was in, if any, was dropped and is run again from its start), so its
episodes are the ones it would have had without the stop. With seed groups a group continues with the group
episode its members with episodes left are in: a member that finished it before the stop waits while the others run
it again from its start, then the group starts its next one together. An env without per-env seeds cannot continue
its generator: its resumed first reset is seeded with :func:`resumed_seed` (different from every earlier start,
deterministic given the episodes already done), and its later episodes continue from there.

:class:`GroupSeeds` derives the seeds (:func:`episode_seed` is the rule); :class:`SeedGroups` follows the groups
through a run (who waits for the rest of its group, which envs a reset starts).

Shares (``--runner.episode-split static`` with ``--num-episodes``): each env runs a fixed number of episodes, its
share of its process's share (:func:`~plugrl_env_client.rollout.budget.env_shares`), so its episodes are its
episodes ``0 .. share - 1``; an env whose next episode is past its share retires.

Fixed start states (``--runner.start-seeds S0 S1 ...``, a suite's ``seeds``): the run's episode ``k`` starts from
``S[k]``, whatever the number of processes, and the run has exactly one episode per listed seed. Process ``p`` takes
the share :func:`listed_share` gives it (the same split as ``--runner.episode-split static``), and its env ``e``
(of ``E`` envs in the process) runs the share's episodes ``e, e + E, e + 2E, ...``: as many as its static share of
them, after which it retires. This needs an env that takes per-env seeds, and seed groups of one env.
"""

from __future__ import annotations

import numpy as np

from plugrl_env_client.errors import ConfigError
from plugrl_env_client.rollout.budget import shares as split_shares
from plugrl_env_client.rollout.idle import IdleEnvs


def listed_share(seeds: tuple[int, ...], process_id: int, num_procs: int) -> tuple[int, ...]:
    """Process ``process_id``'s consecutive share of the listed start seeds: ``len(seeds) // num_procs``, plus one
    for the first ``len(seeds) % num_procs`` processes (the static episode split's shares)."""
    base, extra = divmod(len(seeds), num_procs)
    start = process_id * base + min(process_id, extra)
    return tuple(seeds[start:start + base + (1 if process_id < extra else 0)])


def episode_seed(process_seed: int, process_id: int, group: int, episode: int) -> int:
    """The start seed of seed group ``group``'s ``episode``-th episode (from 0) in process ``process_id`` (see the
    module docstring; a group of one env is that env)."""
    sequence = np.random.SeedSequence(process_seed, spawn_key=(process_id, group, episode))
    return int(sequence.generate_state(1)[0])


def resumed_seed(process_seed: int, process_id: int, episodes_done: int) -> int:
    """The int seed of the first reset of a resumed process whose env takes no per-env seeds (env i starts from it
    plus i): drawn from the process seed and the episodes the process had done, apart from every :func:`episode_seed`
    (another entropy pool)."""
    sequence = np.random.SeedSequence([process_seed, episodes_done], spawn_key=(process_id,))
    return int(sequence.generate_state(1)[0] >> 1)  # room for + i below 2**32


class GroupSeeds:
    """Seeds of the envs ``offset .. offset + n - 1`` of a process.

    ``per_env``: the env starts env i from ``seed[i]`` of a list (``metadata["per_env_seeds"]``); without it only
    the first reset is seeded. ``start``: the episodes each env completed before (a resumed run), where its
    numbering continues (empty: none).

    ``listed``: this process's share of fixed start seeds (module docstring), run by its ``stride`` envs (the
    process's envs over all its groups; default ``offset + n``).

    ``shares``: per env, how many episodes it runs in the whole run (the static split's per-env shares); an env
    whose next episode is past its share has none (:meth:`exhausted`). Default: with ``listed``, the episodes of
    the list each env runs; otherwise no limit."""

    def __init__(self, seed: int | None, process_id: int, offset: int, n: int, group_size: int,
                 per_env: bool = False, start: tuple[int, ...] = (), listed: tuple[int, ...] = (),
                 stride: int | None = None, shares: tuple[int, ...] = ()) -> None:
        if group_size < 1 or offset % group_size or n % group_size:
            raise ValueError(f"envs {offset}..{offset + n - 1} do not split into seed groups of {group_size}")
        if seed is not None and seed < 0:
            raise ConfigError(f"process {process_id} would start from seed {seed} (--runner.seed + process * "
                              "num_envs), and seeds must be >= 0: pass --runner.seed 0 or above")
        self.seed, self.process_id, self.offset, self.n, self.size = seed, process_id, offset, n, group_size
        self.per_env = per_env or group_size > 1
        self._root = seed if seed is not None else int(np.random.SeedSequence().entropy % (1 << 63))  # type: ignore[operator]
        self.group_of = (offset + np.arange(n)) // group_size  # the process's seed group of each env
        self.episode = np.zeros(n, np.int64)  # the group episode each env is in (or waits for the start of)
        self.listed = tuple(int(s) for s in listed)
        self.stride = stride if stride is not None else offset + n
        if self.listed and group_size > 1:
            raise ConfigError("fixed start seeds give each episode a seed of its own; they cannot be combined with "
                              f"seed groups (--runner.group-size {group_size}): use --runner.group-size 1")
        if self.listed and any(s < 0 for s in self.listed):
            raise ConfigError(f"start seeds must be >= 0, got {min(self.listed)}")
        if not shares and self.listed:
            shares = tuple(split_shares(len(self.listed), self.stride)[offset:offset + n])
        if shares and len(shares) != n:
            raise ValueError(f"shares holds {len(shares)} episode counts for {n} envs")
        self.shares = np.asarray(shares, np.int64) if shares else None
        self.ahead = np.zeros(n, bool)
        """Resumed, seed groups: the env completed the group episode it is in, and waits for the group's next."""
        if start:
            if len(start) != n:
                raise ValueError(f"start holds {len(start)} episode counts for {n} envs")
            self._resume(np.asarray(start, np.int64))

    def initial(self) -> int | list[int | None] | None:
        """The seed argument of the first reset of every env (of a resumed run: each at its next episode)."""
        if self.episode.any() or self.ahead.any():
            if not self.per_env:
                return None if self.seed is None else resumed_seed(self._root, self.process_id, int(self.episode.sum()))
            seeds = self._seeds(np.arange(self.n), self.episode + self.ahead)  # one waiting: at the group's next
            if self.size == 1 and self.seed is not None and not self.listed:  # at its first episode: seed + i
                for i in np.flatnonzero(self.episode == 0):
                    seeds[i] = self.seed + self.offset + int(i)
            return seeds
        if self.size == 1 and not self.listed:
            return None if self.seed is None else self.seed + self.offset
        return self._seeds(np.arange(self.n), self.episode)

    def upcoming(self, rows: np.ndarray) -> list[int | None] | None:
        """The seed argument that resets ``rows`` to their group's next episode (None for an env without per-env
        seeds)."""
        if not self.per_env:
            return None
        return self._seeds(rows, self.episode + 1)

    def advance(self, rows: np.ndarray) -> None:
        """The groups of ``rows`` have started their next episode."""
        self.episode[rows] += 1

    def exhausted(self) -> np.ndarray:
        """Per env: its current episode is past its share (it has no episode; always False without shares)."""
        if self.shares is None:
            return np.zeros(self.n, bool)
        return self.episode >= self.shares

    def on_last(self) -> np.ndarray:
        """Per env: the episode it is in is the last of its share (done, it starts none; always False without
        shares)."""
        if self.shares is None:
            return np.zeros(self.n, bool)
        return self.episode + 1 >= self.shares

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

    def _resume(self, done: np.ndarray) -> None:
        """Each env continues after its ``done`` episodes. A seed group goes on with the group episode that the
        members with episodes left are in, the earliest of theirs: a member that finished it before the stop waits
        (:attr:`ahead`) while the others run it again from its start, and the group then starts its next one
        together, as it would have without the stop. A member with no episode left stays past its share."""
        if self.size == 1:
            self.episode[:] = done
            return
        left = done < self.shares if self.shares is not None else np.ones(self.n, bool)
        by_group = np.where(left, done, np.iinfo(np.int64).max).reshape(-1, self.size).min(axis=1)
        current = np.repeat(by_group, self.size)
        self.ahead = left & (done > current)
        self.episode[:] = np.where(left, current, done)

    def _seeds(self, rows: np.ndarray, episodes: np.ndarray) -> list[int | None]:
        out: list[int | None] = [None] * self.n
        if self.listed:
            for i, index in zip(rows, self._listed_index(rows, episodes[rows])):
                out[i] = self.listed[index] if index < len(self.listed) else None
            return out
        for i in rows:
            out[i] = episode_seed(self._root, self.process_id, int(self.group_of[i]), int(episodes[i]))
        return out

    def _listed_index(self, rows: np.ndarray, episodes: np.ndarray) -> np.ndarray:
        """The place in the listed share of the ``episodes``-th episode of each env of ``rows``."""
        return self.offset + rows + episodes * self.stride


class SeedGroups:
    """Seed groups over time: which envs wait for the rest of their group, and which envs a reset starts.

    Without seed groups (size 1) every done env is reset at once, to its own next seed, and nobody waits. With
    them, a group starts its next episode once every member is done, all from the group's next seed; a member done
    early is reset to that start at once (so its simulator is in a valid state) and waits, its row idling, until
    the group starts together. Who waits is kept by ``idle`` (:class:`~plugrl_env_client.rollout.idle.IdleEnvs`),
    beside who retired: a resumed run's members that finished the group's episode before the stop wait from the
    start.
    """

    def __init__(self, seeds: GroupSeeds, idle: IdleEnvs | None = None) -> None:
        self.seeds = seeds
        self.grouped = seeds.size > 1
        self.idle = idle if idle is not None else IdleEnvs(seeds.n)
        if seeds.ahead.any():
            self.idle.wait(np.flatnonzero(seeds.ahead))

    def restart(self, done: np.ndarray) -> tuple[np.ndarray, list[int | None] | None, np.ndarray]:
        """For the envs ``done`` (rows) on this step: (the rows to reset, the reset's seed argument, the rows whose
        episode starts now)."""
        if not self.grouped:
            seed = self.seeds.upcoming(done)
            self.seeds.advance(done)
            return done, seed, done
        idle = self.idle
        idle.wait(done)
        starting = np.flatnonzero(self.seeds.complete(~idle.active) & idle.waiting)  # idle: waiting or retired
        rows = np.union1d(starting, done)
        seed = self.seeds.upcoming(rows)
        self.seeds.advance(starting)
        idle.start(starting)
        return rows, seed, starting

    def restarts_at_once(self, rows: np.ndarray, done: np.ndarray) -> bool:
        """Whether some env of ``rows``, done on this step, starts its next episode at once (rather than waiting
        for its group, or having run the last episode of its share)."""
        restarting = done & ~self.seeds.on_last()
        if self.grouped:
            restarting &= self.seeds.complete(~self.idle.active | done)
        return bool(restarting[rows].any())
