"""--image-codec end to end: the client against the reference server over real sockets on 127.0.0.1, an env whose
camera pixels say which env, episode and step they show, and a policy that checks every batch it gets (infers,
reused rows and feedbacks' terminal observations) against the frames the env returned."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from extras import need
from file_modules import bench_script

from plugrl_env_client.app import run_client
from plugrl_env_client.config import ClientConfig, ConnectionConfig, RecorderConfig, RunnerConfig
from plugrl_env_client.envs.base_env import BaseEnv, BaseEnvConfig, Observation, observation_space
from plugrl_env_client.envs.registry import register_env
from plugrl_env_client.errors import ConfigError
from plugrl_env_client.protocol import images
from plugrl_env_client.server.policy import Policy, PolicySetup
from plugrl_env_client.server.server import PolicyServer

need("simplejpeg")
need("qoi")

ENV_ID = "Cameras-v1"
LENGTH = 6
"""Steps of every episode (terminated): with a horizon of 4 its second chunk ends it, so the feedback carries the
terminal observation."""


def frames(who: np.ndarray) -> dict[str, np.ndarray]:
    """The cameras of rows ``who`` ([n, 3]: env, episode, step): smooth ramps (JPEG's good case) for the 3- and the
    1-channel camera, and a 4-channel one (raw under JPEG) of busy values."""
    env, episode, t = (who[:, i, None, None, None].astype(np.int64) for i in range(3))  # [n, 1, 1, 1]
    y, x = np.mgrid[0:48, 0:64]
    ramp = 20 + 8 * env + 3 * episode + 5 * t + (y + x)[None, :, :, None]  # [n, 48, 64, 1]
    front = np.minimum(ramp + np.array([0, 20, 40]), 255).astype(np.uint8)
    rgba = ((env * 31 + t * 17 + episode * 7 + np.arange(8 * 8 * 4).reshape(1, 8, 8, 4)) * 13 % 256).astype(np.uint8)
    return {"front": front, "depth": np.minimum(ramp, 255).astype(np.uint8), "rgba": rgba}


class CamerasEnv(BaseEnv[BaseEnvConfig]):
    """Episodes of LENGTH steps; ``states["who"]`` is (env, episode, step) of each row, and the cameras are
    :func:`frames` of it."""

    def __init__(self, config: BaseEnvConfig, num_envs: int = 1, **kwargs: Any) -> None:
        super().__init__(config, num_envs=num_envs, **kwargs)
        self.single_action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.single_observation_space = observation_space(
            images={"front": (48, 64, 3), "depth": (48, 64, 1), "rgba": (8, 8, 4)}, states={"who": (3,)})
        self.episode = np.zeros(num_envs, np.int64)
        self.t = np.zeros(num_envs, np.int64)

    def _observe(self) -> Observation:
        who = np.stack([np.arange(self.num_envs), self.episode, self.t], axis=1).astype(np.float64)
        return Observation(images=frames(who), states={"who": who})

    def reset(self, *, seed: Any = None, options: dict[str, Any] | None = None) -> tuple[Observation, dict]:
        self.seed_rngs(seed)
        mask = self.reset_mask(options)
        self.episode[mask] += 1
        self.t[mask] = 0
        return self._observe(), {}

    def step(self, actions: Any) -> tuple[Observation, np.ndarray, np.ndarray, np.ndarray, dict]:
        self.t += 1
        done = self.t >= LENGTH
        return (self._observe(), np.ones(self.num_envs, np.float32), done, np.zeros(self.num_envs, bool), {})


class Checking(Policy):
    """Zero actions; keeps every observation batch it gets, from infers and from feedbacks."""

    off_loop = False

    def __init__(self) -> None:
        super().__init__(PolicySetup(action_shape=(2,), dtype=np.dtype(np.float32), horizon=4, low=-1.0, high=1.0))
        self.infers: list[dict[str, Any]] = []
        self.feedbacks: list[dict[str, Any]] = []

    def act(self, obs: dict[str, Any], n: int) -> np.ndarray:
        self.infers.append(obs)
        return np.zeros((self.horizon, n, 2), np.float32)

    def feedback(self, feedback: Any) -> None:
        self.feedbacks.append(feedback.obs)


def check_frames(batches: list[dict[str, Any]], codec: str) -> int:
    """Every batch's cameras against the env's frames of the rows it names: exact for raw and lossless cameras,
    within JPEG's error on the ones JPEG carries. Returns the rows checked."""
    rows = 0
    for obs in batches:
        expected = frames(obs["states"]["who"])
        for name, sent in expected.items():
            got = obs["images"][name]
            assert got.shape == sent.shape and got.dtype == np.uint8, name
            if codec == "jpeg" and name in ("front", "depth"):
                error = np.abs(got.astype(int) - sent)
                assert error.mean() < 3 and error.max() <= 24, (name, error.mean(), error.max())
            else:
                np.testing.assert_array_equal(got, sent, err_msg=name)
        rows += len(expected["front"])
    return rows


@pytest.fixture
def cameras(registry):
    register_env(ENV_ID, max_episode_steps=100)(CamerasEnv)
    return ENV_ID


@pytest.fixture
def serve():
    made: list[PolicyServer] = []

    def start(**kwargs: Any) -> PolicyServer:
        server = PolicyServer(Checking(), host="127.0.0.1", port=0, **kwargs).start()
        made.append(server)
        return server

    yield start
    for server in made:
        server.shutdown()


def run(tmp_path: Path, name: str, server: PolicyServer, codec: str, pipeline: int = 1,
        recorder: RecorderConfig | None = None, port: int | None = None) -> dict[str, Any]:
    """One client run against ``server`` (or whatever listens on ``port``: a link in front of it)."""
    config = ClientConfig(num_envs=4, num_episodes=8, server_port=port or server.port, output_dir=tmp_path, exp_name=name,
                          progress=False, connection=ConnectionConfig(image_codec=codec),  # type: ignore[arg-type]
                          runner=RunnerConfig(pipeline=pipeline), recorder=recorder or RecorderConfig())
    assert run_client(config, ENV_ID) == 0
    return json.loads((tmp_path / name / "summary.json").read_text())


def codec_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and images.FEATURE in r.getMessage()]


