"""Reading a run's results back: the episodes of an ``episodes.jsonl``, for scripts and notebooks.

The run's writer (``outputs/run_writer.py``) writes one :class:`~plugrl_env_client.records.EpisodeRecord` per line;
:func:`read_episodes` gives them back, skipping what a crash cut short.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from plugrl_env_client.records import EpisodeRecord


def read_episodes(path: Path) -> Iterator[EpisodeRecord]:
    """The records of an ``episodes.jsonl``; a line a crash cut short (or any unreadable line) is skipped."""
    if not path.exists():
        return
    with open(path) as f:
        for line in f:
            try:
                yield EpisodeRecord.from_json(json.loads(line))
            except (ValueError, KeyError, TypeError, AttributeError):
                continue
