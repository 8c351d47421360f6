"""numpy <-> msgpack, byte-compatible with the ndarray convention PlugRL servers use: the package's one encoder
and one decoder of it.

An ndarray travels as a map with bytes keys ``__ndarray__``, ``data`` (raw C-order bytes), ``dtype`` (numpy
typestr) and ``shape``; a numpy scalar as ``__npgeneric__``, ``data``, ``dtype``. Object, void and complex dtypes
are refused both ways (the convention cannot carry them without pickle).

:class:`MessageWriter` writes a message as pieces whose concatenation is msgpack-python's bytes with the
:func:`encode_numpy` hook (the tests hold it to them): it keeps, per array ``(dtype, shape)``, the bytes around the
data, taken from the hook's own map, and per str its packed bytes, and emits arrays as their own memory. What it
does not lay out goes to msgpack with the hook; a message holding a list or tuple, or maps deeper than
:data:`MAX_DEPTH`, goes to msgpack whole, so msgpack's nesting limit counts every level.

The decoder validates every array (dtype, shape, data length): a broken peer gives one ``ProtocolError`` that says
what was wrong, never a numpy exception deep inside a rollout.
"""

from __future__ import annotations

import math
import os
import struct
import threading
import time
from typing import Any

import msgpack
import numpy as np

from plugrl_env_client.errors import ProtocolError

__all__ = ["MAX_DEPTH", "MessageWriter", "ProtocolError", "Timed", "bin_header", "encode_numpy", "packb", "unencodable",
           "unpackb"]

_REFUSED_KINDS = frozenset("OVc")
BUFFER_KINDS = frozenset("biufSU")
"""Kinds numpy exports through the buffer protocol (datetime/timedelta are not), so they can be sent without a copy."""
_MAX_CODE_POINT = 0x10FFFF
_ND, _NG, _DATA, _DTYPE, _SHAPE = b"__ndarray__", b"__npgeneric__", b"data", b"dtype", b"shape"


def encode_numpy(obj: Any) -> Any:
    """msgpack's ``default`` hook: an ndarray or numpy scalar as its map (the array's own buffer when it can lend
    it: no copy), and a :class:`ProtocolError` for anything the convention cannot carry. Every packer of the project
    uses it, so there is one set of rules for what travels. A :class:`Timed` part (in a message msgpack packs whole)
    stands for its value."""
    timed = type(obj) is Timed
    while type(obj) is Timed:
        obj = obj.value
    if isinstance(obj, np.ndarray):
        if obj.dtype.kind in _REFUSED_KINDS:
            raise ProtocolError(f"cannot send an array of dtype {obj.dtype} (object, void and complex are refused)")
        # A C-contiguous plain ndarray is handed to msgpack as a buffer: one copy (into the frame) instead of two.
        # Subclasses go through tobytes(): some override ``.data`` (np.ma.MaskedArray) or ``tobytes`` (which is
        # what the reference convention sends).
        data: memoryview | bytes
        if type(obj) is np.ndarray and obj.flags.c_contiguous and obj.ndim > 0 and obj.dtype.kind in BUFFER_KINDS:
            data = memoryview(obj)  # type: ignore[arg-type]  # numpy arrays export the buffer protocol
        else:
            data = obj.tobytes()
        return {_ND: True, _DATA: data, _DTYPE: obj.dtype.str, _SHAPE: list(obj.shape)}
    if isinstance(obj, np.generic):
        if obj.dtype.kind in _REFUSED_KINDS:
            raise ProtocolError(f"cannot send a scalar of dtype {obj.dtype} (object, void and complex are refused)")
        return {_NG: True, _DATA: obj.item(), _DTYPE: obj.dtype.str}
    if isinstance(obj, int) and not -(1 << 63) <= obj < 1 << 64:  # msgpack hands ints beyond 64 bits to this hook
        raise ProtocolError(f"cannot encode the integer {obj}: msgpack integers are limited to 64 bits")
    if timed:  # a value msgpack packs itself
        return obj
    raise ProtocolError(f"cannot encode a value of type {type(obj).__name__}; send numpy arrays, str, numbers, lists or dicts")


# ------------------------------------------------------------------------------------------------ the encoder

MAX_DEPTH = 32
"""Maps nested deeper than this are left to msgpack (messages nest four or five deep)."""
MAX_KEPT = 4096
"""At most this many strs and array layouts are kept (a peer of ever new keys must not grow them without bound)."""
MAX_KEPT_STR = 64
"""Longer strs are not kept (text values change from message to message; keys and message types do not)."""

