"""Augmented Random Search (Mania, Guy & Recht 2018, version V2-t): a linear policy learned from whole episodes.

The learner knows nothing about sockets or envs. Whoever drives it (the reference server's ARS policy, or a plain
loop that steps an env itself) does four things: it asks :meth:`ArsLearner.start_episode` for the :class:`EpisodePolicy`
an env runs when that env's episode starts, computes the envs' actions with :meth:`ArsLearner.actions`, adds each
step's reward and observed state to the env's :class:`Episode`, and hands finished episodes back with
:meth:`ArsLearner.finish`. Nothing else reaches the learner, so two drivers that feed it the same episodes in the
same order get the same policy, bit for bit: that is what ``bench/learning.py`` checks.

The algorithm, per iteration ``j`` (``M`` is the ``[actions, states]`` weight matrix, zero at the start):

- ``N`` directions ``delta_k`` are drawn from one generator (``--policy.seed``), the same for every env;
- each is rolled out twice, with weights ``M + nu * delta_k`` and ``M - nu * delta_k``, for one whole episode each;
  an action is ``clip(W (x - mean) / std, low, high)`` for the concatenated state ``x``;
- once all 2N returns are in, the directions are ranked by ``max(r+, r-)``, the top ``b`` are kept, and
  ``M += alpha / (b * sigma_R) * sum_k (r+_k - r-_k) delta_k`` with ``sigma_R`` the std of those 2b returns (no
  update when they are all equal: there is nothing to follow);
- ``mean`` and ``std`` are the running statistics of every state the rollouts saw since the start; they stay fixed
  during an iteration and take in its states when it ends (state components that never varied are ignored).

An episode that starts while every rollout of the iteration is handed out runs the current policy without noise:
an evaluation episode, reported but not used for the update. An episode whose start the driver did not see (an env
that joins mid-episode after a reconnect) runs the current policy too and is reported nowhere.

The policy never depends on the order an iteration's episodes finish in: the update ranks by direction, and the
state statistics take in the iteration's episodes in rollout order. What arrival order can change is which env
gets which rollout (with several connections), and so which episode each return comes from.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import logging
import math
import os
import tempfile
import threading
import time
import zipfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from plugrl_env_client.errors import ConfigError

logger = logging.getLogger(__name__)

BATCH_STATE = "_batch"
"""The empty state a client sends for an observation without states (SPEC 4.2); it carries no numbers."""
MIN_STD = 1e-7
"""A state component whose std is below this has not varied: it gets weight 0 rather than a huge one."""
MAX_RECORDS = 10_000
"""Iteration records the learner keeps in memory (the JSONL log next to --policy.save keeps all of them)."""
SAVE_FIELDS = ("weights", "mean", "std", "count", "m2", "iteration", "episodes", "env_steps", "state_keys",
               "state_sizes")

StateLayout = tuple[tuple[str, int], ...]
"""The state arrays a policy reads, in the order they are concatenated: (key, numbers per env), keys sorted."""


class ArsError(ConfigError):
    """ARS cannot learn from what the env sends (no state arrays, a state size that changed, a saved policy of
    another shape)."""


@dataclasses.dataclass(frozen=True)
class ArsSettings:
    """The algorithm's hyperparameters and files (``--policy.*``)."""

    directions: int = 8
    top_directions: int = 4
    step_size: float = 0.02
    noise: float = 0.03
    seed: int | None = None
    save: Path | None = None
    load: Path | None = None
    evaluate: bool = False

    def check(self) -> None:
        if self.directions < 1:
            raise ValueError(f"--policy.directions must be >= 1, got {self.directions}")
        if not 1 <= self.top_directions <= self.directions:
            raise ValueError(f"--policy.top-directions must be between 1 and --policy.directions "
                             f"({self.directions}), got {self.top_directions}")
        for flag, value in (("--policy.step-size", self.step_size), ("--policy.noise", self.noise)):
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{flag} must be a finite number > 0, got {value}")
        if self.evaluate and self.load is None:
            raise ValueError("--policy.eval evaluates a saved policy: pass --policy.load PATH (a file --policy.save "
                             "wrote)")
        if self.evaluate and self.save is not None:
            raise ValueError("--policy.eval does not change the policy, so there is nothing to save: leave out "
                             "--policy.save")
        if self.save is not None and self.save.suffix == ".jsonl":
            raise ValueError(f"--policy.save {self.save}: the iteration log goes next to it as a .jsonl file; "
                             "save the policy under another suffix (e.g. .npz)")

    @property
    def log_path(self) -> Path | None:
        """The iteration log (JSON lines) next to the saved policy."""
        return None if self.save is None else self.save.with_suffix(".jsonl")


