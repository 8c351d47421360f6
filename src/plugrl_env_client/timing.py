"""Where a process's time and bytes went: one model for a process's summary and for the run's aggregate.

The rollout counts env steps and times the env; the connection counts messages and bytes and times packing and
waiting. Both write into the same :class:`Timing`, so a summary is one object serialised; a process's env groups
are combined with :meth:`Timing.total` (one clock, side by side) and a run's processes with
:meth:`Timing.across_processes` (each with a clock of its own). The names follow PlugRL's client where we measure the
same thing (``infer_wait_s``, ``infer_obs_pack_s``, ``env_step_s``, ``feedback_s`` with its parts
``feedback_obs_pack_s`` and ``feedback_info_pack_s``, the stages' ``*_frac`` and ``effective_fps``).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar


@dataclasses.dataclass
class Timing:
    """Counters and seconds of one process (or, summed, of a run)."""

    env_steps: int = 0
    """Env steps taken by envs in an episode (retired envs, and envs waiting for their seed group, not counted)."""
    idle_env_steps: int = 0
    """Steps of envs that took no part (retired, or waiting for their seed group): the batch steps them anyway."""
    batch_steps: int = 0
    """Calls to ``env.step``."""
    infer_calls: int = 0
    infer_rows: int = 0
    """Env rows the infers asked actions for (per infer: how many envs' chunks ended together)."""
    actions_received: int = 0
    feedback_calls: int = 0
    reconnects: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    env_step_s: float = 0.0
    """Inside ``env.step``."""
    reset_s: float = 0.0
    """Inside ``env.reset`` (the first reset and the resets of finished envs)."""
    infer_obs_pack_s: float = 0.0
    """Building and packing infer messages (the observation rows that need actions)."""
    infer_wait_s: float = 0.0
    """From sending an infer to holding its decoded action chunk: the round trip and the server's inference."""
    feedback_s: float = 0.0
    """Building, packing and sending feedback messages."""
    feedback_obs_pack_s: float = 0.0
    """Of feedback_s: putting the feedback's observation rows into the frame (their wire map, and msgpack copying
    their bytes in). As PlugRL's client names it; its client also counts selecting the rows, which the rollout does
    here before the feedback is built."""
    feedback_info_pack_s: float = 0.0
    """Of feedback_s: putting the feedback's ``info`` into the frame (the env's info rows, ``info["episode"]``,
    ``is_step_success``), msgpack encoding. Both parts are inside feedback_s and pack_s, so they are no stage."""
    pack_s: float = 0.0
    """msgpack encoding alone, infers and feedbacks together (part of infer_obs_pack_s and feedback_s)."""
    server_infer_s: float = 0.0
    """Of infer_wait_s: the inference time the servers reported with their replies (openpi's
    ``server_timing.infer_ms``), over the ``server_timed_replies`` that carried it."""
    server_timed_replies: int = 0
    """Replies that reported their server's inference time (PlugRL's do not)."""
    collect_time_s: float = 0.0
    """Wall time of the collection, from the first connection attempt to the end (a run's: its longest process's)."""
    collect_time_sum_s: float = 0.0
    """The collect times of the processes this timing covers, added up (process-seconds): the denominator of the
    ``*_frac``. A process's own timing leaves it 0, which stands for its ``collect_time_s`` (see
    :attr:`process_seconds`); :meth:`to_json` writes the value it stands for."""

    STAGES: ClassVar[tuple[str, ...]] = ("env_step", "reset", "infer_obs_pack", "infer_wait", "feedback")
    """The parts of a collection cycle; each ``*_frac`` is its share of the processes' collection time."""

    @property
    def effective_fps(self) -> float:
        """Env steps per second of wall time: over processes, the run's throughput (they run side by side)."""
        return self.env_steps / self.collect_time_s if self.collect_time_s > 0 else 0.0

    @property
    def process_seconds(self) -> float:
        """The processes' collection time added up: ``collect_time_sum_s`` once processes were combined, else the
        one process's ``collect_time_s``."""
        return self.collect_time_sum_s if self.collect_time_sum_s > 0 else self.collect_time_s

    def fraction(self, stage: str) -> float:
        """The share of the processes' collection time that went into ``stage`` (one of :data:`STAGES`).

        Stage times are summed over processes, so they are divided by the processes' collect times summed, not by
        the run's wall time: with two processes that each stepped their env for 80% of their collection, the share
        is 0.8, not 1.6. It is a share of process-time (how a process spends its time, on average, weighted by
        how long each collected), in [0, 1]. A process times its stages one after another on one thread, so they
        fit in its collection time; the bound is enforced anyway, against timer rounding.
        """
        total = self.process_seconds
        if total <= 0:
            return 0.0
        return min(max(getattr(self, f"{stage}_s") / total, 0.0), 1.0)

    def to_json(self) -> dict[str, Any]:
        """The counters, the seconds (rounded to microseconds), ``effective_fps`` and each stage's ``*_frac``."""
        out: dict[str, Any] = {}
        for field in dataclasses.fields(self):
            value = self.process_seconds if field.name == "collect_time_sum_s" else getattr(self, field.name)
            out[field.name] = round(value, 6) if isinstance(value, float) else value
        out["effective_fps"] = round(self.effective_fps, 3)
        for stage in self.STAGES:
            out[f"{stage}_frac"] = round(self.fraction(stage), 6)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> Timing:
        """Read back what :meth:`to_json` wrote (derived and unknown keys are ignored; missing ones are 0)."""
        data = data or {}
        values: dict[str, Any] = {}
        for field in dataclasses.fields(cls):
            raw = data.get(field.name)
            if isinstance(raw, (int, float)) and not isinstance(raw, bool) and math.isfinite(raw):
                values[field.name] = float(raw) if field.name.endswith("_s") else int(raw)
        return cls(**values)

    @classmethod
    def total(cls, parts: Iterable[Timing]) -> Timing:
        """Parts that share one clock, such as a process's env groups: counters and seconds summed,
        ``collect_time_s`` the longest one (the groups collect over the same stretch of time, so the process's
        collection time is that stretch, once)."""
        out = cls()
        for part in parts:
            for field in dataclasses.fields(cls):
                if field.name == "collect_time_s":
                    out.collect_time_s = max(out.collect_time_s, part.collect_time_s)
                elif field.name != "collect_time_sum_s":
                    setattr(out, field.name, getattr(out, field.name) + getattr(part, field.name))
        return out

    @classmethod
    def in_sequence(cls, parts: Iterable[Timing]) -> Timing:
        """Parts one after the other, such as one process's segments of a resumed run: every counter and every
        second summed (collection times too: the stretches follow each other)."""
        out = cls()
        for part in parts:
            for field in dataclasses.fields(cls):
                setattr(out, field.name, getattr(out, field.name) + getattr(part, field.name))
        return out

    @classmethod
    def across_processes(cls, parts: Iterable[Timing]) -> Timing:
        """A run's timing from its processes' timings: counters and seconds summed; ``collect_time_s`` is the
        longest process's (they run side by side, so ``effective_fps`` is the run's throughput), and
        ``collect_time_sum_s`` their collect times added up, so each ``*_frac`` is a share of the processes'
        total collection time and stays within [0, 1]."""
        parts = list(parts)
        out = cls.total(parts)
        out.collect_time_sum_s = sum(part.process_seconds for part in parts)
        return out


class Stopwatch:
    """Adds the seconds of each ``with`` block to the named fields of a :class:`Timing`.
    Made once per step of the exchange and reused (a block costs two clock readings and two method calls), so a
    step's time is measured in one place, not by clock readings spread through it. Not reentrant."""

    __slots__ = ("_timing", "_fields", "_start")

    def __init__(self, timing: Timing, *fields: str) -> None:
        self._timing, self._fields, self._start = timing, fields, 0.0

    def __enter__(self) -> None:
        self._start = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        elapsed = time.perf_counter() - self._start
        timing = self._timing
        for field in self._fields:
            setattr(timing, field, getattr(timing, field) + elapsed)