_NESTING = (dict, list, tuple)  # what msgpack nests: a message holding one the writer does not lay out goes whole


class Timed:
    """A part of a message whose writing is timed: :class:`MessageWriter` lays ``value`` out where the part
    stands and leaves in :attr:`seconds` how long that took, so a message is written in one pass and a part's cost is
    still known (a feedback's observation and info). A part msgpack would nest is packed by msgpack alone (its
    nesting limit then counts from the part). The seconds say nothing when the message as a whole goes to msgpack
    (it holds a list or a tuple outside its timed parts): the parts are packed with it, untimed."""

    __slots__ = ("value", "seconds")

    def __init__(self, value: Any) -> None:
        self.value, self.seconds = value, 0.0


class _ToMsgpack(Exception):
    """Raised inside :meth:`MessageWriter._emit` to hand the whole message to msgpack (see the module docstring)."""


def _map_header(n: int) -> bytes:
    if n < 16:
        return bytes((0x80 | n,))
    return b"\xde" + struct.pack("!H", n) if n < 1 << 16 else b"\xdf" + struct.pack("!I", n)


def bin_header(n: int) -> bytes:
    """The msgpack ``bin`` header of ``n`` bytes; a ValueError from 4 GiB on, worded as msgpack words it."""
    if n >= 1 << 32:
        raise ValueError("memoryview is too large")
    if n < 1 << 8:
        return b"\xc4" + bytes((n,))
    return b"\xc5" + struct.pack("!H", n) if n < 1 << 16 else b"\xc6" + struct.pack("!I", n)


_MAP_HEADERS = [_map_header(n) for n in range(16)]


def lays_out(arr: np.ndarray) -> bool:
    """Whether the writer lays a plain ndarray out itself, its data as its own memory: C-contiguous, of a kind the
    buffer protocol exports, with at least one dimension (the rest goes through :func:`encode_numpy`)."""
    return bool(arr.ndim) and arr.flags.c_contiguous and arr.dtype.kind in BUFFER_KINDS


