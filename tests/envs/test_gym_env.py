"""Gym-v1: Gymnasium envs as a batch, checked against the plain Gymnasium envs they wrap."""

from __future__ import annotations

import ctypes.util
import json
import logging
import re
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from client_runs import check_run_of_one_process
from extras import need

from plugrl_env_client.envs.gym import gym_env
from plugrl_env_client.envs.gym.gym_env import GymEnv, GymEnvConfig
from plugrl_env_client.errors import ConfigError

DICT_ID = "PlugRLTest/DictObs-v0"
IMAGE_ID = "PlugRLTest/ImageObs-v0"
DICT_ACTION_ID = "PlugRLTest/DictAction-v0"
DICT_TIME_LIMIT = 4


class DictObsEnv(gym.Env):
    """Observes a Dict of every leaf kind Gym-v1 maps, each derived from (step count, reset seed draw)."""

    def __init__(self, action_kind: str = "box") -> None:
        self.observation_space = gym.spaces.Dict({
            "camera": gym.spaces.Box(0, 255, (6, 8, 3), np.uint8),
            "joints": gym.spaces.Box(-10.0, 10.0, (3,), np.float64),
            "counts": gym.spaces.Box(0, 100, (2,), np.int32),
            "mode": gym.spaces.Discrete(4),
            "instruction": gym.spaces.Text(32),
            "arm": gym.spaces.Dict({"pos": gym.spaces.Box(-1.0, 1.0, (2,), np.float64)}),
        })
        if action_kind == "dict":
            self.action_space: gym.Space = gym.spaces.Dict({"a": gym.spaces.Discrete(2)})
        else:
            self.action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.t = 0
        self.start = 0.0

    def _obs(self) -> dict[str, Any]:
        return {
            "camera": np.full((6, 8, 3), self.t, np.uint8),
            "joints": np.array([self.start, self.t, -self.t], np.float64),
            "counts": np.array([self.t, 2 * self.t], np.int32),
            "mode": self.t % 4,
            "instruction": f"step{self.t}",
            "arm": {"pos": np.array([self.start / 10, 0.5], np.float64)},
        }

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        super().reset(seed=seed)
        self.t = 0
        self.start = float(self.np_random.uniform(-5, 5))
        return self._obs(), {}

    def step(self, action: Any) -> tuple[dict, float, bool, bool, dict]:
        self.t += 1
        return self._obs(), float(self.t), False, False, {"t": self.t, "is_success": self.t >= 2}


class ImageObsEnv(gym.Env):
    """Observes one uint8 (h, w, 3) image: its pixels count the steps."""

    observation_space = gym.spaces.Box(0, 255, (5, 7, 3), np.uint8)
    action_space = gym.spaces.Discrete(3)

    def __init__(self) -> None:
        self.t = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.t = 0
        return np.zeros((5, 7, 3), np.uint8), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.t += 1
        return np.full((5, 7, 3), self.t + int(action), np.uint8), 0.0, False, False, {}


@pytest.fixture
def test_envs() -> Iterator[None]:
    gym.register(DICT_ID, entry_point=DictObsEnv, max_episode_steps=DICT_TIME_LIMIT)
    gym.register(IMAGE_ID, entry_point=ImageObsEnv)
    gym.register(DICT_ACTION_ID, entry_point=DictObsEnv, kwargs={"action_kind": "dict"})
    yield
    for uid in (DICT_ID, IMAGE_ID, DICT_ACTION_ID):
        gym.registry.pop(uid, None)


def make(n: int = 2, **fields: Any) -> GymEnv:
    return GymEnv(GymEnvConfig(**fields), num_envs=n)


def random_actions(env: GymEnv, seed: int) -> np.ndarray:
    space = env.action_space
    space.seed(seed)
    return np.asarray(space.sample())


# ------------------------------------------------------------------------------------------------ spaces


