"""Gym-v1: any environment registered with Gymnasium, run as ``num_envs`` copies.

``plugrl-run-env-client gym-v1 --env.id CartPole-v1 --num-envs 8 --num-episodes 10 --local-policy random``

The batching is Gymnasium's own. ``gymnasium.make_vec`` with ``AutoresetMode.DISABLED`` builds a sync vector env
(every copy in this process) or an async one (one subprocess per copy). Both already seed copy ``i`` with
``seed + i`` and reset only the copies a ``reset_mask`` selects, keeping the other rows as they were, which is
the reset contract of :class:`~plugrl_env_client.envs.base_env.BaseEnv`. This module adds only what Gymnasium
does not do: it turns Gymnasium observations into an :class:`Observation`, and turns a wrong env id or bad
constructor arguments into an error that says what to change.

How an observation maps (``name`` is ``obs`` for a space that is not a Dict, else the Dict key, ``outer.inner``
for nested Dicts, ``name.0``, ``name.1``, ... for Tuples):

* a uint8 Box of shape (h, w, c) with c in 1, 3, 4 goes to ``images[name]``;
* any other Box goes to ``states[name]``: float32 for a float Box, the Box's own dtype for integer and bool Boxes;
* Discrete, MultiDiscrete and MultiBinary go to ``states[name]`` as integers. Scalar ones (Discrete, a 0-d Box)
  get shape (n, 1), so every state is at least (n, d);
* Text goes to ``text``.

The inner env's own time limit (the TimeLimit of its registration) shows up as ``truncated``. Gym-v1 registers no
time limit of its own. ``--env.render`` adds each copy's ``render()`` frame as ``images["render"]``. The step
info is Gymnasium's vector info (an array per key, with a ``_key`` mask of the copies that reported it); an
``is_success`` key, the Gymnasium convention, is also given as ``success``, which the client counts.

Rendering without a display: :func:`headless_rendering` picks an OpenGL platform (``MUJOCO_GL=egl``) before the
env's package is imported, since some packages (dm_control, and so gym-aloha and Shimmy's dm_control envs) choose
theirs when they are imported. Rendering on the CPU (Mesa's software EGL on a machine without a GPU) can cost tens
of milliseconds per frame: :class:`RenderCost` measures it and warns once per run when a frame costs more than
:data:`SLOW_FRAME_S`, with the cost and what makes it cheaper.

Frames for the recorder only: with ``--env.render-for-recorder-only`` the envs are made able to render, but their
observations carry no frames (the policy gets none, the wire carries none); the episode recorder asks for the
frames of the envs whose episodes it records, step by step, through :meth:`GymEnv.render_frames`, so only those
envs pay for rendering (with ``--recorder.episode-freq 10``, a tenth of the episodes). The copies of an async
vector env render all together, so there every copy pays whenever one is recorded.
"""

from __future__ import annotations

import ctypes.util
import dataclasses
import difflib
import importlib
import json
import logging
import os
import threading
import time
from collections.abc import Sequence
from typing import Any, Literal

import gymnasium as gym
import numpy as np
from gymnasium.envs.registration import EnvSpec
from gymnasium.vector import AutoresetMode

from plugrl_env_client.envs.base_env import Action, BaseEnv, BaseEnvConfig, BoolArray, Observation, RewardArray
from plugrl_env_client.envs.registry import register_env, register_env_config
from plugrl_env_client.errors import ConfigError

logger = logging.getLogger(__name__)


class OncePerRun(logging.Filter):
    """Lets a record logged with ``extra={"once": key}`` through the first time ``key`` comes by, and drops the
    others; records without a key pass.

    On a module's logger it makes a warning once per run, whichever process logs it: each rollout process logs it
    once, and the launching process hands the records its processes forward to the logger of the same name
    (:class:`~plugrl_env_client.launch.reports.LogReport`), whose filter lets the first one through.
    """

    def __init__(self) -> None:
        super().__init__()
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        key = getattr(record, "once", None)
        if key is None:
            return True
        with self._lock:
            if key in self._seen:
                return False
            self._seen.add(key)
            return True


