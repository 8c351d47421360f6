"""Per-env action plans: which action each env takes next, when its chunk is over, and what the server holds of it.

A server answers an infer with a time-major chunk ``[H, m, *action_shape]``. Each env consumes its column step by
step, up to ``replan_steps``. A chunk ends when it is used up or when the env's episode ends (the rest is
dropped); the envs whose chunk ended get feedback on that step and ask for a new chunk on the next one.

Four small objects, each used by the env group at one point of its step:

* :class:`ActionPlans`: the chunks, and the mask of envs that need one (computed once per batch step, in
  :meth:`~ActionPlans.advance`, and kept up to date by every call that changes it);
* :class:`ChunkEnds`: which envs a step's feedback is for (the chunks that ended, plus, with ``align_chunks``, the
  nearly used ones);
* :class:`PendingFeedback`: a feedback that no infer surely follows, held until one does (so that ``infer action
  feedback`` stays in turn without ending other envs' chunks early);
* :class:`HeldRows`: the envs whose current observation the server holds from their last feedback, so an infer
  can leave their rows out (``reuse-feedback-obs``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from plugrl_env_client.envs.base_env import Observation
from plugrl_env_client.protocol.messages import Feedback
from plugrl_env_client.rollout.idle import IdleEnvs


class ActionPlans:
    """Action queues of ``num_envs`` envs, plus the reward summed over each env's current chunk."""

    def __init__(self, num_envs: int, action_shape: tuple[int, ...], dtype: np.dtype, replan_steps: int | None,
                 idle: IdleEnvs | None = None) -> None:
        self.num_envs = num_envs
        self.idle = idle if idle is not None else IdleEnvs(num_envs)
        self.action_shape = tuple(action_shape)
        self.dtype = np.dtype(dtype)
        self.replan_steps = replan_steps
        self._queue = np.zeros((num_envs, 1, *self.action_shape), self.dtype)  # [env, step, *action_shape]
        self.length = np.zeros(num_envs, np.int64)  # steps in the env's current chunk (0 = no chunk)
        self.cursor = np.zeros(num_envs, np.int64)  # steps of it already taken
        self.chunk_reward = np.zeros(num_envs, np.float64)
        self.chunk_index = np.zeros(num_envs, np.int64)  # completed chunks in the current episode (step_ids)
        self.needing = np.ones(num_envs, bool)
        """Per env: its chunk is used up or was dropped (``cursor >= length``), kept current by every method."""
        self._all = np.arange(num_envs)

    def load(self, env_ids: np.ndarray, actions: np.ndarray) -> None:
        """Queue a time-major chunk ``actions[t, j]`` for env ``env_ids[j]``, cut to ``replan_steps``."""
        steps = actions.shape[0] if self.replan_steps is None else min(actions.shape[0], self.replan_steps)
        if self.dtype.kind == "U" and actions.dtype.itemsize > self.dtype.itemsize:
            self.dtype = actions.dtype  # text actions: widen the queue to the longest string seen
            self._queue = self._queue.astype(self.dtype)
        if steps > self._queue.shape[1]:
            grown = np.zeros((self.num_envs, steps, *self.action_shape), self.dtype)
            grown[:, : self._queue.shape[1]] = self._queue
            self._queue = grown
        self._queue[env_ids, :steps] = np.swapaxes(actions[:steps], 0, 1)
        self.length[env_ids] = steps
        self.cursor[env_ids] = 0
        self.chunk_reward[env_ids] = 0.0
        self.needing[env_ids] = steps == 0

    def next_actions(self) -> np.ndarray:
        """The batch of actions for this env step. Every active env holds a chunk; an env that takes no part in
        the step (retired, or waiting for its seed group) gets the last action it had, as a placeholder."""
        return self._queue[self._all, np.minimum(self.cursor, self._queue.shape[1] - 1)]

    def advance(self, rewards: np.ndarray, done: np.ndarray) -> np.ndarray:
        """Account one env step of the envs that take part in it; returns those whose chunk ended on it (used up or
        episode over). Idle envs (retired, or waiting) keep their plans as they are; their ``rewards`` are 0 and
        ``done`` is False for them."""
        cursor = self.cursor
        cursor += self.idle.active
        self.chunk_reward += rewards
        np.copyto(cursor, self.length, where=done)
        self.needing = needing = cursor >= self.length
        return self.idle.only(needing).nonzero()[0]

    def nearly_used(self, steps_left: int, candidates: np.ndarray) -> np.ndarray:
        """Among ``candidates`` (a bool mask), the envs with at most ``steps_left`` steps left in their chunk."""
        return np.flatnonzero(candidates & (self.length - self.cursor <= steps_left) & ~self.needing)

    def cut(self, env_ids: np.ndarray) -> None:
        """End the chunks of ``env_ids`` now (a prefix of a chunk is a whole chunk to the protocol): they ask for
        a new one at the next infer."""
        self.cursor[env_ids] = self.length[env_ids]
        self.needing[env_ids] = True

    def finish_chunks(self, env_ids: np.ndarray, done: np.ndarray) -> np.ndarray:
        """Step ids of the chunks that just ended at ``env_ids``; counts them and restarts done envs at 0."""
        step_ids = self.chunk_index[env_ids].copy()
        self.chunk_index[env_ids] += 1
        self.chunk_index[env_ids[done[env_ids]]] = 0
        return step_ids

    def drop_all(self) -> None:
        """Forget every chunk (after a reconnect): every env asks for a fresh one."""
        self.length[:] = 0
        self.cursor[:] = 0
        self.chunk_reward[:] = 0.0
        self.needing[:] = True