class MessageWriter:
    """Writes messages as msgpack pieces (see the module docstring). Not thread-safe: one per packer or thread."""

    def __init__(self) -> None:
        self._packer = msgpack.Packer(default=encode_numpy, use_bin_type=True)
        self._strs: dict[str, bytes] = {}
        self.layouts: dict[tuple[np.dtype, tuple[int, ...]], tuple[bytes, bytes]] = {}
        """The bytes before and after the data of each array layout seen, by ``(dtype, shape)``."""
        self._marker = os.urandom(16)  # stands for an array's data while its layout is worked out
        self._marked = self._packer.pack(self._marker)

    def write(self, msg: Any) -> bytes:
        """The msgpack bytes of ``msg``. Raises what msgpack and the convention's hook raise for what they cannot
        carry."""
        return b"".join(self.pieces(msg))

    def pieces(self, msg: Any) -> list[Any]:
        """``msg`` as a list of pieces whose concatenation is its msgpack bytes: bytes and arrays (their own
        memory, not copied), in the order of the message."""
        out: list[Any] = []
        try:
            self._emit(msg, out, 0)
        except _ToMsgpack:
            return [self._packer.pack(msg)]
        return out

    def _emit(self, obj: Any, out: list[Any], depth: int) -> None:
        """``obj``'s pieces onto ``out``. A map's values are laid out here, in its loop (one call per map, not per
        value: a feedback holds a few maps and a few dozen values)."""
        if type(obj) is not dict:
            self._value(obj, out, depth)
            return
        if depth >= MAX_DEPTH:
            raise _ToMsgpack
        n = len(obj)
        out.append(_MAP_HEADERS[n] if n < 16 else _map_header(n))
        strs, layouts, pack = self._strs, self.layouts, self._packer.pack
        for key, value in obj.items():
            if type(key) is str:
                packed = strs.get(key)
                out.append(packed if packed is not None else self._str(key))
            else:
                out.append(pack(key))
            kind = type(value)
            if kind is np.ndarray and lays_out(value):
                layout = layouts.get((value.dtype, value.shape))
                if layout is None:
                    layout = self._layout(value)
                    if layout is None:  # 4 GiB or more (msgpack says why it cannot), or a marker clash
                        raise _ToMsgpack
                out.append(layout[0])
                out.append(value)
                out.append(layout[1])
            elif kind is dict:
                self._emit(value, out, depth + 1)
            elif kind is str:
                packed = strs.get(value)
                out.append(packed if packed is not None else self._str(value))
            else:
                self._value(value, out, depth + 1)

    def _value(self, obj: Any, out: list[Any], depth: int) -> None:
        """A value the writer does not lay out: a timed part, or msgpack's (the whole message's, when msgpack nests
        it)."""
        if type(obj) is Timed:
            start, mark = time.perf_counter(), len(out)
            try:
                self._emit(obj.value, out, depth)
            except _ToMsgpack:  # the part alone goes to msgpack, as a message of its own would
                del out[mark:]
                out.append(self._packer.pack(obj.value))
            obj.seconds = time.perf_counter() - start
        elif isinstance(obj, _NESTING):
            raise _ToMsgpack
        else:
            out.append(self._packer.pack(obj))

    def _str(self, text: str) -> bytes:
        packed = self._packer.pack(text)
        if len(text) <= MAX_KEPT_STR and len(self._strs) < MAX_KEPT:
            self._strs[text] = packed
        return packed

    def layout_of(self, arr: Any) -> tuple[bytes, bytes] | None:
        """The bytes around ``arr``'s data as the writer lays it out (kept, or made now), or None for what it does
        not lay out itself (:func:`lays_out`)."""
        if type(arr) is not np.ndarray or not lays_out(arr):
            return None
        return self.layouts.get((arr.dtype, arr.shape)) or self._layout(arr)

    def _layout(self, arr: np.ndarray) -> tuple[bytes, bytes] | None:
        """The bytes before and after an array's data, taken from the codec's own map for it
        (:func:`encode_numpy`, packed with a marker for the data: one rule for what an array travels as).
        None for 4 GiB or more (msgpack's bin cannot hold it), or if the marker turned up twice (a 2**-128 chance):
        the message then goes to msgpack whole."""
        if arr.nbytes >= 1 << 32:
            return None
        encoded = encode_numpy(arr)
        encoded[_DATA] = self._marker
        around = self._packer.pack(encoded).split(self._marked)
        if len(around) != 2:
            return None
        layout = (around[0] + bin_header(arr.nbytes), around[1])
        if len(self.layouts) < MAX_KEPT:
            self.layouts[(arr.dtype, arr.shape)] = layout
        return layout



# ------------------------------------------------------------------------------------------------ the decoder

_KNOWN_DTYPES: dict[str, np.dtype] = {}
"""Typestrs already validated (a frame carries ~10 arrays of a handful of dtypes; parsing each costs ~1 us)."""
_KNOWN_DTYPES_MAX = 256  # a peer sending ever new typestrs must not grow it without bound


def _dtype(value: Any) -> np.dtype:
    known = _KNOWN_DTYPES.get(value) if type(value) is str else None
    if known is not None:
        return known
    if not isinstance(value, str):
        raise ProtocolError(f"array dtype must be a numpy typestr string, got {value!r}")
    if value.lstrip("<>|=").startswith("a"):  # numpy 2 deprecates the alias (a warning, then an error): refuse it
        raise ProtocolError(f"array dtype {value!r} uses numpy's deprecated 'a' alias; send bytes as 'S' (e.g. '|S5')")
    try:
        dtype = np.dtype(value)
    except TypeError:
        raise ProtocolError(f"array dtype {value!r} is not a numpy typestr") from None
    if dtype.kind in _REFUSED_KINDS:
        raise ProtocolError(f"array dtype {value!r} is refused (object, void and complex cannot travel safely)")
    if dtype.itemsize <= 0:
        raise ProtocolError(f"array dtype {value!r} has no item size (give strings a length, e.g. '<U1')")
    if type(value) is str and len(_KNOWN_DTYPES) < _KNOWN_DTYPES_MAX:
        _KNOWN_DTYPES[value] = dtype
    return dtype


