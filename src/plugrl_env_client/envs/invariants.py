"""What an env must keep the same from one call to the next, checked while the rollout runs.

:mod:`plugrl_env_client.envs.contract` checks each value an env returns on its own. Two mistakes show only across
calls, and without these checks a run with them ends as "finished" with wrong data:

* an observation whose keys, shapes (after the batch axis) or dtypes change between ``reset()`` and ``step()``:
  servers and their policies size their inputs from the first observation, and a server that reuses feedback rows
  cannot put rows of two layouts in one batch (the reference server resyncs, the client reconnects, and the same
  thing happens again);
* a partial reset that changes rows it was not asked to reset (an env that re-randomises every row): the client
  goes on with those rows as if their episodes went on, so the episodes it records mix two starts.

Both checks are small objects an :class:`EnvChecks` bundles, so the rollout calls them at three points: after every
reset and step (:meth:`EnvChecks.after_reset`, :meth:`EnvChecks.after_step`) and before every reset
(:meth:`EnvChecks.before_reset`). They stay within the hot path's budget:

* :class:`ObservationSignature` caches ``(key, shape, dtype)`` of every image and state array of the first
  observation and compares each later observation's list with it: no pass over the data. A change of key
  order alone is accepted. Text is compared in one respect only, and only as a warning: a ``step()`` whose text is
  empty for every env after the first ``reset()`` returned text (a ``step`` that forgot its text). Text that comes
  and goes is not stopped, because envs do it on purpose: a first observation left empty for the instruction in
  ``info["env_instruction"]``, an env with no episode left returning empty rows.
* :class:`PartialResetCheck` keeps a reference to the state arrays of the env's latest observation (no copy), copies
  the rows a reset leaves alone just before a partial reset (the env may reuse its buffers; the step's arrays are let
  go then) and compares them with the same rows of what the reset returns. State arrays only: images are skipped (a frame is tens of thousands of
  values per env, and a renderer may redraw an unchanged scene with different pixels), and so is text.

The partial-reset rule has two callers, as the env contract has: this check, and ``plugrl-check-env``'s rule 8,
which both say :func:`partial_reset_problem`.

One more thing is fixed here rather than refused, because it is easy to produce and the fix is obvious: a lone
surrogate (``"\\ud800"``, from text cut in the middle of a UTF-16 pair or decoded with ``surrogateescape``) in an
env's text. Python holds it, but no UTF-8 encoder writes it: the wire, the recorder's text samples and every JSON
line would fail on it. :class:`TextCheck` replaces each one by U+FFFD (the replacement character) in the text
observation and in the info's text (keys, str values and '<U' arrays, ``info["env_instruction"]`` and metric names
among them), and warns once per env and field. Text without one costs one reduction over its code points (or one
``str.encode``); an info entry whose key was clean before and whose value is a number, a non-text array or a short
str seen clean before costs a set lookup or two; a text is only copied when it holds one.
"""

from __future__ import annotations

import codecs
import logging
import operator
import re
import sys
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np

from plugrl_env_client.envs.base_env import Observation, reset_mask_of
from plugrl_env_client.envs.contract import Problem, rows_text
from plugrl_env_client.errors import EnvContractError

logger = logging.getLogger(__name__)

PARTIAL_RESET_FLAG = "--runner.check-partial-reset off"

Entry = tuple[str, tuple[int, ...], np.dtype]
"""One array of an observation as its layout sees it: key, shape, dtype. The whole shape: the batch axis is the same
in every observation of one env object (the contract checks it), and a shape need not be cut to be compared."""


# ------------------------------------------------------------------------------------------------ the rule texts


def partial_reset_problem(reset_rows: np.ndarray | Sequence[int], changed: Sequence[str]) -> Problem:
    """A partial reset of ``reset_rows`` that changed other rows: ``changed`` lists them, one phrase per array
    (``states['pos'] in envs [0, 2]``)."""
    return Problem(
        f"resetting envs {rows_text(reset_rows)} changed rows it was not asked to reset: {'; '.join(changed)}",
        "reset only the rows of `mask = self.reset_mask(options)` (options['reset_mask'] or options['reset_indices']) "
        "and leave the others as they are",
        key="partial reset",
    )