class ChunkEnds:
    """Which envs get feedback on a step: the envs whose chunk ended, always; with ``align`` A, also the active envs
    whose chunk has at most A steps left (the protocol lets a client use any prefix of a chunk), so they join the
    next infer instead of needing one of their own a step or two later.

    Without ``align`` an env's chunk ends only when it is used up or its episode ends, so when an env asks for
    actions, and what it has seen when it does, depends on its own episode alone, never on its neighbours in the
    batch (a feedback no infer surely follows waits in :class:`PendingFeedback` instead of cutting other chunks).
    ``align`` trades that for fewer exchanges: it ends an env's chunk early because another env's ended.
    """

    def __init__(self, plans: ActionPlans, align: int) -> None:
        self.plans, self.align = plans, align

    def rows(self, ended: np.ndarray, done: np.ndarray) -> np.ndarray:
        """The feedback's env rows (ascending, each once) for a step whose chunks ``ended`` (rows), with the
        step's ``done`` mask."""
        if ended.size == 0 or not self.align:
            return ended
        early = self.plans.nearly_used(self.align, self.plans.idle.only(~done))
        if early.size == 0:
            return ended
        self.plans.cut(early)
        return np.union1d(ended, early)


class PendingFeedback:
    """A feedback that no infer surely follows, held until one does.

    The protocol wants ``infer action feedback`` in turn on a connection. A feedback whose rows all ended their
    episode may be followed by no infer for a while: those envs may retire (their share of the run is done) or wait
    for their seed group, while the others go on with their chunks. Rather than ending the others' chunks early (which
    would make an env's schedule depend on its neighbours), such a feedback is held: it goes out merged into the next
    feedback (whose rows come from other envs: a held env takes no step before an infer), on its own right before
    the next infer, or at the end of the connection. A reconnect drops it (a feedback never crosses connections).

    What is held is a copy: an env may overwrite its observation and info buffers on its next step.
    """

    def __init__(self) -> None:
        self.held: Feedback[Observation] | None = None

    def __bool__(self) -> bool:
        return self.held is not None

    def hold(self, feedback: Feedback[Observation]) -> None:
        """Keep ``feedback`` (with whatever is held already) until :meth:`take`."""
        owned = dataclasses.replace(feedback, obs=feedback.obs.copy(), info=_copied(feedback.info))
        self.held = owned if self.held is None else merged(self.held, owned)

    def take(self, feedback: Feedback[Observation] | None = None) -> Feedback[Observation] | None:
        """What to send now: the held feedback merged with ``feedback`` (either may be None); nothing is held
        afterwards."""
        held, self.held = self.held, None
        if held is None:
            return feedback
        return held if feedback is None else merged(held, feedback)

    def drop(self) -> None:
        """Forget what is held (the connection it was for is gone)."""
        self.held = None