def test_pendulum_batch_matches_single_gymnasium_envs() -> None:
    n = 3
    env = make(n, id="Pendulum-v1")
    try:
        assert env.single_action_space == gym.spaces.Box(-2.0, 2.0, (1,), np.float32)
        obs, _ = env.reset(seed=7)
        singles = [gym.make("Pendulum-v1") for _ in range(n)]
        expected = np.stack([s.reset(seed=7 + i)[0] for i, s in enumerate(singles)])  # Gymnasium: copy i gets seed+i
        assert obs.states["obs"].dtype == np.float32 and obs.states["obs"].shape == (n, 3)
        np.testing.assert_allclose(obs.states["obs"], expected, rtol=1e-6)
        actions = np.array([[-1.5], [0.0], [1.5]], np.float32)
        obs, rewards, terminated, truncated, _ = env.step(actions)
        steps = [s.step(actions[i]) for i, s in enumerate(singles)]
        np.testing.assert_allclose(obs.states["obs"], np.stack([s[0] for s in steps]), rtol=1e-6)
        assert rewards.dtype == np.float32 and rewards.shape == (n,)
        np.testing.assert_allclose(rewards, [s[1] for s in steps], rtol=1e-6)
        assert terminated.dtype == np.bool_ and truncated.dtype == np.bool_ and not (terminated | truncated).any()
        assert obs.images == {} and list(obs.text) == [""] * n
    finally:
        env.close()


def test_cartpole_discrete_actions_pass_through() -> None:
    env = make(4, id="CartPole-v1")
    try:
        assert env.single_action_space == gym.spaces.Discrete(2)
        start = env.reset(seed=0)[0].states["obs"]
        obs, *_ = env.step(np.array([0, 1, 0, 1]))
        velocity = obs.states["obs"][:, 1] - start[:, 1]  # cart velocity: pushed left (0) or right (1)
        assert (velocity[[0, 2]] < 0).all() and (velocity[[1, 3]] > 0).all()
    finally:
        env.close()


def test_dict_observation_maps_every_leaf(test_envs: None) -> None:
    env = make(3, id=DICT_ID)
    try:
        obs, _ = env.reset(seed=1)
        successes = []
        for _ in range(2):
            obs, rewards, *_, info = env.step(random_actions(env, 0))
            successes.append(info["success"])
        np.testing.assert_array_equal(successes, [[False] * 3, [True] * 3])  # from the env's info["is_success"]
        assert set(obs.images) == {"camera"}
        assert obs.images["camera"].dtype == np.uint8 and obs.images["camera"].shape == (3, 6, 8, 3)
        assert (obs.images["camera"] == 2).all()
        assert set(obs.states) == {"joints", "counts", "mode", "arm.pos"}
        assert obs.states["joints"].dtype == np.float32 and obs.states["joints"].shape == (3, 3)
        np.testing.assert_array_equal(obs.states["joints"][:, 1:], [[2, -2]] * 3)
        assert obs.states["counts"].dtype == np.int32
        np.testing.assert_array_equal(obs.states["counts"], [[2, 4]] * 3)
        assert obs.states["mode"].shape == (3, 1) and obs.states["mode"].dtype.kind == "i"
        np.testing.assert_array_equal(obs.states["mode"], [[2]] * 3)
        np.testing.assert_allclose(obs.states["arm.pos"][:, 0], obs.states["joints"][:, 0] / 10, rtol=1e-6)
        assert list(obs.text) == ["step2"] * 3
        np.testing.assert_array_equal(rewards, [2.0, 2.0, 2.0])
    finally:
        env.close()


def test_image_box_goes_to_images(test_envs: None) -> None:
    env = make(2, id=IMAGE_ID)
    try:
        assert env.single_action_space == gym.spaces.Discrete(3)
        env.reset(seed=0)
        obs, *_ = env.step(np.array([0, 2]))
        assert obs.states == {}
        assert obs.images["obs"].shape == (2, 5, 7, 3) and obs.images["obs"].dtype == np.uint8
        np.testing.assert_array_equal(obs.images["obs"][:, 0, 0, 0], [1, 3])
    finally:
        env.close()


def test_dict_action_space_is_refused(test_envs: None) -> None:
    with pytest.raises(ConfigError, match="cannot be sent as one array per env"):
        make(1, id=DICT_ACTION_ID)