def sent_per_step(summary: dict[str, Any]) -> float:
    return summary["timing"]["bytes_sent"] / summary["timing"]["env_steps"]


@pytest.mark.parametrize("codec", ["jpeg", "qoi"])
def test_the_policy_gets_the_env_frames_and_the_link_carries_fewer_bytes(tmp_path, cameras, serve, codec, caplog):
    """Infers (reused rows among them: reuse-feedback-obs is on) and feedbacks with their terminal observations
    reach the policy as arrays of the env's shapes; the encoded run sends a fraction of the raw run's bytes."""
    raw_server, server = serve(), serve()
    raw = run(tmp_path, "raw", raw_server, "none")
    with caplog.at_level(logging.WARNING):
        coded = run(tmp_path, codec, server, codec)
    assert not codec_warnings(caplog), "offered: no warning"
    policy = server.policy
    assert isinstance(policy, Checking)
    assert check_frames(policy.infers, codec) >= 8 and check_frames(policy.feedbacks, codec) >= 8
    terminal = [obs for obs in policy.feedbacks if (obs["states"]["who"][:, 2] == LENGTH).any()]
    assert terminal, "some feedback carried a terminal observation"
    assert raw["timing"]["env_steps"] == coded["timing"]["env_steps"]
    assert sent_per_step(coded) < 0.6 * sent_per_step(raw), (sent_per_step(coded), sent_per_step(raw))


