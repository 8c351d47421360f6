"""GEM-v1: any GEM env (the ``gem-llm`` package), ``num_envs`` copies stepped as one batched env.

``plugrl-run-env-client gem-v1 --env.env-id game:GuessTheNumber-v0-easy --num-envs 8 --local-policy text`` builds
eight ``gem.make(env_id, **env_kwargs)`` envs. Actions are text (a ``gymnasium.spaces.Text`` space); each sub-env
gets its row as a ``str``.

Observations:

* a ``str`` becomes the env's ``text``;
* an RGB numpy array (``(h, w, 3)``, or grayscale/RGBA, converted) becomes ``images["image"]``;
* a dict becomes text from its ``prompt`` (or ``problem`` / ``question`` / ``text``) and ``images["image"]`` from the
  *first* frame of its ``image`` / ``images`` / ``video`` list (PIL images or arrays). Limits: one frame per env;
  every env's frames must share one size (a frame of another size is an EnvContractError); an env whose current
  observation has no frame shows zeros; ``images`` appears once the first frame was seen and stays;
* ``None`` from ``reset`` (GEM's way of saying a dataset has no episode left): the row's text is empty, its
  frame zeros, and ``info["no_episode"]`` marks it; such an env is never stepped again (its step rows are empty,
  reward 0, not done) until a reset gives it an episode;
* anything else becomes ``str(obs)``.

GEM's ``suffix`` and ``prefix`` (from a call's info) are placed as GEM's own observation wrapper places them around
an episode's transcript: the suffix (e.g. "Enter your next guess.") is appended to that call's observation text
(after a newline); the prefix goes before the whole episode, so a reset's prefix becomes that env's
``info["env_instruction"]`` (a '<U' array, one str per env, "" when GEM gives none), which a runner puts before the
episode's first observation. A prefix in a step's info is not repeated.

Step info: ``action_is_valid`` (bool per env) and ``metrics`` with ``metrics_agg_mode``:

* ``success`` (max): on an episode's last step, GEM's ``info["correct"]`` when it reports one, else whether the
  episode's summed reward reached ``--env.success-return`` (GEM's games pay 1.0 in total for a win);
* ``action_is_valid`` (mean) and ``format_errors`` (sum): GEM reports no validity, but its envs answer an
  unparsable action with the reward ``-0.1`` (``--env.format-error-reward``); that reward marks a format error
  (a bool ``action_is_valid`` in GEM's info wins when present);
* ``turns`` (last): steps of the episode so far;
* every GEM info value that is a finite number or bool (e.g. ``tool_use_counter``), as float64, agg ``last``; a key
  is kept from the first step it appears on (0 in rows that do not report it). Strings and other values are not
  passed on (``suffix`` is already in the text).

Randomness: GEM envs seed Python's ``random`` and numpy's legacy ``np.random`` in ``reset(seed)`` and draw from
them later, so n envs in one process would share (and disturb) one stream. With ``--env.rng-isolation all`` (the
default) each sub-env owns a saved ``random`` and ``np.random`` state, swapped in around every call into it
(construction, reset, step) under a process-wide lock: same seeds give the same episodes run to run, env i's
episodes do not depend on what the others do, and the process's own global state is left as it was. Reset seeds
are ``seed + i`` (mod 2**32) for env i, as ``gymnasium.vector`` and ``gem.make_vec`` do; later resets without a
seed continue each env's own stream. The swap copies both generators' states, about 0.1 ms per sub-env call
(nothing next to a language model's answer; ``off`` skips it).

Concurrency: ``--env.max-concurrent K`` steps the sub-envs on a pool of K threads (for slow steps, e.g. envs that
call tools); results are gathered in env order, whatever the thread timing. The global RNG state is process-wide,
so a per-env state cannot be swapped in for two calls running at once: K > 1 needs ``--env.rng-isolation reset``
(resets, where episodes draw their tasks, run one at a time with their own state; steps run concurrently on the
process's shared state, so in-episode randomness is not reproducible) or ``off`` (nothing swapped).
``--env.use-thread-lock`` holds one process-wide lock around every sub-env call, for envs that are not thread-safe;
it rules out K > 1.

``close()`` closes every sub-env exactly once (after the pool's running calls finished), also after a sub-env
raised and when a KeyboardInterrupt arrives while closing (the rest are closed, then it is re-raised); a second
``close()`` does nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import functools
import json
import logging
import math
import random
import string
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

import gymnasium as gym
import numpy as np

from plugrl_env_client.envs.base_env import Action, BaseEnv, BaseEnvConfig, BoolArray, Observation, RewardArray
from plugrl_env_client.envs.registry import register_env, register_env_config
from plugrl_env_client.errors import ConfigError, EnvContractError

logger = logging.getLogger(__name__)

MAX_ACTION_LENGTH = 1 << 20
"""The Text space's max_length: far beyond any model's answer (sub-envs get the whole string regardless)."""

OWN_METRICS = {"success": "max", "action_is_valid": "mean", "format_errors": "sum", "turns": "last"}
"""Metrics this env computes for every GEM env, with their episode aggregation."""

_RNG_LOCK = threading.RLock()
"""Held while a sub-env's RNG state is swapped into the process-wide ``random`` / ``np.random``."""
_ENV_LOCK = threading.RLock()
"""``--env.use-thread-lock``: one lock for every sub-env call in the process (GEM envs may share module state)."""