def test_observations_are_copies_not_views_of_the_vector_env() -> None:
    env = make(2, id="Pendulum-v1")
    try:
        first, _ = env.reset(seed=0)
        kept = first.states["obs"].copy()
        env.step(np.ones((2, 1), np.float32))
        np.testing.assert_array_equal(first.states["obs"], kept)
    finally:
        env.close()


# ------------------------------------------------------------------------------------------------ resets, seeds, time limits


@pytest.mark.parametrize("vectorization", ["sync", "async"])
def test_partial_reset_leaves_other_rows_unchanged(vectorization: str) -> None:
    n = 4
    env = make(n, id="Pendulum-v1", vectorization=vectorization)
    try:
        env.reset(seed=3)
        for k in range(5):
            before, *_ = env.step(np.full((n, 1), 2.0 if k % 2 else -2.0, np.float32))
        mask = np.array([False, True, False, True])
        after, _ = env.reset(options={"reset_mask": mask, "reset_indices": np.flatnonzero(mask)})
        np.testing.assert_array_equal(after.states["obs"][~mask], before.states["obs"][~mask])
        assert not np.array_equal(after.states["obs"][mask], before.states["obs"][mask])
        cos, sin, speed = after.states["obs"][mask].T  # a fresh start: angle anywhere, speed in [-1, 1]
        np.testing.assert_allclose(cos**2 + sin**2, 1.0, rtol=1e-5)
        assert (np.abs(speed) <= 1.0).all()
        again, _ = env.reset(options={"reset_indices": np.array([0])})  # PlugRL's name alone
        np.testing.assert_array_equal(again.states["obs"][1:], after.states["obs"][1:])
    finally:
        env.close()


def trajectory(seed: int, vectorization: str = "sync") -> list[np.ndarray]:
    env = make(3, id="Pendulum-v1", vectorization=vectorization)
    try:
        out = [env.reset(seed=seed)[0].states["obs"]]
        for k in range(10):
            obs, rewards, *_ = env.step(np.full((3, 1), np.sin(k), np.float32))
            out += [obs.states["obs"], rewards]
        out.append(env.reset(options={"reset_mask": np.array([True, False, True])})[0].states["obs"])
        return out
    finally:
        env.close()


def test_seeds_reproduce() -> None:
    a, b, c = trajectory(5), trajectory(5), trajectory(6)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(a[0], c[0])
    # seed s gives copy i the seed s + i: copy 1 of seed 5 starts where copy 0 of seed 6 does
    np.testing.assert_array_equal(a[0][1], c[0][0])


@pytest.mark.slow
def test_async_matches_sync() -> None:
    for x, y in zip(trajectory(5, "sync"), trajectory(5, "async")):
        np.testing.assert_array_equal(x, y)


def test_truncated_at_the_inner_time_limit_and_no_reset_inside_step() -> None:
    limit = gym.spec("Pendulum-v1").max_episode_steps
    assert limit == 200
    env = make(2, id="Pendulum-v1")
    try:
        env.reset(seed=0)
        zeros = np.zeros((2, 1), np.float32)
        for _ in range(limit - 1):
            _, _, terminated, truncated, _ = env.step(zeros)
            assert not (terminated | truncated).any()
        last, _, terminated, truncated, _ = env.step(zeros)
        assert truncated.all() and not terminated.any()
        with pytest.raises(RuntimeError, match="not reset"):
            env.step(zeros)
        obs, _ = env.reset(options={"reset_mask": np.array([True, False])})
        np.testing.assert_array_equal(obs.states["obs"][1], last.states["obs"][1])
        with pytest.raises(RuntimeError, match=r"\[1\]"):
            env.step(zeros)
        env.reset(options={"reset_indices": [1]})
        _, _, terminated, truncated, _ = env.step(zeros)
        assert not (terminated | truncated).any()
    finally:
        env.close()