# ------------------------------------------------------------------------------------------------ states


def state_layout(states: Mapping[str, Any]) -> StateLayout:
    """The layout of an observation's ``states`` map: every array but the ``_batch`` placeholder, keys sorted."""
    return tuple((key, int(np.prod(np.shape(states[key])[1:], dtype=np.int64)))
                 for key in sorted(states) if key != BATCH_STATE)


def state_matrix(states: Mapping[str, Any], layout: StateLayout, n: int) -> np.ndarray:
    """``[n, state size]`` float64: the state arrays of ``layout``, each flattened per env, side by side."""
    parts = [np.asarray(states[key]).reshape(n, size) for key, size in layout]
    if len(parts) == 1:
        return parts[0].astype(np.float64)
    return np.concatenate(parts, axis=1, dtype=np.float64)


def describe_layout(layout: StateLayout) -> str:
    inner = ", ".join(f"{key!r}: {size}" for key, size in layout) or "none"
    return f"{{{inner}}} ({sum(size for _, size in layout)} numbers)"


class RunningStats:
    """Count, mean and sum of squared deviations of states, merged batch by batch (Chan et al.'s update)."""

    def __init__(self, size: int) -> None:
        self.count = 0
        self.mean = np.zeros(size)
        self.m2 = np.zeros(size)

    def merge(self, count: int, mean: np.ndarray, m2: np.ndarray) -> None:
        if count == 0:
            return
        total = self.count + count
        delta = mean - self.mean
        self.mean = self.mean + delta * (count / total)
        self.m2 = self.m2 + m2 + delta * delta * (self.count * count / total)
        self.count = total

    def std(self) -> np.ndarray:
        """Per component; 1 before any state was seen (the paper's identity covariance)."""
        if self.count == 0:
            return np.ones_like(self.mean)
        return np.sqrt(self.m2 / self.count)


def batch_stats(states: Sequence[np.ndarray], size: int) -> tuple[int, np.ndarray, np.ndarray]:
    """(count, mean, m2) of a list of state rows."""
    if not states:
        return 0, np.zeros(size), np.zeros(size)
    x = np.stack(states)
    mean = x.mean(axis=0)
    return len(states), mean, ((x - mean) ** 2).sum(axis=0)


# ------------------------------------------------------------------------------------------------ episodes


@dataclasses.dataclass(frozen=True)
class EpisodePolicy:
    """The policy of one episode (ARS's "rollout"): weights and the state normalization they go with, fixed for the
    episode.

    ``direction`` is None for an episode run without noise (an evaluation, or an episode joined midway);
    ``sign`` is +1 or -1 for the two rollouts of a direction, 0 otherwise.
    """

    iteration: int
    direction: int | None
    sign: int
    weights: np.ndarray
    mean: np.ndarray
    scale: np.ndarray
    whole: bool = True
    """False for an episode joined midway: its return is not the episode's, so it is reported nowhere."""

    @property
    def trains(self) -> bool:
        return self.direction is not None

    @property
    def key(self) -> tuple[int, int]:
        """(direction, sign) of a training rollout."""
        assert self.direction is not None, "an evaluation has no direction"
        return self.direction, self.sign

    def act(self, state: np.ndarray) -> np.ndarray:
        """The unclipped action (float64, flat) for one env's state vector."""
        return self.weights @ ((state - self.mean) * self.scale)


@dataclasses.dataclass
class Episode:
    """One env's episode under a rollout: the return so far (summed in float64), steps, and the states it saw."""

    rollout: EpisodePolicy
    ret: float = 0.0
    chunks: int = 0
    states: list[np.ndarray] = dataclasses.field(default_factory=list)

    def observe(self, state: np.ndarray) -> None:
        """A state the rollout acted on (kept for the running statistics when the rollout trains)."""
        if self.rollout.trains:
            self.states.append(state)

    def add(self, reward: float) -> None:
        """The reward of one chunk (one env step at horizon 1)."""
        self.ret += reward
        self.chunks += 1


