"""Per-env episode accounting: return, length and success of each running episode, and finished-episode records.

Kept per env (not per batch) so statistics stay right when envs finish on different steps.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np


@dataclasses.dataclass(frozen=True)
class EpisodeRecord:
    """One finished episode, as written to ``episodes.jsonl``."""

    env_index: int
    episode_return: float
    length: int
    success: bool
    terminated: bool
    truncated: bool

    def to_json(self) -> dict[str, Any]:
        return {
            "env_index": self.env_index,
            "return": self.episode_return,
            "length": self.length,
            "success": self.success,
            "terminated": self.terminated,
            "truncated": self.truncated,
        }


class EpisodeTracker:
    """Running totals of the current episode of each env."""

    def __init__(self, num_envs: int, success_threshold: float | None) -> None:
        self.success_threshold = success_threshold
        self.returns = np.zeros(num_envs, np.float64)
        self.lengths = np.zeros(num_envs, np.int64)
        self.success = np.zeros(num_envs, bool)

    def add_step(self, rewards: np.ndarray, info: dict[str, Any]) -> None:
        """Account one env step of every env.

        An episode succeeds when any step's reward reaches the registered threshold, or when the env reports
        ``info["success"]`` (a bool array) true on any step.
        """
        self.returns += rewards
        self.lengths += 1
        if self.success_threshold is not None:
            self.success |= rewards >= self.success_threshold
        reported = info.get("success")
        if isinstance(reported, np.ndarray) and reported.shape == self.success.shape:
            self.success |= reported.astype(bool)

    def finish(self, env_ids: np.ndarray, terminated: np.ndarray, truncated: np.ndarray) -> list[EpisodeRecord]:
        """Records of the episodes that ended at ``env_ids`` (the caller resets the envs and :meth:`restart`s)."""
        return [
            EpisodeRecord(int(i), float(self.returns[i]), int(self.lengths[i]), bool(self.success[i]),
                          bool(terminated[i]), bool(truncated[i]))
            for i in env_ids
        ]

    def episode_info(self, rows: np.ndarray, done: np.ndarray) -> dict[str, np.ndarray]:
        """``info["episode"]`` for a feedback on ``rows``: r, l, s of every row and the mask of finished ones."""
        return {
            "r": self.returns[rows].astype(np.float32),
            "l": self.lengths[rows].astype(np.int64),
            "s": self.success[rows].copy(),
            "mask": done[rows].copy(),
        }

    def restart(self, env_ids: np.ndarray) -> None:
        self.returns[env_ids] = 0.0
        self.lengths[env_ids] = 0
        self.success[env_ids] = False