def test_dict_env_time_limit_comes_from_its_registration(test_envs: None) -> None:
    env = make(2, id=DICT_ID)
    try:
        env.reset(seed=0)
        flags = [env.step(random_actions(env, k))[3] for k in range(DICT_TIME_LIMIT)]
        assert [bool(f.all()) for f in flags] == [False] * (DICT_TIME_LIMIT - 1) + [True]
    finally:
        env.close()


# ------------------------------------------------------------------------------------------------ render


def test_render_adds_frames_and_keeps_rows_of_envs_not_reset() -> None:
    need("pygame")  # CartPole's frames
    env = make(2, id="CartPole-v1", render=True)
    try:
        obs, _ = env.reset(seed=0)
        frames = obs.images["render"]
        assert frames.dtype == np.uint8 and frames.shape == (2, 400, 600, 3)
        for _ in range(6):
            obs, *_ = env.step(np.array([0, 1]))
        inner = env.vector_env.envs  # type: ignore[attr-defined]
        np.testing.assert_array_equal(obs.images["render"][1], inner[1].render())
        assert not np.array_equal(obs.images["render"][0], obs.images["render"][1])  # the carts moved apart
        after, _ = env.reset(options={"reset_mask": np.array([True, False])})
        np.testing.assert_array_equal(after.images["render"][1], obs.images["render"][1])
        np.testing.assert_array_equal(after.images["render"][0], inner[0].render())
        assert not np.array_equal(after.images["render"][0], obs.images["render"][0])
    finally:
        env.close()


def test_frames_for_the_recorder_only_are_drawn_on_request_and_not_sent() -> None:
    need("pygame")  # CartPole's frames
    env = make(2, id="CartPole-v1", render_for_recorder_only=True)
    try:
        obs, _ = env.reset(seed=0)
        for _ in range(4):
            obs, *_ = env.step(np.array([0, 1]))
        assert obs.images == {} and env.frames_for_recorder
        inner = env.vector_env.envs  # type: ignore[attr-defined]
        drawn = env.render_frames(np.array([1]))["render"]
        assert drawn.shape == (1, 400, 600, 3)
        np.testing.assert_array_equal(drawn[0], inner[1].render())
    finally:
        env.close()
    with pytest.raises(ConfigError, match="--env.render sends every frame to the policy already"):
        make(1, id="CartPole-v1", render=True, render_for_recorder_only=True)


def test_without_render_there_are_no_frames() -> None:
    env = make(1, id="CartPole-v1")
    try:
        assert env.reset(seed=0)[0].images == {}
    finally:
        env.close()


# ------------------------------------------------------------------------------------------------ rendering costs


FRAMES_ID = "PlugRLTest/Frames-v0"


class FramesEnv(gym.Env):
    """Renders small frames, taking ``frame_s`` seconds for each (a CPU renderer, standing in for MuJoCo's)."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 30}
    observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, render_mode: str | None = None, frame_s: float = 0.0) -> None:
        self.render_mode, self.frame_s = render_mode, frame_s

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        return np.zeros(1, np.float32), 0.0, False, False, {}

    def render(self) -> np.ndarray:
        time.sleep(self.frame_s)  # the cost under test
        return np.zeros((6, 4, 3), np.uint8)


@pytest.fixture
def frames_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The frames env registered, and a fresh once-per-run filter (another test may have used the warning up)."""
    monkeypatch.setattr(gym_env.logger, "filters", [gym_env.OncePerRun()])
    gym.register(FRAMES_ID, entry_point=FramesEnv)
    yield
    gym.registry.pop(FRAMES_ID, None)


def _cost_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and "ms per frame" in r.getMessage()]


