"""Which envs of a batch take part in its steps.

An env is idle when it is retired (its reset had no episode for it, ``info["no_episode"]``, or it ran its share of
the run's episodes) or while it waits for the rest of its seed group to finish their episodes. The batched
``env.step`` still steps an idle env's row (with a placeholder action); its results are not counted, fed back or
recorded.

:class:`IdleEnvs` is the one owner of that state: the retired and waiting masks and :attr:`IdleEnvs.active`, the
envs that take part. The rollout's steps read the mask only through it (:meth:`~IdleEnvs.only`,
:meth:`~IdleEnvs.rows`, :meth:`~IdleEnvs.leave_out`), so the common case, every env taking part and no mask to
apply, is decided here (:attr:`IdleEnvs.everyone`) and nowhere else.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from plugrl_env_client.errors import EnvContractError

logger = logging.getLogger(__name__)

_NO_ROWS = np.zeros(0, np.intp)


class IdleEnvs:
    """The retired and the waiting envs of ``n``, and the mask of the others.

    ``may_retire`` says whether any env may still retire: the env declares it (``metadata["finite_episodes"]``),
    or once reported ``no_episode``. Until then a done env surely starts a new episode at its reset.
    """

    def __init__(self, n: int, env_id: str = "env", offset: int = 0, may_retire: bool = False) -> None:
        self.n, self.env_id, self.offset = n, env_id, offset
        self.may_retire = may_retire
        self.retired = np.zeros(n, bool)
        self.waiting = np.zeros(n, bool)
        """Done, and waiting for the rest of its seed group (:class:`~plugrl_env_client.rollout.seeds.SeedGroups`
        sets and clears it)."""
        self.active = np.ones(n, bool)
        """The envs that take part in steps: neither retired nor waiting."""
        self.everyone = True
        """Every env takes part: :attr:`active` is all True and the masks need not be applied."""
        self.count = n
        """How many envs take part."""
        self.all_retired = False
        self._all = np.arange(n)

    # ------------------------------------------------------------------------------------------ reading

    def only(self, mask: np.ndarray) -> np.ndarray:
        """``mask`` (one bool per env) without the idle envs."""
        return mask if self.everyone else mask & self.active

    def rows(self) -> np.ndarray:
        """The rows of the envs that take part (ascending)."""
        return self._all if self.everyone else self.active.nonzero()[0]

    def leave_out(self, rewards: np.ndarray, terminated: np.ndarray, truncated: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """A batched step's rewards and flags with the idle envs left out (reward 0, not done), and the rows of
        retired envs that the env says ended: those are reset quietly, as an env may refuse to step a row that
        ended and was not reset."""
        if self.everyone:
            return rewards, terminated, truncated, _NO_ROWS
        active = self.active
        quiet = np.flatnonzero((terminated | truncated) & self.retired)
        return np.where(active, rewards, rewards.dtype.type(0)), terminated & active, truncated & active, quiet

    # ------------------------------------------------------------------------------------------ changing

    def wait(self, rows: np.ndarray) -> None:
        """``rows`` wait for the rest of their seed group."""
        self.waiting[rows] = True
        self._changed()

    def start(self, rows: np.ndarray) -> None:
        """``rows`` stop waiting: their group's next episode starts."""
        self.waiting[rows] = False
        self._changed()

    def retire_without_episode(self, info: dict[str, Any], started: np.ndarray,
                               none_left: np.ndarray | None = None) -> np.ndarray:
        """The envs of ``started`` that did get an episode from the reset whose info is ``info``; the others
        retire. ``none_left``: a mask of envs the run itself has no episode left for (each ran its share of the
        run's episodes)."""
        no_episode = _no_episode(info, self.n)
        if none_left is not None and np.count_nonzero(none_left):
            no_episode = none_left if no_episode is None else no_episode | none_left
        if no_episode is None:
            return started
        self.may_retire = True
        retiring = started[no_episode[started]]
        if retiring.size == 0:
            return started
        self.retired[retiring] = True
        self._changed()
        logger.info("env %s: no episode left for envs %s; they are retired", self.env_id,
                    (self.offset + retiring).tolist())
        return started[~no_episode[started]]

    def _changed(self) -> None:
        """Everything derived from the two masks, worked out once per change rather than on every read."""
        np.logical_not(self.retired | self.waiting, out=self.active)
        self.count = int(self.active.sum())
        self.everyone = self.count == self.n
        self.all_retired = bool(self.retired.all())


def _no_episode(info: dict[str, Any], n: int) -> np.ndarray | None:
    """``info["no_episode"]`` as a bool mask of the batch (one bool for all envs, or one per env); None when the
    env does not report it."""
    if "no_episode" not in info:
        return None
    mask = np.asarray(info["no_episode"])
    if mask.ndim == 0:
        mask = np.full(n, bool(mask))
    if mask.shape != (n,) or mask.dtype.kind not in "biu":
        raise EnvContractError(f"reset() info['no_episode'] must be a bool or one bool per env ({n}); got "
                               f"{mask.dtype} {mask.shape}")
    return mask.astype(bool)
