"""The batched env API: one env object steps ``num_envs`` copies of a simulator at once.

Why a ``gymnasium.vector.VectorEnv`` subclass: spaces are the contract between env and policy, and the gymnasium
vector API already fixes the batch-as-leading-axis convention. The differences from a plain ``VectorEnv`` are:

* observations are :class:`Observation` (images, states, text), the shape policy servers expect;
* an env never resets inside ``step``. A done env's row holds its terminal observation, and the caller resets
  finished envs explicitly with ``reset(options={"reset_mask": mask, "reset_indices": idx})``. Gymnasium calls
  this ``AutoresetMode.DISABLED`` ("the caller resets with a mask"), which is what ``metadata`` declares, so that
  Gymnasium's vector wrappers (``RecordEpisodeStatistics`` and friends) treat a partial reset as one;
* an env that declares no observation space gets one from its first reset (:func:`observation_space_of`),
  however it was built (the class itself, ``gymnasium.make_vec``, the runner), so Gymnasium wrappers made after
  that reset find it. Wrappers that read it when they are made (``NormalizeObservation`` and the like) need it
  declared in ``__init__``; ``plugrl-check-env`` warns when it is not.
"""

from __future__ import annotations

import dataclasses
import functools
import string
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic, TypeVar

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

_PRINTABLE = frozenset(string.printable)

Action = np.ndarray
"""A batch of actions, shape ``(num_envs, *single_action_space.shape)``."""
RewardArray = np.ndarray
"""float32 rewards, shape ``(num_envs,)``."""
BoolArray = np.ndarray
"""bool flags (terminated / truncated), shape ``(num_envs,)``."""

TextLike = None | str | Sequence[str] | np.ndarray


def _as_text_array(text: TextLike, n: int | None) -> np.ndarray:
    """Normalise ``text`` to a numpy unicode array of shape (n,); ``n=None`` means 'infer from text'."""
    if text is None:
        return np.zeros(n if n is not None else 1, dtype="<U1")  # empty strings
    if isinstance(text, str):
        return np.full(n if n is not None else 1, text, dtype=f"<U{max(len(text), 1)}")
    arr = np.asarray(text)
    if arr.dtype.kind == "O" or arr.dtype.kind == "S":
        arr = arr.astype(str)
    if arr.dtype.kind != "U":
        raise ValueError(f"Observation.text must be None, a str, a sequence of str or a '<U' array; got dtype {arr.dtype}")
    if arr.ndim == 0:
        arr = arr.reshape(1)
    if arr.ndim != 1:
        raise ValueError(f"Observation.text must be one-dimensional (one string per env); got shape {arr.shape}")
    if n is not None and arr.shape[0] == 1 and n != 1:
        arr = np.repeat(arr, n)
    if n is not None and arr.shape[0] != n:
        raise ValueError(f"Observation.text has {arr.shape[0]} entries but the batch has {n} envs")
    return arr


