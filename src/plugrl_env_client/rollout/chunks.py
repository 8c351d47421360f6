"""Per-env action plans: which action each env takes next, and when its chunk is over.

A server answers an infer with a time-major chunk ``[H, m, *action_shape]``. Each env consumes its column step by
step, up to ``replan_steps``. A chunk ends when it is used up or when the env's episode ends (the rest is
dropped); the envs whose chunk ended get feedback on that step and ask for a new chunk on the next one.
"""

from __future__ import annotations

import numpy as np


class ActionPlans:
    """Action queues of ``num_envs`` envs, plus the reward summed over each env's current chunk."""

    def __init__(self, num_envs: int, action_shape: tuple[int, ...], dtype: np.dtype, replan_steps: int | None) -> None:
        self.num_envs = num_envs
        self.action_shape = tuple(action_shape)
        self.dtype = np.dtype(dtype)
        self.replan_steps = replan_steps
        self._queue = np.zeros((num_envs, 1, *self.action_shape), self.dtype)  # [env, step, *action_shape]
        self.length = np.zeros(num_envs, np.int64)  # steps in the env's current chunk (0 = no chunk)
        self.cursor = np.zeros(num_envs, np.int64)  # steps of it already taken
        self.chunk_reward = np.zeros(num_envs, np.float64)
        self.chunk_index = np.zeros(num_envs, np.int64)  # completed chunks in the current episode (step_ids)
        self._all = np.arange(num_envs)

    def needing_actions_mask(self) -> np.ndarray:
        """Per env: its chunk is used up or was dropped."""
        return self.cursor >= self.length

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

    def next_actions(self) -> np.ndarray:
        """The batch of actions for this env step. Every active env holds a chunk; an env that takes no part in
        the step (retired, or waiting for its seed group) gets the last action it had, as a placeholder."""
        return self._queue[self._all, np.minimum(self.cursor, self._queue.shape[1] - 1)]

    def advance(self, rewards: np.ndarray, done: np.ndarray, active: np.ndarray | None = None) -> np.ndarray:
        """Account one env step of the ``active`` envs (all when None); returns the envs whose chunk ended on it
        (used up or episode over). Inactive envs (retired, or waiting) keep their plans as they are."""
        if active is None:
            self.cursor += 1
            self.chunk_reward += rewards
            ended = (self.cursor >= self.length) | done
        else:
            self.cursor += active
            self.chunk_reward += np.where(active, rewards, 0.0)
            ended = active & ((self.cursor >= self.length) | done)
        self.cursor[done] = self.length[done]
        return ended.nonzero()[0]

    def nearly_used(self, steps_left: int, candidates: np.ndarray) -> np.ndarray:
        """Among ``candidates`` (a bool mask), the envs with at most ``steps_left`` steps left in their chunk."""
        return np.flatnonzero(candidates & (self.length - self.cursor <= steps_left) & (self.cursor < self.length))

    def cut(self, env_ids: np.ndarray) -> None:
        """End the chunks of ``env_ids`` now (a prefix of a chunk is a whole chunk to the protocol): they ask for
        a new one at the next infer."""
        self.cursor[env_ids] = self.length[env_ids]

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