def _decode_ndarray(obj: dict) -> np.ndarray:
    typestr = obj.get(_DTYPE)
    dtype = _KNOWN_DTYPES.get(typestr) if type(typestr) is str else None  # (a call less for the usual ones)
    if dtype is None:
        dtype = _dtype(typestr)
    shape, data = obj.get(_SHAPE), obj.get(_DATA)
    if not isinstance(shape, (list, tuple)):
        raise ProtocolError(f"array shape must be a list of non-negative ints, got {shape!r}")
    for d in shape:  # a loop, not all(...): no generator per array (a feedback carries a dozen)
        if type(d) is not int or d < 0:  # type(): no bools
            raise ProtocolError(f"array shape must be a list of non-negative ints, got {shape!r}")
    if not isinstance(data, bytes):
        raise ProtocolError(f"array data must be bytes, got {type(data).__name__}")
    expected = math.prod(shape) * dtype.itemsize
    if len(data) != expected:
        raise ProtocolError(
            f"array data has {len(data)} bytes but shape {list(shape)} of dtype {dtype.str} needs {expected}"
        )
    try:
        arr = np.frombuffer(data, dtype=dtype).reshape(shape)
    except ValueError as exc:  # e.g. more than 32 dimensions, or a dimension numpy cannot index
        raise ProtocolError(f"array of dtype {dtype.str} and shape {list(shape)} cannot be built: {exc}") from None
    if dtype.kind == "U" and arr.size:
        # numpy accepts any 32-bit code unit here and fails only later, with a SystemError, when a row is read.
        units = np.frombuffer(data, dtype=dtype.byteorder.replace("|", "=") + "u4")
        if int(units.max()) > _MAX_CODE_POINT:
            raise ProtocolError(f"text array of dtype {dtype.str} holds a value that is not a unicode code point")
    return arr


def _decode_generic(obj: dict) -> np.generic:
    dtype = _dtype(obj.get(_DTYPE))
    if _DATA not in obj:
        raise ProtocolError(f"numpy scalar of dtype {dtype.str} has no 'data'")
    try:
        with np.errstate(over="raise"):  # 1e300 as a float32 would become inf: a value the dtype cannot hold
            value = dtype.type(obj[_DATA])
    except (TypeError, ValueError, OverflowError, FloatingPointError) as exc:
        raise ProtocolError(f"numpy scalar of dtype {dtype.str} has an unusable value: {exc}") from None
    if not isinstance(value, np.generic):  # e.g. np.float64([1, 2]) builds an array
        raise ProtocolError(f"numpy scalar of dtype {dtype.str} must carry one plain value, got {obj[_DATA]!r}")
    if value.dtype.itemsize == 0:  # an empty string scalar: numpy sizes it 0 bytes, which no frame can carry back
        raise ProtocolError(f"numpy scalar of dtype {dtype.str} carries an empty string; send a plain str or bytes")
    return value


def _object_hook(obj: dict) -> Any:
    if _ND in obj:
        return _decode_ndarray(obj)
    if _NG in obj:
        return _decode_generic(obj)
    for key in obj:
        if not isinstance(key, (str, bytes)):
            raise ProtocolError(f"map keys must be str or bytes, got {key!r} ({type(key).__name__})")
    return obj


_WRITERS = threading.local()  # a writer is not thread-safe: one per thread that packs


def packb(obj: Any) -> bytes:
    """One message (dicts, lists, str, numbers, numpy arrays and scalars) as msgpack bytes, written by this
    thread's :class:`MessageWriter`."""
    writer = getattr(_WRITERS, "writer", None)
    if writer is None:
        writer = _WRITERS.writer = MessageWriter()
    try:
        return writer.write(obj)
    except ProtocolError:
        raise
    except (OverflowError, UnicodeEncodeError, ValueError, TypeError) as exc:
        raise unencodable(exc) from None


def unencodable(exc: Exception) -> ProtocolError:
    """The error for what msgpack itself refused (an int beyond 64 bits, a str with a lone surrogate, nesting deeper
    than msgpack allows), as every packer reports it."""
    return ProtocolError(f"cannot encode the message: {type(exc).__name__}: {exc}")


def unpackb(data: bytes | bytearray | memoryview) -> Any:
    """Decode one msgpack message; every failure is a :class:`ProtocolError` saying what was wrong."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ProtocolError(f"expected a binary frame, got {type(data).__name__}")
    try:
        return msgpack.unpackb(data, object_hook=_object_hook, raw=False, strict_map_key=False)
    except ProtocolError:
        raise
    except Exception as exc:  # ExtraData, FormatError, StackError, ValueError, TypeError, RecursionError, ...
        # Several msgpack errors carry no text (e.g. the reserved byte 0xc1); the class name still says something.
        why = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        raise ProtocolError(f"frame is not a valid msgpack message ({why})") from None