@pytest.mark.parametrize("codec", ["none", "jpeg", "qoi"])
def test_through_a_limited_link_each_codec_delivers_the_env_frames(tmp_path, cameras, serve, codec):
    """The client through bench/link_proxy.py's link (25 MB/s and a 2 ms round trip, as bench/link.py) against the
    reference server: with each codec the policy gets the env's frames (exactly, or within JPEG's error), reused rows
    and terminal observations among them, and the run ends with every episode."""
    server = serve()
    with bench_script("link_proxy") as link_proxy, link_proxy.LinkProxy(server.port, rate_mbytes=25, rtt_ms=2) as link:
        summary = run(tmp_path, codec, server, codec, port=link.port)
    assert summary["status"] == "finished" and summary["completed_episodes"] == 8, summary["status"]
    policy = server.policy
    assert isinstance(policy, Checking)
    assert check_frames(policy.infers, codec) >= 8 and check_frames(policy.feedbacks, codec) >= 8
    assert any((obs["states"]["who"][:, 2] == LENGTH).any() for obs in policy.feedbacks), "a terminal observation"


def test_pipelined_groups_send_encoded_images_and_the_recorder_keeps_the_env_frames(tmp_path, cameras, serve):
    server = serve()
    run(tmp_path, "piped", server, "jpeg", pipeline=2,
        recorder=RecorderConfig(episode_freq=1, record_full_rollout=True, record_obs_stats=False))
    policy = server.policy
    assert isinstance(policy, Checking)
    assert check_frames(policy.infers, "jpeg") and check_frames(policy.feedbacks, "jpeg")
    saved = sorted((tmp_path / "piped").rglob("rollouts/*.npz"))
    assert saved, "the recorder wrote the episodes' rollouts"
    for path in saved:
        with np.load(path) as rollout:
            expected = frames(rollout["states/who"])
            for name, frame in expected.items():  # what the env returned, not what the server decoded
                np.testing.assert_array_equal(rollout[f"images/{name}"], frame, err_msg=f"{path.name} {name}")


def test_a_server_without_the_feature_gets_raw_arrays_and_the_client_warns_once(tmp_path, cameras, serve, caplog):
    server = serve(image_codecs=False)
    with caplog.at_level(logging.WARNING):
        run(tmp_path, "plain", server, "jpeg")
    assert codec_warnings(caplog) == [f"--image-codec jpeg: the server does not offer {images.FEATURE} (its features: "
                    "reuse-feedback-obs); sending raw image arrays"]
    policy = server.policy
    assert isinstance(policy, Checking)
    check_frames(policy.infers, "none")  # exact: raw arrays


@pytest.mark.parametrize("flags,said", [
    (dict(image_quality=0), "--image-quality must be 1..100 (JPEG quality), got 0"),
    (dict(image_quality=101), "--image-quality must be 1..100 (JPEG quality), got 101"),
    (dict(image_codec="png"), "--image-codec must be one of none, jpeg, qoi, got 'png'"),
])
def test_bad_codec_flags_stop_the_run_before_it_starts(tmp_path, cameras, flags, said):
    config = ClientConfig(num_envs=1, num_episodes=1, output_dir=tmp_path, exp_name="bad", progress=False,
                          connection=ConnectionConfig(**flags))
    with pytest.raises(ConfigError) as info:
        run_client(config, ENV_ID)
    assert str(info.value) == said
    assert not (tmp_path / "bad").exists(), "nothing started"


def test_without_the_images_extra_a_codec_stops_the_run_before_it_starts_and_a_server_does_not_offer_it(
        tmp_path, cameras, monkeypatch):
    monkeypatch.setitem(sys.modules, "simplejpeg", None)  # an import of it now fails, as when not installed
    config = ClientConfig(num_envs=1, num_episodes=1, output_dir=tmp_path, exp_name="bare", progress=False,
                          connection=ConnectionConfig(image_codec="jpeg"))
    with pytest.raises(ConfigError) as info:
        run_client(config, ENV_ID)
    assert str(info.value) == ("the jpeg image codec needs the simplejpeg package: pip install "
                               "'plugrl-env-client[images]' (or pass --image-codec none)")
    assert not (tmp_path / "bare").exists(), "nothing started"
    server = PolicyServer(Checking(), host="127.0.0.1", port=0)
    try:
        assert images.FEATURE not in server.metadata()["features"]
    finally:
        server.shutdown()


