"""What a rollout runs with: the choices a user makes (:class:`LoopConfig`, the ``--runner.*`` flags the loop reads)
and, per process, what the run adds to them (:class:`LoopSettings`).

The CLI's runner section *is* a :class:`LoopConfig` (``config.RunnerConfig`` subclasses it and adds what only the
launcher reads), so a flag is declared once, here, with its help text, and reaches the loop without being copied
by name: :meth:`LoopSettings.of` takes every field of the config and the few values the run adds.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any, Literal

import tyro

TIME_LIMIT_DEFAULT = "(default: the env's registered max_episode_steps)"
"""The help's default of ``--runner.max-episode-steps`` (and of its alias ``--env.max-episode-steps``)."""


@dataclasses.dataclass(frozen=True)
class LoopConfig:
    """How the rollout loop steps the envs: the user's choices, the same for every process."""

    seed: int | None = 0
    """Seed of the run: env i of process p starts its first episode from seed + p * num_envs + i, later episodes from
    seeds derived from it and their place (process, env, episode number), for envs that take per-env seeds (the
    others continue each env's RNG)."""
    max_episode_steps: Annotated[int | None, tyro.conf.arg(help_behavior_hint=TIME_LIMIT_DEFAULT)] = None
    """Time limit in env steps (marks truncated)."""
    replan_steps: Annotated[int | None, tyro.conf.arg(help_behavior_hint="(default: the whole chunk)")] = None
    """Use at most this many steps of each action chunk before asking again."""
    non_finite_actions: Literal["error", "clip"] = "error"
    """What to do with NaN/inf actions for a float action space: stop with an error, or clip into the bounds."""
    non_finite_rewards: Literal["error", "zero"] = "error"
    """What to do with NaN/inf rewards from the env: stop with an error naming the env rows, or replace them by 0."""
    non_finite_observations: Literal["error", "allow"] = "error"
    """NaN/inf in the env's float states: stop with an error naming the key and rows, or send them as they are."""
    check_partial_reset: Literal["on", "off"] = "on"
    """After each partial reset, compare the state rows of the envs it did not reset with the step before: an env
    that changes them (e.g. re-randomises every row) stops the run, since its episodes would be wrong. 'off' skips
    the comparison (for an env whose unreset rows change on purpose)."""
    instruction: Literal["prepend", "off"] = "prepend"
    """Put the env's info['env_instruction'] in front of the first observation text of each episode, or not."""
    align_chunks: int = 0
    """When some envs' chunks end, also end the chunks with at most this many steps left, so envs ask for actions
    together (fewer round trips when episodes end at different steps; 0: never)."""
    group_size: int = 1
    """Consecutive envs form groups of this size that start every episode from the same seed and are reset together
    once all of them are done (GRPO-style); num_envs must be a multiple of it."""
    start_seeds: Annotated[tuple[int, ...], tyro.conf.arg(
        help_behavior_hint="(default: none: seeds derived from --runner.seed)")] = ()
    """Fixed start states: the run's k-th episode starts from the k-th of these seeds, whatever the number of
    processes, and the run ends after one episode per seed (each process runs a fixed share of them; for envs that
    take per-env seeds)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoopSettings(LoopConfig):
    """One process's rollout settings: its :class:`LoopConfig`, with ``seed`` (this process's first seed) and
    ``max_episode_steps`` (the time limit in force) resolved, and what the run adds."""

    env_id: str
    process_id: int = 0
    success_threshold: float | None = None
    """The env's registered ``best_reward_threshold_for_success`` (None: no reward rule)."""
    reuse_feedback_obs: bool = True
    """Leave out of infers the rows the server already holds from feedback (when the server offers it)."""
    progress_period_s: float = 2.0
    """How often the rollout reports its timing to the run's writer."""
    process_envs: int | None = None
    """The process's envs over all its groups (they share its ``start_seeds``, which here hold only this process's
    share); None: one group."""
    first_episodes: tuple[int, ...] = ()
    """Per env of the process: the episodes it completed in earlier segments of a resumed run, where its episode
    numbering (and so its seeds) continues; empty: none (a new run)."""
    env_shares: tuple[int, ...] = ()
    """Per env of the process: how many episodes it runs in the whole run (the static split's share of each env,
    :func:`~plugrl_env_client.rollout.budget.env_shares`, or of the listed start seeds); an env that has run them
    retires. Empty: no env has a share of its own (the budget alone ends the run)."""

    @classmethod
    def of(cls, config: LoopConfig, **added: Any) -> LoopSettings:
        """``config``'s choices (every field of :class:`LoopConfig`, whatever subclass carries them), with
        ``added``: the values the run adds and the ones it resolves (``seed``, ``max_episode_steps``)."""
        chosen = {f.name: getattr(config, f.name) for f in dataclasses.fields(LoopConfig)}
        return cls(**{**chosen, **added})