def changed_rows_phrase(name: str, rows: np.ndarray | Sequence[int]) -> str:
    """``states['pos'] in envs [0, 2]``: the rows of one array a reset changed."""
    return f"{name} in envs {rows_text(rows)}"


# ------------------------------------------------------------------------------------------------ layout


def _entries(arrays: dict[str, np.ndarray]) -> list[Entry]:
    return [(k, v.shape, v.dtype) for k, v in arrays.items()]


def _has_text(text: np.ndarray) -> bool:
    """Some env's text is not empty. A '<U' array wider than one character holds a string that long (the common
    case: no look at the strings); in a one-character-wide one, some character is not NUL."""
    return text.itemsize > 4 or bool(text.tobytes().strip(b"\0"))


class ObservationSignature:
    """The layout of the first observation (its image and state keys, each one's shape and dtype), compared with
    every later one; see the module docstring."""

    __slots__ = ("_images", "_states", "_text", "_where")

    def __init__(self) -> None:
        self._images: list[Entry] | None = None
        self._states: list[Entry] | None = None
        self._text = False  # the first observation had text, and no step has dropped it yet
        self._where = ""

    def check(self, obs: Observation, where: str) -> None:
        """``obs``, returned by ``where`` (``"step()"``), against the first observation: a changed layout is an
        :class:`EnvContractError` naming each array and both shapes or dtypes."""
        states, images = _entries(obs.states), _entries(obs.images)
        if states != self._states or images != self._images:
            if self._states is None:
                self._images, self._states, self._where = images, states, where
                self._text = _has_text(obs.text)
                return
            changes = _layout_changes("images", self._images or [], images, where, self._where) + \
                _layout_changes("states", self._states, states, where, self._where)
            if changes:
                raise EnvContractError(
                    f"{'; '.join(changes)}: an env returns the same observation keys, each with one shape (after the "
                    "batch axis) and dtype, from every reset() and step() (servers size their inputs from the first "
                    "observation); fix the env"
                )
            self._images, self._states = images, states  # the same arrays in another order: compare with this one
        if self._text and where == "step()" and not _has_text(obs.text):
            self._text = False  # said once
            logger.warning("%s returned no text (an empty string for every env) where the first %s returned text: a "
                           "policy that reads text gets empty prompts; return the text on every step",
                           where, self._where)


def _layout_changes(kind: str, first: list[Entry], now: list[Entry], where: str, first_where: str) -> list[str]:
    """What differs between two layouts of ``images`` or ``states``, one phrase per array (keys in any order)."""
    old, new = {k: (s, d) for k, s, d in first}, {k: (s, d) for k, s, d in now}
    out = []
    for key in [k for k, _, _ in first] + [k for k, _, _ in now if k not in old]:
        name = f"{kind}[{key!r}]"
        if key not in new:
            out.append(f"{where} returned no {name}, which the first {first_where} returned")
        elif key not in old:
            out.append(f"{where} returned {name}, which the first {first_where} did not")
        elif new[key][0] != old[key][0]:
            out.append(f"{where} returned {name} of shape {new[key][0]} where the first {first_where} returned "
                       f"{old[key][0]}")
        elif new[key][1] != old[key][1]:
            out.append(f"{where} returned {name} of dtype {new[key][1]} where the first {first_where} returned "
                       f"{old[key][1]}")
    return out


# ------------------------------------------------------------------------------------------------ partial resets