_TEXT_KEYS = ("prompt", "problem", "question", "text")
_FRAME_KEYS = ("image", "images", "video")


@register_env_config("GEM-v1")
@dataclasses.dataclass
class GemEnvConfig(BaseEnvConfig):
    env_id: str = "game:GuessTheNumber-v0-easy"
    """GEM env id passed to gem.make (list them: python -c 'import gem; gem.print_envs()')."""
    env_kwargs: str = "{}"
    """JSON object of keyword arguments for gem.make, e.g. '{"max_turns": 5}'."""
    use_thread_lock: bool = False
    """Hold one process-wide lock around every sub-env call (for envs that are not thread-safe)."""
    max_concurrent: int = 1
    """Step the sub-envs on a pool of this many threads (for slow steps); > 1 needs --env.rng-isolation reset/off."""
    rng_isolation: Literal["all", "reset", "off"] = "all"
    """Give each sub-env its own random/np.random state in every call (all), in construction and resets only (reset), or never (off)."""
    format_error_reward: float | None = -0.1
    """A step with exactly this reward counts as an invalid action (GEM's format penalty); None: never."""
    success_return: float = 1.0
    """An episode whose summed reward reaches this is a success (when GEM's info has no 'correct')."""


@dataclasses.dataclass
class _RngState:
    """One sub-env's saved ``random`` and ``np.random`` states."""

    py: Any
    np: Any

    @classmethod
    def fresh(cls) -> _RngState:
        """States from OS entropy: construction draws nothing from, and changes nothing in, the process's own."""
        return cls(random.Random().getstate(), np.random.RandomState().get_state())


def parse_env_kwargs(text: str) -> dict[str, Any]:
    """``--env.env-kwargs`` as a dict; malformed JSON or a non-object is a ConfigError showing the expected form."""
    example = """--env.env-kwargs '{"max_turns": 5}'"""
    try:
        value = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--env.env-kwargs is not valid JSON ({exc}): {text!r}; pass a JSON object, e.g. {example}") from None
    if not isinstance(value, dict):
        raise ConfigError(f"--env.env-kwargs must be a JSON object, got {type(value).__name__} {text!r}; e.g. {example}")
    return value


def import_gem() -> Any:
    """Import ``gem`` (its envs register on import), leaving the root logger as it was.

    ``gem`` calls ``logging.basicConfig`` when imported, which would attach a second stderr handler to the root
    logger of this process and print every record twice; the handlers and level it adds are removed again.
    """
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        import gem
        import gem.envs.registration
    except ImportError as exc:
        raise ConfigError(f'GEM-v1 needs the gem-llm package ({exc}); install it with: pip install "plugrl-env-client[gem]"') from exc
    finally:
        for handler in list(root.handlers):
            if handler not in handlers:
                root.removeHandler(handler)
        root.setLevel(level)
    return gem