@dataclasses.dataclass(init=False, eq=False)
class Observation:
    """A batch of observations with the env batch as the leading axis of every array.

    ``images`` are uint8 ``(n, h, w, c)``; ``states`` are numeric ``(n, d)`` (any trailing shape is accepted);
    ``text`` is stored as a numpy unicode array of shape ``(n,)`` (None / a str are broadcast).
    """

    images: dict[str, np.ndarray]
    states: dict[str, np.ndarray]
    text: np.ndarray

    def __init__(
        self,
        images: Mapping[str, np.ndarray] | None = None,
        states: Mapping[str, np.ndarray] | None = None,
        text: TextLike = None,
    ) -> None:
        # Plain loops rather than comprehensions: every env builds one of these on every step.
        self.images, self.states = {}, {}
        for given, arrays in ((images, self.images), (states, self.states)):
            if given:
                for k, v in given.items():
                    arrays[str(k)] = np.asarray(v)
        n: int | None = None
        mixed = False
        for kind, arrays in (("images", self.images), ("states", self.states)):
            for k, arr in arrays.items():
                if arr.ndim == 0:
                    raise ValueError(f"Observation {kind}[{k!r}] is a scalar; every array needs the env batch as its "
                                     "leading axis")
                if n is None:
                    n = int(arr.shape[0])
                elif arr.shape[0] != n:
                    mixed = True
        if mixed:
            listing = ", ".join(f"{kind}[{k!r}]: {int(arr.shape[0])}" for kind, arrays in
                                (("images", self.images), ("states", self.states)) for k, arr in arrays.items())
            raise ValueError(f"Observation arrays must share the leading batch dimension; got {listing}")
        self.text = _as_text_array(text, n)

    @property
    def batch_size(self) -> int:
        """Number of envs in this batch."""
        for arr in self.images.values():
            return int(arr.shape[0])
        for arr in self.states.values():
            return int(arr.shape[0])
        return int(self.text.shape[0])

    def select(self, indices: np.ndarray | Sequence[int] | slice) -> Observation:
        """Rows ``indices`` (env indices, a bool mask or a slice) of every array, as a new batch.

        A slice, or rows that form one ascending run (``[3, 4, 5]``), come back as views, without a copy (an image
        batch is tens of MB); any other selection is a copy (numpy's fancy indexing)."""
        idx: np.ndarray | slice
        if isinstance(indices, slice):
            idx = indices
        else:
            idx = _row_index(indices)
            run = _as_run(idx)
            if run is not None and run.stop <= self.batch_size:
                idx = run
        # Plain loops rather than comprehensions: the rollout selects rows on most steps.
        out = Observation.__new__(Observation)
        out.images, out.states = {}, {}
        for k, v in self.images.items():
            out.images[k] = v[idx]
        for k, v in self.states.items():
            out.states[k] = v[idx]
        out.text = self.text[idx]
        return out

    def copy(self) -> Observation:
        """A batch that owns its arrays: an env may overwrite its buffers on the next call, and :meth:`select`
        hands on views, so whatever keeps an observation past the next call keeps a copy."""
        out = Observation.__new__(Observation)
        out.images = {k: np.array(v, copy=True) for k, v in self.images.items()}
        out.states = {k: np.array(v, copy=True) for k, v in self.states.items()}
        out.text = np.array(self.text, copy=True)
        return out


def _as_run(idx: np.ndarray) -> slice | None:
    """``idx`` as a slice when it is one ascending run of row numbers (a view then selects it without a copy)."""
    if idx.dtype == np.bool_:
        rows = np.flatnonzero(idx)
    else:
        rows = idx
    if rows.ndim != 1 or rows.size == 0 or rows[0] < 0:
        return None
    if rows.size > 1 and (rows[-1] - rows[0] + 1 != rows.size or not bool((np.diff(rows) == 1).all())):
        return None
    return slice(int(rows[0]), int(rows[-1]) + 1)


def reset_mask_of(options: Mapping[str, Any] | None, num_envs: int) -> np.ndarray:
    """The bool mask of the envs a batched ``reset(options=...)`` names: ``reset_mask`` (Gymnasium's name) or
    ``reset_indices`` (PlugRL's: env indices or a bool mask); every env when neither is given."""
    options = options or {}
    chosen = options.get("reset_mask")
    if chosen is None:
        chosen = options.get("reset_indices")
    mask = np.zeros(num_envs, dtype=bool)
    if chosen is None:
        mask[:] = True
    else:
        mask[_row_index(chosen)] = True
    return mask


def _row_index(indices: np.ndarray | Sequence[int] | Sequence[bool]) -> np.ndarray:
    """An index for the batch axis: a bool mask stays a mask (casting it to int would pick rows 0 and 1)."""
    idx = np.asarray(indices)
    return idx if idx.dtype == np.bool_ else idx.astype(np.intp)


TEXT_SPACE_LENGTH = 1 << 20
"""The longest text an observation space built here admits (observations are free text; the space describes)."""


