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


def _line(env: int, ret: float, length: int) -> str:
    return json.dumps(EpisodeRecord(env, ret, length, None, terminated=True, truncated=False).to_json()) + "\n"


def test_a_file_is_read_by_the_one_rule_blank_lines_none_garbage_named_and_a_torn_tail_measured(tmp_path: Path) -> None:
    from plugrl_env_client.outputs.results import read_episode_lines

    path = tmp_path / "episodes.jsonl"
    torn = '{"env_index": 0, "return": 1.0, "length": 4}'  # a whole record, but its newline never got written
    path.write_text(_line(0, 1.0, 2) + "\n" + "garbage\n" + _line(1, 2.0, 3) + "  \n" + torn)
    lines = read_episode_lines(path)
    assert [(n, r.env_index, r.length) for n, r in lines.episodes] == [(1, 0, 2), (4, 1, 3)]
    assert [n for n, _ in lines.not_episodes] == [3] and "not JSON" in lines.not_episodes[0][1]
    assert lines.torn_bytes == len(torn)
    assert [r.length for r in read_episodes(path)] == [2, 3]
    assert read_episode_lines(tmp_path / "missing.jsonl").episodes == ()


def test_the_resumed_writer_and_the_report_count_the_episodes_the_rule_reads(tmp_path: Path) -> None:
    """One run folder with blank lines and a torn tail: the resumed run's summary and the report count exactly the
    episode lines, and the torn tail is what the writer cuts."""
    from plugrl_env_client.outputs.results import read_episode_lines
    from plugrl_env_client.outputs.run_dir import RunDir
    from plugrl_env_client.outputs.run_writer import RunWriter
    from plugrl_env_client.report.data import load_run

    run = RunDir(tmp_path / "run").create()
    path = run.episodes_file(0)
    path.parent.mkdir(parents=True)
    path.write_text("\n" + _line(0, 1.0, 2) + "\n\n" + _line(1, 2.0, 3) + '{"env_index": 1, "ret')
    assert len(load_run(run.root).processes[0].episodes) == 2
    writer = RunWriter(run, "run", 1, num_envs=2, resume=True)
    try:
        assert writer.completed_episodes == len(read_episode_lines(path).episodes) == 2
        assert writer.episodes_per_env(0) == (1, 1)
    finally:
        summary = writer.close()
    assert summary["completed_episodes"] == 2 and read_episode_lines(path).torn_bytes == 0


def test_lines_are_read_with_a_bound_and_holes_are_jumped(tmp_path: Path) -> None:
    """A line longer than the bound comes as None (never held whole), lines around it as they are, and a 2 GiB hole
    at the end of the file (sparse: no disk used) is one over-long line, gone past at once."""
    from plugrl_env_client.outputs.results import bounded_lines, read_episode_lines

    record = EpisodeRecord(0, 1.0, 3, None, terminated=True, truncated=False)
    line = json.dumps(record.to_json()) + "\n"
    path = tmp_path / "episodes.jsonl"
    path.write_text(line + "y" * 5000 + "\n" + line)
    with open(path, "r+b") as f:
        f.truncate(2 * 2**30)
    assert list(bounded_lines(path, limit=1000)) == [(1, line), (2, None), (3, line), (4, None)]
    assert list(read_episodes(path)) == [record, record]
    lines = read_episode_lines(path, limit=1000)
    assert lines.too_long == (2, 4) and [n for n, _ in lines.not_episodes] == [2]
    assert lines.torn_bytes == 2 * 2**30 - 2 * len(line) - 5001, "the hole at the end is a torn last line, measured"
