"""EpisodeRecorder: which episodes are recorded, the files it writes and their contents, and that it never blocks
or copies more than it needs. The recorder is driven the way a rollout drives it: env groups with their own rows
and global env ids, partial resets, steps, episode ends."""

from __future__ import annotations

import dataclasses
import io
import json
import re
import subprocess
import sys
import threading
import tracemalloc
import weakref
from pathlib import Path
from typing import Any

import imageio.v3 as iio
import numpy as np
import pytest
from children import sigint_default

from plugrl_env_client.envs.base_env import Observation
from plugrl_env_client.errors import ConfigError
from plugrl_env_client.outputs.recorder import (
    AppendableSink,
    DirectorySink,
    EpisodeRecorder,
    RecorderConfig,
    RecorderReport,
    encode_png,
)
from plugrl_env_client.records import EpisodeRecord

CAM = (16, 16, 3)
WRIST = (15, 17, 3)  # odd height and width: videos must pad it
SAMPLE = "sampled/ep_000001/env_000/obs"
"""The sample folder of a process's first completed episode, in env 0."""
EVERYTHING = dict(record_video=True, record_full_rollout=True, record_obs_stats=True, record_episode_metrics=True)


@pytest.fixture(autouse=True)
def _writer_threads_end() -> Any:
    """Every recorder a test starts is closed, so its writer thread has ended."""
    yield
    assert [t.name for t in threading.enumerate() if t.name.startswith("recorder-")] == []


# ------------------------------------------------------------------------------------------------ a fake rollout


def image(env: int, t: int, shape: tuple[int, int, int]) -> np.ndarray:
    """Smooth content (video codecs keep it well), distinct for every env and step."""
    base = (25 * t + 40 * env) % 200
    img = np.empty(shape, np.uint8)
    img[..., 0] = base
    img[..., 1] = base + 2 * np.arange(shape[1])[None, :]
    img[..., 2] = 255 - base
    return img


def state(env: int, t: int) -> np.ndarray:
    return np.array([env, t, env * 10 + t * 0.5])


def text(env: int, t: int) -> str:
    return f"env {env} step {t}"


def action(env: int, t: int) -> np.ndarray:
    return np.array([env, -t], np.float32)


def reward(env: int, t: int) -> float:
    return env + t / 8  # exact in float32


