"""Reading a run's results back: the episodes of an ``episodes.jsonl``, for scripts and notebooks and for the
client itself.

The run's writer (``outputs/run_writer.py``) writes one :class:`~plugrl_env_client.records.EpisodeRecord` per
line, each ended by a newline. :func:`read_episode_lines` reads a file by the one rule of what an episode is
(:func:`~plugrl_env_client.records.episode_of_line`), and says what else the file holds: whole lines that hold no
episode, and a torn last line (no newline: a write a stop cut short). Everything that reads or counts a run's
episodes goes through it, so a resumed run's finished check, its loader, its summaries and the report agree.
:func:`read_episodes` gives the episodes alone, skipping the rest.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

from plugrl_env_client.records import EpisodeRecord, NotAnEpisode, episode_of_line


@dataclasses.dataclass(frozen=True)
class EpisodeLines:
    """What an ``episodes.jsonl`` holds: its episodes with their line numbers (from 1), the whole lines that hold
    no episode and are not blank (line number, what is wrong), and the bytes of a torn last line (0: none)."""

    episodes: tuple[tuple[int, EpisodeRecord], ...] = ()
    not_episodes: tuple[tuple[int, str], ...] = ()
    torn_bytes: int = 0

    @property
    def records(self) -> list[EpisodeRecord]:
        return [record for _, record in self.episodes]


def read_episode_lines(path: Path) -> EpisodeLines:
    """``path`` read line by line (a missing file holds nothing)."""
    episodes: list[tuple[int, EpisodeRecord]] = []
    not_episodes: list[tuple[int, str]] = []
    torn = 0
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        return EpisodeLines()
    with f:
        for number, line in enumerate(f, start=1):
            if not line.endswith(b"\n"):
                torn = len(line)
                break
            try:
                record = episode_of_line(line)
            except NotAnEpisode as exc:
                not_episodes.append((number, str(exc)))
                continue
            if record is not None:
                episodes.append((number, record))
    return EpisodeLines(tuple(episodes), tuple(not_episodes), torn)


def read_episodes(path: Path) -> Iterator[EpisodeRecord]:
    """The records of an ``episodes.jsonl``; a line a crash cut short (or any line that is no episode) is
    skipped."""
    yield from read_episode_lines(path).records
