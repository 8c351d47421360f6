"""LIBERO-v1: without the extra and without OpenGL it says what to install; with LIBERO (installed as
tests/_support/pip_sites.py says, in a folder of its own, since it pins a MuJoCo below 4) its copies start from the
benchmark's initial states, keep their own randomness, and a client runs a task against the embedded server.

Every LIBERO run here is a few steps of small cameras: a step with both cameras costs about a quarter of a second
on one CPU core, whatever the image size."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from pip_sites import LIBERO, installed, python_path_with

from plugrl_env_client.envs.libero import libero_env
from plugrl_env_client.envs.libero.libero_env import LIBERO_EXTRA, OPENGL_PACKAGES, LiberoEnv, LiberoEnvConfig
from plugrl_env_client.errors import ConfigError

SUPPORT = Path(__file__).resolve().parents[1] / "_support"
PROTOCOLS = ["plugrl", "openpi"]
"""The wire protocols the client run is tested in (a parameter of the run test)."""


def protocol_flags(protocol: str) -> list[str]:
    """The client flags that choose ``protocol`` (the default needs none; openpi's with its LIBERO keys)."""
    return [] if protocol == "plugrl" else ["--protocol", protocol, "--openpi.preset", "libero"]


# ------------------------------------------------------------------------------------------------ without LIBERO


@pytest.mark.skipif(importlib.util.find_spec("libero") is not None, reason="LIBERO is installed here")
def test_without_the_extra_the_env_names_it() -> None:
    with pytest.raises(ConfigError) as err:
        LiberoEnv(LiberoEnvConfig(), num_envs=1)
    assert LIBERO_EXTRA in str(err.value) and "pip install 'plugrl-env-client[libero]'" in str(err.value)


def test_without_egl_or_osmesa_the_error_names_mujoco_gl_and_the_packages(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MUJOCO_GL", raising=False)
    monkeypatch.setattr(libero_env.ctypes.util, "find_library", lambda name: None)
    with pytest.raises(ConfigError) as err:
        libero_env.opengl_platform()
    text = str(err.value)
    for platform, packages in OPENGL_PACKAGES.items():
        assert f"MUJOCO_GL={platform}" in text and packages in text, text
    assert "libegl1 libegl-mesa0 libgl1-mesa-dri" in text and "libosmesa6" in text
    assert "--env.render false" in text


def test_a_mujoco_gl_whose_library_is_missing_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MUJOCO_GL", "osmesa")
    monkeypatch.setattr(libero_env.ctypes.util, "find_library", lambda name: None if name == "OSMesa" else name)
    with pytest.raises(ConfigError, match="MUJOCO_GL=osmesa but no OSMesa library"):
        libero_env.opengl_platform()


def test_the_platform_is_the_one_set_else_egl_else_osmesa(monkeypatch: pytest.MonkeyPatch) -> None:
    found = {"EGL", "OSMesa"}
    monkeypatch.setattr(libero_env.ctypes.util, "find_library", lambda name: name if name in found else None)
    monkeypatch.delenv("MUJOCO_GL", raising=False)
    assert libero_env.opengl_platform() == "egl"
    found.discard("EGL")
    assert libero_env.opengl_platform() == "osmesa"
    monkeypatch.setenv("MUJOCO_GL", "glfw")
    assert libero_env.opengl_platform() == "glfw"


@pytest.mark.parametrize(("config", "flag"), [
    (LiberoEnvConfig(suite="libero_100"), "--env.suite"),  # type: ignore[arg-type]
    (LiberoEnvConfig(camera_size=0), "--env.camera-size"),
    (LiberoEnvConfig(settle_steps=-1), "--env.settle-steps"),
    (LiberoEnvConfig(max_episode_steps=0), "--env.max-episode-steps"),
])
def test_a_bad_flag_is_named_before_anything_is_imported(config: LiberoEnvConfig, flag: str) -> None:
    with pytest.raises(ConfigError, match=flag):
        LiberoEnv(config, num_envs=1)


def test_the_orientation_is_robosuites_axis_angle() -> None:
    rng = np.random.default_rng(0)
    for _ in range(20):
        axis = rng.normal(size=3)
        axis /= np.linalg.norm(axis)
        angle = rng.uniform(0.01, math.pi - 0.01)
        quat = np.r_[axis * math.sin(angle / 2), math.cos(angle / 2)]  # x, y, z, w
        assert np.allclose(libero_env.axis_angle(quat), axis * angle)
    assert np.array_equal(libero_env.axis_angle(np.array([0.0, 0.0, 0.0, 1.0])), np.zeros(3))
    assert np.array_equal(libero_env.axis_angle(np.array([0.0, 0.0, 0.0, 1.0 + 1e-9])), np.zeros(3))  # w clipped


# ------------------------------------------------------------------------------------------------ with LIBERO


@pytest.fixture(scope="module")
def libero_site() -> Path:
    return installed(LIBERO)


SITE_TIMEOUT = pytest.mark.timeout(900)
"""For the tests with LIBERO: the first one installs it (about 1.7 GB, a minute or more) before it runs."""


def _child_env(site: Path, **extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": python_path_with(site), **extra}


@pytest.mark.slow
@SITE_TIMEOUT
def test_copies_start_from_the_benchmarks_initial_states_and_keep_their_own_randomness(libero_site: Path) -> None:
    res = subprocess.run([sys.executable, str(SUPPORT / "libero_copies.py")], capture_output=True, text=True,
                         timeout=600, env=_child_env(libero_site))
    assert res.returncode == 0, res.stderr[-3000:]
    found = json.loads(res.stdout.splitlines()[-1])
    assert found["file_rows"] == 50
    assert found["init_state"] == [47, 3], "the initial state is the seed modulo 50"
    assert found["sim_is_file_row"] == [True, True], "the copies hold the file's rows as their MuJoCo states"
    assert found["partial_init_state"] == [47, 9] and found["other_row_kept"] and found["reset_row_changed"]
    assert found["copy_alone_sees_the_same"] == [True] * 4, "a copy's episode does not depend on its neighbour's"
    assert found["process_rng_kept"], "numpy's global generator is the process's own again"
    assert found["images"] == {"agentview": [[2, 32, 32, 3], "uint8"], "wrist": [[2, 32, 32, 3], "uint8"]}
    assert found["upright"] == {"agentview": True, "wrist": True}, "both axes of robosuite's images flipped"
    assert found["states"] == {"robot0_eef_pos": [[2, 3], "float32"], "robot0_eef_axis_angle": [[2, 3], "float32"],
                               "robot0_gripper_qpos": [[2, 2], "float32"], "state": [[2, 8], "float32"]}
    assert found["state_is_the_concatenation"] and found["eef_pos_is_robosuite's"]
    assert found["text"] == [found["instruction"]] * 2
    assert found["step"] == {"rewards": [0.0], "terminated": [False], "truncated": [False], "success": [False]}
    assert found["blind_observation"] == {"images": [], "states": [
        "robot0_eef_axis_angle", "robot0_eef_pos", "robot0_gripper_qpos", "state"]}, "--env.render false: no cameras"


@pytest.mark.slow
@SITE_TIMEOUT
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_client_runs_a_libero_task_against_the_embedded_server(libero_site: Path, tmp_path: Path,
                                                                 protocol: str) -> None:
    """Two envs of libero_goal's task 3, two episodes of 3 steps each after 2 settle steps, 32-px cameras."""
    args = ["libero-v1", "--env.suite", "libero_goal", "--env.task-id", "3", "--env.camera-size", "32",
            "--env.settle-steps", "2", "--env.max-episode-steps", "3", "--num-envs", "2", "--num-episodes", "2",
            "--local-policy", "random", "--output-dir", str(tmp_path), "--exp-name", "run", "--no-progress",
            *protocol_flags(protocol)]
    res = subprocess.run([sys.executable, "-m", "plugrl_env_client", *args], capture_output=True, text=True,
                         timeout=600, env=_child_env(libero_site))
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    run = tmp_path / "run"
    episodes = [json.loads(line) for line in (run / "rollout/proc_000/episodes.jsonl").read_text().splitlines()]
    assert sorted(e["seed"] for e in episodes) == [0, 1]
    assert all(e["length"] == 3 and e["truncated"] and not e["terminated"] and e["success"] is False
               for e in episodes), episodes
    summary = json.loads((run / "summary.json").read_text())
    assert summary["completed_episodes"] == 2 and summary["has_success_rule"] is True
    assert summary["timing"]["env_steps"] == 6, "the settle steps are not the episodes' steps"
    config = json.loads((run / "client_config.json").read_text())
    assert config["env"] == {"suite": "libero_goal", "task_id": 3, "camera_size": 32, "render": True,
                             "settle_steps": 2, "max_episode_steps": 3}


@pytest.mark.slow
@SITE_TIMEOUT
@pytest.mark.skipif(libero_env.ctypes.util.find_library("OSMesa") is not None, reason="OSMesa is installed here")
def test_without_a_working_opengl_the_run_stops_at_once_naming_what_to_install(libero_site: Path,
                                                                               tmp_path: Path) -> None:
    res = subprocess.run([sys.executable, "-m", "plugrl_env_client", "libero-v1", "--local-policy", "random",
                          "--num-episodes", "1", "--output-dir", str(tmp_path), "--no-progress"],
                         capture_output=True, text=True, timeout=300, env=_child_env(libero_site, MUJOCO_GL="osmesa"))
    assert res.returncode != 0
    assert "MUJOCO_GL=osmesa but no OSMesa library" in res.stderr, res.stderr[-3000:]
    assert "libegl1 libegl-mesa0 libgl1-mesa-dri" in res.stderr and "libosmesa6" in res.stderr
    assert "robosuite" not in res.stderr, "it stopped before LIBERO was imported"


@pytest.mark.slow
@SITE_TIMEOUT
def test_an_egl_without_a_driver_stops_the_run_at_once_naming_what_to_install(libero_site: Path,
                                                                             tmp_path: Path) -> None:
    """libglvnd's libEGL with no vendor library to hand the calls to (what libegl1 without libegl-mesa0 gives):
    the library is found, yet no context can be made."""
    no_vendor = {"MUJOCO_GL": "egl", "__EGL_VENDOR_LIBRARY_FILENAMES": str(tmp_path / "no-vendor.json")}
    res = subprocess.run([sys.executable, "-m", "plugrl_env_client", "libero-v1", "--local-policy", "random",
                          "--num-episodes", "1", "--output-dir", str(tmp_path), "--no-progress"],
                         capture_output=True, text=True, timeout=300, env=_child_env(libero_site, **no_vendor))
    assert res.returncode != 0
    assert "LIBERO-v1 cannot render with MUJOCO_GL=egl" in res.stderr, res.stderr[-3000:]
    assert "libegl1 libegl-mesa0 libgl1-mesa-dri" in res.stderr and "libosmesa6" in res.stderr
    (run,) = tmp_path.glob("libero-v1-*")
    assert json.loads((run / "summary.json").read_text())["timing"]["env_steps"] == 0