logger.addFilter(OncePerRun())

Vectorization = Literal["sync", "async"]

IMAGE_CHANNELS = (1, 3, 4)
"""Channel counts that make a uint8 (h, w, c) Box an image rather than a state."""

RENDER_KEY = "render"
"""``images`` key of the frames ``--env.render`` adds."""

SLOW_FRAME_S = 0.010
"""A rendered frame that costs more than this (10 ms; a GPU renders a 128x128 MuJoCo frame in well under 1 ms, a
CPU in about 70) is worth a warning: at 8 envs it is already most of a step's time."""
RENDER_SAMPLE = (5, 0.5)
""":class:`RenderCost` judges the cost over its first renders after the first one: 5 of them, or 0.5 s of them."""


class RenderCost:
    """The measured cost of an env's frames, and one warning per run when it is high (see the module docstring).

    The first render is not counted (it makes the renderer: the OpenGL context, the buffers); the next ones are,
    until :data:`RENDER_SAMPLE` is reached, then the cost per frame is judged once. ``smaller`` says how to ask the
    env for smaller frames (the flags of the env at hand).
    """

    def __init__(self, env_id: str, smaller: str, for_recorder_only: bool = False) -> None:
        self.env_id, self.smaller, self.for_recorder_only = env_id, smaller, for_recorder_only
        self.calls = self.frames = 0
        self.seconds = 0.0
        self.judged = False

    def add(self, frames: np.ndarray, seconds: float) -> None:
        """One render call that made ``frames`` (k, h, w, c) in ``seconds``."""
        self.calls += 1
        if self.judged or self.calls == 1:
            return
        self.frames += len(frames)
        self.seconds += seconds
        calls, budget = RENDER_SAMPLE
        if self.calls - 1 >= calls or self.seconds >= budget:
            self.judged = True
            self._judge(frames.shape[1:3])

    @property
    def per_frame_s(self) -> float:
        return self.seconds / self.frames if self.frames else 0.0

    def _judge(self, size: tuple[int, ...]) -> None:
        per_frame = self.per_frame_s
        logger.info("%s: rendering costs %.1f ms per %s frame", self.env_id, per_frame * 1e3, "x".join(map(str, size)))
        if per_frame <= SLOW_FRAME_S:
            return
        gl = f", MUJOCO_GL={os.environ['MUJOCO_GL']}" if os.environ.get("MUJOCO_GL") else ""
        advice = ("each step of a recorded episode waits for its frame; record fewer episodes (a larger "
                  "--recorder.episode-freq) or" if self.for_recorder_only else
                  "with --env.render the envs spend most of their time drawing. When the policy does not need "
                  "images, leave --env.render off (--env.render-for-recorder-only renders only the episodes the "
                  "recorder keeps); otherwise")
        logger.warning("%s: rendering costs %.0f ms per frame here (%s pixels%s, measured over %d frame%s): %s ask "
                       "for smaller frames (%s)", self.env_id, per_frame * 1e3, "x".join(map(str, size)), gl,
                       self.frames, "" if self.frames == 1 else "s", advice, self.smaller, extra={"once": "render-cost"})


@register_env_config("Gym-v1")
@dataclasses.dataclass
class GymEnvConfig(BaseEnvConfig):
    id: str = "Pendulum-v1"
    """Gymnasium env id; package:Env-v0 imports package first (e.g. gym_pusht:gym_pusht/PushT-v0)."""
    vectorization: Literal["sync", "async"] = "sync"
    """sync: all copies in this process, stepped one after another; async: one subprocess per copy (for envs
    whose step is slow enough to pay for the inter-process traffic)."""
    kwargs: str = "{}"
    """JSON object of keyword arguments for the env's constructor, e.g. '{"g": 9.81}'."""
    render: bool = False
    """Make the envs with render_mode="rgb_array" and send each copy's frame as images["render"]."""
    render_for_recorder_only: bool = False
    """Render only the frames the episode recorder keeps (--recorder.episode-freq K), for its images and videos;
    the policy gets no frames. For a policy that does not need images: other envs never render."""


