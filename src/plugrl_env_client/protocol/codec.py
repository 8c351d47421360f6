"""numpy <-> msgpack, byte-compatible with the ndarray convention PlugRL servers use.

An ndarray travels as a map with bytes keys ``__ndarray__``, ``data`` (raw C-order bytes), ``dtype`` (numpy
typestr) and ``shape``; a numpy scalar as ``__npgeneric__``, ``data`` (a plain value), ``dtype``. Object, void and
complex dtypes are refused both ways: the convention cannot carry them without pickle, which we never use.

Decoding validates every array (dtype, shape, data length) so a broken peer produces one ``ProtocolError`` with a
message, never a numpy exception from deep inside a rollout.
"""

from __future__ import annotations

import math
from typing import Any

import msgpack
import numpy as np

from plugrl_env_client.errors import ProtocolError

__all__ = ["ProtocolError", "packb", "unpackb"]

_REFUSED_KINDS = frozenset("OVc")
_ND, _NG, _DATA, _DTYPE, _SHAPE = b"__ndarray__", b"__npgeneric__", b"data", b"dtype", b"shape"


def _encode(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        if obj.dtype.kind in _REFUSED_KINDS:
            raise ProtocolError(f"cannot send an array of dtype {obj.dtype} (object, void and complex are refused)")
        # A C-contiguous array is handed to msgpack as a buffer: one copy (into the frame) instead of two.
        data = obj.data if obj.flags.c_contiguous and obj.ndim > 0 else obj.tobytes()
        return {_ND: True, _DATA: data, _DTYPE: obj.dtype.str, _SHAPE: list(obj.shape)}
    if isinstance(obj, np.generic):
        if obj.dtype.kind in _REFUSED_KINDS:
            raise ProtocolError(f"cannot send a scalar of dtype {obj.dtype} (object, void and complex are refused)")
        return {_NG: True, _DATA: obj.item(), _DTYPE: obj.dtype.str}
    raise ProtocolError(f"cannot encode a value of type {type(obj).__name__}; send numpy arrays, str, numbers, lists or dicts")


def _dtype(value: Any) -> np.dtype:
    if not isinstance(value, str):
        raise ProtocolError(f"array dtype must be a numpy typestr string, got {value!r}")
    try:
        dtype = np.dtype(value)
    except TypeError:
        raise ProtocolError(f"array dtype {value!r} is not a numpy typestr") from None
    if dtype.kind in _REFUSED_KINDS:
        raise ProtocolError(f"array dtype {value!r} is refused (object, void and complex cannot travel safely)")
    return dtype


def _decode_ndarray(obj: dict) -> np.ndarray:
    dtype = _dtype(obj.get(_DTYPE))
    shape, data = obj.get(_SHAPE), obj.get(_DATA)
    if not isinstance(shape, (list, tuple)) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise ProtocolError(f"array shape must be a list of non-negative ints, got {shape!r}")
    if not isinstance(data, bytes):
        raise ProtocolError(f"array data must be bytes, got {type(data).__name__}")
    expected = math.prod(shape) * dtype.itemsize
    if len(data) != expected:
        raise ProtocolError(
            f"array data has {len(data)} bytes but shape {list(shape)} of dtype {dtype.str} needs {expected}"
        )
    return np.frombuffer(data, dtype=dtype).reshape(shape)


def _decode_generic(obj: dict) -> np.generic:
    dtype = _dtype(obj.get(_DTYPE))
    try:
        return dtype.type(obj.get(_DATA))
    except (TypeError, ValueError, OverflowError) as exc:
        raise ProtocolError(f"numpy scalar of dtype {dtype.str} has an unusable value: {exc}") from None


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
    return msgpack.packb(obj, default=_encode, use_bin_type=True)


def unpackb(data: bytes) -> Any:
    """Decode one msgpack message; every failure is a :class:`ProtocolError` saying what was wrong."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ProtocolError(f"expected a binary frame, got {type(data).__name__}")
    try:
        return msgpack.unpackb(data, object_hook=_object_hook, raw=False, strict_map_key=False)
    except ProtocolError:
        raise
    except (msgpack.ExtraData, msgpack.FormatError, msgpack.StackError, ValueError, TypeError) as exc:
        raise ProtocolError(f"frame is not a valid msgpack message: {exc}") from None
    except Exception as exc:  # the C unpacker raises a few more kinds on garbage (e.g. RecursionError)
        raise ProtocolError(f"frame is not a valid msgpack message: {type(exc).__name__}: {exc}") from None
