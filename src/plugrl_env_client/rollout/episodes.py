"""Per-env episode accounting: return, length, success and metrics of each running episode, until it is a record.

Kept per env (not per batch) so statistics stay right when envs finish on different steps.

What a reset reports besides the observation has an object of its own: :class:`Instructions`
(``info["env_instruction"]``, recorded with the episode and, unless ``--runner.instruction off``, put in front of
its first observation text); envs whose reset had no episode for them (``info["no_episode"]``) retire
(:class:`~plugrl_env_client.rollout.idle.IdleEnvs`).

Metrics follow ROLL/GEM's convention: a step's ``info["metrics"]`` maps names to one value per env, and
``info["metrics_agg_mode"]`` says how a name is aggregated over an episode: ``sum``, ``mean``, ``min``, ``max``,
``first`` or ``last``; a name without a mode is averaged (``mean``). An unknown mode, or a mode that changes between
steps, is an error the first time it is seen.

``info["success"]`` and ``info["metrics"]`` of another type than these (a list, a str, one bool for the batch) cannot
be read per env; the tracker leaves them out and says so once per key, since a run that silently counts no success
looks like a policy that never succeeds.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np

from plugrl_env_client.envs.base_env import Observation
from plugrl_env_client.envs.contract import describe_value
from plugrl_env_client.errors import EnvContractError
from plugrl_env_client.records import EpisodeRecord
from plugrl_env_client.rollout.idle import IdleEnvs

logger = logging.getLogger(__name__)

AGG_MODES = ("sum", "mean", "min", "max", "first", "last")
DEFAULT_AGG_MODE = "mean"


def _latest(aggregate: np.ndarray, values: np.ndarray) -> np.ndarray:
    return values


_EMPTY = {"sum": 0.0, "mean": 0.0, "min": np.inf, "max": -np.inf, "first": np.nan, "last": np.nan}
_COMBINE: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "sum": np.add, "mean": np.add, "min": np.minimum, "max": np.maximum, "last": _latest}
"""How a step's value joins the aggregate; "first" keeps the value of an episode's first step instead."""


class _Metric:
    """One metric's running aggregate for every env: what its mode needs (a sum, with the count for a mean; the
    least or greatest value; the first or last), and how many steps reported it."""

    def __init__(self, n: int, mode: str) -> None:
        self.mode = mode
        self.acc = np.full(n, _EMPTY[mode])
        self.count = np.zeros(n, np.int64)
        self._combine = _COMBINE.get(mode)

    def add(self, values: np.ndarray, rows: np.ndarray) -> None:
        acc = self.acc
        if self._combine is None:  # "first"
            fresh = rows[self.count[rows] == 0]
            acc[fresh] = values[fresh]
        else:
            acc[rows] = self._combine(acc[rows], values[rows])
        self.count[rows] += 1

    def value(self, i: int) -> float | None:
        if self.count[i] == 0:
            return None
        if self.mode == "mean":
            return float(self.acc[i] / self.count[i])
        return float(self.acc[i])

    def clear(self, rows: np.ndarray) -> None:
        self.acc[rows] = _EMPTY[self.mode]
        self.count[rows] = 0


class EpisodeTracker:
    """Running totals of the current episode of each env."""

    def __init__(self, num_envs: int, success_threshold: float | None, idle: IdleEnvs | None = None) -> None:
        self.n = num_envs
        self.idle = idle if idle is not None else IdleEnvs(num_envs)
        self.success_threshold = success_threshold
        self.returns = np.zeros(num_envs, np.float64)
        self.lengths = np.zeros(num_envs, np.int64)
        self.success = np.zeros(num_envs, bool)
        self.seeds: list[int | None] = [None] * num_envs
        self.instructions: list[str | None] = [None] * num_envs
        self.metrics: dict[str, _Metric] = {}
        # Success is judged when the env has a rule: a registered threshold, or info["success"] seen on some step.
        self.judges_success = success_threshold is not None
        self._warned: set[str] = set()  # the info keys of a wrong type already warned about

    def start(self, env_ids: np.ndarray, seeds: list[int | None] | None = None,
              instructions: list[str] | None = None) -> None:
        """New episodes begin at ``env_ids``, with the seeds and instructions they were reset with, when known."""
        env_ids = np.asarray(env_ids, dtype=np.intp)
        self.returns[env_ids] = 0.0
        self.lengths[env_ids] = 0
        self.success[env_ids] = False
        for metric in self.metrics.values():
            metric.clear(env_ids)
        for k, env in enumerate(env_ids.tolist()):
            self.seeds[env] = None if seeds is None else seeds[k]
            self.instructions[env] = None if instructions is None else instructions[k]

    def add_step(self, rewards: np.ndarray, info: dict[str, Any]) -> None:
        """Account one env step of the envs that take part in it (``rewards`` of idle envs are 0).

        An episode succeeds when any step's reward reaches the registered threshold, or when the env reports
        ``info["success"]`` (a bool array) true on any step.
        """
        idle = self.idle
        self.returns += rewards
        self.lengths += idle.active
        if self.success_threshold is not None:
            reached = rewards >= self.success_threshold
            if reached.any():  # (none on most steps)
                self.success |= idle.only(reached)
        reported = info.get("success")
        if reported is not None:
            if (isinstance(reported, np.ndarray) and reported.shape == self.success.shape
                    and reported.dtype.kind in "biuf"):
                self.judges_success = True
                self.success |= idle.only(reported.astype(bool))
            elif "success" not in self._warned:
                self._wrong_type("success", reported, f"counts success only from a bool array of shape ({self.n},) (one per "
                                 "env), so it counts none from it")
        metrics = info.get("metrics")
        if isinstance(metrics, dict):
            if metrics:
                self._add_metrics(metrics, info.get("metrics_agg_mode") or {}, idle.rows())
        elif metrics is not None and "metrics" not in self._warned:
            self._wrong_type("metrics", metrics, "reads metrics only from a dict of metric name -> one number per env "
                             f"(shape ({self.n},)), so it records none from it")

    def _wrong_type(self, key: str, value: Any, expected: str) -> None:
        """Say once per key that ``info[key]`` is of a type the tracker cannot read."""
        self._warned.add(key)
        what = f"an array of {value.dtype} and shape {value.shape}" if isinstance(value, np.ndarray) else \
            describe_value(value)
        logger.warning("info[%r] is %s; the client %s (said once)", key, what, expected)

    def _add_metrics(self, metrics: dict[str, Any], modes: Any, rows: np.ndarray) -> None:
        if not isinstance(modes, dict):
            raise EnvContractError(f"info['metrics_agg_mode'] must map metric names to one of {', '.join(AGG_MODES)}; "
                                   f"got {type(modes).__name__}")
        for name, values in metrics.items():
            mode = modes.get(name, DEFAULT_AGG_MODE)
            if mode not in AGG_MODES:
                raise EnvContractError(f"info['metrics_agg_mode'][{name!r}] is {mode!r}; use one of "
                                       f"{', '.join(AGG_MODES)} (a metric without a mode is averaged)")
            metric = self.metrics.get(name)
            if metric is None:
                metric = self.metrics[name] = _Metric(self.n, mode)
            elif metric.mode != mode:
                raise EnvContractError(f"info['metrics_agg_mode'][{name!r}] changed from {metric.mode!r} to {mode!r}; "
                                       "a metric keeps one aggregation mode for the whole run")
            arr = np.asarray(values)
            if arr.shape != (self.n,) or arr.dtype.kind not in "biuf":
                raise EnvContractError(f"info['metrics'][{name!r}] must be a numeric or bool array of shape ({self.n},) "
                                       f"(one value per env); got {arr.dtype} {arr.shape}")
            metric.add(arr.astype(np.float64, copy=False), rows)  # read only: no copy of float64 values

    def finish(self, env_ids: np.ndarray, terminated: np.ndarray, truncated: np.ndarray, process_id: int,
               wall_time_s: float, env_steps: int, offset: int = 0) -> list[EpisodeRecord]:
        """Records of the episodes that ended at ``env_ids`` (batch rows; the record names the process's env id
        ``offset + row``). The caller resets the envs and :meth:`start` s them."""
        rows = np.asarray(env_ids, dtype=np.intp)
        # Plain Python values up front: one conversion per array rather than a numpy scalar per field and episode.
        returns, lengths = self.returns[rows].tolist(), self.lengths[rows].tolist()
        success, term, trunc = self.success[rows].tolist(), terminated[rows].tolist(), truncated[rows].tolist()
        records = []
        for k, i in enumerate(rows.tolist()):
            metrics = {name: value for name, m in self.metrics.items() if (value := m.value(i)) is not None}
            records.append(EpisodeRecord(
                env_index=offset + i,
                episode_return=returns[k],
                length=lengths[k],
                success=success[k] if self.judges_success else None,
                terminated=term[k],
                truncated=trunc[k],
                process_id=process_id,
                seed=self.seeds[i],
                wall_time_s=wall_time_s,
                env_steps=env_steps,
                metrics=metrics,
                instruction=self.instructions[i],
            ))
        return records

    def episode_info(self, rows: np.ndarray, done: np.ndarray) -> dict[str, np.ndarray]:
        """``info["episode"]`` for a feedback on ``rows``: r, l, s of every row and the mask of finished ones."""
        return {
            "r": self.returns[rows].astype(np.float32),
            "l": self.lengths[rows].astype(np.int64),
            "s": self.success[rows].copy(),
            "mask": done[rows].copy(),
        }

    def add_to_feedback(self, info: dict[str, Any], rows: np.ndarray, done: np.ndarray) -> None:
        """What a feedback on ``rows`` whose info is ``info`` says of their episodes: ``info["episode"]``
        (:meth:`episode_info`), and ``info["is_step_success"]`` when success is judged and the env did not say it
        (as PlugRL's client does: a server cannot tell a False ``"s"`` from no rule)."""
        info["episode"] = self.episode_info(rows, done)
        if self.judges_success:
            info.setdefault("is_step_success", self.success[rows].copy())


class Instructions:
    """``info["env_instruction"]`` of a reset: the instruction of each episode it starts, for its record, and (mode
    ``prepend``) in front of that episode's first observation text, where a language policy reads it."""

    def __init__(self, num_envs: int, mode: str) -> None:
        self.n, self.prepend = num_envs, mode == "prepend"

    def note_reset(self, obs: Observation, info: dict[str, Any], started: np.ndarray
                   ) -> tuple[Observation, list[str] | None]:
        """The observation the episodes ``started`` begin from, and their instructions (None: the env gave none)."""
        instructions = _instructions(info.get("env_instruction"), self.n)
        if instructions is None:
            return obs, None
        if self.prepend and started.size:
            obs = _prepend(obs, started, instructions)
        return obs, [instructions[i] for i in started]


def _instructions(value: Any, n: int) -> list[str] | None:
    """``info["env_instruction"]``: one str for all envs, or one per env; None when the env gave none."""
    if value is None:
        return None
    if isinstance(value, str):
        return [value] * n
    items = np.asarray(value, dtype=object).reshape(-1)
    if items.shape != (n,):
        raise EnvContractError(f"reset() info['env_instruction'] must be a str or one str per env ({n}); got "
                               f"{items.shape[0]} values")
    return ["" if v is None else str(v) for v in items]


def _prepend(obs: Observation, rows: np.ndarray, instructions: list[str]) -> Observation:
    """A copy of ``obs`` whose text rows ``rows`` start with their instruction (other arrays are shared)."""
    texts = obs.text.astype(object)
    for i in rows:
        head, body = instructions[i], str(texts[i])
        if head:
            texts[i] = f"{head}\n\n{body}" if body else head
    out = Observation.__new__(Observation)
    out.images, out.states = obs.images, obs.states
    out.text = np.asarray(texts.tolist(), dtype=str) if len(texts) else obs.text
    return out