def describe_space(space: gym.Space) -> str:
    """A space in one short line (a Text space's repr lists its whole character set, control characters too)."""
    if isinstance(space, gym.spaces.Text):
        return (f"Text(min_length={space.min_length}, max_length={space.max_length}, "
                f"{len(space.character_set)} characters)")
    return str(space)


def observation_space(
    images: Mapping[str, tuple[int, int, int]] | None = None,
    states: Mapping[str, tuple[int, ...] | gym.spaces.Box | np.ndarray] | None = None,
    text: gym.spaces.Text | None = None,
) -> gym.spaces.Dict:
    """The single-env observation space of an :class:`Observation`: ``images`` name -> (h, w, c) (uint8),
    ``states`` name -> shape (float64, unbounded), a Box, or an example array of one env's state (its shape and
    dtype: ``np.zeros(2, np.float32)`` declares the float32 states the guide recommends), and a Text space for
    ``text``. The rollout warns once when the first observation's dtypes differ from the declared ones."""
    image_spaces: dict[str, gym.Space] = {k: gym.spaces.Box(0, 255, tuple(shape), np.uint8)
                                          for k, shape in (images or {}).items()}
    state_spaces: dict[str, gym.Space] = {k: _state_space(v) for k, v in (states or {}).items()}
    return gym.spaces.Dict({
        "images": gym.spaces.Dict(image_spaces),
        "states": gym.spaces.Dict(state_spaces),
        "text": text if text is not None else gym.spaces.Text(TEXT_SPACE_LENGTH, min_length=0,
                                                              charset=_PRINTABLE),
    })


def _state_space(value: tuple[int, ...] | gym.spaces.Box | np.ndarray) -> gym.spaces.Box:
    """One state's space: a Box as given, an example array's shape and dtype, or a shape (float64)."""
    if isinstance(value, gym.spaces.Box):
        return value
    if isinstance(value, np.ndarray):
        if value.dtype.kind == "f":
            return gym.spaces.Box(-np.inf, np.inf, value.shape, value.dtype)
        info = np.iinfo(value.dtype) if value.dtype.kind in "iu" else None
        low, high = (info.min, info.max) if info is not None else (0, 1)
        return gym.spaces.Box(low, high, value.shape, value.dtype)
    return gym.spaces.Box(-np.inf, np.inf, tuple(value), np.float64)


def _deriving_observation_space(reset: Callable[..., Any]) -> Callable[..., Any]:
    """``reset``, which then sets ``single_observation_space`` from the observation it returns while the env has
    none. Only the most derived ``reset`` does: a subclass's reset may change what its parent's returned.

    A reset that returns something other than ``(Observation, info)``, or an observation the space cannot be
    built from, is left to the contract checks, which say what is wrong (the space stays undeclared).

    It also notes a call made while the rollout is inside the env's ``step`` (:attr:`BaseEnv.in_step`): the env
    reset itself there, and the rollout stops with the contract's words once ``step`` returns."""

    @functools.wraps(reset)
    def reset_deriving_space(self: BaseEnv, *args: Any, **kwargs: Any) -> Any:
        if self.in_step:
            self.reset_in_step = True
        result = reset(self, *args, **kwargs)
        if "_single_observation_space" not in self.__dict__ and type(self).reset is reset_deriving_space:
            obs = result[0] if isinstance(result, tuple) and result else None
            if isinstance(obs, Observation):
                try:
                    self.single_observation_space = observation_space_of(obs)
                except Exception:  # a malformed observation: the checks report it
                    pass
        return result

    return reset_deriving_space


def observation_space_of(obs: Observation) -> gym.spaces.Dict:
    """The single-env observation space an observation batch implies (shapes and dtypes of its rows)."""
    states = {k: _state_space(v[0] if len(v) else np.empty(v.shape[1:], v.dtype)) for k, v in obs.states.items()}
    images = {k: tuple(v.shape[1:]) for k, v in obs.images.items()}
    return observation_space(images=images, states=dict(states))