class PartialResetCheck:
    """The rows a partial reset was not asked to reset come back as the env's latest observation had them (state
    arrays; see the module docstring)."""

    __slots__ = ("_latest", "_kept", "_before", "_reset_rows")

    def __init__(self) -> None:
        self._latest: dict[str, np.ndarray] | None = None
        self._kept: np.ndarray | None = None
        self._before: dict[str, np.ndarray] = {}
        self._reset_rows: np.ndarray | None = None

    def seen(self, obs: Observation) -> None:
        """The env returned ``obs`` (a step's, or a reset's): the rows a next reset leaves alone must keep it."""
        self._latest = obs.states

    def before(self, mask: np.ndarray) -> None:
        """A reset of the rows of ``mask`` is about to run: copy the other rows of the latest state arrays, and let
        go of those arrays (the step's observation need not stay alive while the env builds a whole new batch)."""
        latest, self._latest = self._latest, None
        if latest is None or mask.all():
            self._kept = None
            return
        self._kept, self._reset_rows = np.flatnonzero(~mask), mask
        self._before = {k: v[self._kept] for k, v in latest.items()}

    def after(self, obs: Observation) -> Problem | None:
        """What the reset returned, against the rows copied by :meth:`before`: the problem, or None."""
        self._latest = obs.states
        kept, self._kept = self._kept, None
        if kept is None:
            return None
        before, self._before = self._before, {}
        changed = []
        for key, old in before.items():
            new = obs.states.get(key)
            if new is None or new.shape[1:] != old.shape[1:]:
                continue  # a layout change, which the signature reports
            new = new[kept]
            if old.dtype == new.dtype and old.tobytes() == new.tobytes():
                continue  # the same bits: the common case, in one comparison of bytes
            same = old == new
            if old.dtype.kind in "fc" and new.dtype.kind in "fc":  # NaN stays NaN; -0.0 is 0.0
                same |= np.isnan(old) & np.isnan(new)
            rows = kept[~same.reshape(kept.size, -1).all(axis=1)]
            if rows.size:
                changed.append(changed_rows_phrase(f"states[{key!r}]", rows))
        if not changed:
            return None
        assert self._reset_rows is not None
        return partial_reset_problem(np.flatnonzero(self._reset_rows), sorted(changed))


# ------------------------------------------------------------------------------------------------ declared space


def undeclared_dtypes(space: Any, obs: Observation) -> list[str]:
    """Image and state arrays of ``obs`` whose dtype differs from the env's declared ``single_observation_space``,
    one phrase each (``states['pos'] is float64 where the space declares float32``). Checked once, on the first
    reset: gymnasium wrappers and recorders read the space, the server gets the arrays."""
    out = []
    for kind, arrays in (("images", obs.images), ("states", obs.states)):
        declared = _subspaces(space, kind)
        for key, arr in arrays.items():
            box = declared.get(key)
            dtype = getattr(box, "dtype", None)
            if dtype is not None and np.dtype(dtype) != arr.dtype:
                out.append(f"{kind}[{key!r}] is {arr.dtype} where the space declares {np.dtype(dtype)}")
    return out


def _subspaces(space: Any, kind: str) -> dict[str, Any]:
    try:
        return dict(space[kind].spaces)
    except (KeyError, TypeError, AttributeError):
        return {}


# ------------------------------------------------------------------------------------------------ lone surrogates

_SURROGATE_CODES = (0xD800, 0xE000)
_REPLACEMENT = 0xFFFD
_LONE = re.compile("[\ud800-\udfff]")
_PLAIN = frozenset({float, int, bool, type(None), np.float32, np.float64, np.int32, np.int64, np.bool_})
# A native '<U' array's code units, decoded straight from the array's buffer (no copy, no codec lookup).
_UTF32_DECODE = codecs.utf_32_le_decode if sys.byteorder == "little" else codecs.utf_32_be_decode
_DECODE_MAX = 4096  # bytes of text up to which decoding it costs less than numpy's reduction over it
_ARRAYS = {np.ndarray}
_DTYPE_KIND = operator.attrgetter("dtype.kind")
_CLEAN_KEYS_KEPT = 4096  # past this many distinct keys (or str values), new ones are checked on every call
_CLEAN_STR_LENGTH = 64  # longer str values are not kept: text that changes from step to step


def _field(where: tuple[Any, ...]) -> str:
    """The words for a place in an info: ``info['metrics']['score']``."""
    return "info" + "".join(f"[{key!r}]" for key in where)


