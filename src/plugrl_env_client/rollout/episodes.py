"""Per-env episode accounting: return, length and success of each running episode, until it becomes a record.

Kept per env (not per batch) so statistics stay right when envs finish on different steps.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from plugrl_env_client.outputs.results import EpisodeRecord


class EpisodeTracker:
    """Running totals of the current episode of each env."""

    def __init__(self, num_envs: int, success_threshold: float | None) -> None:
        self.success_threshold = success_threshold
        self.returns = np.zeros(num_envs, np.float64)
        self.lengths = np.zeros(num_envs, np.int64)
        self.success = np.zeros(num_envs, bool)
        self.seeds: list[int | None] = [None] * num_envs
        # Success is judged when the env has a rule: a registered threshold, or info["success"] seen on some step.
        self.judges_success = success_threshold is not None

    def start(self, env_ids: np.ndarray, seeds: list[int | None] | None = None) -> None:
        """New episodes begin at ``env_ids`` (with the seeds they were reset with, when known)."""
        self.returns[env_ids] = 0.0
        self.lengths[env_ids] = 0
        self.success[env_ids] = False
        for k, env in enumerate(np.asarray(env_ids).tolist()):
            self.seeds[env] = None if seeds is None else seeds[k]

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
            self.judges_success = True
            self.success |= reported.astype(bool)

    def finish(self, env_ids: np.ndarray, terminated: np.ndarray, truncated: np.ndarray, process_id: int,
               wall_time_s: float, env_steps: int) -> list[EpisodeRecord]:
        """Records of the episodes that ended at ``env_ids`` (the caller resets the envs and :meth:`start` s them)."""
        return [
            EpisodeRecord(
                env_index=int(i),
                episode_return=float(self.returns[i]),
                length=int(self.lengths[i]),
                success=bool(self.success[i]) if self.judges_success else None,
                terminated=bool(terminated[i]),
                truncated=bool(truncated[i]),
                process_id=process_id,
                seed=self.seeds[int(i)],
                wall_time_s=wall_time_s,
                env_steps=env_steps,
            )
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