def _note(exc: BaseException, text: str) -> None:
    if hasattr(exc, "add_note"):  # Python >= 3.11
        exc.add_note(text)


@register_env("GEM-v1", best_reward_threshold_for_success=1.0)
class GemEnv(BaseEnv[GemEnvConfig]):
    """Any GEM env (--env.env-id game:GuessTheNumber-v0-easy, ...) as a batch of copies, text actions in and out.

    The module docstring says how GEM's observations, infos and randomness map onto the batched env API."""

    metadata = {**BaseEnv.metadata, "per_env_seeds": True, "finite_episodes": True}

    def __init__(self, config: GemEnvConfig, num_envs: int = 1, **kwargs: Any) -> None:
        _check_config(config)
        env_kwargs = parse_env_kwargs(config.env_kwargs)
        super().__init__(config, num_envs=num_envs, **kwargs)
        self.single_action_space = gym.spaces.Text(max_length=MAX_ACTION_LENGTH, min_length=0, charset=string.printable)
        self._envs: list[Any] = []
        self._rng = [_RngState.fresh() for _ in range(self.num_envs)]
        self._pool: ThreadPoolExecutor | None = None
        gem = import_gem()
        _check_env_id(gem, config.env_id)
        isolate = config.rng_isolation != "off"
        try:
            with self._process_rng_kept(isolate):
                for i in range(self.num_envs):
                    self._envs.append(self._call(i, "make", lambda: _make(gem, config.env_id, env_kwargs), isolate))
        except BaseException:
            self.close_extras()
            raise
        if config.max_concurrent > 1:
            self._pool = ThreadPoolExecutor(config.max_concurrent, thread_name_prefix="gem-env")
        n = self.num_envs
        self._text = [""] * n
        self._instruction = [""] * n
        self._images: np.ndarray | None = None
        self._has_episode = np.zeros(n, dtype=bool)
        self._turns = np.zeros(n, dtype=np.int64)
        self._return = np.zeros(n, dtype=np.float64)
        self._gem_keys: dict[str, None] = {}  # GEM info keys passed on as metrics, in first-seen order

    @property
    def sub_envs(self) -> tuple[Any, ...]:
        """The GEM env objects, env i at index i (for inspection; call them only through this env)."""
        return tuple(self._envs)

    # ------------------------------------------------------------------------------------------ sub-env calls

    @contextlib.contextmanager
    def _process_rng_kept(self, isolate: bool) -> Iterator[None]:
        """With ``isolate``: hold the RNG lock for the block and give the process its own ``random`` / ``np.random``
        states back after it. Sub-env calls inside swap their states in and out (:meth:`_own_rng`); saving and
        restoring the process's states once per batch rather than once per call halves the cost of isolation."""
        if not isolate:
            yield
            return
        with _RNG_LOCK:
            outer_py, outer_np = random.getstate(), np.random.get_state()
            try:
                yield
            finally:
                random.setstate(outer_py)
                np.random.set_state(outer_np)

    @contextlib.contextmanager
    def _own_rng(self, i: int) -> Iterator[None]:
        """Sub-env ``i``'s saved states in ``random`` / ``np.random`` for the block (inside :meth:`_process_rng_kept`)."""
        random.setstate(self._rng[i].py)
        np.random.set_state(self._rng[i].np)
        try:
            yield
        finally:
            self._rng[i] = _RngState(random.getstate(), np.random.get_state())

    def _call(self, i: int, what: str, fn: Callable[[], Any], isolate: bool) -> Any:
        """``fn()`` for sub-env ``i`` under the configured lock and, with ``isolate``, its own RNG states (callers
        wrap ``isolate`` calls in :meth:`_process_rng_kept`); errors name the sub-env."""
        with contextlib.ExitStack() as stack:
            if self.config.use_thread_lock:
                stack.enter_context(_ENV_LOCK)
            if isolate:
                stack.enter_context(self._own_rng(i))
            try:
                return fn()
            except Exception as exc:
                _note(exc, f"raised by GEM sub-env {i} ({self.config.env_id!r}) in {what}")
                raise

    def _map(self, what: str, indices: Sequence[int], fn: Callable[[int], Any], isolate: bool) -> list[Any]:
        """``fn(i)`` for each index, results in index order; on the pool when there is one and calls may overlap."""
        def one(i: int) -> Any:
            return self._call(i, what, functools.partial(fn, i), isolate=isolate)

        if self._pool is not None and not isolate and len(indices) > 1:
            return list(self._pool.map(one, indices))
        with self._process_rng_kept(isolate):
            return [one(i) for i in indices]

    # ------------------------------------------------------------------------------------------ env API

    def reset(self, *, seed: int | list[int | None] | None = None,
              options: dict[str, Any] | None = None) -> tuple[Observation, dict]:
        self.seed_rngs(seed)
        indices = np.flatnonzero(self.reset_mask(options)).tolist()

        seeds = self.per_env_seeds(seed)

        def reset_one(i: int) -> Any:
            own = seeds[i]
            return self._envs[i].reset() if own is None else self._envs[i].reset(seed=own % 2**32)

        results = self._map("reset", indices, reset_one, isolate=self.config.rng_isolation != "off")
        for i, result in zip(indices, results):
            obs, info = result if isinstance(result, tuple) else (result, {})
            info = info if isinstance(info, dict) else {}
            self._has_episode[i] = obs is not None
            self._turns[i] = 0
            self._return[i] = 0.0
            prefix = info.get("prefix")
            self._instruction[i] = prefix if isinstance(prefix, str) else ""
            self._show(i, obs, info.get("suffix"))
        info_out = {"env_instruction": np.array(self._instruction, dtype=str), "no_episode": ~self._has_episode}
        return self._observe(), info_out

    def step(self, actions: Action) -> tuple[Observation, RewardArray, BoolArray, BoolArray, dict]:
        texts = np.asarray(actions, dtype=object).reshape(-1)
        n = self.num_envs
        if texts.shape[0] != n:
            raise ValueError(f"GEM-v1 got {texts.shape[0]} actions for {n} envs; pass one str per env")
        live = np.flatnonzero(self._has_episode).tolist()
        results = self._map("step", live, lambda i: self._envs[i].step(str(texts[i])),
                            isolate=self.config.rng_isolation == "all")
        reward = np.zeros(n, dtype=np.float32)
        terminated = np.zeros(n, dtype=bool)
        truncated = np.zeros(n, dtype=bool)
        success = np.zeros(n, dtype=bool)
        valid = np.zeros(n, dtype=bool)
        gem_values: dict[str, dict[int, float]] = {}
        for i, (obs, r, term, trunc, info) in zip(live, results):
            info = info if isinstance(info, dict) else {}
            r = float(r)
            if not math.isfinite(r):
                raise EnvContractError(f"GEM sub-env {i} ({self.config.env_id!r}) returned the reward {r}; rewards must be finite")
            reward[i], terminated[i], truncated[i] = r, bool(term), bool(trunc)
            self._turns[i] += 1
            self._return[i] += r
            valid[i] = self._is_valid(r, info)
            if terminated[i] or truncated[i]:
                correct = info.get("correct")
                success[i] = bool(correct) if isinstance(correct, (bool, np.bool_, int, np.integer)) else (
                    self._return[i] >= self.config.success_return - 1e-9)
            for key, value in info.items():
                if key in OWN_METRICS or not _is_number(value):
                    continue
                self._gem_keys.setdefault(str(key), None)
                gem_values.setdefault(str(key), {})[i] = float(value)
            self._show(i, obs, info.get("suffix"))
        metrics: dict[str, np.ndarray] = {
            "success": success,
            "action_is_valid": valid,
            "format_errors": (~valid & self._has_episode).astype(np.int64),
            "turns": self._turns.copy(),
        }
        agg = dict(OWN_METRICS)
        for key in self._gem_keys:
            column = np.zeros(n, dtype=np.float64)
            for i, value in gem_values.get(key, {}).items():
                column[i] = value
            metrics[key] = column
            agg[key] = "last"
        info_out = {"action_is_valid": valid.copy(), "metrics": metrics, "metrics_agg_mode": agg}
        return self._observe(), reward, terminated, truncated, info_out

    def close_extras(self, **kwargs: Any) -> None:
        """Close each sub-env once, after the pool's running calls finished; see the module docstring."""
        pool, self._pool = self._pool, None
        envs, self._envs = self._envs, []
        interrupt: BaseException | None = None
        if pool is not None:
            try:
                pool.shutdown(wait=True, cancel_futures=True)
            except KeyboardInterrupt as exc:
                interrupt = exc
        for i, env in enumerate(envs):
            close = getattr(env, "close", None)
            if not callable(close):
                continue
            try:
                self._call(i, "close", close, isolate=False)
            except KeyboardInterrupt as exc:  # close the others first; the interrupt is re-raised below
                interrupt = interrupt or exc
            except Exception:
                logger.warning("closing GEM sub-env %d (%r) failed", i, self.config.env_id, exc_info=True)
        if interrupt is not None:
            raise interrupt

    # ------------------------------------------------------------------------------------------ observations

    def _is_valid(self, reward: float, info: dict[str, Any]) -> bool:
        flag = info.get("action_is_valid")
        if isinstance(flag, (bool, np.bool_)):
            return bool(flag)
        penalty = self.config.format_error_reward
        return penalty is None or not math.isclose(reward, penalty, rel_tol=0.0, abs_tol=1e-9)

    def _show(self, i: int, obs: Any, suffix: Any) -> None:
        """Store sub-env ``i``'s observation as its text row (with GEM's suffix) and image row."""
        text, frame = _split_observation(obs)
        if isinstance(suffix, str) and suffix:
            text = (text if not text or text.endswith("\n") else text + "\n") + suffix
        self._text[i] = text
        if frame is not None and self._images is None:
            self._images = np.zeros((self.num_envs, *frame.shape), dtype=np.uint8)
        if self._images is None:
            return
        if frame is None:
            self._images[i] = 0
        elif frame.shape != self._images.shape[1:]:
            raise EnvContractError(
                f"GEM sub-env {i} ({self.config.env_id!r}) gave a frame of shape {frame.shape}, but GEM-v1 batches "
                f"frames of one size and holds {self._images.shape[1:]}; use envs (or a dataset) whose images share "
                "a size, or resize them in a GEM wrapper"
            )
        else:
            self._images[i] = frame

    def _observe(self) -> Observation:
        images = {"image": self._images.copy()} if self._images is not None else None
        return Observation(images=images, text=list(self._text))