@dataclasses.dataclass
class _Result:
    ret: float
    stats: tuple[int, np.ndarray, np.ndarray]


# ------------------------------------------------------------------------------------------------ the learner


class ArsLearner:
    """One ARS run, shared by every env that feeds it (thread-safe: one lock, taken once per episode start and end).

    ``action_shape`` and the bounds are those of the actions it answers; the state size is fixed by the first
    observation (:meth:`bind`), or by the policy loaded from ``settings.load``.
    """

    def __init__(self, action_shape: tuple[int, ...], low: Any, high: Any, settings: ArsSettings,
                 horizon: int = 1) -> None:
        settings.check()
        self.settings = settings
        self.action_shape = tuple(action_shape)
        self.action_size = int(np.prod(self.action_shape, dtype=np.int64))
        if self.action_size < 1:
            raise ValueError(f"ARS needs at least one action number; the action shape is {self.action_shape}")
        self.low = np.broadcast_to(np.asarray(low, np.float64), self.action_shape).reshape(-1)
        self.high = np.broadcast_to(np.asarray(high, np.float64), self.action_shape).reshape(-1)
        self.horizon = horizon
        self._lock = threading.Lock()
        self._rng = np.random.default_rng(settings.seed)
        self.layout: StateLayout | None = None
        self.weights = np.zeros((self.action_size, 0))
        self.stats = RunningStats(0)
        self.iteration = 0  # updates done so far
        self.episodes = 0  # training episodes finished so far
        self.env_steps = 0  # env steps of every finished episode (training and evaluation)
        self.records: collections.deque[dict[str, Any]] = collections.deque(maxlen=MAX_RECORDS)
        self._saved: dict[str, Any] | None = None
        if settings.load is not None:
            self._saved = load_policy(settings.load, self.action_size)
        self._started = time.monotonic()
        self._log_file = self._open_log()
        if horizon > 1:
            logger.info("ARS with --policy.action-horizon %d: each chunk repeats, %d times, the action for the "
                        "chunk's first observation (the policy and its state statistics see only those)",
                        horizon, horizon)

    # -------------------------------------------------------------------------------------------- driver API

    def bind(self, layout: StateLayout) -> None:
        """Fix the state layout at the first observation (or check it against the fixed one)."""
        if layout == self.layout:  # every infer after the first: no lock
            return
        with self._lock:
            if self.layout is None:
                self._begin(layout)
            fixed = self.layout
            if layout == fixed:
                return
        assert fixed is not None
        raise ArsError(f"the env's state arrays changed mid-run: the ARS policy reads {describe_layout(fixed)}, "
                       f"this observation has {describe_layout(layout)}. A linear policy needs one fixed state size: "
                       "serve one env per ARS server (restart it for another env)")

    def start_episode(self, whole: bool = True) -> EpisodePolicy:
        """The rollout of an episode that starts now: the next unassigned (direction, sign) of the iteration, or
        the current policy without noise (an evaluation) when all are handed out. ``whole=False``: the episode
        started unseen (joined midway), so it just runs the current policy."""
        with self._lock:
            if whole and self._pending and not self.settings.evaluate:
                k, sign = self._pending.pop(0)
                return self._rollouts[(k, sign)]
            return dataclasses.replace(self._current, whole=whole)

    def actions(self, rollouts: Sequence[EpisodePolicy], states: np.ndarray) -> np.ndarray:
        """``[n, *action_shape]`` float64 actions, clipped to the bounds, row ``j`` from ``rollouts[j]``."""
        n = len(rollouts)
        first = rollouts[0] if n else self._current
        if all(r.mean is first.mean for r in rollouts):  # one iteration's normalization (the usual case)
            z = (states - first.mean) * first.scale
        else:
            z = (states - np.stack([r.mean for r in rollouts])) * np.stack([r.scale for r in rollouts])
        out = np.einsum("nas,ns->na", np.stack([r.weights for r in rollouts]), z) if n else np.zeros((0, self.action_size))
        np.clip(out, self.low, self.high, out=out)
        return out.reshape(n, *self.action_shape)

    def finish(self, finished: Iterable[tuple[Episode, int]], connection: int = 0) -> None:
        """Episodes that ended on one step, with their lengths in env steps. Their returns are recorded first, then
        the iteration updates if it is complete: an evaluation that ends on the same step as the iteration's last
        rollout counts for that iteration."""
        with self._lock:
            for episode, length in finished:
                self._record(episode, length, connection)
            if self._rollouts and len(self._results) == len(self._rollouts):
                self._update()

    def abandon(self, episodes: Iterable[Episode]) -> None:
        """Episodes that will not finish (their connection closed): their rollouts are handed out again first."""
        with self._lock:
            if self.layout is None:  # no iteration has begun (the connection closed before its first infer)
                return
            back = [e.rollout.key for e in episodes if e.rollout.trains and e.rollout.iteration == self.iteration]
            self._pending[:0] = sorted((key for key in back if key not in self._results), key=lambda ks: (ks[0], -ks[1]))

    # -------------------------------------------------------------------------------------------- internals

    def _begin(self, layout: StateLayout) -> None:
        size = sum(s for _, s in layout)
        if size == 0:
            raise ArsError("ARS learns a linear policy on the env's state arrays (the observation's 'states'), but "
                           "this env sends none (only images and/or text). Use an env with state arrays, or another "
                           "policy (e.g. --policy.name random, or --local-policy random)")
        if self._saved is not None:
            saved = tuple(zip(self._saved["state_keys"], self._saved["state_sizes"]))
            if saved != layout:
                raise ArsError(f"--policy.load {self.settings.load} holds a policy for the states "
                               f"{describe_layout(saved)}, but this env sends {describe_layout(layout)}: load a "
                               "policy saved for this env")
            self.weights = self._saved["weights"]
            self.stats.count, self.stats.mean, self.stats.m2 = self._saved["count"], self._saved["mean"], self._saved["m2"]
            self.iteration, self.episodes = self._saved["iteration"], self._saved["episodes"]
            self.env_steps = self._saved["env_steps"]
        else:
            self.weights = np.zeros((self.action_size, size))
            self.stats = RunningStats(size)
        self.layout = layout
        self._new_iteration()

    def _new_iteration(self) -> None:
        std = self.stats.std()
        mean = self.stats.mean.copy()
        scale = np.where(std >= MIN_STD, 1.0 / np.maximum(std, MIN_STD), 0.0)
        it = self.iteration
        self._current = EpisodePolicy(it, None, 0, self.weights, mean, scale)
        self._rollouts: dict[tuple[int, int], EpisodePolicy] = {}
        self._pending: list[tuple[int, int]] = []
        self._results: dict[tuple[int, int], _Result] = {}
        self._evals: list[float] = []
        self._connections: set[int] = set()
        if self.settings.evaluate:
            return
        nu = self.settings.noise
        self._deltas = self._rng.standard_normal((self.settings.directions, *self.weights.shape))
        for k in range(self.settings.directions):
            for sign in (1, -1):
                weights = self.weights + sign * nu * self._deltas[k]
                self._rollouts[(k, sign)] = EpisodePolicy(it, k, sign, weights, mean, scale)
                self._pending.append((k, sign))

    def _record(self, episode: Episode, length: int, connection: int) -> None:
        rollout = episode.rollout
        if not rollout.whole:
            return
        self.env_steps += length
        if not math.isfinite(episode.ret):
            logger.warning("ARS: an episode's return is %s (NaN or infinite rewards); it is not used%s", episode.ret,
                           " and its rollout is run again" if rollout.trains else "")
            if rollout.trains and rollout.iteration == self.iteration:
                self._pending.insert(0, rollout.key)
            return
        if not rollout.trains:
            self._evals.append(episode.ret)
            if self.settings.evaluate and len(self._evals) == 2 * self.settings.directions:
                self._log_evaluation()
            return
        key = rollout.key
        if rollout.iteration != self.iteration or key in self._results:
            return  # cannot happen with one driver; a stale rollout of a replaced connection is dropped
        self.episodes += 1
        self._connections.add(connection)
        self._results[key] = _Result(episode.ret, batch_stats(episode.states, self.weights.shape[1]))

    def _update(self) -> None:
        n, b = self.settings.directions, self.settings.top_directions
        plus = np.array([self._results[(k, 1)].ret for k in range(n)])
        minus = np.array([self._results[(k, -1)].ret for k in range(n)])
        top = np.argsort(-np.maximum(plus, minus), kind="stable")[:b]
        sigma = float(np.concatenate([plus[top], minus[top]]).std())
        updated = sigma > 0.0
        if updated:
            step = np.tensordot(plus[top] - minus[top], self._deltas[top], axes=1)
            self.weights = self.weights + (self.settings.step_size / (b * sigma)) * step
        for k in range(n):
            for sign in (1, -1):
                self.stats.merge(*self._results[(k, sign)].stats)
        self.iteration += 1
        record = {
            "iteration": self.iteration,
            "episodes": self.episodes,
            "env_steps": self.env_steps,
            "mean_return": float(np.concatenate([plus, minus]).mean()),
            "max_return": float(max(plus.max(), minus.max())),
            "eval_episodes": len(self._evals),
            "eval_mean_return": float(np.mean(self._evals)) if self._evals else None,
            "connections": len(self._connections),
            "updated": updated,
            "wall_time_s": round(time.monotonic() - self._started, 3),
            "returns_plus": plus.tolist(),
            "returns_minus": minus.tolist(),
        }
        self._emit(record, "ARS iteration %(iteration)d: %(episodes)d episodes, %(env_steps)d env steps, rollout "
                           "returns mean %(mean_return).2f max %(max_return).2f, %(evals)s%(skipped)s")
        if self.settings.save is not None:
            save_policy(self.settings.save, self)
        self._new_iteration()

    def _log_evaluation(self) -> None:
        record = {"iteration": self.iteration, "episodes": self.episodes, "env_steps": self.env_steps,
                  "eval_episodes": len(self._evals), "eval_mean_return": float(np.mean(self._evals)),
                  "eval_max_return": float(np.max(self._evals)), "wall_time_s": round(time.monotonic() - self._started, 3)}
        self._emit(record, "ARS evaluation of iteration %(iteration)d: %(evals)s")
        self._evals = []

    def _emit(self, record: dict[str, Any], text: str) -> None:
        self.records.append(record)
        mean = record["eval_mean_return"]
        evals = ("no evaluation episodes" if mean is None
                 else f"evaluation mean {mean:.2f} over {record['eval_episodes']} episodes")
        skipped = "" if record.get("updated", True) else " (all returns equal: no update)"
        logger.info(text, {**record, "evals": evals, "skipped": skipped})
        if self._log_file is not None:
            self._log_file.write(json.dumps(record, allow_nan=False) + "\n")
            self._log_file.flush()

    def _open_log(self) -> Any:
        path = self.settings.log_path
        if path is None:
            return None
        path.parent.mkdir(parents=True, exist_ok=True)
        resuming = self.settings.load is not None and Path(self.settings.load).resolve() == self.settings.save.resolve()  # type: ignore[union-attr]
        return path.open("a" if resuming else "w", encoding="utf-8")

    def close(self) -> None:
        with self._lock:
            if self._log_file is not None:
                self._log_file.close()
                self._log_file = None