def _codes(text: np.ndarray) -> np.ndarray:
    """The code points of a C-contiguous '<U' array, flat (a view: writing to it writes to ``text``)."""
    return text.reshape(-1).view(np.uint32)


def _native(text: np.ndarray) -> np.ndarray:
    """``text`` in the machine's byte order (a '>U' array read as code points otherwise gives byte-swapped ones)."""
    return text if text.dtype.byteorder in "=|" else text.astype(text.dtype.newbyteorder("="))


def _surrogate_mask(text: np.ndarray) -> np.ndarray | None:
    """Where a '<U' array holds a surrogate code point (a mask over its flat code points), or None when it holds
    none: one ``max`` for the common text entirely below U+D800, one range test otherwise."""
    if text.size == 0 or text.itemsize == 0:
        return None
    codes = _codes(np.ascontiguousarray(_native(text)))
    if int(codes.max()) < _SURROGATE_CODES[0]:
        return None
    mask = (codes >= _SURROGATE_CODES[0]) & (codes < _SURROGATE_CODES[1])
    return mask if mask.any() else None


def _text_array_fixed(text: np.ndarray) -> np.ndarray | None:
    """A copy of a '<U' array with every surrogate replaced by U+FFFD, or None when it holds none."""
    mask = _surrogate_mask(text)
    if mask is None:
        return None
    fixed = np.array(_native(text), copy=True, order="C")
    _codes(fixed)[mask] = _REPLACEMENT
    return fixed


