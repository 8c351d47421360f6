"""Run folder layout, default names, and the atomic, strict JSON writes every output goes through."""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

import numpy as np
import pytest

from plugrl_env_client.outputs.run_dir import (
    EpisodeLineCount,
    RunDir,
    default_exp_name,
    with_plugrl_config_keys,
    write_json_atomic,
)


def test_write_json_atomic_replaces_content_and_leaves_no_temp_files(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "summary.json"
    write_json_atomic(target, {"a": 1, "b": [1, 2]})
    assert json.loads(target.read_text()) == {"a": 1, "b": [1, 2]}
    write_json_atomic(target, {"c": np.float32(0.5), "d": np.int64(3), "e": np.bool_(True)})
    assert json.loads(target.read_text()) == {"c": 0.5, "d": 3, "e": True}
    assert sorted(p.name for p in target.parent.iterdir()) == ["summary.json"]


def test_write_json_atomic_keeps_the_old_file_when_encoding_fails(tmp_path: Path) -> None:
    target = tmp_path / "summary.json"
    write_json_atomic(target, {"ok": True})

    class Boom:
        def __repr__(self) -> str:
            raise RuntimeError("cannot encode")

    with pytest.raises(RuntimeError, match="cannot encode"):
        write_json_atomic(target, {"bad": Boom()})
    assert json.loads(target.read_text()) == {"ok": True}
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]


def test_write_json_atomic_encodes_arrays_as_lists(tmp_path: Path) -> None:
    target = tmp_path / "config.json"
    write_json_atomic(target, {"one": np.array([5]), "grid": np.arange(4).reshape(2, 2), "s": {3}})
    assert json.loads(target.read_text()) == {"one": [5], "grid": [[0, 1], [2, 3]], "s": [3]}


def test_write_json_atomic_files_follow_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        write_json_atomic(tmp_path / "summary.json", {})
    finally:
        os.umask(old)
    assert (tmp_path / "summary.json").stat().st_mode & 0o777 == 0o644


def test_default_exp_name_format() -> None:
    name = default_exp_name("Point-V1", 8)
    assert re.fullmatch(r"point-v1-nenv8-\d{8}-\d{6}-[0-9a-f]{8}", name), name
    assert default_exp_name("Point-V1", 8) != name  # random suffix


def test_run_dir_layout(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "exp").create()
    assert (tmp_path / "exp" / "logs").is_dir() and (tmp_path / "exp" / "rollout").is_dir()
    assert run.proc_dir(7) == tmp_path / "exp" / "rollout" / "proc_007"
    assert run.summary == tmp_path / "exp" / "summary.json"
    assert run.client_config == tmp_path / "exp" / "client_config.json"
    assert run.log_file == tmp_path / "exp" / "logs" / "client.log"


def test_episodes_are_counted_again_from_what_was_appended(tmp_path: Path) -> None:
    """Episode lines by the one rule (blank and garbage lines are none, a torn last line counts once it ends), in
    every process's file; each count reads only the bytes appended since the one before (a change before them goes
    unseen), and a file that got shorter is read again from its start."""
    run = RunDir(tmp_path / "exp").create()
    for p in range(2):
        run.proc_dir(p).mkdir()
    first, second = (run.episodes_file(p) for p in range(2))

    def line(env: int) -> bytes:
        return f'{{"env_index": {env}, "return": 1.0, "length": 2}}\n'.encode()

    counter = EpisodeLineCount(run, 3)  # process 2 has written nothing yet
    assert counter.count() == 0
    first.write_bytes(line(0) + b"\n" + b"garbage\n" + line(1) + b'{"env_index": 2, "ret')
    second.write_bytes(line(5))
    assert counter.count() == 3
    with first.open("r+b") as f:
        f.write(b" " * len(line(0)))  # a line the counter has read already, gone: a count from the start would see it
        f.seek(0, os.SEEK_END)
        f.write(b'urn": 1.0, "length": 3}\n')
    assert counter.count() == 4
    assert EpisodeLineCount(run, 3).count() == 3, "counted afresh: the blanked line is none"
    first.write_bytes(line(0))  # shorter: counted again from its start
    assert counter.count() == 2


