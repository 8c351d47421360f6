"""A message's msgpack bytes, written with each array's layout kept from one message to the next.

msgpack-python packs an ndarray through the codec's ``default`` hook: a Python call per array that builds a
four-key map (``__ndarray__``, ``data``, ``dtype``, ``shape``), which msgpack then packs key by key. A rollout's
messages carry the same arrays step after step (a Gymnasium info alone is a dozen small arrays per feedback), so
that map costs the same work every time for bytes that only the data changes. :class:`MessageWriter` keeps, per
``(dtype, shape)``, the bytes around an array's data (the map header, the keys, the ``bin`` header, the dtype string
and the shape), and per str the bytes of a map key, and writes a message as a list of pieces: those kept bytes and
the arrays themselves, joined once. That halves the packing of a typical feedback (24 -> 13 us for 8 Hopper envs).

The bytes are exactly those of :func:`~plugrl_env_client.protocol.codec.packb`: what the writer does not lay out
itself (numbers, None, numpy scalars, non-str keys, arrays that are not plain, C-contiguous and of a kind the
buffer protocol exports) goes to a msgpack packer with the codec's hook, which is what packb is. A message that holds
a container msgpack would nest (a list, a tuple, a dict subclass), or maps nested deeper than :data:`MAX_DEPTH`, is
packed by msgpack whole, so that msgpack's own nesting limit counts every level as it does in packb (PlugRL's infer
and feedback messages hold neither). The tests compare the bytes with packb's.

A :data:`SLOT` as a map's value stays a piece of its own (:meth:`MessageWriter.pieces`): a caller fills it with a
part packed (and timed) apart, which is how a feedback's observation and info costs are measured.
"""

from __future__ import annotations

import os
import struct
from typing import Any

import msgpack
import numpy as np

from plugrl_env_client.protocol import codec

__all__ = ["MAX_DEPTH", "SLOT", "MessageWriter", "bin_header"]

MAX_DEPTH = 32
"""Maps nested deeper than this are left to msgpack (messages nest four or five deep)."""
MAX_KEPT = 4096
"""At most this many strs and array layouts are kept (a peer of ever new keys must not grow them without bound)."""
MAX_KEPT_STR = 64
"""Longer strs are not kept (text values change from message to message; keys and message types do not)."""

_BUFFER_KINDS = codec.BUFFER_KINDS  # the codec hands these to msgpack as buffers: the same bytes as these pieces
_NESTING = (dict, list, tuple)  # what msgpack nests: a message holding one the writer does not lay out goes whole


class _Slot:
    """Where a part goes in a skeleton message."""

    def __repr__(self) -> str:
        return "SLOT"


SLOT = _Slot()
"""The placeholder of a part in a skeleton message (see :meth:`MessageWriter.pieces`)."""


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


class MessageWriter:
    """Writes messages as msgpack pieces (see the module docstring). Not thread-safe: one per packer."""

    def __init__(self) -> None:
        self._packer = msgpack.Packer(default=codec.encode_numpy, use_bin_type=True)
        self._strs: dict[str, bytes] = {}
        self._layouts: dict[tuple[np.dtype, tuple[int, ...]], tuple[bytes, bytes]] = {}
        self._marker = os.urandom(16)  # stands for an array's data while its layout is worked out
        self._marked = self._packer.pack(self._marker)

    def write(self, msg: Any) -> bytes:
        """The msgpack bytes of ``msg`` (a message without slots): the bytes of ``codec.packb(msg)``. Raises what
        msgpack and the codec raise for what they cannot carry."""
        pieces = self.pieces(msg)
        try:
            return b"".join(pieces)
        except TypeError:
            if any(piece is SLOT for piece in pieces):
                raise RuntimeError("write() got a message holding slots: fill them (FramePacker.pack_parts)") from None
            raise

    def pieces(self, msg: Any) -> list[Any]:
        """``msg`` as a list of pieces whose concatenation is its msgpack bytes: bytes, arrays (their own memory,
        not copied) and, for each :data:`SLOT`, the SLOT itself, in the order of the message."""
        out: list[Any] = []
        try:
            self._emit(msg, out, 0)
        except _ToMsgpack:
            return [self._packer.pack(msg)]  # (a slot in such a message is refused by the codec's hook)
        return out

    def _emit(self, obj: Any, out: list[Any], depth: int) -> None:
        """``obj``'s pieces onto ``out``. A map's values are laid out here, in its loop (one call per map, not per
        value: a feedback holds a few maps and a few dozen values)."""
        if type(obj) is not dict:
            self._value(obj, out)
            return
        if depth >= MAX_DEPTH:
            raise _ToMsgpack
        n = len(obj)
        out.append(_MAP_HEADERS[n] if n < 16 else _map_header(n))
        strs, layouts, pack = self._strs, self._layouts, self._packer.pack
        for key, value in obj.items():
            if type(key) is str:
                packed = strs.get(key)
                out.append(packed if packed is not None else self._str(key))
            else:
                out.append(pack(key))
            kind = type(value)
            if kind is np.ndarray and value.ndim and value.flags.c_contiguous and value.dtype.kind in _BUFFER_KINDS:
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
                self._value(value, out)

    def _value(self, obj: Any, out: list[Any]) -> None:
        """A value the writer does not lay out: a slot, or msgpack's (the whole message's, when msgpack nests it)."""
        if obj is SLOT:
            out.append(SLOT)
        elif isinstance(obj, _NESTING):
            raise _ToMsgpack
        else:
            out.append(self._packer.pack(obj))

    def _str(self, text: str) -> bytes:
        packed = self._packer.pack(text)
        if len(text) <= MAX_KEPT_STR and len(self._strs) < MAX_KEPT:
            self._strs[text] = packed
        return packed

    def _layout(self, arr: np.ndarray) -> tuple[bytes, bytes] | None:
        """The bytes before and after an array's data, taken from the codec's own map for it
        (:func:`codec.encode_numpy`, packed with a marker for the data: one rule for what an array travels as).
        None for 4 GiB or more (msgpack's bin cannot hold it), or if the marker turned up twice (a 2**-128 chance):
        the message then goes to msgpack whole."""
        if arr.nbytes >= 1 << 32:
            return None
        encoded = codec.encode_numpy(arr)
        encoded[codec.DATA_KEY] = self._marker
        around = self._packer.pack(encoded).split(self._marked)
        if len(around) != 2:
            return None
        layout = (around[0] + bin_header(arr.nbytes), around[1])
        if len(self._layouts) < MAX_KEPT:
            self._layouts[(arr.dtype, arr.shape)] = layout
        return layout
