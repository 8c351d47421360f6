"""numpy <-> msgpack, byte-compatible with the ndarray convention PlugRL servers use.

An ndarray travels as a map with bytes keys ``__ndarray__``, ``data`` (raw C-order bytes), ``dtype`` (numpy
typestr) and ``shape``; a numpy scalar as ``__npgeneric__``, ``data`` (a plain value), ``dtype``. Object, void and
complex dtypes are refused both ways: the convention cannot carry them without pickle, which we never use.

Decoding validates every array (dtype, shape, data length) so a broken peer produces one ``ProtocolError`` with a
message, never a numpy exception from deep inside a rollout.

Copies: an array's bytes are copied once on the way out, into the frame (:func:`encode_numpy` hands msgpack the array's
own buffer). On the way in, msgpack copies each array's bytes out of the frame once and ``np.frombuffer`` wraps them.
"""

from __future__ import annotations

import math
from typing import Any

import msgpack
import numpy as np

from plugrl_env_client.errors import ProtocolError

__all__ = ["ProtocolError", "encode_numpy", "packb", "unencodable", "unpackb"]

_REFUSED_KINDS = frozenset("OVc")
BUFFER_KINDS = frozenset("biufSU")
"""Kinds numpy exports through the buffer protocol (datetime/timedelta are not), so they can be sent without a copy."""
_MAX_CODE_POINT = 0x10FFFF
_ND, _NG, _DATA, _DTYPE, _SHAPE = b"__ndarray__", b"__npgeneric__", b"data", b"dtype", b"shape"
DATA_KEY = _DATA
"""The key of an array's bytes in its map (what :class:`~plugrl_env_client.protocol.frame_packer.MessageWriter` fills)."""


def encode_numpy(obj: Any) -> Any:
    """msgpack's ``default`` hook: an ndarray or numpy scalar as its map (the array's own buffer when it can lend
    it: no copy), and a :class:`ProtocolError` for anything the convention cannot carry. Every packer of the project
    uses it, so there is one set of rules for what travels."""
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
    if isinstance(obj, int):  # msgpack hands ints beyond 64 bits to this hook
        raise ProtocolError(f"cannot encode the integer {obj}: msgpack integers are limited to 64 bits")
    raise ProtocolError(f"cannot encode a value of type {type(obj).__name__}; send numpy arrays, str, numbers, lists or dicts")


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
    dtype = _dtype(obj.get(_DTYPE))
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
        value = dtype.type(obj[_DATA])
    except (TypeError, ValueError, OverflowError) as exc:
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


def packb(obj: Any) -> bytes:
    """Encode one message (dicts, lists, str, numbers, numpy arrays and scalars) to msgpack bytes."""
    try:
        return msgpack.packb(obj, default=encode_numpy, use_bin_type=True)
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