def test_write_json_atomic_never_writes_nan_or_infinity(tmp_path: Path) -> None:
    target = tmp_path / "summary.json"
    write_json_atomic(target, {"a": math.nan, "b": [1.0, math.inf, -math.inf], "c": {"d": np.float32("nan")}, "e": 2.5})
    text = target.read_text()
    assert "NaN" not in text and "Infinity" not in text
    assert json.loads(text) == {"a": None, "b": [1.0, None, None], "c": {"d": None}, "e": 2.5}


def test_client_config_gets_plugrls_uid_and_time_limit_without_losing_the_envs_own() -> None:
    record = {"env_id": "Point-v1", "num_envs": 2, "env": {"step_size": 0.1}}
    out = with_plugrl_config_keys(record, "Point-v1", 100)
    assert list(out)[0] == "uid" and out["uid"] == "Point-v1" and out["env_id"] == "Point-v1"
    assert out["env"] == {"step_size": 0.1, "max_episode_steps": 100} and record["env"] == {"step_size": 0.1}
    assert with_plugrl_config_keys(record, "Point-v1", None)["env"]["max_episode_steps"] is None
    own = {"env_id": "X-v1", "env": {"max_episode_steps": 30}}
    assert with_plugrl_config_keys(own, "X-v1", 500)["env"]["max_episode_steps"] == 30, "the field the env got"


@pytest.mark.parametrize("reconnect", [True, False])
def test_client_config_gets_plugrls_top_level_reconnect_flag_and_runner_uid(reconnect: bool) -> None:
    record = {"env_id": "Point-v1", "connection": {"reconnect_on_server_stop": reconnect, "max_reconnects": None},
              "runner": {"num_envs_per_group": None}}
    out = with_plugrl_config_keys(record, "Point-v1", None)
    assert out["reconnect_on_server_stop"] is reconnect, "PlugRL's key, at the top level"
    assert out["connection"]["reconnect_on_server_stop"] is reconnect, "ours stays in its section"
    assert out["runner"] == {"num_envs_per_group": None, "uid": "Point-v1"}
    assert "uid" not in record["runner"], "the record given is left as it was"


def test_write_errors_are_said_in_words_a_user_can_act_on(tmp_path: Path) -> None:
    import errno

    from plugrl_env_client.outputs.run_dir import describe_write_error

    run = tmp_path / "out" / "run"
    full = OSError(errno.ENOSPC, "No space left on device")
    assert describe_write_error(full, run, run / "summary.json") == f"no space left on device in {run} (writing summary.json)"
    assert describe_write_error(OSError(errno.EROFS, "x"), run) == f"{run} is on a read-only file system"
    (tmp_path / "out").write_text("")
    assert describe_write_error(OSError(errno.ENOTDIR, "x"), run) == f"{tmp_path / 'out'} is a file, not a folder"
    assert describe_write_error(OSError(errno.EACCES, "x"), run) == f"no permission to write in {run}"


def test_the_space_reserve_takes_its_space_and_gives_it_back(tmp_path: Path) -> None:
    from small_disk import small_tmpfs

    from plugrl_env_client.outputs.run_dir import SpaceReserve

    with small_tmpfs(tmp_path / "disk", "64k") as disk:
        free = os.statvfs(disk).f_bavail
        reserve = SpaceReserve(disk / ".reserve", 32 * 1024).create()
        assert os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize <= free * os.statvfs(disk).f_frsize - 32 * 1024
        with pytest.raises(OSError) as too_big:
            SpaceReserve(disk / ".second", 64 * 1024).create()
        assert too_big.value.errno == 28 and not (disk / ".second").exists(), "a reserve that does not fit is no file"
        reserve.release()
        reserve.release()  # a second release does nothing
        assert os.statvfs(disk).f_bavail == free


def test_write_text_in_place_only_writes_what_fits_the_files_blocks(tmp_path: Path) -> None:
    from plugrl_env_client.outputs.run_dir import write_text_in_place

    path = tmp_path / "summary.json"
    path.write_text("x" * 3000)
    write_text_in_place(path, "short\n")
    assert path.read_text() == "short\n"
    held = os.stat(path).st_blocks * 512
    with pytest.raises(OSError) as refused:
        write_text_in_place(path, "y" * (held + 1))
    assert refused.value.errno == 28 and path.read_text() == "short\n", "a text that does not fit leaves the file"