def _check_config(config: GemEnvConfig) -> None:
    if config.max_concurrent < 1:
        raise ConfigError(f"--env.max-concurrent must be >= 1, got {config.max_concurrent}")
    if config.rng_isolation not in ("all", "reset", "off"):
        raise ConfigError(f"--env.rng-isolation must be all, reset or off, got {config.rng_isolation!r}")
    if config.max_concurrent > 1 and config.rng_isolation == "all":
        raise ConfigError(
            f"--env.max-concurrent {config.max_concurrent} runs sub-env steps at the same time, but Python's random and "
            "numpy's np.random state is one per process, so each sub-env cannot have its own during overlapping "
            "calls (--env.rng-isolation all). Pass --env.rng-isolation reset (resets keep their own state and run one "
            "at a time; steps run concurrently and share the process's state) or off, or use --env.max-concurrent 1"
        )
    if config.max_concurrent > 1 and config.use_thread_lock:
        raise ConfigError(
            f"--env.use-thread-lock allows one sub-env call at a time, so --env.max-concurrent {config.max_concurrent} "
            "would run nothing concurrently; drop one of the two"
        )
    if config.format_error_reward is not None and not math.isfinite(config.format_error_reward):
        raise ConfigError(f"--env.format-error-reward must be a finite number or None, got {config.format_error_reward}")
    if not math.isfinite(config.success_return):
        raise ConfigError(f"--env.success-return must be a finite number, got {config.success_return}")