class MemorySink:
    """An in-memory sink (write_bytes only, so the recorder rewrites its JSON-lines files)."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}

    def write_bytes(self, relpath: str, data: bytes) -> None:
        self.files[relpath] = data


@dataclasses.dataclass
class Log:
    """What the fake rollout did: episode starts in order, the episodes that ended (start -> env, length), their
    completion numbers (start -> the process's count of ended episodes when it ended) and each start's number of
    its env's episode (from 1)."""

    starts: list[int] = dataclasses.field(default_factory=list)
    current: dict[int, int] = dataclasses.field(default_factory=dict)
    ended: dict[int, tuple[int, int]] = dataclasses.field(default_factory=dict)
    completed: dict[int, int] = dataclasses.field(default_factory=dict)
    env_episode: dict[int, int] = dataclasses.field(default_factory=dict)


class Group:
    """One env group of a pipelined rollout: its own batch rows, mapped to the process's global env ids."""

    def __init__(self, rec: EpisodeRecorder, env_ids: list[int], log: Log) -> None:
        self.rec, self.ids, self.log = rec, np.asarray(env_ids), log
        self.t = np.zeros(len(env_ids), int)

    def obs(self) -> Observation:
        pairs = list(zip(self.ids.tolist(), self.t.tolist()))
        return Observation(
            images={"cam": np.stack([image(e, t, CAM) for e, t in pairs]),
                    "wrist": np.stack([image(e, t, WRIST) for e, t in pairs])},
            states={"pos": np.stack([state(e, t) for e, t in pairs])},
            text=[text(e, t) for e, t in pairs])

    def reset(self, rows: list[int]) -> None:
        self.t[rows] = 0
        for env in self.ids[rows].tolist():
            self.log.current[env] = len(self.log.starts)
            self.log.env_episode[len(self.log.starts)] = self.log.starts.count(env) + 1
            self.log.starts.append(env)
        self.rec.on_reset(self.obs(), self.ids[rows], np.asarray(rows))

    def step(self) -> None:
        self.t += 1
        pairs = list(zip(self.ids.tolist(), self.t.tolist()))
        actions = np.stack([action(e, t) for e, t in pairs])
        rewards = np.array([reward(e, t) for e, t in pairs], np.float32)
        self.rec.on_step(self.obs(), actions, rewards, self.ids)

    def end(self, env: int) -> None:
        length = int(self.t[list(self.ids).index(env)])
        start = self.log.current.pop(env)
        self.log.ended[start] = (env, length)
        self.log.completed[start] = len(self.log.completed) + 1
        ret = sum(reward(env, t) for t in range(1, length + 1))
        self.rec.on_episode_end(EpisodeRecord(env, ret, length, env % 2 == 0 if env < 2 else None, terminated=True,
                                              truncated=False, metrics={"dist": 0.5 * env}), last_info(env, length))


def last_info(env: int, length: int) -> dict[str, Any]:
    """An env's part of its last step's info, as the rollout hands it over: numpy values, one of them NaN."""
    return {"dist": np.float32(env + length / 4), "goal": np.array([env, length]), "bad": np.float64("nan"),
            "sub": {"flag": np.bool_(env % 2 == 0)}}


def scenario(rec: EpisodeRecorder) -> Log:
    """Two groups (env ids 0,1 and 2,3), partial resets in both, episodes of different lengths, two still running at
    the end. Starts: 0 env0, 1 env1, 2 env2, 3 env3, 4 env1, 5 env3, 6 env2, 7 env0, 8 env1."""
    log = Log()
    a, b = Group(rec, [0, 1], log), Group(rec, [2, 3], log)
    a.reset([0, 1])
    b.reset([0, 1])
    a.step()
    b.step()
    a.step()
    a.end(1)
    a.reset([1])
    b.step()
    b.end(3)
    b.end(2)
    b.reset([1, 0])  # rows in reverse: env 3 starts before env 2
    a.step()
    a.end(0)
    a.end(1)
    a.reset([0, 1])
    b.step()
    b.end(2)
    b.end(3)
    a.step()
    return log


def recorder(sink: Any, k: int = 1, process_id: int = 0, num_envs: int = 4, **options: Any) -> EpisodeRecorder:
    limits = {name: options.pop(name) for name in ("max_frames", "queue_episodes", "queue_bytes") if name in options}
    return EpisodeRecorder(RecorderConfig(episode_freq=k, **options), process_id, num_envs, sink, **limits)


def recorded(files: Any) -> set[tuple[int, int]]:
    """(completion number, env) pairs named by the files."""
    found = set()
    for relpath in files:
        match = re.search(r"ep_?(\d{6})[_/]env_?(\d{3})", relpath)
        if match:
            found.add((int(match.group(1)), int(match.group(2))))
    return found


def strict_lines(data: bytes) -> list[dict[str, Any]]:
    def refuse(constant: str) -> None:
        raise AssertionError(f"non-strict JSON constant {constant}")

    return [json.loads(line, parse_constant=refuse) for line in data.decode().splitlines()]


# ------------------------------------------------------------------------------------------------ which episodes


def test_the_scenario_starts_and_ends_the_episodes_its_docstring_says() -> None:
    log = scenario(recorder(MemorySink(), k=0))
    assert log.starts == [0, 1, 2, 3, 1, 3, 2, 0, 1]
    assert log.ended == {0: (0, 3), 1: (1, 2), 2: (2, 2), 3: (3, 2), 4: (1, 1), 5: (3, 1), 6: (2, 1)}


@pytest.mark.parametrize("k", [1, 2, 3])
def test_the_kth_2kth_episode_start_is_recorded_and_named_by_its_completion(k: int) -> None:
    sink = MemorySink()
    rec = recorder(sink, k=k)
    log = scenario(rec)
    report = rec.close()
    expected = {(log.completed[start], env) for start, (env, _) in log.ended.items() if (start + 1) % k == 0}
    assert recorded(sink.files) == expected
    assert report.episodes_recorded == len(expected)
    running = [start for start in log.current.values() if (start + 1) % k == 0]
    assert report.episodes_unfinished == len(running)
    assert report.episodes_dropped == 0 and report.errors == ()
    if k == 3:  # starts 3 (env 2, third to end) and 6 (env 3, seventh to end); start 9 (env 1) still runs
        assert expected == {(3, 2), (7, 3)} and report.episodes_unfinished == 1


def test_a_resumed_process_continues_the_numbering_of_its_episodes() -> None:
    """A process of a resumed run whose envs completed 3, 0, 2 and 1 episodes before numbers its episodes from 7 on
    (no file takes an earlier segment's name), and records the starts that are a K-th of the whole process's."""
    sink = MemorySink()
    rec = EpisodeRecorder(RecorderConfig(episode_freq=2), 0, 4, sink, first_episodes=(3, 0, 2, 1))
    log = scenario(rec)
    rec.close()
    expected = {(6 + log.completed[start], env) for start, (env, _) in log.ended.items() if (6 + start + 1) % 2 == 0}
    assert recorded(sink.files) == expected
    assert expected and min(number for number, _ in expected) > 6


def test_thread0_only_records_in_process_zero_only() -> None:
    quiet, loud = MemorySink(), MemorySink()
    off = recorder(quiet, k=1, process_id=1)  # PlugRL's default: process 0 only
    on = recorder(loud, k=1, process_id=0)
    assert not off.enabled and on.enabled
    scenario(off)
    scenario(on)
    assert off.close() == RecorderReport() and quiet.files == {}
    assert on.close().episodes_recorded == 7 and len(recorded(loud.files)) == 7
    other = recorder(MemorySink(), k=1, process_id=1, thread0_only=False)
    assert other.enabled  # --recorder.no-thread0-only: every process records
    other.close()


# ------------------------------------------------------------------------------------------------ files and contents


def test_relpaths_of_one_recorded_episode_follow_plugrls_layout() -> None:
    sink = MemorySink()
    rec = recorder(sink, k=1, num_envs=1, **EVERYTHING)
    group = Group(rec, [0], Log())
    group.reset([0])
    group.step()
    group.end(0)
    report = rec.close()
    folder = "sampled/ep_000001/env_000/obs"
    assert sorted(sink.files) == sorted(report.files) == [
        "metrics/episode_metrics.jsonl",
        "metrics/obs_stats.jsonl",
        "rollouts/ep000001_env000.npz",
        f"{folder}/first/images/cam.png",
        f"{folder}/first/images/wrist.png",
        f"{folder}/first/states/pos.npy",
        f"{folder}/first/text.txt",
        f"{folder}/last/images/cam.png",
        f"{folder}/last/images/wrist.png",
        f"{folder}/last/info.json",
        f"{folder}/last/states/pos.npy",
        f"{folder}/last/text.txt",
        "videos/ep000001_env000_cam.mp4",
        "videos/ep000001_env000_wrist.mp4",
    ]


def test_with_the_json_lines_off_only_samples_are_written_and_keys_are_made_safe_for_file_names() -> None:
    sink = MemorySink()
    rec = recorder(sink, k=1, num_envs=1, record_obs_stats=False, record_episode_metrics=False)
    obs = Observation(images={"cam/left view": np.zeros((1, 4, 4, 3), np.uint8)}, states={"q": np.zeros((1, 2))})
    rec.on_reset(obs, np.array([0]), np.array([0]))
    rec.on_step(obs, np.zeros((1, 1)), np.zeros(1), np.array([0]))
    rec.on_episode_end(EpisodeRecord(0, 0.0, 1, None, True, False))
    rec.close()
    folder = "sampled/ep_000001/env_000/obs"
    assert sorted(sink.files) == [f"{folder}/first/images/cam_left_view.png", f"{folder}/first/states/q.npy",
                                  f"{folder}/first/text.txt", f"{folder}/last/images/cam_left_view.png",
                                  f"{folder}/last/info.json", f"{folder}/last/states/q.npy",
                                  f"{folder}/last/text.txt"]
    assert sink.files[f"{folder}/first/text.txt"] == b"" and json.loads(sink.files[f"{folder}/last/info.json"]) == {}


def test_recorders_defaults_are_plugrls() -> None:
    config = RecorderConfig()
    assert (config.thread0_only, config.record_obs_stats, config.record_episode_metrics) == (True, True, True)
    assert isinstance(config.video_fps, float) and config.episode_freq == 0


@pytest.mark.slow
def test_every_file_holds_what_the_episode_observed(tmp_path: Path) -> None:
    rec = recorder(DirectorySink(tmp_path), k=1, video_fps=10.0, metric_window=3, **EVERYTHING)
    log = scenario(rec)
    report = rec.close()
    on_disk = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert on_disk == sorted(report.files)  # every file reported, and no temp file left behind
    assert report.errors == () and report.episodes_recorded == len(log.ended) == 7

    for start, (env, length) in log.ended.items():
        n = log.completed[start]
        stem = f"ep{n:06d}_env{env:03d}"
        folder = tmp_path / f"sampled/ep_{n:06d}/env_{env:03d}/obs"
        for moment, t in (("first", 0), ("last", length)):
            np.testing.assert_array_equal(iio.imread(folder / moment / "images/cam.png"), image(env, t, CAM))
            np.testing.assert_array_equal(iio.imread(folder / moment / "images/wrist.png"), image(env, t, WRIST))
            np.testing.assert_array_equal(np.load(folder / moment / "states/pos.npy"), state(env, t))
            assert (folder / moment / "text.txt").read_text() == text(env, t)
        info = json.loads((folder / "last/info.json").read_text(), parse_constant=float)
        assert info == {"dist": env + length / 4, "goal": [env, length], "bad": None, "sub": {"flag": env % 2 == 0}}

        with np.load(tmp_path / "rollouts" / f"{stem}.npz", allow_pickle=False) as npz:
            steps = range(length + 1)
            np.testing.assert_array_equal(npz["images/cam"], np.stack([image(env, t, CAM) for t in steps]))
            np.testing.assert_array_equal(npz["images/wrist"], np.stack([image(env, t, WRIST) for t in steps]))
            np.testing.assert_array_equal(npz["states/pos"], np.stack([state(env, t) for t in steps]))
            assert npz["text"].tolist() == [text(env, t) for t in steps]
            np.testing.assert_array_equal(npz["actions"], np.stack([action(env, t) for t in steps[1:]]))
            np.testing.assert_array_equal(npz["rewards"], [reward(env, t) for t in steps[1:]])
            assert (int(npz["episode"]), int(npz["env_index"]), int(npz["num_steps"])) == (n, env, length)
            assert int(npz["env_episode"]) == log.env_episode[start]

        for key, shape in (("cam", CAM), ("wrist", WRIST)):
            video = tmp_path / "videos" / f"{stem}_{key}.mp4"
            frames = iio.imread(video, index=None, plugin="FFMPEG")  # imageio-ffmpeg: the video extra
            assert frames.shape == (length + 1, 16, shape[1] + shape[1] % 2, 3)  # 15x17 padded to 16x18
            for t in (0, length):
                decoded = frames[t, :shape[0], :shape[1]].astype(int)
                assert np.abs(decoded - image(env, t, shape)).mean() < 3  # lossy, but close
                assert np.abs(decoded - image(env, t + 1, shape)).mean() > 10  # and not another step's frame

    by_completion = {n: start for start, n in log.completed.items()}
    stats = strict_lines((tmp_path / "metrics/obs_stats.jsonl").read_bytes())
    assert [row["completed_episode"] for row in stats] == list(range(1, 8))
    for row in stats:
        start = by_completion[row["completed_episode"]]
        env, length = log.ended[start]
        assert list(row)[:7] == ["completed_episode", "process_id", "env_id", "env_episode_id", "first", "last",
                                 "last_info"], "PlugRL's fields, in PlugRL's order"
        assert (row["process_id"], row["env_id"], row["env_episode_id"]) == (0, env, log.env_episode[start])
        for moment, t in (("first", 0), ("last", length)):
            pos, cam = state(env, t), image(env, t, CAM)
            got = row[moment]
            assert got["states"]["pos"] | {"mean": 0, "std": 0} == {
                "shape": [3], "dtype": "float64", "mean": 0, "std": 0, "min": pos.min(), "max": pos.max(),
                "count": 3, "non_finite": 0}
            assert got["states"]["pos"]["mean"] == pytest.approx(pos.mean())
            assert got["states"]["pos"]["std"] == pytest.approx(pos.std())
            assert (got["images"]["cam"]["shape"], got["images"]["cam"]["dtype"]) == (list(CAM), "uint8")
            assert got["images"]["cam"]["mean"] == pytest.approx(cam.mean())
            assert got["text"]["value"] == [text(env, t)] and got["text"]["shape"] == [1]
            assert got["text"]["dtype"] == str(np.array([text(env, t)]).dtype)
        assert row["last_info"]["goal"] == [env, length] and row["last_info"]["bad"] is None

    metrics = strict_lines((tmp_path / "metrics/episode_metrics.jsonl").read_bytes())
    assert [row["completed_episode"] for row in metrics] == list(range(1, 8))
    returns: list[float] = []
    judged: list[bool | None] = []
    for row in metrics:
        start = by_completion[row["completed_episode"]]
        env, length = log.ended[start]
        assert list(row)[:8] == ["completed_episode", "process_id", "env_id", "env_episode_id", "episode_return",
                                 "episode_success", "mean_return", "mean_success_rate"]
        ret = sum(reward(env, t) for t in range(1, length + 1))
        success = env % 2 == 0 if env < 2 else None
        returns.append(ret)
        judged.append(success)
        assert (row["env_id"], row["env_episode_id"], row["length"]) == (env, log.env_episode[start], length)
        assert row["episode_return"] == pytest.approx(ret), "the episode's own return"
        assert row["episode_success"] is bool(success) and row["has_success_rule"] is (success is not None)
        window = returns[-3:]
        assert row["mean_return"] == pytest.approx(sum(window) / len(window)), "over the metric window"
        rated = [s for s in judged[-3:] if s is not None]
        assert row["mean_success_rate"] == pytest.approx(sum(rated) / len(rated) if rated else 0.0)
        assert isinstance(row["mean_success_rate"], float) and row["metrics"] == {"dist": 0.5 * env}


def test_recorded_frames_are_copies_that_later_changes_to_the_batch_do_not_reach() -> None:
    sink = MemorySink()
    rec = recorder(sink, k=1, num_envs=1, record_full_rollout=True)
    cam = np.full((1, 4, 4, 3), 7, np.uint8)
    pos = np.zeros((1, 2))
    act = np.array([[1.0]])
    obs = Observation(images={"cam": cam}, states={"pos": pos})
    rec.on_reset(obs, np.array([0]), np.array([0]))
    cam[:] = 9
    pos[:] = 3.0
    rec.on_step(obs, act, np.ones(1), np.array([0]))
    cam[:] = 255  # the env reuses its buffers
    pos[:] = -1.0
    act[:] = 5.0
    rec.on_episode_end(EpisodeRecord(0, 1.0, 1, None, True, False))
    rec.close()
    npz = np.load(io.BytesIO(sink.files["rollouts/ep000001_env000.npz"]))
    assert npz["images/cam"][:, 0, 0, 0].tolist() == [7, 9]
    assert npz["states/pos"][:, 0].tolist() == [0.0, 3.0]
    assert npz["actions"].tolist() == [[1.0]]
    assert iio.imread(sink.files[f"{SAMPLE}/last/images/cam.png"])[0, 0, 0] == 9


def test_frames_past_the_cap_are_not_kept_but_the_last_observation_is() -> None:
    sink = MemorySink()
    rec = recorder(sink, k=1, num_envs=1, record_full_rollout=True, max_frames=3)
    group = Group(rec, [0], Log())
    group.reset([0])
    for _ in range(5):
        group.step()
    group.end(0)
    report = rec.close()
    npz = np.load(io.BytesIO(sink.files["rollouts/ep000001_env000.npz"]))
    assert npz["states/pos"][:, 1].tolist() == [0, 1, 2, 3] and int(npz["num_steps"]) == 5
    assert npz["actions"].shape == (3, 2) and report.frames_truncated == 2
    np.testing.assert_array_equal(np.load(io.BytesIO(sink.files[f"{SAMPLE}/last/states/pos.npy"])),
                                  state(0, 5))


def test_json_lines_are_strict_when_the_episode_holds_nan_and_infinity() -> None:
    sink = MemorySink()
    assert not isinstance(sink, AppendableSink)  # so each line rewrites the file: both paths are covered
    rec = recorder(sink, k=1, num_envs=1, record_obs_stats=True, record_episode_metrics=True)
    for _ in range(2):
        rec.on_reset(Observation(states={"q": np.array([[1.0, 2.0]])}), np.array([0]), np.array([0]))
        rec.on_step(Observation(states={"q": np.array([[np.nan, -4.0]])}), np.zeros((1, 1)), np.zeros(1),
                    np.array([0]))
        rec.on_step(Observation(states={"q": np.array([[np.inf, -3.0]])}), np.zeros((1, 1)), np.zeros(1),
                    np.array([0]))
        rec.on_episode_end(EpisodeRecord(0, float("nan"), 2, None, True, False, metrics={"m": float("inf")}),
                           {"x": np.array(np.inf), "y": np.array([np.nan, 1.0])})
    assert rec.close().episodes_recorded == 2
    stats = strict_lines(sink.files["metrics/obs_stats.jsonl"])
    assert [row["completed_episode"] for row in stats] == [1, 2]
    assert [row["env_episode_id"] for row in stats] == [1, 2]
    assert stats[0]["first"]["states"]["q"] == {"shape": [2], "dtype": "float64", "mean": 1.5, "std": 0.5,
                                                "min": 1.0, "max": 2.0, "count": 2, "non_finite": 0}
    assert stats[0]["last"]["states"]["q"] == {"shape": [2], "dtype": "float64", "mean": -3.0, "std": 0.0,
                                               "min": -3.0, "max": -3.0, "count": 1, "non_finite": 1}
    assert stats[0]["last_info"] == {"x": None, "y": [None, 1.0]}
    metrics = strict_lines(sink.files["metrics/episode_metrics.jsonl"])
    assert [(row["completed_episode"], row["episode_return"], row["metrics"]) for row in metrics] == [
        (1, None, {"m": None}), (2, None, {"m": None})]
    assert [row["mean_return"] for row in metrics] == [0.0, 0.0], "a NaN return counts as 0, as in summary.json"


def test_obs_stats_of_a_key_without_finite_values_are_null() -> None:
    sink = MemorySink()
    rec = recorder(sink, k=1, num_envs=1, record_obs_stats=True)
    rec.on_reset(Observation(states={"q": np.array([[np.nan]])}), np.array([0]), np.array([0]))
    rec.on_episode_end(EpisodeRecord(0, 0.0, 0, None, True, False))
    rec.close()
    (row,) = strict_lines(sink.files["metrics/obs_stats.jsonl"])
    assert row["first"]["states"]["q"] == {"shape": [1], "dtype": "float64", "min": None, "max": None,
                                           "mean": None, "std": None, "count": 0, "non_finite": 1}


@pytest.mark.parametrize("shape", [(5, 7), (5, 7, 1), (5, 7, 2), (5, 7, 3), (5, 7, 4), (1, 1, 3)])
def test_png_encoder_round_trips_every_channel_layout(shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(sum(shape))
    img = rng.integers(0, 256, shape, dtype=np.uint8)
    decoded = iio.imread(encode_png(img), extension=".png")
    np.testing.assert_array_equal(decoded.reshape(img.shape), img)


def test_images_png_cannot_hold_are_sampled_as_npy() -> None:
    sink = MemorySink()
    rec = recorder(sink, k=1, num_envs=1)
    depth = np.linspace(0, 1, 12, dtype=np.float32).reshape(1, 3, 4, 1)
    rec.on_reset(Observation(images={"depth": depth}), np.array([0]), np.array([0]))
    rec.on_episode_end(EpisodeRecord(0, 0.0, 0, None, True, False))
    rec.close()
    np.testing.assert_array_equal(np.load(io.BytesIO(sink.files[f"{SAMPLE}/first/images/depth.npy"])),
                                  depth[0])


def test_samples_whose_names_meet_get_distinct_files() -> None:
    """Keys that differ only in unsafe characters each keep their own file (an image and a state of one key are in
    folders of their own)."""
    sink = MemorySink()
    rec = recorder(sink, k=1, num_envs=1)
    depth = np.ones((1, 3, 4, 1), np.float32)
    obs = Observation(images={"depth": depth}, states={"depth": np.full((1, 2), 2.0), "a b": np.full((1, 1), 3.0),
                                                       "a_b": np.full((1, 1), 4.0)})
    rec.on_reset(obs, np.array([0]), np.array([0]))
    rec.on_episode_end(EpisodeRecord(0, 0.0, 0, None, True, False))
    rec.close()
    first = {name.removeprefix(f"{SAMPLE}/first/"): np.load(io.BytesIO(data))
             for name, data in sink.files.items() if name.startswith(f"{SAMPLE}/first/") and name.endswith(".npy")}
    assert sorted(first) == ["images/depth.npy", "states/a_b.npy", "states/a_b_2.npy", "states/depth.npy"]
    assert first["images/depth.npy"].shape == (3, 4, 1) and first["states/depth.npy"].tolist() == [2.0, 2.0]
    assert {first["states/a_b.npy"].item(), first["states/a_b_2.npy"].item()} == {3.0, 4.0}


# ------------------------------------------------------------------------------------------------ cost and blocking


def test_a_disabled_recorder_keeps_and_copies_nothing() -> None:
    sink = MemorySink()
    rec = recorder(sink, k=0, **EVERYTHING)
    assert not rec.enabled
    big = np.zeros((4, 256, 256, 3), np.uint8)  # 192 KiB a row
    big_ref = weakref.ref(big)
    obs = Observation(images={"cam": big}, states={"pos": np.zeros((4, 3))})
    ids = np.arange(4)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        rec.on_reset(obs, ids, ids)
        for _ in range(20):
            rec.on_step(obs, np.zeros((4, 2)), np.zeros(4), ids)
        for env in range(4):
            rec.on_episode_end(EpisodeRecord(env, 0.0, 20, None, True, False))
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < big[0].nbytes // 4  # not one row was copied
    del obs, big
    assert big_ref() is None  # and nothing was kept
    assert rec.close() == RecorderReport() and sink.files == {}


def test_steps_of_envs_not_recorded_copy_nothing_and_steps_of_recorded_ones_do() -> None:
    rec = recorder(MemorySink(), k=2, num_envs=2, record_full_rollout=True)
    frame = np.zeros((1, 256, 256, 3), np.uint8)
    one = Observation(images={"cam": frame})
    rec.on_reset(Observation(images={"cam": np.zeros((2, 256, 256, 3), np.uint8)}), np.arange(2), np.arange(2))
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        for _ in range(10):
            rec.on_step(one, np.zeros((1, 1)), np.zeros(1), np.array([0]))  # env 0 holds start 1: not recorded
        not_recorded = tracemalloc.get_traced_memory()[0] - start
        for _ in range(10):
            rec.on_step(one, np.zeros((1, 1)), np.zeros(1), np.array([1]))  # env 1 holds start 2: recorded
        recorded_growth = tracemalloc.get_traced_memory()[0] - start - not_recorded
    finally:
        tracemalloc.stop()
    assert not_recorded < frame.nbytes // 4
    assert recorded_growth >= 10 * frame.nbytes  # the measurement sees copies when there are some
    rec.close()


class BlockingSink(MemorySink):
    """A sink whose writes wait until released: the writer thread is stuck in its first write."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.release = threading.Event()

    def write_bytes(self, relpath: str, data: bytes) -> None:
        self.entered.set()
        self.release.wait()
        super().write_bytes(relpath, data)


@pytest.mark.parametrize("limits", [dict(queue_episodes=1), dict(queue_episodes=10, queue_bytes=1)],
                         ids=["episodes", "bytes"])
def test_a_full_hand_off_drops_and_counts_instead_of_blocking(limits: dict[str, int],
                                                              caplog: pytest.LogCaptureFixture) -> None:
    sink = BlockingSink()
    rec = recorder(sink, k=1, **limits)
    watchdog = threading.Timer(60, sink.release.set)  # only so that a blocking recorder fails instead of hanging
    watchdog.start()
    try:
        group = Group(rec, [0, 1, 2, 3], Log())
        group.reset([0, 1, 2, 3])
        group.step()
        group.end(0)
        assert sink.entered.wait(60)  # the writer took episode 0 and is stuck writing it
        for env in (1, 2, 3):  # episode 1 waits in the hand-off; 2 and 3 find it full
            group.end(env)
        assert not sink.release.is_set()  # every call above returned while the writer was stuck
    finally:
        watchdog.cancel()
        sink.release.set()
    report = rec.close()
    assert (report.episodes_recorded, report.episodes_dropped, report.frames_dropped) == (2, 2, 4)
    assert recorded(sink.files) == {(1, 0), (2, 1)}
    assert "writer is behind" in caplog.text and "2 recorded episodes (4 observations) were dropped" in caplog.text


# ------------------------------------------------------------------------------------------------ lifecycle


def test_close_is_idempotent_and_nothing_is_recorded_after_it() -> None:
    sink = MemorySink()
    rec = recorder(sink, k=1, num_envs=1)
    group = Group(rec, [0], Log())
    group.reset([0])
    group.step()
    group.end(0)
    group.reset([0])  # episode 1 is still running at close: not written
    report = rec.close()
    assert report.episodes_recorded == 1 and report.episodes_unfinished == 1
    files = dict(sink.files)
    assert rec.close() == report
    group.step()
    group.end(0)
    group.reset([0])
    group.step()
    group.end(0)
    assert sink.files == files and recorded(files) == {(1, 0)}
    assert rec.close() == report


def test_an_env_reset_again_without_an_end_loses_its_recorded_episode() -> None:
    sink = MemorySink()
    rec = recorder(sink, k=1, num_envs=1)
    group = Group(rec, [0], Log())
    group.reset([0])
    group.step()
    group.reset([0])  # episode 0 abandoned
    group.step()
    group.end(0)
    report = rec.close()
    assert recorded(sink.files) == {(1, 0)} and report.episodes_unfinished == 1  # the second start ended first


def test_a_failing_sink_is_reported_and_the_run_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    class FullDisk(MemorySink):
        def write_bytes(self, relpath: str, data: bytes) -> None:
            if relpath.endswith(".png"):
                raise OSError("No space left on device")
            super().write_bytes(relpath, data)

    sink = FullDisk()
    rec = recorder(sink, k=1, num_envs=1, record_episode_metrics=True)
    group = Group(rec, [0], Log())
    group.reset([0])
    group.step()
    group.end(0)
    report = rec.close()
    assert report.episodes_recorded == 0 and len(report.errors) == 1 and "No space left" in report.errors[0]
    assert "metrics/episode_metrics.jsonl" in sink.files  # the other outputs were still written
    assert "could not be written" in caplog.text


def test_video_without_imageio_ffmpeg_fails_at_construction(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "imageio_ffmpeg", None)  # makes the import fail
    with pytest.raises(ConfigError, match=re.escape('pip install "plugrl-env-client[video]"')):
        recorder(MemorySink(), k=1, record_video=True)
    assert not recorder(MemorySink(), k=0, record_video=True).enabled  # nothing recorded: nothing needed


def test_bad_settings_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="episode-freq"):
        recorder(MemorySink(), k=-1)
    with pytest.raises(ConfigError, match="video-fps"):
        recorder(MemorySink(), k=1, record_video=True, video_fps=0)


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


# ------------------------------------------------------------------------------------------------ flags that do nothing


def _warnings(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and text in r.getMessage()]


def test_record_flags_without_an_episode_freq_are_named_once_by_process_zero(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("WARNING", logger="plugrl_env_client.outputs.recorder")
    for pid in (0, 1, 2):
        recorder(MemorySink(), k=0, process_id=pid, record_video=True, record_full_rollout=True).close()
    (message,) = _warnings(caplog, "--recorder.episode-freq")
    assert message.startswith("--recorder.record-video, --recorder.record-full-rollout record nothing without")
    assert "add --recorder.episode-freq 1" in message
    caplog.clear()
    recorder(MemorySink(), k=0, process_id=0).close()  # nothing asked for (PlugRL's defaults on): nothing to say
    recorder(MemorySink(), k=2, process_id=0, record_full_rollout=True).close()
    assert _warnings(caplog, "--recorder.episode-freq") == []


def test_video_of_an_env_without_images_is_named_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("WARNING", logger="plugrl_env_client.outputs.recorder")
    states_only = Observation(states={"pos": np.zeros((4, 2), np.float32)})
    for pid in (0, 1):
        rec = recorder(MemorySink(), k=1, process_id=pid, record_video=True)
        for _ in range(3):
            rec.on_reset(states_only, np.arange(4), np.arange(4))
        rec.close()
    (message,) = _warnings(caplog, "hold no image")
    assert "--env.render" in message
    caplog.clear()
    with_images = recorder(MemorySink(), k=1, process_id=0, record_video=True)
    Group(with_images, [0, 1, 2, 3], Log()).reset([0, 1, 2, 3])
    with_images.close()
    assert _warnings(caplog, "hold no image") == []


@pytest.mark.slow
def test_a_run_of_two_processes_warns_once(tmp_path: Path) -> None:
    """Both processes record every episode of an env without images: the run's console says so once."""
    done = subprocess.run(sigint_default([
        sys.executable, "-m", "plugrl_env_client", "point-v1", "--num-procs", "2", "--num-envs", "2",
        "--num-episodes", "4", "--local-policy", "random", "--env.max-episode-steps", "5", "--no-progress",
        "--recorder.episode-freq", "1", "--recorder.no-thread0-only", "--recorder.record-video",
        "--output-dir", str(tmp_path),
        "--exp-name", "run"]), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("hold no image") == 1, done.stderr
    assert (tmp_path / "run/logs/client.log").read_text().count("hold no image") == 1


# ------------------------------------------------------------------------------------------------ frames for the recorder


class Renders:
    """An env group that renders only when asked (--env.render-for-recorder-only): its frame of a row is a function
    of (its first process env id + row, the number of steps it took), and every request is logged."""

    frames_for_recorder = True

    def __init__(self, offset: int, num_envs: int) -> None:
        self.offset, self.num_envs = offset, num_envs
        self.t = 0
        self.asked: list[list[int]] = []

    def render_frames(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        self.asked.append(rows.tolist())
        return {"render": np.stack([image(self.offset + int(r), self.t, (4, 6, 3)) for r in rows])}


class Plain:
    """An env group that sends its frames in its observations (or has none): never asked."""

    frames_for_recorder = False
    num_envs = 2

    def render_frames(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        raise AssertionError("an env that does not render for the recorder is never asked")


@pytest.mark.slow
def test_envs_that_render_for_the_recorder_draw_only_the_recorded_envs_frames() -> None:
    sink = MemorySink()
    rec = recorder(sink, k=2, num_envs=4, record_video=True)
    first, second = Renders(0, 2), Renders(2, 2)
    rec.render_for([first, second])
    log = Log()
    a, b = Group(rec, [0, 1], log), Group(rec, [2, 3], log)

    def step(group: Group, env: Renders) -> None:
        env.t += 1
        group.step()

    a.reset([0, 1])  # starts 1 and 2 (env 1: recorded)
    b.reset([0, 1])  # starts 3 and 4 (env 3: recorded)
    for _ in range(2):
        step(a, first)
        step(b, second)
    a.end(1)
    b.end(3)
    rec.close()
    assert first.asked == [[1], [1], [1]] and second.asked == [[1], [1], [1]], "the recorded rows, each time"
    for n, env, steps in ((1, 1, 2), (2, 3, 2)):
        for moment, t in (("first", 0), ("last", steps)):
            png = sink.files[f"sampled/ep_{n:06d}/env_{env:03d}/obs/{moment}/images/render.png"]
            np.testing.assert_array_equal(iio.imread(png, extension=".png"), image(env, t, (4, 6, 3)))
        assert f"videos/ep{n:06d}_env{env:03d}_render.mp4" in sink.files


def test_rendering_for_the_recorder_without_an_episode_freq_is_named(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("WARNING", logger="plugrl_env_client.outputs.recorder")
    quiet = recorder(MemorySink(), k=0, process_id=0)
    quiet.render_for([Plain()])
    assert _warnings(caplog, "--env.render-for-recorder-only") == [], "no env renders for the recorder"
    for pid in (0, 1):
        rec = recorder(MemorySink(), k=0, process_id=pid)
        rec.render_for([Renders(0, 4)])
    (message,) = _warnings(caplog, "--env.render-for-recorder-only")
    assert "renders nothing without --recorder.episode-freq" in message
