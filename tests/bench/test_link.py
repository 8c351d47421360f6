"""bench/link.py's env and shipped frames: real camera images, small enough to ship, played back per env and step."""

from __future__ import annotations

import numpy as np
import pytest
from file_modules import BENCH, bench_script


@pytest.fixture
def link(registry):
    with bench_script("link") as module:
        yield module


def test_the_shipped_frames_are_small_camera_images():
    path = BENCH / "frames" / "halfcheetah.npz"
    assert path.stat().st_size < 2_000_000
    frames = np.load(path)
    assert frames["cam224"].shape[1:] == (224, 224, 3) and frames["cam112"].shape[1:] == (112, 112, 3)
    assert frames["cam224"].dtype == np.uint8 and len(frames["cam224"]) == len(frames["cam112"]) >= 16
    # Rendered scenes, not solid colours or noise: many distinct values, and neighbouring pixels mostly alike.
    image = frames["cam224"][0].astype(np.int16)
    assert len(np.unique(image.reshape(-1, 3), axis=0)) > 100
    assert np.median(np.abs(np.diff(image, axis=1))) < 8
    assert not np.array_equal(frames["cam224"][0], frames["cam224"][1])


def test_the_bench_env_plays_the_frames_back_per_env_and_step(link):
    env = link.LinkFramesEnv(link.LinkFramesConfig(), num_envs=16)
    obs, _ = env.reset(seed=0)
    first = obs.images["cam224"]
    assert first.shape == (16, 224, 224, 3) and obs.images["cam112"].shape == (16, 112, 112, 3)
    assert not np.array_equal(first[0], first[1]), "each env shows its own frame"
    obs, *_ = env.step(np.zeros((16, link.ACTION_DIM), np.float32))
    np.testing.assert_array_equal(obs.images["cam224"][0], first[1])  # env 0 moved on to the next frame
    env.reset(options={"reset_mask": np.arange(16) == 0})
    np.testing.assert_array_equal(env._observe().images["cam224"][0], first[0])
    env.close()
