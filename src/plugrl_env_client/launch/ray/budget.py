"""The episode budget of a run whose processes are Ray actors: leases handed out by the driver.

Actors may be on other machines, and they may die with episodes they finished but never reported. So the driver
is the one authority: an episode counts when its record reaches the driver, never earlier. To keep
``Budget.claim`` and ``Budget.finished`` local (they are asked on every loop iteration), the driver leases each
actor a number of episodes it may claim on its own; an actor never produces more records than it was leased, so
the driver never receives more than the target.

* ``static`` split: process p's lease is the rest of its share (``share - recorded``), final: it never grows.
* ``shared`` split: leases come in chunks from a common pool (a fraction of what is left, so the last episodes go
  one at a time to whoever asks first); an actor asks for more before it runs out.

Every run of an actor is an *epoch*. When an epoch ends (its result arrived, or its actor died), whatever it
leased but did not deliver goes back: to the process's next epoch under ``static``, to the pool under ``shared``.
Episodes an actor claimed but whose records were lost with it are therefore collected again, and none is counted
twice. Grants are totals per epoch (not increments), so a repeated or late message cannot grant twice, and a
message for an older epoch is ignored.

This module has no Ray in it: :class:`LeaseBook` is the driver's side, :class:`LeasedBudget` the actor's.
"""

from __future__ import annotations

import dataclasses
import math
import threading
from collections.abc import Callable

from plugrl_env_client.rollout.budget import Split, StopFlag, shares

CLAIM_WAIT_S = 30.0
"""How long an actor out of lease waits for the driver's answer before it drops the episode."""


@dataclasses.dataclass(frozen=True)
class Grant:
    """What the driver allows one epoch of one actor: ``total`` episodes so far; ``final`` when no more will come;
    ``answered``: the last lease request of this epoch the driver has answered."""

    total: int = 0
    final: bool = False
    answered: int = 0


class LeasedBudget:
    """An actor's view of the run's budget (the :class:`~plugrl_env_client.rollout.budget.Budget` protocol).

    ``claim`` consumes the lease (and, under ``shared``, asks for more through ``ask`` when it runs low, waiting for
    the answer only when nothing is left); ``finished`` reads two local flags. ``stop`` is set by the actor when the
    driver says stop, or when a newer epoch replaces this one.
    """

    def __init__(self, target: int | None, grant: Grant, ask: Callable[[int], None] | None = None) -> None:
        self.target = target
        self.stop: StopFlag = threading.Event()
        self.env_steps = 0
        self._steps_lock = threading.Lock()
        self._ask = ask
        self._cond = threading.Condition()
        self._granted = grant.total
        self._final = grant.final
        self._used = 0
        self._asked = 0  # sequence number of the latest request
        self._answered = grant.answered
        self._denied = False  # the driver had nothing left to lease; it pushes a grant once it has
        self._last_chunk = grant.total

    # ---------------------------------------------------------------------------------------- Budget protocol

    def claim(self, process_id: int = 0) -> bool:
        if self.target is None:
            return True
        with self._cond:
            if self._used < self._granted:
                self._used += 1
                self._maybe_prefetch()
                return True
            if self._final or self._ask is None or self._denied:
                return False
            if self._answered >= self._asked:  # no request in flight: ask now
                self._request()
            self._cond.wait_for(lambda: self._answered >= self._asked or self.stop.is_set(), CLAIM_WAIT_S)
            if self._used < self._granted:
                self._used += 1
                return True
            return False

    def exhausted(self, process_id: int = 0) -> bool:
        return self.target is not None and self._final and self._used >= self._granted

    def finished(self, process_id: int = 0) -> bool:
        return self.stop.is_set() or self.exhausted(process_id)

    def add_env_steps(self, count: int) -> None:
        with self._steps_lock:
            self.env_steps += count

    # ---------------------------------------------------------------------------------------- from the driver

    def update(self, grant: Grant) -> None:
        """A grant arrived (an answer to a request, or pushed): totals only grow, flags only set."""
        with self._cond:
            if grant.total > self._granted:
                self._last_chunk = grant.total - self._granted
                self._granted = grant.total
                self._denied = False
            elif grant.answered > self._answered and grant.total == self._granted:
                # An answer with nothing in it (a stale answer has a smaller total): the driver now counts this
                # epoch as waiting and pushes a grant when it has one, so do not ask again until then.
                self._denied = True
            self._final = self._final or grant.final
            self._answered = max(self._answered, grant.answered)
            self._cond.notify_all()

    def release(self) -> None:
        """Wake a claim waiting for an answer (the epoch is stopping)."""
        with self._cond:
            self._cond.notify_all()

    # ---------------------------------------------------------------------------------------- helpers

    def _maybe_prefetch(self) -> None:
        """Ask ahead once half of the last chunk is used, so a claim rarely waits for a round trip."""
        if self._final or self._ask is None or self._answered < self._asked or self._denied:
            return  # nothing more will come, or a request is in flight, or the driver pushes when it has more
        if self._granted - self._used <= self._last_chunk // 2:
            self._request()

    def _request(self) -> None:
        self._asked += 1
        assert self._ask is not None
        self._ask(self._asked)