def codec_lines(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    """(level, message) of every line that says which codec the run's images travel with, or that one travels raw."""
    return [(r.levelno, r.getMessage()) for r in caplog.records
            if r.getMessage().startswith(("--image-codec", "image codec"))]


@pytest.mark.slow
@pytest.mark.parametrize("procs,pipeline", [(1, 2), (2, 1)])
def test_what_the_server_took_and_what_travels_raw_is_said_once_per_run(tmp_path, cameras, serve, caplog, procs,
                                                                         pipeline):
    """Two connections (two env groups of one process, or two processes): the codec the server took is said once,
    so is the camera JPEG cannot carry, and so is the warning of a server without the feature."""
    offering, plain = serve(), serve(image_codecs=False)
    for name, server in (("offered", offering), ("plain", plain)):
        config = ClientConfig(num_envs=4, num_procs=procs, num_episodes=8, server_port=server.port,
                              output_dir=tmp_path, exp_name=name, progress=False,
                              connection=ConnectionConfig(image_codec="jpeg"),
                              runner=RunnerConfig(pipeline=pipeline, start_method="fork"))  # children see the env
        caplog.clear()
        with caplog.at_level(logging.INFO):
            assert run_client(config, ENV_ID) == 0
        said = codec_lines(caplog)
        if server is offering:
            assert said == [
                (logging.INFO, f"image codec jpeg: the server offers {images.FEATURE}, so camera images travel "
                               "jpeg-encoded per env row"),
                (logging.WARNING, f"--image-codec jpeg: camera 'rgba' (uint8 [{4 // pipeline}, 8, 8, 4]) travels raw: "
                                  "jpeg carries images of 1 or 3 channels, not 4"),
            ], said
        else:
            assert said == [(logging.WARNING, f"--image-codec jpeg: the server does not offer {images.FEATURE} (its "
                                              "features: reuse-feedback-obs); sending raw image arrays")], said
        log = (tmp_path / name / "logs" / "client.log").read_text()
        assert sum(line.count("--image-codec jpeg") + line.count("image codec jpeg:") for line in log.splitlines()) \
            == len(said), log


class WideEnv(CamerasEnv):
    """CamerasEnv with one more camera, 1 x 65535 pixels: wider than JPEG's 65500."""

    def _observe(self) -> Observation:
        obs = super()._observe()
        wide = np.zeros((self.num_envs, 1, 65535, 3), np.uint8)
        wide[:, 0, :, 0] = self.t[:, None] % 256
        return Observation(images={**obs.images, "wide": wide}, states=obs.states)


@pytest.mark.slow
def test_an_image_wider_than_jpeg_carries_travels_raw_and_the_run_finishes(tmp_path, registry, serve, caplog):
    register_env("WideCamera-v1", max_episode_steps=100)(WideEnv)
    server = serve()
    config = ClientConfig(num_envs=2, num_episodes=2, server_port=server.port, output_dir=tmp_path, exp_name="wide",
                          progress=False, connection=ConnectionConfig(image_codec="jpeg"))
    with caplog.at_level(logging.WARNING):
        assert run_client(config, "WideCamera-v1") == 0
    summary = json.loads((tmp_path / "wide" / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["completed_episodes"] == 2
    assert ("--image-codec jpeg: camera 'wide' (uint8 [2, 1, 65535, 3]) travels raw: jpeg carries images of 1 to "
            "65500 pixels a side, not 1x65535") in [r.getMessage() for r in caplog.records]
    policy = server.policy
    assert isinstance(policy, Checking)
    got = policy.infers[0]["images"]["wide"]
    assert got.shape == (2, 1, 65535, 3) and (got[:, 0, :, 0] == got[:, 0, :1, 0]).all(), "raw: exact"
