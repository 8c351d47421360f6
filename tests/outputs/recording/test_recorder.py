"""EpisodeRecorder: which episodes are recorded, that it copies only what it records and never blocks, its
checks and warnings, and the frames of envs that render for it. The recorder is driven the way a rollout drives
it: env groups with their own rows and global env ids, partial resets, steps, episode ends."""

from __future__ import annotations

import io
import re
import subprocess
import sys
import tracemalloc
import weakref
from pathlib import Path

import numpy as np
import pytest
from children import sigint_default
from extras import need
from recording_rollouts import (
    EVERYTHING,
    SAMPLE,
    Group,
    Log,
    MemorySink,
    image,
    recorded,
    recorder,
    scenario,
    state,
    warnings_of,
)

from plugrl_env_client.envs.base_env import Observation
from plugrl_env_client.errors import ConfigError
from plugrl_env_client.outputs.recording.config import RecorderConfig
from plugrl_env_client.outputs.recording.recorder import EpisodeRecorder
from plugrl_env_client.outputs.recording.summary import RecorderSummary
from plugrl_env_client.records import EpisodeRecord


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
    assert off.close() == RecorderSummary() and quiet.files == {}
    assert on.close().episodes_recorded == 7 and len(recorded(loud.files)) == 7
    other = recorder(MemorySink(), k=1, process_id=1, thread0_only=False)
    assert other.enabled  # --recorder.no-thread0-only: every process records
    other.close()


def test_recorded_frames_are_copies_that_later_changes_to_the_batch_do_not_reach() -> None:
    iio = need("imageio.v3")
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
    assert rec.close() == RecorderSummary() and sink.files == {}


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


def test_video_of_an_env_without_images_is_named_once(caplog: pytest.LogCaptureFixture) -> None:
    need("imageio_ffmpeg")  # a recorder of videos
    caplog.set_level("WARNING", logger="plugrl_env_client.outputs.recording")
    states_only = Observation(states={"pos": np.zeros((4, 2), np.float32)})
    for pid in (0, 1):
        rec = recorder(MemorySink(), k=1, process_id=pid, record_video=True)
        for _ in range(3):
            rec.on_reset(states_only, np.arange(4), np.arange(4))
        rec.close()
    (message,) = warnings_of(caplog, "hold no image")
    assert "--env.render" in message
    caplog.clear()
    with_images = recorder(MemorySink(), k=1, process_id=0, record_video=True)
    Group(with_images, [0, 1, 2, 3], Log()).reset([0, 1, 2, 3])
    with_images.close()
    assert warnings_of(caplog, "hold no image") == []


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
    iio = need("imageio.v3")
    need("imageio_ffmpeg")  # the videos
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
    caplog.set_level("WARNING", logger="plugrl_env_client.outputs.recording")
    quiet = recorder(MemorySink(), k=0, process_id=0)
    quiet.render_for([Plain()])
    assert warnings_of(caplog, "--env.render-for-recorder-only") == [], "no env renders for the recorder"
    for pid in (0, 1):
        rec = recorder(MemorySink(), k=0, process_id=pid)
        rec.render_for([Renders(0, 4)])
    (message,) = warnings_of(caplog, "--env.render-for-recorder-only")
    assert "renders nothing without --recorder.episode-freq" in message