@dataclasses.dataclass
class _Lease:
    epoch: int = -1
    active: bool = False
    granted: int = 0
    delivered: int = 0  # records of this epoch that reached the driver
    answered: int = 0
    waiting: bool = False  # asked and got nothing: gets a push when the pool refills

    def grant(self, final: bool) -> Grant:
        return Grant(self.granted, final, self.answered)


class LeaseBook:
    """The driver's ledger of leases and recorded episodes (one per run; not thread-safe: the driver loop owns it).

    With ``target`` None there is nothing to count: every grant is empty and not final, and actors claim freely.
    """

    def __init__(self, target: int | None, num_procs: int, split: Split, recorded: list[int] | None = None) -> None:
        self.target = target
        self.split = split
        self.num_procs = num_procs
        self._shares = shares(target, num_procs) if target is not None else [0] * num_procs
        self.recorded = list(recorded) if recorded else [0] * num_procs
        """Each process's recorded episodes (a resumed run starts from those of its earlier segments)."""
        self._leases = [_Lease() for _ in range(num_procs)]

    @property
    def total_recorded(self) -> int:
        return sum(self.recorded)

    @property
    def reached(self) -> bool:
        return self.target is not None and self.total_recorded >= self.target

    def pool(self) -> int:
        """Episodes neither recorded nor leased to a running epoch (shared split)."""
        if self.target is None:
            return 0
        leased = sum(lease.granted - lease.delivered for lease in self._leases if lease.active)
        return self.target - self.total_recorded - leased

    def start(self, pid: int, epoch: int) -> Grant:
        """A new epoch of ``pid`` begins: what it may claim from the start."""
        lease = self._leases[pid] = _Lease(epoch=epoch, active=True)
        if self.target is None:
            return Grant()
        if self.split == "static":
            lease.granted = max(self._shares[pid] - self.recorded[pid], 0)
            return lease.grant(final=True)
        # Nothing up front: an epoch that takes long to start (a restart, a slow env) must not sit on episodes the
        # running ones could collect; it asks with its first claim.
        return lease.grant(final=self.reached)

    def record(self, pid: int, epoch: int) -> bool:
        """A record of ``pid``'s ``epoch`` arrived: True when it counts (it was leased)."""
        lease = self._leases[pid]
        if not lease.active or lease.epoch != epoch:
            return False
        if self.target is not None and lease.delivered >= lease.granted:
            return False
        lease.delivered += 1
        self.recorded[pid] += 1
        return True

    def request(self, pid: int, epoch: int, seq: int) -> Grant | None:
        """``pid`` asks for more (shared split): its new grant (unchanged when the pool is empty), or None when the
        request is for an epoch that is over."""
        lease = self._leases[pid]
        if lease.epoch != epoch or not lease.active:
            return None
        lease.answered = max(lease.answered, seq)
        added = self._chunk() if self.split == "shared" else 0
        lease.granted += added
        lease.waiting = added == 0 and not self.reached
        return lease.grant(final=self.split == "static" or self.reached)

    def end(self, pid: int) -> dict[int, Grant]:
        """``pid``'s current epoch ended (result or death): its undelivered lease goes back. Returns the grants to
        push to waiting epochs that the returned lease now feeds (shared split)."""
        self._leases[pid].active = False
        if self.split != "shared" or self.target is None:
            return {}
        pushes = {}
        for other, lease in enumerate(self._leases):
            if lease.active and lease.waiting:
                added = self._chunk()
                if added == 0:
                    break
                lease.granted += added
                lease.waiting = False
                pushes[other] = lease.grant(final=False)
        return pushes

    def finals(self) -> dict[int, Grant]:
        """Once the target is reached: a final grant for every running epoch, so each stops as finished."""
        if not self.reached:
            return {}
        return {pid: lease.grant(final=True) for pid, lease in enumerate(self._leases) if lease.active}

    def remaining_share(self, pid: int) -> int:
        """Static split: episodes of ``pid``'s share not recorded yet."""
        return max(self._shares[pid] - self.recorded[pid], 0)

    def _chunk(self) -> int:
        """A shared lease: about half of the pool over the running epochs, at least one while any is left."""
        pool = self.pool()
        if pool <= 0:
            return 0
        active = max(sum(lease.active for lease in self._leases), 1)
        return min(pool, max(1, math.ceil(pool / (2 * active))))