# ------------------------------------------------------------------------------------------------ files


def save_policy(path: Path, learner: ArsLearner) -> None:
    """The policy as an npz (weights, state mean and std, and what resuming needs), written atomically: a reader
    sees the previous iteration's file or this one, never half of one."""
    assert learner.layout is not None
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays = {
        "weights": learner.weights, "mean": learner.stats.mean, "std": learner.stats.std(),
        "count": np.int64(learner.stats.count), "m2": learner.stats.m2, "iteration": np.int64(learner.iteration),
        "episodes": np.int64(learner.episodes), "env_steps": np.int64(learner.env_steps),
        "state_keys": np.array([k for k, _ in learner.layout]), "state_sizes": np.array([s for _, s in learner.layout]),
    }
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_policy(path: Path, action_size: int) -> dict[str, Any]:
    """What :func:`save_policy` wrote, checked: a missing file, another file type or another action size is an
    :class:`ArsError` saying so."""
    try:
        check_saved_shapes(path, action_size)
        with np.load(path, allow_pickle=False) as data:
            missing = [k for k in SAVE_FIELDS if k not in data.files]
            if missing:
                raise ArsError(f"--policy.load {path} is not an ARS policy saved by --policy.save (it lacks "
                               f"{', '.join(missing)})")
            saved = {k: data[k] for k in SAVE_FIELDS}
    except FileNotFoundError:
        raise ArsError(f"--policy.load {path}: no such file (pass a file --policy.save wrote)") from None
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise ArsError(f"--policy.load {path} is not an ARS policy saved by --policy.save ({exc})") from None
    weights = np.asarray(saved["weights"], np.float64)
    if weights.ndim != 2 or weights.shape[0] != action_size:
        raise ArsError(f"--policy.load {path} holds a policy of {weights.shape[0] if weights.ndim == 2 else '?'} "
                       f"actions, but the server answers {action_size} (--policy.action-dim): load a policy saved "
                       "for this env")
    out = {"weights": weights, "mean": np.asarray(saved["mean"], np.float64), "m2": np.asarray(saved["m2"], np.float64),
           "state_keys": [str(k) for k in saved["state_keys"]], "state_sizes": [int(s) for s in saved["state_sizes"]]}
    for key in ("count", "iteration", "episodes", "env_steps"):
        out[key] = int(saved[key])
    return out


