"""The reference server's account of the episodes clients report: running totals, and a file if one is wanted.

A server runs for days, so what it keeps in memory does not grow with the episodes it has seen: exact sums and
counts, and a window of the latest :data:`~plugrl_env_client.records.DEFAULT_METRIC_WINDOW` (an
:class:`~plugrl_env_client.records.EpisodeStats`). Every episode, one JSON line each, goes to disk only when asked
for (``PolicyServer(episode_log=path)``): the server writes it as it goes and keeps none of it.

Success rates count only episodes the server can tell were judged. A client sends ``info["episode"]["s"]`` for
every finished episode, and for an env with no success rule that flag is simply False: on the wire, "no rule" and
"failed" look the same. So a connection's False flags count as failures only once its feedback shows that its env
has a rule (see :class:`SuccessJudging`); until then the log says ``success_rate=n/a`` rather than 0.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from pathlib import Path
from typing import IO, Any

from plugrl_env_client.records import EpisodeStats, finite_or_none
from plugrl_env_client.server.info import FinishedEpisodes

logger = logging.getLogger(__name__)

FLUSH_PERIOD_S = 1.0
"""How often the episode file is flushed (it is also flushed when the server shuts down)."""


@dataclasses.dataclass
class SuccessJudging:
    """Whether the env behind one connection has a success rule, as far as its feedback has shown.

    A feedback shows it when an episode reports ``s`` True (only a rule makes a success), or when its ``info``
    carries a per-env success flag (:data:`~plugrl_env_client.server.info.SUCCESS_INFO_KEYS`). Before that,
    episodes whose ``s`` is False are ``pending``: not counted in the success rate, since the env may have no rule
    at all. Once the rule shows, they count as the failures they were. A reconnect starts over: a new connection
    may carry another env.
    """

    known: bool = False
    pending: int = 0


@dataclasses.dataclass(frozen=True)
class Source:
    """Where reported episodes came from, as the episode file names it."""

    connection: int
    """The server's number for the connection (1, 2, ... in the order they opened)."""
    stream: str | None = None
    """The client's ``X-PlugRL-Stream`` header (``<process>.<group>``), when it sent a valid one."""


class EpisodeFile:
    """``PolicyServer(episode_log=path)``: one JSON line per reported episode, appended as they come.

    A line: ``connection`` and ``stream`` (see :class:`Source`), ``env_index`` (the connection's own index),
    ``return``, ``length``, ``success`` (the ``s`` flag as the client sent it, null when it sent none: a False
    may mean that the env has no success rule) and ``time`` (Unix seconds). Numbers that are not finite are written
    as null. A failing write (a full disk) is logged once and ends the file, not the serving.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[str] | None = self.path.open("a", encoding="utf-8")
        self._flushed = time.monotonic()

    def write(self, source: Source, env_indices: list[int], report: FinishedEpisodes) -> None:
        if self._file is None:
            return
        now = time.time()
        success = None if report.success is None else report.success.tolist()
        lines = [json.dumps({"connection": source.connection, "stream": source.stream, "env_index": env_indices[row],
                             "return": finite_or_none(ret), "length": length,
                             "success": None if success is None else success[k], "time": round(now, 3)},
                            allow_nan=False)
                 for k, (row, ret, length) in enumerate(zip(report.rows.tolist(), report.returns.tolist(),
                                                            report.lengths.tolist()))]
        try:
            self._file.write("\n".join(lines) + "\n")
            if time.monotonic() - self._flushed >= FLUSH_PERIOD_S:
                self._file.flush()
                self._flushed = time.monotonic()
        except OSError as exc:
            self._give_up(exc)

    def close(self) -> None:
        if self._file is None:
            return
        try:
            self._file.close()
        except OSError as exc:
            self._give_up(exc)
        self._file = None

    def _give_up(self, exc: OSError) -> None:
        logger.error("cannot write the episode log %s (%s); the server goes on serving without it", self.path, exc)
        file, self._file = self._file, None
        if file is not None:
            try:
                file.close()
            except OSError:
                pass


class EpisodeLog:
    """Running totals of the episodes clients reported in ``info["episode"]`` (thread-safe), and the episode file
    when there is one."""

    def __init__(self, file: EpisodeFile | None = None) -> None:
        self.stats = EpisodeStats()
        self.file = file
        self._lock = threading.Lock()

    @property
    def episodes(self) -> int:
        return self.stats.count

    def add(self, report: FinishedEpisodes | None, judging: SuccessJudging, shows_rule: bool = False,
            source: Source | None = None, env_indices: list[int] | None = None) -> int:
        """Count the episodes of one feedback's report, from the connection ``judging`` belongs to; returns how
        many there were.

        ``shows_rule``: the feedback's ``info`` showed that the env judges success. An episode's ``s`` counts in
        the success rate once the connection's env is known to have a rule (see :class:`SuccessJudging`); a report
        without ``s`` says nothing about success. ``source`` and ``env_indices`` (the feedback's) name the episodes
        in the episode file.
        """
        count = 0 if report is None else len(report)
        if not count and (judging.known or not shows_rule):
            return 0  # most feedbacks: no episode ended, nothing new about the rule
        judged = None if report is None else report.success
        with self._lock:
            if not judging.known and (shows_rule or (judged is not None and bool(judged.any()))):
                judging.known = True
                self.stats.judge_later(judging.pending)
                judging.pending = 0
            if report is not None and count:
                flags: list[Any] = [None] * count if judged is None or not judging.known else judged.tolist()
                for ret, length, flag in zip(report.returns.tolist(), report.lengths.tolist(), flags):
                    self.stats.add(ret, length, flag)
                if judged is not None and not judging.known:
                    judging.pending += count
        if self.file is not None and report is not None and count and source is not None and env_indices is not None:
            self.file.write(source, env_indices, report)
        return count

    def line(self) -> str:
        """One log line: episodes, mean return and length, and the success rate over the episodes known to be
        judged (``n/a`` when none is; how many were, when not all)."""
        with self._lock:
            means = self.stats.all_episodes()
            count, judged = self.stats.count, self.stats.success_judged

        def fmt(value: float | None, spec: str) -> str:
            return "n/a" if value is None else format(value, spec)

        rate = fmt(means["mean_success_rate"], ".3f")
        if 0 < judged < count:
            rate += f" (over the {judged} episodes with a success rule)"
        return (f"episodes={count} mean_return={fmt(means['mean_return'], '.3f')} "
                f"mean_length={fmt(means['mean_length'], '.1f')} success_rate={rate}")

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