def _check_env_id(gem: Any, env_id: str) -> None:
    known = list(gem.envs.registration.ENV_REGISTRY)
    if env_id in known:
        return
    by_lower = {k.lower(): k for k in known}
    close = difflib.get_close_matches(env_id.lower(), list(by_lower), n=3, cutoff=0.5)
    hint = f" Did you mean {', '.join(repr(by_lower[c]) for c in close)}?" if close else ""
    raise ConfigError(
        f"Unknown GEM env id {env_id!r} (--env.env-id).{hint} List GEM's envs with: "
        "python -c 'import gem; gem.print_envs()'"
    )


def _make(gem: Any, env_id: str, env_kwargs: dict[str, Any]) -> Any:
    try:
        return gem.make(env_id, **env_kwargs)
    except TypeError as exc:  # an argument the env's constructor does not take, or one it is missing
        raise ConfigError(f"gem.make({env_id!r}) rejected --env.env-kwargs {json.dumps(env_kwargs)}: {exc}; "
                          "pass the arguments of that env's constructor") from exc


def _is_number(value: Any) -> bool:
    """A finite int, float or bool (python or numpy scalar): a value that can be a per-env metric."""
    if isinstance(value, (bool, np.bool_)):
        return True
    if isinstance(value, (int, float, np.integer, np.floating)):
        return math.isfinite(float(value))
    return False


