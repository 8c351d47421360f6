"""MuJoCo-v1: Gymnasium's MuJoCo tasks (HalfCheetah, Hopper, Walker2d, ...) as one batch, on Gymnasium or EnvPool.

``plugrl-run-env-client mujoco-v1 --env.task Hopper-v5 --num-envs 16 --env.backend envpool --local-policy random``

Observations are ``states["obs"]`` (float32, the task's observation vector) and, with ``--env.render``,
``images["render"]`` (uint8 (n, height, width, 3) camera frames). Both backends run the same tasks:

* ``gymnasium`` (extra ``mujoco``): Gymnasium's own MuJoCo envs in its vector env. This backend *is*
  :class:`~plugrl_env_client.envs.gym.gym_env.GymEnv` with the task as its id, so resets, seeding, time limits
  and rendering work the same way as in Gym-v1.
* ``envpool`` (extra ``envpool``): EnvPool's C++ thread pool steps all copies in parallel, outside the GIL.
  EnvPool has its own MuJoCo builds of the tasks, under its own version names; a task it lacks under the
  Gymnasium name maps to its closest version of that task (with a warning), and one it does not have at all is a
  ConfigError that lists the tasks it has.

How EnvPool resets (found by experiment; ``tests/envs/test_mujoco_env.py`` pins it): an env that is done on a
step is reset by EnvPool *on that env's next step*, whatever the action (that step returns reward 0 and
``elapsed_step`` 0). An explicit ``reset(env_id=ids)`` resets exactly those envs once and cancels the pending
automatic reset, so their next step is a real step. This backend follows the batched env contract on top of
that: the done step returns EnvPool's terminal observation, the runner's ``reset(options=mask)`` becomes one
explicit reset of the masked env ids, and stepping an env that is done and was not reset is refused, because
EnvPool would reset it inside ``step``.

Seeds: the gymnasium backend takes per-env seeds (``reset(seed=[...])`` starts copy i from ``seed[i]``, as Gym-v1
does), so each episode starts from the seed the runner derives for it. EnvPool seeds its envs only when the pool
is made (env ``i`` gets ``seed + i``, as Gymnasium does) and ignores the seed of a reset, so the envpool backend
does not declare ``per_env_seeds``: ``reset(seed=s)`` of every env makes a new pool with seed ``s``, and later
episodes continue each env's generator (their seeds are recorded as null, and ``--runner.group-size`` above 1 is
refused).

Rendering without a display: the gymnasium backend renders with ``MUJOCO_GL=egl`` (see
:func:`~plugrl_env_client.envs.gym.gym_env.headless_rendering`; ``osmesa`` when EGL is missing; a value you set
is kept). EnvPool makes its own EGL context, but its wheel ships a renamed copy of libEGL that MuJoCo does not
recognise as an OpenGL platform library, and MuJoCo then aborts the process on the first render. Loading the
system libEGL before ``envpool`` is first imported avoids that, so :func:`import_envpool` does it.

Rendering on a machine without a GPU costs about 70 ms per 128x128 frame (Hopper-v5, 8 envs: 14 env steps per
second with ``--env.render``, 1,508 without); both backends measure it and warn once when frames are slow
(:class:`~plugrl_env_client.envs.gym.gym_env.RenderCost`), naming ``--env.width`` and ``--env.height``. A policy
that does not need the frames can leave them to the recorder: ``--env.render-for-recorder-only`` renders only the
envs whose episodes ``--recorder.episode-freq K`` records (as in Gym-v1; EnvPool renders the ids asked for).
Gymnasium's tracking camera follows its body from where it was at a copy's first render, so there a frame drawn on
request can frame the scene a little differently from the one ``--env.render`` would have drawn at that step.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import json
import logging
import os
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

import gymnasium as gym
import numpy as np

from plugrl_env_client.envs.base_env import Action, BaseEnv, BaseEnvConfig, BoolArray, Observation, RewardArray
from plugrl_env_client.envs.gym.gym_env import (
    RENDER_KEY,
    GymEnv,
    GymEnvConfig,
    RenderCost,
    close_gym_ids,
    parse_kwargs,
    resolve_gym_spec,
)
from plugrl_env_client.envs.registry import register_env, register_env_config
from plugrl_env_client.errors import ConfigError

logger = logging.getLogger(__name__)

MUJOCO_EXTRA = 'pip install "plugrl-env-client[mujoco]"'
SMALLER_FRAMES = "e.g. --env.width 64 --env.height 64: a quarter of the pixels"
ENVPOOL_EXTRA = 'pip install "plugrl-env-client[envpool]"'


@register_env_config("MuJoCo-v1")
@dataclasses.dataclass
class MujocoEnvConfig(BaseEnvConfig):
    task: str = "HalfCheetah-v5"
    """A Gymnasium MuJoCo task id (HalfCheetah-v5, Hopper-v5, Walker2d-v5, Ant-v5, ...)."""
    backend: Literal["gymnasium", "envpool"] = "gymnasium"
    """gymnasium: Gymnasium's MuJoCo envs in its vector env; envpool: EnvPool's C++ thread pool."""
    vectorization: Literal["sync", "async"] = "sync"
    """gymnasium backend: all copies in this process (sync) or one subprocess per copy (async)."""
    num_threads: int = 0
    """envpool backend: worker threads (0: EnvPool chooses from the number of envs and CPUs)."""
    render: bool = False
    """Send each copy's camera frame as images["render"]."""
    render_for_recorder_only: bool = False
    """Render only the frames the episode recorder keeps (--recorder.episode-freq K), for its images and videos;
    the policy gets no frames. For a policy that does not need images: other envs never render."""
    width: int = 128
    """Width of the rendered frames, in pixels."""
    height: int = 128
    """Height of the rendered frames, in pixels."""
    kwargs: str = "{}"
    """JSON object of task arguments, e.g. '{"ctrl_cost_weight": 0.05}' (Gymnasium's or EnvPool's names)."""


