"""Reading a run's results back: the episodes of an ``episodes.jsonl``, for scripts and notebooks.

The run's writer (``outputs/run_writer.py``) writes one :class:`~plugrl_env_client.records.EpisodeRecord` per line;
:func:`read_episodes` gives them back, skipping what a crash cut short. Every reader of those lines (this one, and
``plugrl-report``'s) reads them through :func:`bounded_lines`, so no line, however long, is held whole.
"""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from plugrl_env_client.records import EpisodeRecord

MAX_LINE_BYTES = 1 << 20
"""The longest line :func:`bounded_lines` reads whole; an episode's line is a few hundred bytes."""
_CHUNK = 1 << 20
_SEEK_DATA: int | None = getattr(os, "SEEK_DATA", None)


def bounded_lines(path: Path, limit: int = MAX_LINE_BYTES) -> Iterator[tuple[int, str | None]]:
    """(line number from 1, text) of every line of ``path``, read ``limit`` bytes at most at a time: a longer line
    (a file ending in a hole of zeros, a line of garbage) comes as None and is skipped without being held, so
    reading takes memory for one line, whatever the file holds. Holes of a sparse file are jumped over, not read."""
    with open(path, "rb") as f:
        number = 0
        while True:
            line = f.readline(limit + 1)
            if not line:
                return
            number += 1
            if len(line) <= limit or line.endswith(b"\n"):
                yield number, line.decode("utf-8", "replace")
                continue
            yield number, None
            _skip_line(f)


def _skip_line(f: Any) -> None:
    """Move ``f`` past the end of the line it is in (or to the end of the file)."""
    while True:
        chunk = f.read(_CHUNK)
        if not chunk:
            return
        end = chunk.find(b"\n")
        if end >= 0:
            f.seek(end + 1 - len(chunk), os.SEEK_CUR)
            return
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
            return
        f.seek(data)


def read_episodes(path: Path) -> Iterator[EpisodeRecord]:
    """The records of an ``episodes.jsonl``; a line a crash cut short (or any unreadable or over-long line) is
    skipped."""
    if not path.exists():
        return
    for _, line in bounded_lines(path):
        if line is None:
            continue
        try:
            yield EpisodeRecord.from_json(json.loads(line))
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