def _str_fixed(text: str) -> str | None:
    """``text`` with every lone surrogate replaced by U+FFFD, or None when it holds none (``encode`` refuses
    surrogates and nothing else)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return _LONE.sub("\ufffd", text)
    return None


class TextCheck:
    """Lone surrogates in an env's text replaced by U+FFFD, with a warning once per field (see the module
    docstring)."""

    __slots__ = ("env_id", "_warned", "_clean_keys", "_clean_strs")

    def __init__(self, env_id: str) -> None:
        self.env_id = env_id
        self._warned: set[str] = set()
        self._clean_keys: set[Any] = set()  # keys that hold no lone surrogate (an info's keys repeat every step)
        self._clean_strs: set[str] = set()  # short str values that hold none (an info's modes and tags repeat too)

    def observation(self, obs: Observation) -> None:
        """The observation's text, fixed in place (a new array: the env's own is not written to)."""
        text = obs.text
        if text.dtype.byteorder == "=" and text.flags.c_contiguous:  # the common case, in one pass
            if text.nbytes <= _DECODE_MAX:
                try:  # a small batch: the UTF-32 codec refuses surrogates (and only those, in a numpy '<U' array)
                    _UTF32_DECODE(text, "strict", True)  # type: ignore[arg-type]  # an ndarray is a buffer
                    return
                except UnicodeDecodeError:
                    pass
            elif int(text.view(np.uint32).max()) < _SURROGATE_CODES[0]:  # a big one: a reduction is cheaper
                return
        fixed = _text_array_fixed(text)
        if fixed is not None:
            obs.text = fixed
            self._warn("the observation's text")

    def info(self, info: dict[str, Any], where: tuple[Any, ...] = ()) -> dict[str, Any]:
        """``info`` with its text fixed: the same dict when it holds no lone surrogate, else a copy of the maps on
        the way to each one (the env's own are not written to). ``where``: the keys of the map inside the info
        (the words of a warning are built only for a warning)."""
        clean = self._clean_keys
        if clean.issuperset(info):  # every key seen clean before: look at the values' types in C loops
            kinds = set(map(type, info.values()))
            if kinds <= _PLAIN or (kinds == _ARRAYS and "U" not in set(map(_DTYPE_KIND, info.values()))):
                return info
        out: dict[str, Any] | None = None
        for key, value in info.items():
            kind = type(value)
            if key in clean and (kind in _PLAIN or (kind is np.ndarray and value.dtype.kind != "U")
                                 or (kind is str and value in self._clean_strs)):
                continue  # a key seen before, a value that holds no text or a text seen clean: the common case
            name = key
            if type(key) is str and (fixed_key := _str_fixed(key)) is not None:
                name = fixed_key
                self._warn("a key of " + _field(where))
            fixed = self._value(value, (*where, name))
            if name is not key or fixed is not None:
                if out is None:
                    out = dict(info)
                if name is not key:
                    del out[key]
                out[name] = value if fixed is None else fixed
            elif name is key and len(clean) < _CLEAN_KEYS_KEPT:
                clean.add(key)
        return info if out is None else out

    def _value(self, value: Any, where: tuple[Any, ...]) -> Any:
        """``value`` with its text fixed, or None when it needs no fix."""
        fixed: Any = None
        if isinstance(value, np.ndarray):
            if value.dtype.kind == "U":
                fixed = _text_array_fixed(value)
        elif isinstance(value, dict):
            fixed = self.info(value, where)
            return None if fixed is value else fixed
        elif isinstance(value, str):
            fixed = _str_fixed(value)
            if fixed is None and len(value) <= _CLEAN_STR_LENGTH and len(self._clean_strs) < _CLEAN_KEYS_KEPT:
                self._clean_strs.add(value)  # a text that comes back step after step ("mean", a mode, a tag)
        elif isinstance(value, (list, tuple)) and any(type(v) is str for v in value):
            texts = [_str_fixed(v) if type(v) is str else None for v in value]
            if any(t is not None for t in texts):
                fixed = type(value)(v if t is None else t for v, t in zip(value, texts))
        if fixed is not None:
            self._warn(_field(where))
        return fixed

    def _warn(self, field: str) -> None:
        if field not in self._warned:
            self._warned.add(field)
            logger.warning("env %s returned a lone surrogate (half of a UTF-16 pair, which no UTF-8 file or message "
                           "can hold) in %s; each one is replaced by U+FFFD", self.env_id, field)


# ------------------------------------------------------------------------------------------------ the bundle


class EnvChecks:
    """The checks across calls of one env object, as its group calls them."""

    __slots__ = ("env_id", "n", "layout", "rows", "text")

    def __init__(self, env_id: str, num_envs: int, check_partial_reset: Literal["on", "off"] = "on") -> None:
        self.env_id, self.n = env_id, num_envs
        self.layout = ObservationSignature()
        self.rows = PartialResetCheck() if check_partial_reset == "on" else None
        self.text = TextCheck(env_id)

    def before_reset(self, options: dict[str, Any] | None) -> None:
        """Call right before ``env.reset(options=options)``."""
        if self.rows is not None:
            mask = None if options is None else options.get("reset_mask")
            self.rows.before(mask if isinstance(mask, np.ndarray) and mask.dtype == np.bool_ and mask.shape == (self.n,)
                             else reset_mask_of(options, self.n))

    def after_reset(self, obs: Observation, info: dict[str, Any]) -> dict[str, Any]:
        """Call with the (contract-checked) observation and info ``env.reset`` returned, before anything uses them;
        use the info it returns (its text fixed, see :class:`TextCheck`)."""
        self._layout(obs, "reset()")
        self.text.observation(obs)
        info = self.text.info(info)
        if self.rows is not None:
            problem = self.rows.after(obs)
            if problem is not None:
                raise EnvContractError(f"env {self.env_id}: {problem.message} (checked after every partial reset; "
                                       f"{PARTIAL_RESET_FLAG} skips the check)")
        return info

    def after_step(self, obs: Observation, info: dict[str, Any]) -> dict[str, Any]:
        """Call with the (contract-checked) observation and info ``env.step`` returned, before anything uses them;
        use the info it returns (its text fixed, see :class:`TextCheck`)."""
        self._layout(obs, "step()")
        if self.rows is not None:
            self.rows.seen(obs)
        self.text.observation(obs)
        return self.text.info(info) if info else info

    def _layout(self, obs: Observation, where: str) -> None:
        try:
            self.layout.check(obs, where)
        except EnvContractError as exc:
            raise EnvContractError(f"env {self.env_id}: {exc}") from None