@register_env("MuJoCo-v1")
class MujocoEnv(BaseEnv[MujocoEnvConfig]):
    """Gymnasium's MuJoCo tasks (--env.task HalfCheetah-v5, Hopper-v5, ...) as a batch, on Gymnasium or EnvPool.

    The backend chosen by ``--env.backend`` does the work; this class only hands each call on to it.
    """

    def __init__(self, config: MujocoEnvConfig, num_envs: int = 1, **kwargs: Any) -> None:
        super().__init__(config, num_envs=num_envs, **kwargs)
        if config.render and config.render_for_recorder_only:
            raise ConfigError("--env.render sends every frame to the policy already; drop it to render only the "
                              "recorded episodes' frames with --env.render-for-recorder-only")
        if renders(config) and (config.width < 1 or config.height < 1):
            raise ConfigError(f"--env.width and --env.height must be >= 1, got {config.width} x {config.height}")
        self.frames_for_recorder = config.render_for_recorder_only
        self.backend: GymEnv | EnvPoolMujocoEnv
        if config.backend == "gymnasium":
            self.backend = gymnasium_backend(config, self.num_envs)
        elif config.backend == "envpool":
            self.backend = EnvPoolMujocoEnv(config, self.num_envs)
        else:
            raise ConfigError(f"--env.backend must be 'gymnasium' or 'envpool', got {config.backend!r}")
        self.single_action_space = self.backend.single_action_space
        self.metadata = {**self.metadata, "per_env_seeds": bool(self.backend.metadata.get("per_env_seeds", False))}

    def reset(self, *, seed: int | list[int | None] | None = None,
              options: dict[str, Any] | None = None) -> tuple[Observation, dict[str, Any]]:
        return self.backend.reset(seed=seed, options=options)  # type: ignore[arg-type]  # a list: the gymnasium one

    def step(self, actions: Action) -> tuple[Observation, RewardArray, BoolArray, BoolArray, dict[str, Any]]:
        return self.backend.step(actions)

    def render_frames(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        """The current frames of the copies ``rows``, for the recorder (``--env.render-for-recorder-only``)."""
        return self.backend.render_frames(rows)

    def close_extras(self, **kwargs: Any) -> None:
        backend = getattr(self, "backend", None)
        if backend is not None:
            backend.close()


# ------------------------------------------------------------------------------------------------ gymnasium backend


def gymnasium_backend(config: MujocoEnvConfig, num_envs: int) -> GymEnv:
    """Gym-v1 on the task, with the frame size passed to the task's constructor when rendering."""
    require_mujoco()
    spec = resolve_gym_spec(config.task)
    if not str(spec.entry_point).startswith("gymnasium.envs.mujoco"):
        close = [t for t in close_gym_ids(config.task, n=20) if t in gymnasium_mujoco_tasks()][:5]
        hint = f" Did you mean {', '.join(repr(t) for t in close)}?" if close else ""
        raise ConfigError(f"{spec.id!r} is not a Gymnasium MuJoCo task.{hint} MuJoCo tasks: "
                          f"{', '.join(gymnasium_mujoco_tasks())} (run other Gymnasium envs with gym-v1)")
    task_kwargs = parse_kwargs(config.kwargs)
    if renders(config):
        task_kwargs = {"width": config.width, "height": config.height, **task_kwargs}
    gym_config = GymEnvConfig(id=spec.id, vectorization=config.vectorization, kwargs=json.dumps(task_kwargs),
                              render=config.render, render_for_recorder_only=config.render_for_recorder_only)
    env = GymEnv(gym_config, num_envs=num_envs)
    env.render_cost.smaller = SMALLER_FRAMES  # the frame size is this env's flags, not Gym-v1's --env.kwargs
    return env


def renders(config: MujocoEnvConfig) -> bool:
    """Whether the envs are made able to render: for the policy (--env.render) or for the recorder."""
    return config.render or config.render_for_recorder_only


def gymnasium_mujoco_tasks() -> list[str]:
    """Ids of the MuJoCo tasks registered with Gymnasium."""
    return sorted(k for k, s in gym.registry.items()
                  if isinstance(s.entry_point, str) and s.entry_point.startswith("gymnasium.envs.mujoco"))


def require_mujoco() -> None:
    """Import mujoco (a ConfigError naming the extra when it is missing) and route its warnings to the log."""
    try:
        import mujoco
    except ImportError as exc:
        raise ConfigError(f"MuJoCo-v1 with --env.backend gymnasium needs the mujoco package ({exc}): {MUJOCO_EXTRA}") from None
    # MuJoCo prints compiler warnings (e.g. a deprecated attribute in a task's XML) to stderr once per model, which
    # is once per copy; keep one line per distinct warning in the run's log instead. A handler set by the user stays.
    if mujoco.get_mju_user_warning() is None:
        mujoco.set_mju_user_warning(_log_mujoco_warning)


_MUJOCO_WARNINGS_SEEN: set[str] = set()


def _log_mujoco_warning(message: str) -> None:
    if message not in _MUJOCO_WARNINGS_SEEN:
        _MUJOCO_WARNINGS_SEEN.add(message)
        logger.info("MuJoCo warning: %s", message)


# ------------------------------------------------------------------------------------------------ envpool backend


class EnvPoolMujocoEnv(BaseEnv[MujocoEnvConfig]):
    """A MuJoCo task on EnvPool, with explicit resets only (see the module docstring)."""

    def __init__(self, config: MujocoEnvConfig, num_envs: int = 1, **kwargs: Any) -> None:
        super().__init__(config, num_envs=num_envs, **kwargs)
        self.envpool = import_envpool(render=renders(config))
        self.render_cost = RenderCost(f"{config.task} (EnvPool)", SMALLER_FRAMES, config.render_for_recorder_only)
        self.task = envpool_task(config.task, envpool_mujoco_tasks(self.envpool))
        self.make_kwargs = parse_kwargs(config.kwargs)
        if config.num_threads:
            self.make_kwargs["num_threads"] = config.num_threads
        if renders(config):
            self.make_kwargs.update(render_mode="rgb_array", render_width=config.width, render_height=config.height)
        self.pool_seed = 0
        self.pool = self._make_pool(self.pool_seed)
        self.fresh = True  # the pool was made and not reset since: a reset with its seed need not make a new one
        # EnvPool declares float64 actions; Gymnasium's tasks (and so the policy's contract) use float32.
        space = self.pool.action_space
        self.single_action_space = gym.spaces.Box(space.low.astype(np.float32), space.high.astype(np.float32),
                                                  space.shape, np.float32)
        self.obs_dim = int(np.prod(self.pool.observation_space.shape))
        # The arrays below are replaced, never written into once handed out in an Observation.
        self._obs = np.zeros((self.num_envs, self.obs_dim), np.float32)
        self._frames: np.ndarray | None = None
        self._done = np.zeros(self.num_envs, dtype=bool)
        self._warned_seed = False

    def _make_pool(self, seed: int) -> Any:
        try:
            return self.envpool.make(self.task, env_type="gymnasium", num_envs=self.num_envs,
                                     batch_size=self.num_envs, seed=seed, **self.make_kwargs)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"EnvPool cannot make {self.task} with --env.kwargs {self.config.kwargs}: {exc}") from exc

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Observation, dict[str, Any]]:
        mask = self.reset_mask(options)
        if not mask.any():
            return self._observation(), {}
        if seed is not None and mask.all():
            if not (self.fresh and seed == self.pool_seed):
                self.pool.close()
                self.pool_seed = seed
                self.pool = self._make_pool(seed)
        elif seed is not None and not self._warned_seed:
            self._warned_seed = True
            logger.warning("EnvPool seeds its envs when the pool is made; the seed of a partial reset is ignored")
        self.fresh = False
        ids = np.flatnonzero(mask).astype(np.int32)
        obs, info = self.pool.reset(env_id=ids)
        rows = np.asarray(info["env_id"])
        new_obs = self._obs.copy()
        new_obs[rows] = np.asarray(obs, dtype=np.float32).reshape(len(rows), self.obs_dim)
        self._obs = new_obs
        self._done[rows] = False
        if self.config.render:
            frames = self._frames.copy() if self._frames is not None else self._render(np.arange(self.num_envs))
            frames[ids] = self._render(ids)
            self._frames = frames
        return self._observation(), {}

    def step(self, actions: Action) -> tuple[Observation, RewardArray, BoolArray, BoolArray, dict[str, Any]]:
        if self._done.any():
            raise RuntimeError(
                f"{self.task}: envs {np.flatnonzero(self._done).tolist()} finished on the previous step and were not "
                "reset; reset them with reset(options={'reset_mask': mask}) first (EnvPool would reset them inside "
                "this step)"
            )
        obs, rewards, terminated, truncated, info = self.pool.step(np.asarray(actions))
        order = np.argsort(np.asarray(info["env_id"]))  # rows in env order (EnvPool's sync mode already is)
        self._obs = np.asarray(obs, dtype=np.float32).reshape(self.num_envs, self.obs_dim)[order]
        terminated = np.asarray(terminated, dtype=bool)[order]
        truncated = np.asarray(truncated, dtype=bool)[order]
        self._done = terminated | truncated
        if self.config.render:
            self._frames = self._render(np.arange(self.num_envs))
        step_info = {k: np.asarray(v)[order] for k, v in info.items()
                     if k not in ("env_id", "players") and np.ndim(v) >= 1 and len(v) == self.num_envs}
        return self._observation(), np.asarray(rewards, dtype=np.float32)[order], terminated, truncated, step_info

    def render_frames(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        """The current frames of the envs ``rows``, for the recorder (``--env.render-for-recorder-only``)."""
        return {RENDER_KEY: self._render(np.asarray(rows, dtype=np.intp).reshape(-1))}

    def close_extras(self, **kwargs: Any) -> None:
        pool = getattr(self, "pool", None)
        if pool is not None:
            pool.close()

    def _observation(self) -> Observation:
        images = {RENDER_KEY: self._frames} if self._frames is not None else {}
        return Observation(images=images, states={"obs": self._obs})

    def _render(self, ids: np.ndarray) -> np.ndarray:
        start = time.perf_counter()
        frames = self.pool.render(env_ids=np.asarray(ids, dtype=np.int32))
        out = np.asarray(frames, dtype=np.uint8).reshape(len(ids), self.config.height, self.config.width, -1)
        self.render_cost.add(out, time.perf_counter() - start)
        return out


def import_envpool(render: bool = False) -> ModuleType:
    """``import envpool``, after loading the system libEGL when envpool is not imported yet (see the module
    docstring); a ConfigError naming the extra when envpool is missing."""
    if "envpool" not in sys.modules:
        _load_system_egl()
    elif render and _system_egl_loaded() is False:
        raise ConfigError(
            "envpool was imported before the system libEGL was loaded, and MuJoCo would abort the process on the "
            "first EnvPool render; build MuJoCo-v1 before importing envpool yourself, or render with --env.backend "
            "gymnasium"
        )
    try:
        import envpool
    except ImportError as exc:
        raise ConfigError(f"MuJoCo-v1 with --env.backend envpool needs the envpool package ({exc}): {ENVPOOL_EXTRA}") from None
    return envpool


def _load_system_egl() -> None:
    path = ctypes.util.find_library("EGL")
    if path is None:
        return  # no EGL on this machine: EnvPool can still step, only rendering will fail
    try:
        ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    except OSError as exc:
        logger.info("could not load %s (%s); EnvPool rendering may fail", path, exc)


def _system_egl_loaded() -> bool | None:
    """Whether a library named ``libEGL.so*`` is mapped into this process (None: cannot tell on this OS)."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    return any(os.path.basename(line.split()[-1]).startswith("libEGL.so") for line in maps.splitlines() if "/" in line)


def envpool_mujoco_tasks(envpool: ModuleType) -> list[str]:
    """EnvPool's Gymnasium-style MuJoCo task ids (HalfCheetah-v4, Hopper-v5, ...)."""
    registry = getattr(getattr(envpool, "registration", None), "registry", None)
    specs = getattr(registry, "specs", None)
    if isinstance(specs, dict):
        return sorted(k for k, v in specs.items() if v and v[0] == "envpool.mujoco.gym")
    return sorted(envpool.list_all_envs())


_VERSIONED = re.compile(r"^(?P<name>.+)-v(?P<version>\d+)$")


def envpool_task(task: str, available: Sequence[str]) -> str:
    """EnvPool's id for the Gymnasium task ``task``: the same id when EnvPool has it; else EnvPool's closest version
    of that task (the highest below the one asked for, else the lowest above it), with a warning; else a
    ConfigError naming the tasks EnvPool has."""
    if task in available:
        return task
    asked = _VERSIONED.match(task)
    if asked is not None:
        versions = sorted(int(m["version"]) for t in available if (m := _VERSIONED.match(t)) and m["name"] == asked["name"])
        if versions:
            want = int(asked["version"])
            below = [v for v in versions if v < want]
            chosen = f"{asked['name']}-v{below[-1] if below else versions[0]}"
            logger.warning("EnvPool has no %s; using its %s instead", task, chosen)
            return chosen
    raise ConfigError(f"EnvPool has no MuJoCo task {task!r}; it has: {', '.join(sorted(available))}")
