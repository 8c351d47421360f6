"""The recorder's writer thread: the files of a recorded episode and their contents, the bounded hand-off that drops
instead of blocking, and a sink that fails."""

from __future__ import annotations

import io
import json
import threading
from pathlib import Path

import numpy as np
import pytest
from extras import need
from recording_rollouts import (
    CAM,
    EVERYTHING,
    SAMPLE,
    WRIST,
    Group,
    Log,
    MemorySink,
    action,
    image,
    recorded,
    recorder,
    reward,
    scenario,
    state,
    strict_lines,
    text,
)

from plugrl_env_client.envs.base_env import Observation
from plugrl_env_client.outputs.recording.sinks import DirectorySink
from plugrl_env_client.records import EpisodeRecord


def test_relpaths_of_one_recorded_episode_follow_plugrls_layout() -> None:
    need("imageio_ffmpeg")  # the videos
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


@pytest.mark.slow
def test_every_file_holds_what_the_episode_observed(tmp_path: Path) -> None:
    iio = need("imageio.v3")
    need("imageio_ffmpeg")  # the videos
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