@dataclasses.dataclass
class BaseEnvConfig:
    """Base of env config dataclasses. Every field needs a default: the CLI builds one with no arguments and
    turns each field into an ``--env.<field>`` flag."""


ConfigT = TypeVar("ConfigT", bound=BaseEnvConfig)


class BaseEnv(gym.vector.VectorEnv[Observation, np.ndarray, np.ndarray], Generic[ConfigT]):
    """A batch of ``num_envs`` copies of one simulator behind the gymnasium vector API.

    Subclasses name their config type (``class PointEnv(BaseEnv[PointEnvConfig])``, so ``self.config`` is typed),
    set ``self.single_action_space`` (unbatched) in ``__init__`` and implement :meth:`reset` and :meth:`step`.
    All randomness should come from ``self.np_random`` so that ``--runner.seed`` reproduces a run.
    """

    metadata: dict[str, Any] = {"autoreset_mode": AutoresetMode.DISABLED}
    config: ConfigT
    in_step: bool = False
    """Set by the rollout while it is inside this env's ``step`` (a boolean on the hot path, nothing more)."""
    reset_in_step: bool = False
    """Set when the env's own ``reset`` ran while :attr:`in_step` was: the env reset itself inside ``step``, which
    the contract forbids (the client resets finished envs after sending their terminal observation)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A subclass's ``reset`` also derives the observation space on the first reset, when none is declared."""
        super().__init_subclass__(**kwargs)
        if "reset" in cls.__dict__:
            cls.reset = _deriving_observation_space(cls.__dict__["reset"])  # type: ignore[method-assign]

    def __init__(
        self,
        config: ConfigT,
        num_envs: int = 1,
        process_id: int | None = None,
        total_processes: int | None = None,
    ) -> None:
        if int(num_envs) < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        self.config = config
        self.num_envs = int(num_envs)
        self.process_id = process_id
        self.total_processes = total_processes

    def seed_rngs(self, seed: int | Sequence[int | None] | None) -> None:
        """Seed ``self.np_random``; call first in ``reset``. ``None`` keeps the current generator (or makes one).

        A list (one seed per env, as the runner passes to envs that take per-env seeds) leaves the batch generator
        as it is: envs that declare ``metadata["per_env_seeds"] = True`` start each reset env from its own seed
        (see :meth:`env_rngs`)."""
        batch_seed = seed if isinstance(seed, int) else None
        if batch_seed is not None or self._np_random is None:
            self._np_random, self._np_random_seed = gym.utils.seeding.np_random(batch_seed)

    def per_env_seeds(self, seed: int | Sequence[int | None] | None) -> list[int | None]:
        """The ``seed`` argument of :meth:`reset` as one seed per env: an int ``s`` gives env i ``s + i``
        (Gymnasium's convention for vector envs), a list gives each env its own, None gives none."""
        if seed is None:
            return [None] * self.num_envs
        if isinstance(seed, int):
            return [seed + i for i in range(self.num_envs)]
        if len(seed) != self.num_envs:
            raise ValueError(f"reset(seed=[...]) needs one seed per env ({self.num_envs}), got {len(seed)}")
        return [None if s is None else int(s) for s in seed]

    def env_rngs(self, seed: int | Sequence[int | None] | None,
                 mask: np.ndarray) -> list[tuple[int, np.random.Generator]]:
        """``(i, generator)`` for each env i that ``mask`` selects, ascending, to draw env i's start from: a new
        generator seeded with env i's own seed when it has one (:meth:`per_env_seeds`: ``s + i`` of an int ``s``, or
        ``seed[i]`` of a list), so its start depends on that seed alone; else ``self.np_random``, the batch's.

        An env that draws each reset env's start from these generators takes per-env seeds and declares
        ``metadata["per_env_seeds"] = True``."""
        seeds = self.per_env_seeds(seed)
        return [(i, self.np_random if seeds[i] is None else gym.utils.seeding.np_random(seeds[i])[0])
                for i in np.flatnonzero(mask).tolist()]

    def reset_mask(self, options: dict[str, Any] | None) -> np.ndarray:
        """Bool mask of the envs a ``reset`` call must reset.

        ``options["reset_mask"]`` (Gymnasium's name: a bool array) or ``options["reset_indices"]`` (PlugRL's name:
        env indices or a bool mask); all envs when neither is given. The runner passes both, because Gymnasium's
        vector wrappers consume ``reset_mask`` on the way down.
        """
        return reset_mask_of(options, self.num_envs)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Observation, dict[str, Any]]:
        """Reset the envs :meth:`reset_mask` selects (all when ``options`` names none) and return the whole batch.

        ``seed`` is an int for the first reset of a run (env i starts from ``seed + i``, Gymnasium's convention);
        later, an env that can start env i from ``seed[i]`` says so with ``metadata["per_env_seeds"] = True`` and
        gets a list of one seed per env (None for envs not reset), the others get None.

        Rows of envs that were not reset must come back unchanged: the client (and, with reuse-feedback-obs, the
        server) keeps using the observation those envs last produced.
        """
        raise NotImplementedError

    def step(self, actions: Action) -> tuple[Observation, RewardArray, BoolArray, BoolArray, dict[str, Any]]:
        """Step every env once with ``actions[i]``; never reset inside (the client resets finished envs).

        Returns ``(observation, rewards float32 (n,), terminated bool (n,), truncated bool (n,), info)``; info
        values that are arrays with leading dim n reach the server row by row.
        """
        raise NotImplementedError


    @property
    def single_observation_space(self) -> gym.Space:
        """The unbatched observation space: a Dict with ``images``, ``states`` and ``text`` (see
        :func:`observation_space`). Declare it in ``__init__``, or leave it to the first reset, which derives it
        from the observation it returns (:func:`observation_space_of`); setting it also defines the batched
        ``observation_space``."""
        space = self.__dict__.get("_single_observation_space")
        if space is None:
            raise AttributeError(
                f"{type(self).__name__} has no single_observation_space yet: declare it in __init__ "
                "(self.single_observation_space = observation_space(states={...})) or set it from an observation "
                "with observation_space_of(obs)"
            )
        return space

    @single_observation_space.setter
    def single_observation_space(self, space: gym.Space) -> None:
        self.__dict__["_single_observation_space"] = space
        self.__dict__.pop("_observation_space", None)

    @property
    def observation_space(self) -> gym.Space:
        """``single_observation_space`` batched over ``num_envs`` (built once, on first use)."""
        space = self.__dict__.get("_observation_space")
        if space is None:
            space = gym.vector.utils.batch_space(self.single_observation_space, self.num_envs)
            self.__dict__["_observation_space"] = space
        return space

    @observation_space.setter
    def observation_space(self, space: gym.Space) -> None:
        self.__dict__["_observation_space"] = space

    @property
    def single_action_space(self) -> gym.Space:
        """The unbatched action space; setting it also defines the batched ``action_space``."""
        space = self.__dict__.get("_single_action_space")
        if space is None:
            raise AttributeError("single_action_space")
        return space

    @single_action_space.setter
    def single_action_space(self, space: gym.Space) -> None:
        self.__dict__["_single_action_space"] = space
        self.__dict__.pop("_action_space", None)

    @property
    def action_space(self) -> gym.Space:
        """``single_action_space`` batched over ``num_envs`` (built once, on first use)."""
        space = self.__dict__.get("_action_space")
        if space is None:
            space = gym.vector.utils.batch_space(self.single_action_space, self.num_envs)
            self.__dict__["_action_space"] = space
        return space

    @action_space.setter
    def action_space(self, space: gym.Space) -> None:
        self.__dict__["_action_space"] = space