def check_saved_shapes(path: Path, action_size: int) -> None:
    """Check the shapes an npz's arrays claim, from their headers alone, before any array is read: a file whose
    header claims an array larger than the file holds, or a shape that does not fit this policy, is an
    :class:`ArsError` naming the file, the array, the shape found and the shape expected (loading it would try to
    allocate whatever the header claims). Members the file lacks are left to the caller.

    Expected: scalars for the counters, ``(K,)`` for ``state_keys`` and ``state_sizes``, ``(D,)`` for ``mean``,
    ``std`` and ``m2`` (D, the state size, taken from ``mean``), ``(action_size, D)`` for ``weights``."""
    shapes: dict[str, tuple[int, ...]] = {}
    with zipfile.ZipFile(path) as archive:
        for info in archive.infolist():
            name = info.filename.removesuffix(".npy")
            if name not in SAVE_FIELDS:
                continue
            with archive.open(info) as member:
                version = np.lib.format.read_magic(member)
                if version == (1, 0):
                    shape, _, dtype = np.lib.format.read_array_header_1_0(member)
                elif version == (2, 0):
                    shape, _, dtype = np.lib.format.read_array_header_2_0(member)
                else:
                    raise ArsError(f"--policy.load {path}: array {name!r} is in .npy format {version[0]}.{version[1]}, "
                                   "which --policy.save never writes; load a file --policy.save wrote")
                available = info.file_size - member.tell()
            claimed = math.prod(shape) * dtype.itemsize
            if claimed > available:
                raise ArsError(f"--policy.load {path}: array {name!r} claims shape {shape} ({claimed} bytes) but the "
                               f"file holds {max(available, 0)} bytes of it; the file is damaged or was not written "
                               "by --policy.save")
            shapes[name] = shape
    size = shapes["mean"][0] if len(shapes.get("mean", ())) == 1 else None
    keys = shapes["state_keys"][0] if len(shapes.get("state_keys", ())) == 1 else None
    expected: dict[str, tuple[Any, ...]] = {
        **{k: () for k in ("count", "iteration", "episodes", "env_steps")},
        "state_keys": ("K",), "state_sizes": (keys if keys is not None else "K",),
        "mean": ("D",), "std": (size if size is not None else "D",), "m2": (size if size is not None else "D",),
        "weights": (action_size, size if size is not None else "D"),
    }
    for name, want in expected.items():
        found = shapes.get(name)
        if found is None:
            continue
        fits = len(found) == len(want) and all(not isinstance(w, int) or f == w for f, w in zip(found, want))
        if fits:
            continue
        if name == "weights" and len(found) == 2 and found[0] != action_size:
            raise ArsError(f"--policy.load {path} holds a policy of {found[0]} actions, but the server answers "
                           f"{action_size} (--policy.action-dim): load a policy saved for this env")
        shown = "(" + ", ".join(str(w) for w in want) + ("," if len(want) == 1 else "") + ")"
        raise ArsError(f"--policy.load {path}: array {name!r} has shape {found}, expected {shown} (D: the state "
                       "size, as in 'mean'; K: the number of state arrays); load a file --policy.save wrote for "
                       "this env")