def _split_observation(obs: Any) -> tuple[str, np.ndarray | None]:
    """A GEM observation as (text, RGB frame or None); see the module docstring for the forms understood."""
    if obs is None:
        return "", None
    if isinstance(obs, str):
        return obs, None
    if isinstance(obs, np.ndarray) and obs.dtype.kind in "biuf" and obs.ndim in (2, 3):
        return "", _as_frame(obs)
    if isinstance(obs, dict):
        text = next((obs[k] for k in _TEXT_KEYS if isinstance(obs.get(k), str)), "")
        frames = next((obs[k] for k in _FRAME_KEYS if obs.get(k) is not None), None)
        return text, _first_frame(frames)
    if hasattr(obs, "convert") and hasattr(obs, "size"):  # a PIL image
        return "", _as_frame(obs)
    return str(obs), None


def _first_frame(frames: Any) -> np.ndarray | None:
    """The first frame of a list of images, of a video (a list of frames or a ``(t, h, w, c)`` array), or an image."""
    while isinstance(frames, (list, tuple)):
        if not frames:
            return None
        frames = frames[0]
    if frames is None:
        return None
    if isinstance(frames, np.ndarray) and frames.ndim == 4:
        return _as_frame(frames[0]) if len(frames) else None
    return _as_frame(frames)


def _as_frame(image: Any) -> np.ndarray:
    """An image as RGB uint8 ``(h, w, 3)``: PIL images are converted, gray is repeated, alpha dropped; floats in
    [0, 1] are scaled to [0, 255]."""
    if hasattr(image, "convert") and not isinstance(image, np.ndarray):
        image = image.convert("RGB")
    arr = np.asarray(image)
    if arr.ndim == 2:
        arr = arr[..., None]
    if arr.ndim != 3 or arr.shape[-1] not in (1, 3, 4) or arr.dtype.kind not in "biuf":
        raise EnvContractError(f"a GEM observation holds an image of dtype {arr.dtype} and shape {arr.shape}; "
                               "GEM-v1 takes (h, w), (h, w, 1), (h, w, 3) or (h, w, 4) numeric images")
    if arr.shape[-1] == 1:
        arr = np.repeat(arr, 3, axis=-1)
    arr = arr[..., :3]
    if arr.dtype == np.uint8:
        return np.ascontiguousarray(arr)
    if arr.dtype.kind == "b":
        return arr.astype(np.uint8) * 255
    if arr.dtype.kind == "f":
        arr = np.nan_to_num(arr, nan=0.0, posinf=255.0, neginf=0.0)
        if arr.size and arr.max() <= 1.0:
            arr = arr * 255.0
    return np.clip(arr, 0, 255).astype(np.uint8)