def merged(a: Feedback[Observation], b: Feedback[Observation]) -> Feedback[Observation]:
    """One feedback for the rows of ``a`` and ``b`` (disjoint env indices), in ascending env order.

    Info values are per-row arrays (the step's info sliced to the rows); a key that only one side has is filled
    with zeros of its dtype for the other side's rows, as ``info["episode"]`` is for rows that did not end."""
    overlap = np.intersect1d(a.env_indices, b.env_indices)
    if overlap.size:
        raise RuntimeError(f"a held feedback and the next one both carry env rows {overlap.tolist()}")
    order = np.argsort(np.concatenate([a.env_indices, b.env_indices]), kind="stable")

    def cat(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        return np.concatenate([x, y])[order]

    obs = Observation.__new__(Observation)
    obs.images = {k: cat(v, b.obs.images[k]) for k, v in a.obs.images.items()}
    obs.states = {k: cat(v, b.obs.states[k]) for k, v in a.obs.states.items()}
    obs.text = cat(a.obs.text, b.obs.text)
    return Feedback(
        env_indices=cat(a.env_indices, b.env_indices),
        step_ids=cat(a.step_ids, b.step_ids),
        obs=obs,
        rewards=cat(a.rewards, b.rewards),
        terminated=cat(a.terminated, b.terminated),
        truncated=cat(a.truncated, b.truncated),
        info=_merged_info(a.info, b.info, len(a.env_indices), len(b.env_indices), order),
    )


def _merged_info(a: dict[str, Any], b: dict[str, Any], m: int, k: int, order: np.ndarray) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in {**a, **b}:
        x, y = a.get(key), b.get(key)
        if isinstance(x, dict) or isinstance(y, dict):
            out[key] = _merged_info(x if isinstance(x, dict) else {}, y if isinstance(y, dict) else {}, m, k, order)
            continue
        first = np.asarray(x) if x is not None else None
        second = np.asarray(y) if y is not None else None
        if first is None:
            assert second is not None
            first = np.zeros((m, *second.shape[1:]), second.dtype)
        if second is None:
            second = np.zeros((k, *first.shape[1:]), first.dtype)
        out[key] = np.concatenate([first, second])[order]
    return out


def _copied(info: dict[str, Any]) -> dict[str, Any]:
    return {k: _copied(v) if isinstance(v, dict) else np.array(v, copy=True) for k, v in info.items()}


class HeldRows:
    """Envs whose current observation row is the one their last feedback on this connection carried: an env whose
    chunk ended without ending its episode asks for its next chunk with exactly that row, so with the server's
    ``reuse-feedback-obs`` the infer leaves it out."""

    def __init__(self, num_envs: int, wanted: bool) -> None:
        self.wanted = wanted
        self.enabled = False  # the current connection offers the feature and we use it
        self.held = np.zeros(num_envs, bool)

    def connected(self, offered: bool) -> None:
        """A fresh connection, which holds nothing; ``offered``: its server offers the feature."""
        self.enabled = self.wanted and offered
        self.held[:] = False

    def reuse(self, need: np.ndarray) -> np.ndarray | None:
        """The ``reuse`` mask of an infer for the envs ``need``; None without the feature."""
        return self.held[need] if self.enabled else None

    def fed_back(self, rows: np.ndarray, done: np.ndarray) -> None:
        """A feedback goes out for ``rows`` (or is held to go out before the next infer): those whose episode goes
        on (not ``done``) are held from now on. Rows and flags rather than the feedback: the observation it carries
        is none of this object's business, and stays on its way from the env to the socket."""
        self.held[rows] = ~done[rows]
