"""Reading a run's results back: the episodes of an ``episodes.jsonl``, for scripts and notebooks and for the
client itself.

The run's writer (``outputs/run_writer.py``) writes one :class:`~plugrl_env_client.records.EpisodeRecord` per
line, each ended by a newline. :func:`read_episode_lines` reads a file by the one rule of what an episode is
(:func:`~plugrl_env_client.records.episode_of_line`), and says what else the file holds: whole lines that hold no
episode, lines too long to be one, and a torn last line (no newline: a write a stop cut short). Everything that
reads or counts a run's episodes goes through it, so a resumed run's finished check, its loader, its summaries and
the report agree. It reads through :func:`bounded_lines`, so no line, however long, is held whole.
:func:`read_episodes` gives the episodes alone, skipping the rest.
"""

from __future__ import annotations

import dataclasses
import errno
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from plugrl_env_client.records import EpisodeRecord, NotAnEpisode, episode_of_line

MAX_LINE_BYTES = 1 << 20
"""The longest line :func:`bounded_lines` reads whole; an episode's line is a few hundred bytes."""
_CHUNK = 1 << 20
_SEEK_DATA: int | None = getattr(os, "SEEK_DATA", None)


@dataclasses.dataclass(frozen=True)
class EpisodeLines:
    """What an ``episodes.jsonl`` holds: its episodes with their line numbers (from 1), the whole lines that hold
    no episode and are not blank (line number, what is wrong; a line over :data:`MAX_LINE_BYTES` among them), the
    bytes of a torn last line (0: none), and the numbers of the lines over the bound (a torn one too)."""

    episodes: tuple[tuple[int, EpisodeRecord], ...] = ()
    not_episodes: tuple[tuple[int, str], ...] = ()
    torn_bytes: int = 0
    too_long: tuple[int, ...] = ()

    @property
    def records(self) -> list[EpisodeRecord]:
        return [record for _, record in self.episodes]


def read_episode_lines(path: Path, limit: int = MAX_LINE_BYTES) -> EpisodeLines:
    """``path`` read line by line, at most ``limit`` bytes of a line held at a time (a missing file holds
    nothing)."""
    episodes: list[tuple[int, EpisodeRecord]] = []
    not_episodes: list[tuple[int, str]] = []
    too_long: list[int] = []
    torn = 0
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        return EpisodeLines()
    with f:
        for number, line, size, ended in _lines(f, limit):
            if not ended:
                torn = size
                if line is None:
                    too_long.append(number)
                break
            if line is None:
                too_long.append(number)
                not_episodes.append((number, f"longer than {limit} bytes (an episode's line is a few hundred)"))
                continue
            try:
                record = episode_of_line(line)
            except NotAnEpisode as exc:
                not_episodes.append((number, str(exc)))
                continue
            if record is not None:
                episodes.append((number, record))
    return EpisodeLines(tuple(episodes), tuple(not_episodes), torn, tuple(too_long))


def count_episodes(path: Path, offset: int = 0, limit: int = MAX_LINE_BYTES) -> tuple[int, int]:
    """The episodes, by the one rule, in the whole lines of ``path`` from byte ``offset`` (a line's start) on, and
    the offset after the last whole line, where a later count of what was appended meanwhile starts (a missing
    file: none, and 0)."""
    count = 0
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        return 0, 0
    with f:
        f.seek(offset)
        for _, line, size, ended in _lines(f, limit):
            if not ended:
                break
            offset += size
            try:
                count += line is not None and episode_of_line(line) is not None
            except NotAnEpisode:
                pass
    return count, offset


def bounded_lines(path: Path, limit: int = MAX_LINE_BYTES) -> Iterator[tuple[int, str | None]]:
    """(line number from 1, text) of every line of ``path``, read ``limit`` bytes at most at a time: a longer line
    (a file ending in a hole of zeros, a line of garbage) comes as None and is skipped without being held, so
    reading takes memory for one line, whatever the file holds. Holes of a sparse file are jumped over, not read."""
    with open(path, "rb") as f:
        for number, line, _, _ in _lines(f, limit):
            yield number, None if line is None else line.decode("utf-8", "replace")


def _lines(f: Any, limit: int) -> Iterator[tuple[int, bytes | None, int, bool]]:
    """(number, the line or None when over ``limit``, its bytes, whether it ends with a newline) of every line of
    the binary file ``f``."""
    number = 0
    while True:
        start = f.tell()
        line = f.readline(limit + 1)
        if not line:
            return
        number += 1
        if len(line) <= limit or line.endswith(b"\n"):
            yield number, line, len(line), line.endswith(b"\n")
            continue
        ended = _skip_line(f)
        yield number, None, f.tell() - start, ended


def _skip_line(f: Any) -> bool:
    """Move ``f`` past the end of the line it is in (or to the end of the file); whether the line had a newline."""
    while True:
        chunk = f.read(_CHUNK)
        if not chunk:
            return False
        end = chunk.find(b"\n")
        if end >= 0:
            f.seek(end + 1 - len(chunk), os.SEEK_CUR)
            return True
        if _SEEK_DATA is None:
            continue
        fd = f.fileno()
        where = os.lseek(fd, 0, os.SEEK_CUR)  # the buffered file's own idea of it, given back below
        try:  # a hole holds no newline: go on from the next data
            data = os.lseek(fd, f.tell(), _SEEK_DATA)
        except OSError as exc:
            data = -1 if exc.errno == errno.ENXIO else f.tell()  # ENXIO: no data after here, the line ends the file
        os.lseek(fd, where, os.SEEK_SET)
        if data < 0:
            f.seek(0, os.SEEK_END)
            return False
        f.seek(data)


def read_episodes(path: Path) -> Iterator[EpisodeRecord]:
    """The records of an ``episodes.jsonl``; a line a crash cut short (or any line that is no episode, or too long
    to be one) is skipped."""
    yield from read_episode_lines(path).records