def test_slow_frames_are_named_once_with_their_cost_and_what_makes_them_cheaper(
        frames_env: None, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("INFO", logger="plugrl_env_client.envs.gym.gym_env")
    for _ in range(2):  # two env groups of one process
        env = make(2, id=FRAMES_ID, render=True, kwargs=json.dumps({"frame_s": 0.02}))
        try:
            env.reset(seed=0)
            for _ in range(8):
                env.step(np.array([0, 1]))
        finally:
            env.close()
        assert env.render_cost.per_frame_s >= 0.02
    (message,) = _cost_warnings(caplog)
    match = re.search(r"rendering costs (\d+) ms per frame here \(6x4 pixels", message)
    assert match is not None and int(match.group(1)) >= 20, message
    assert '"width": 64' in message and "leave --env.render off" in message


def test_cheap_frames_are_not_warned_about(frames_env: None, caplog: pytest.LogCaptureFixture) -> None:
    env = make(2, id=FRAMES_ID, render=True)
    try:
        env.reset(seed=0)
        for _ in range(8):
            env.step(np.array([0, 1]))
    finally:
        env.close()
    assert env.render_cost.judged and env.render_cost.per_frame_s < gym_env.SLOW_FRAME_S
    assert _cost_warnings(caplog) == []


def test_a_warning_once_per_run_is_written_once_whichever_process_logs_it(
        frames_env: None, caplog: pytest.LogCaptureFixture) -> None:
    """A rollout process logs it once; the launcher hands each process's record to the logger of the same name
    (launch/reports.py LogReport), whose filter lets one through."""
    caplog.set_level("WARNING")
    forwarded = [gym_env.logger.makeRecord(gym_env.logger.name, logging.WARNING, __file__, 0, f"slow in process {p}",
                                           None, None, extra={"once": "render-cost"}) for p in (0, 1)]
    for record in forwarded:
        logging.getLogger(record.name).handle(record)
    gym_env.logger.warning("not once per run")
    gym_env.logger.warning("not once per run")
    assert [r.getMessage() for r in caplog.records] == ["slow in process 0", "not once per run", "not once per run"]


def test_the_opengl_platform_is_chosen_before_the_envs_package_is_imported(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """dm_control (so gym-aloha and Shimmy's dm_control envs) picks its OpenGL platform when it is imported, which
    --env.id package:Env-v0 does: without a display, MUJOCO_GL must be set by then."""
    expected = next((gl for gl, lib in (("egl", "EGL"), ("osmesa", "OSMesa")) if ctypes.util.find_library(lib)), None)
    if expected is None:
        pytest.skip("no EGL or OSMesa library on this machine: there is no platform to choose")
    for name in ("DISPLAY", "WAYLAND_DISPLAY", "MUJOCO_GL", "SDL_VIDEODRIVER"):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "glprobe_pkg.py").write_text(textwrap.dedent(f'''
        import os
        import gymnasium as gym
        SEEN_AT_IMPORT = os.environ.get("MUJOCO_GL")
        gym.register("GlProbe-v0", entry_point="{__name__}:FramesEnv")
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        make(1, id="glprobe_pkg:GlProbe-v0").close()
        assert sys.modules["glprobe_pkg"].SEEN_AT_IMPORT == expected
    finally:
        gym.registry.pop("GlProbe-v0", None)
        sys.modules.pop("glprobe_pkg", None)


# ------------------------------------------------------------------------------------------------ errors, close


def test_kwargs_reach_the_inner_env() -> None:
    env = make(2, id="Pendulum-v1", kwargs=json.dumps({"g": 3.5}))
    try:
        assert [e.unwrapped.g for e in env.vector_env.envs] == [3.5, 3.5]  # type: ignore[attr-defined]
    finally:
        env.close()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ('{"g": ', "--env.kwargs is not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        ('{"gravity_constant": 1}', "gravity_constant"),
    ],
)
def test_bad_kwargs_are_config_errors(kwargs: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        make(1, id="Pendulum-v1", kwargs=kwargs)


@pytest.mark.parametrize("env_id", ["Pendulm-v1", "pendulum-v1", "Pendulum-v9", "Pendulum"])
def test_unknown_id_names_close_matches(env_id: str) -> None:
    with pytest.raises(ConfigError, match="Did you mean .*'Pendulum-v1'"):
        make(1, id=env_id)


def test_unimportable_module_prefix_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="cannot be imported"):
        make(1, id="no_such_package_here:Thing-v0")


def test_vector_only_ids_are_refused(registry: None) -> None:
    from plugrl_env_client.envs import discover_envs

    discover_envs()  # registers Point-v1 with Gymnasium as a vector-only entry point
    with pytest.raises(ConfigError, match="no single-env entry point"):
        make(1, id="Point-v1")


def test_close_is_idempotent() -> None:
    env = make(2, id="CartPole-v1", vectorization="async")
    env.reset(seed=0)
    env.close()
    assert env.vector_env.closed
    env.close()  # a second close does nothing


# ------------------------------------------------------------------------------------------------ end to end


def test_run_through_the_client(tmp_path: Any, registry: None) -> None:
    from plugrl_env_client.app import run_client
    from plugrl_env_client.config import ClientConfig

    config = ClientConfig(num_envs=3, num_episodes=5, local_policy="random", output_dir=tmp_path, progress=False,
                          exp_name="gym-e2e", env=GymEnvConfig(id="CartPole-v1"))
    assert run_client(config, "Gym-v1") == 0
    check_run_of_one_process(tmp_path / "gym-e2e", episodes=5, max_length=500)  # the env's own time limit


def test_envs_that_ran_their_share_are_reset_quietly_when_their_idle_row_ends(tmp_path: Path, registry: None) -> None:
    """Static split, 4 envs, 5 episodes: shares 2, 1, 1, 1. The three envs that ran theirs take no part any more,
    but the batched env still steps their rows (placeholder actions), which soon end; Gym-v1 refuses to step a row
    that ended and was not reset, so those rows are reset (without a seed, nothing recorded)."""
    from plugrl_env_client.app import run_client
    from plugrl_env_client.config import ClientConfig

    config = ClientConfig(num_envs=4, num_episodes=5, local_policy="random", output_dir=tmp_path, progress=False,
                          exp_name="shares", env=GymEnvConfig(id="CartPole-v1"))
    assert run_client(config, "Gym-v1") == 0
    episodes = [json.loads(line) for line in
                (tmp_path / "shares/rollout/proc_000/episodes.jsonl").read_text().splitlines()]
    per_env = [sum(1 for e in episodes if e["env_index"] == i) for i in range(4)]
    assert per_env == [2, 1, 1, 1]
    summary = json.loads((tmp_path / "shares/summary.json").read_text())
    assert summary["status"] == "finished" and summary["completed_episodes"] == 5


def test_a_run_renders_only_the_episodes_it_records(tmp_path: Path, registry: None) -> None:
    """--env.render-for-recorder-only with --recorder.episode-freq 3: the recorded episodes have their frames
    (samples and a video), the policy's observations none, and only recorded envs were rendered."""
    need("pygame")  # CartPole's frames
    need("imageio_ffmpeg")  # the video
    from plugrl_env_client.app import run_client
    from plugrl_env_client.config import ClientConfig, RecorderConfig, RunnerConfig

    config = ClientConfig(num_envs=2, num_episodes=6, local_policy="random", output_dir=tmp_path, progress=False,
                          exp_name="rec", env=GymEnvConfig(id="CartPole-v1", render_for_recorder_only=True),
                          runner=RunnerConfig(max_episode_steps=4),
                          recorder=RecorderConfig(episode_freq=3, record_video=True))
    assert run_client(config, "Gym-v1") == 0
    proc = tmp_path / "rec/rollout/proc_000"
    videos = sorted(p.name for p in (proc / "videos").iterdir())
    assert videos and all(name.endswith("_render.mp4") for name in videos)
    firsts = sorted((proc / "sampled").glob("ep_*/env_*/obs/first/images/render.png"))
    assert [f"{p.parts[-6].replace('_', '')}_{p.parts[-5].replace('_', '')}_render.mp4" for p in firsts] == videos
    episodes = [json.loads(line) for line in (proc / "episodes.jsonl").read_text().splitlines()]
    assert len(videos) < len(episodes), "not every episode was rendered"
    timing = json.loads((proc / "summary.json").read_text())["timing"]
    assert timing["bytes_sent"] / (timing["infer_calls"] + timing["feedback_calls"]) < 10_000, \
        "no 400x600 frame (720 kB) went to the policy"
