"""DirectorySink: files only inside its folder, written whole."""

from __future__ import annotations

from pathlib import Path

import pytest

from plugrl_env_client.outputs.recording.sinks import DirectorySink


def test_directory_sink_writes_inside_its_folder_only(tmp_path: Path) -> None:
    sink = DirectorySink(tmp_path)
    sink.write_bytes("a/b.bin", b"12")
    sink.write_bytes("a/b.bin", b"345")
    sink.append_bytes("m/x.jsonl", b"1\n")
    sink.append_bytes("m/x.jsonl", b"2\n")
    assert (tmp_path / "a/b.bin").read_bytes() == b"345" and (tmp_path / "m/x.jsonl").read_bytes() == b"1\n2\n"
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["b.bin"]
    for bad in ("../escape.bin", "/etc/passwd", "a/../../b", ""):
        with pytest.raises(ValueError, match="must be relative"):
            sink.write_bytes(bad, b"")
