"""Reading episodes.jsonl back: every record a run wrote, and nothing a crash cut short."""

from __future__ import annotations

import json
from pathlib import Path

from plugrl_env_client.outputs.results import read_episodes
from plugrl_env_client.records import EpisodeRecord


def test_a_written_record_reads_back_equal(tmp_path: Path) -> None:
    record = EpisodeRecord(2, 1.5, 9, True, terminated=True, truncated=False, process_id=1, seed=4,
                           wall_time_s=0.5, env_steps=90, metrics={"d": 0.1}, instruction="go")
    path = tmp_path / "episodes.jsonl"
    path.write_text(json.dumps(record.to_json()) + "\n")
    assert list(read_episodes(path)) == [record]


def test_old_lines_read_back_with_the_new_fields_unknown(tmp_path: Path) -> None:
    path = tmp_path / "episodes.jsonl"
    path.write_text(json.dumps({"env_index": 1, "return": 2.0, "length": 3, "success": False,
                                "terminated": True, "truncated": False}) + "\n"
                    + '{"env_index": 0, "return": 1.0, "len')  # a last line cut short by a crash
    records = list(read_episodes(path))
    assert len(records) == 1
    assert records[0].env_index == 1 and records[0].wall_time_s is None and records[0].seed is None
    assert list(read_episodes(tmp_path / "missing.jsonl")) == []


def test_lines_are_read_with_a_bound_and_holes_are_jumped(tmp_path: Path) -> None:
    """A line longer than the bound comes as None (never held whole), lines around it as they are, and a 2 GiB hole
    at the end of the file (sparse: no disk used) is one over-long line, gone past at once."""
    from plugrl_env_client.outputs.results import bounded_lines

    record = EpisodeRecord(0, 1.0, 3, None, terminated=True, truncated=False)
    line = json.dumps(record.to_json()) + "\n"
    path = tmp_path / "episodes.jsonl"
    path.write_text(line + "y" * 5000 + "\n" + line)
    with open(path, "r+b") as f:
        f.truncate(2 * 2**30)
    assert list(bounded_lines(path, limit=1000)) == [(1, line), (2, None), (3, line), (4, None)]
    assert list(read_episodes(path)) == [record, record]