@register_env("Gym-v1")
class GymEnv(BaseEnv[GymEnvConfig]):
    """Any registered Gymnasium env (--env.id Pendulum-v1, CartPole-v1, ...) as a batch of copies."""

    metadata = {**BaseEnv.metadata, "per_env_seeds": True}  # Gymnasium's vector reset takes a list of seeds

    def __init__(self, config: GymEnvConfig, num_envs: int = 1, **kwargs: Any) -> None:
        super().__init__(config, num_envs=num_envs, **kwargs)
        if config.render and config.render_for_recorder_only:
            raise ConfigError("--env.render sends every frame to the policy already; drop it to render only the "
                              "recorded episodes' frames with --env.render-for-recorder-only")
        headless_rendering()  # before the env's package is imported: some choose their OpenGL platform on import
        spec = resolve_gym_spec(config.id)
        env_kwargs = parse_kwargs(config.kwargs)
        if config.render or config.render_for_recorder_only:
            env_kwargs["render_mode"] = "rgb_array"
        self.gym_id = spec.id
        self.frames_for_recorder = config.render_for_recorder_only
        """Whether the recorder is to ask :meth:`render_frames` for its frames (they are not in the observations)."""
        self.render_cost = RenderCost(spec.id, 'the env\'s size arguments in --env.kwargs, e.g. \'{"width": 64, '
                                               '"height": 64}\' for MuJoCo tasks', config.render_for_recorder_only)
        self.vector_env = make_vector_env(spec, self.num_envs, config.vectorization, env_kwargs, config.kwargs)
        try:
            self.single_action_space = check_action_space(spec.id, self.vector_env.single_action_space)
            self.layout = observation_layout(spec.id, self.vector_env.single_observation_space)
        except BaseException:
            self.vector_env.close()
            raise
        self._last: Observation | None = None
        self._frames: np.ndarray | None = None  # replaced, never written into once handed out
        self._done = np.zeros(self.num_envs, dtype=bool)

    def reset(self, *, seed: int | list[int | None] | None = None,
              options: dict[str, Any] | None = None) -> tuple[Observation, dict[str, Any]]:
        mask = self.reset_mask(options)
        # Other options (e.g. an env's own "reset_to_state") go on to the inner envs' reset.
        inner = {k: v for k, v in (options or {}).items() if k not in ("reset_mask", "reset_indices")}
        if self._last is not None and not mask.any():
            return self._last.select(np.arange(self.num_envs)), {}
        if self._last is None or mask.all():
            mask[:] = True
            obs, info = self.vector_env.reset(seed=seed, options=inner or None)  # type: ignore[arg-type]  # lists too
        else:
            # Gymnasium keeps the rows of copies outside the mask, in both the sync and the async vector env.
            obs, info = self.vector_env.reset(seed=seed, options={**inner, "reset_mask": mask})  # type: ignore[arg-type]
        self._done[mask] = False
        if self.config.render:
            self._frames = self._rendered(mask)
        self._last = self._observe(obs)
        return self._last, info

    def step(self, actions: Action) -> tuple[Observation, RewardArray, BoolArray, BoolArray, dict[str, Any]]:
        if self._done.any():
            raise RuntimeError(
                f"{self.gym_id}: envs {np.flatnonzero(self._done).tolist()} finished on the previous step and were "
                "not reset; reset them with reset(options={'reset_mask': mask}) before stepping again (this env "
                "never resets inside step)"
            )
        obs, rewards, terminated, truncated, info = self.vector_env.step(actions)
        terminated = np.asarray(terminated, dtype=bool)
        truncated = np.asarray(truncated, dtype=bool)
        self._done = terminated | truncated
        if self.config.render:
            self._frames = self._rendered(None)
        if "is_success" in info and "success" not in info:  # the Gymnasium convention, under the client's name
            info["success"] = np.asarray(info["is_success"], dtype=bool)
        self._last = self._observe(obs)
        return self._last, np.asarray(rewards, dtype=np.float32), terminated, truncated, info

    def close_extras(self, **kwargs: Any) -> None:
        """Close the inner vector env (``close()`` runs this once; a second ``close()`` does nothing)."""
        vector_env = getattr(self, "vector_env", None)
        if vector_env is not None:
            vector_env.close()

    def _observe(self, obs: Any) -> Observation:
        observation = translate_observation(self.layout, obs, self.num_envs)
        if self._frames is not None:
            observation.images[RENDER_KEY] = self._frames
        return observation

    def render_frames(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        """``{"render": frames}``: the current frames of the copies ``rows`` (batch rows), uint8 (k, h, w, 3); for
        the recorder, with ``--env.render-for-recorder-only`` (see the module docstring)."""
        rows = np.asarray(rows, dtype=np.intp).reshape(-1)
        return {RENDER_KEY: self._render_copies(rows) if rows.size else np.zeros((0, 0, 0, 3), np.uint8)}

    def _rendered(self, rows: np.ndarray | None) -> np.ndarray:
        """A new frame batch: fresh frames for the copies in ``rows`` (a bool mask; all when None), the previous
        frames for the others, so the rows of copies that were not reset stay unchanged."""
        if rows is None or self._frames is None or rows.all():
            return self._render_copies(np.arange(self.num_envs))
        idx = np.flatnonzero(rows)
        frames = self._frames.copy()
        frames[idx] = self._render_copies(idx)
        return frames

    def _render_copies(self, idx: np.ndarray) -> np.ndarray:
        """Fresh frames of the copies ``idx``, in that order (timed, for :class:`RenderCost`)."""
        start = time.perf_counter()
        if np.array_equal(idx, np.arange(self.num_envs)):
            frames = _stack_frames(self.gym_id, self.vector_env.render(), idx)
        elif isinstance(self.vector_env, gym.vector.SyncVectorEnv):
            frames = _stack_frames(self.gym_id, [self.vector_env.envs[i].render() for i in idx], idx)
        else:  # AsyncVectorEnv renders every copy (one call per worker)
            every = self.vector_env.render() or ()
            frames = _stack_frames(self.gym_id, [every[i] for i in idx], idx)
        self.render_cost.add(frames, time.perf_counter() - start)
        return frames


# ------------------------------------------------------------------------------------------------ building


def resolve_gym_spec(env_id: str) -> EnvSpec:
    """The Gymnasium spec of ``env_id``; a ConfigError naming close matches when Gymnasium has no such env.

    ``package:Env-v0`` imports ``package`` first, as ``gymnasium.make`` does. For ``namespace/Env-v0`` whose
    namespace is not registered yet, a module named like the namespace is imported when one exists (packages such as
    ``gym_pusht`` register their envs on import under their own name).
    """
    module, _, name = env_id.rpartition(":")
    if module:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ConfigError(
                f"--env.id {env_id!r} names the module {module!r}, which cannot be imported ({exc}); install the "
                "package that provides it"
            ) from None
    namespace = name.split("/", 1)[0] if "/" in name else None
    if namespace and not any(s.namespace == namespace for s in gym.registry.values()):
        try:
            importlib.import_module(namespace)
        except ImportError:
            pass  # the lookup below reports the id
    try:
        spec = gym.spec(name)
    except gym.error.Error as exc:
        close = close_gym_ids(name)
        hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        raise ConfigError(
            f"Gymnasium has no env {name!r} ({exc}).{hint} `python -c \"import gymnasium; "
            "gymnasium.pprint_registry()\"` lists the registered ids; an env from another package needs "
            "--env.id package:Env-v0 so that the package is imported first"
        ) from None
    if spec.entry_point is None:
        raise ConfigError(
            f"Gymnasium env {spec.id!r} has no single-env entry point (only a vector one), so gymnasium.make cannot "
            f"build its copies; if it is a PlugRL env, run it directly: plugrl-run-env-client {spec.id.lower()}"
        )
    return spec


def close_gym_ids(name: str, n: int = 5) -> list[str]:
    """Registered Gymnasium ids that ``gymnasium.make`` can build and that look like ``name`` (any case)."""
    by_lower = {k.lower(): k for k, s in gym.registry.items() if s.entry_point is not None}
    return [by_lower[m] for m in difflib.get_close_matches(name.lower(), list(by_lower), n=n, cutoff=0.6)]


def parse_kwargs(text: str, flag: str = "--env.kwargs") -> dict[str, Any]:
    """The JSON object of constructor arguments given as ``flag``."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{flag} is not valid JSON ({exc.msg} at position {exc.pos}): {text!r}; pass a JSON object such as "
            "'{\"g\": 9.81}' (single quotes around it in the shell)"
        ) from None
    if not isinstance(value, dict):
        raise ConfigError(f"{flag} must be a JSON object (keyword arguments by name), got {text!r}")
    return value


def make_vector_env(
    spec: EnvSpec, num_envs: int, vectorization: str, env_kwargs: dict[str, Any], kwargs_text: str = "{}"
) -> gym.vector.VectorEnv:
    """Gymnasium's sync or async vector env of ``num_envs`` copies; the caller resets (``AutoresetMode.DISABLED``).

    ``copy=False``: the observations this module hands out are its own copies (see :func:`translate_observation`),
    so letting Gymnasium copy them first as well would copy every observation twice. The async workers start
    with ``forkserver``: the client runs threads (the embedded policy server, the progress display) and forking
    a process that has threads can deadlock the child.
    """
    if vectorization not in ("sync", "async"):
        raise ConfigError(f"--env.vectorization must be 'sync' or 'async', got {vectorization!r}")
    vector_kwargs: dict[str, Any] = {"autoreset_mode": AutoresetMode.DISABLED, "copy": False}
    if vectorization == "async":
        vector_kwargs["context"] = "forkserver"
    try:
        return gym.make_vec(spec, num_envs=num_envs, vectorization_mode=vectorization, vector_kwargs=vector_kwargs,
                            **env_kwargs)
    except TypeError as exc:
        raise ConfigError(f"{spec.id} cannot be built with --env.kwargs {kwargs_text}: {exc}") from exc
    except gym.error.Error as exc:
        raise ConfigError(f"{spec.id} cannot be built: {exc}") from exc


def headless_rendering() -> dict[str, str]:
    """Environment defaults that let ``render_mode="rgb_array"`` work without a display; returns what was set.

    Only when there is no display, and never over a value the user set: ``SDL_VIDEODRIVER=dummy`` for envs that
    draw with pygame (classic control, PushT), and ``MUJOCO_GL=egl`` for MuJoCo envs (``osmesa`` when there is
    no EGL library; MuJoCo's default, GLFW, needs a display). Set before the env's package is imported (dm_control
    picks its OpenGL platform when it is imported, and gym-aloha renders its camera in every step, ``--env.render``
    or not) and before the envs are made, so async workers inherit them.
    """
    if os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"):
        return {}
    chosen: dict[str, str] = {}
    if "SDL_VIDEODRIVER" not in os.environ:
        chosen["SDL_VIDEODRIVER"] = "dummy"
    if "MUJOCO_GL" not in os.environ:
        backend = next((name for name, lib in (("egl", "EGL"), ("osmesa", "OSMesa")) if ctypes.util.find_library(lib)),
                       None)
        if backend is not None:
            chosen["MUJOCO_GL"] = backend
    os.environ.update(chosen)
    if chosen:
        logger.info("no display: rendering with %s", ", ".join(f"{k}={v}" for k, v in chosen.items()))
    return chosen


def check_action_space(env_id: str, space: gym.Space) -> gym.Space:
    """The inner env's action space, if the wire protocol can carry it (one array per env and step)."""
    if isinstance(space, (gym.spaces.Box, gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary)):
        return space
    raise ConfigError(
        f"{env_id} has the action space {space}, which cannot be sent as one array per env; wrap the env so that "
        "its action is one Box, Discrete, MultiDiscrete or MultiBinary space, and register the wrapped env"
    )


# ------------------------------------------------------------------------------------------------ observations


@dataclasses.dataclass(frozen=True)
class Leaf:
    """Where one leaf of the observation space lives in a batched observation, and where it goes."""

    path: tuple[str | int, ...]
    """Dict keys and Tuple indices from the batched observation down to this leaf's array."""
    kind: Literal["image", "state", "text"]
    name: str
    dtype: np.dtype | None = None
    """dtype of a state as sent (float32 for float Boxes)."""


def observation_layout(env_id: str, space: gym.Space) -> list[Leaf]:
    """The leaves of ``space`` and where each goes in an :class:`Observation` (see the module docstring)."""
    leaves: list[Leaf] = []
    _walk(env_id, space, (), "obs" if not isinstance(space, gym.spaces.Dict) else "", leaves)
    texts = [leaf.name for leaf in leaves if leaf.kind == "text"]
    if len(texts) > 1:
        raise ConfigError(f"{env_id} observes several Text spaces ({', '.join(texts)}); an Observation carries one "
                          "text per env: wrap the env to join them")
    return leaves


def _walk(env_id: str, space: gym.Space, path: tuple[str | int, ...], name: str, out: list[Leaf]) -> None:
    if isinstance(space, gym.spaces.Dict):
        for key, sub in space.spaces.items():
            _walk(env_id, sub, (*path, key), f"{name}.{key}" if name else str(key), out)
    elif isinstance(space, gym.spaces.Tuple):
        for i, sub in enumerate(space.spaces):
            _walk(env_id, sub, (*path, i), f"{name}.{i}", out)
    elif isinstance(space, gym.spaces.Text):
        out.append(Leaf(path, "text", name))
    elif isinstance(space, gym.spaces.Box) and _is_image(space):
        out.append(Leaf(path, "image", name, np.dtype(np.uint8)))
    elif isinstance(space, gym.spaces.Box):
        dtype = np.dtype(space.dtype)
        out.append(Leaf(path, "state", name, np.dtype(np.float32) if dtype.kind == "f" else dtype))
    elif isinstance(space, (gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary)):
        out.append(Leaf(path, "state", name, np.dtype(space.dtype)))
    else:
        raise ConfigError(f"{env_id}: the observation space {space} (at {name!r}) cannot be sent as arrays or text; "
                          "wrap the env so that it observes Box, Discrete, MultiDiscrete, MultiBinary, Text, Dict or "
                          "Tuple spaces")


def _is_image(space: gym.spaces.Box) -> bool:
    return space.dtype == np.uint8 and len(space.shape) == 3 and space.shape[-1] in IMAGE_CHANNELS


def translate_observation(layout: Sequence[Leaf], obs: Any, num_envs: int) -> Observation:
    """A batched Gymnasium observation as an :class:`Observation` of fresh arrays (never views of ``obs``,
    whose buffers the vector env overwrites on its next call)."""
    images: dict[str, np.ndarray] = {}
    states: dict[str, np.ndarray] = {}
    text: np.ndarray | None = None
    for leaf in layout:
        value = obs
        for key in leaf.path:
            value = value[key]
        if leaf.kind == "text":
            text = np.array([str(s) for s in value])
        elif leaf.kind == "image":
            images[leaf.name] = np.array(value, dtype=np.uint8)
        else:
            arr = np.array(value, dtype=leaf.dtype)
            states[leaf.name] = arr.reshape(num_envs, 1) if arr.ndim == 1 else arr
    return Observation(images=images, states=states, text=text)


def _stack_frames(env_id: str, frames: Any, rows: Any) -> np.ndarray:
    """``render()`` results as one uint8 (k, h, w, 3) array; a copy that returns no frame is a ConfigError."""
    checked = []
    for i, frame in zip(rows, frames or ()):
        if not (isinstance(frame, np.ndarray) and frame.ndim == 3):
            raise ConfigError(f"{env_id} copy {i} returned {type(frame).__name__} from render() with "
                              "render_mode='rgb_array' instead of an (h, w, 3) image; this env cannot be rendered, "
                              "drop --env.render")
        checked.append(frame)
    if not checked:
        raise ConfigError(f"{env_id} returned no frames from render(); this env cannot be rendered, drop --env.render")
    return np.stack(checked).astype(np.uint8, copy=False)
