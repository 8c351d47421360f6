"""One encoder: a message's msgpack bytes, laid out straight into its masked client frame.

msgpack-python packs an ndarray through the codec's ``default`` hook: a Python call per array that builds a
four-key map (``__ndarray__``, ``data``, ``dtype``, ``shape``), which msgpack then packs key by key. A rollout's
messages carry the same arrays step after step (a Gymnasium info alone is a dozen small arrays per feedback), so
:class:`MessageWriter` keeps, per ``(dtype, shape)``, the bytes around an array's data (the map header, the keys,
the ``bin`` header, the dtype string and the shape), and per str the bytes of a map key, and writes a message as a
list of pieces: those kept bytes and the arrays themselves (their own memory, not copied).

RFC 6455 makes a client mask every byte it sends with the frame's 4-byte key, so masking is a copy anyway; it is the
only one here: :class:`FramePacker` joins a small message's pieces once and masks them with websockets' C helper,
and lays a big one out in a frame buffer it keeps for the connection's life, masking each big array's bytes from the
array itself (no fresh memory once the buffer has the size of the largest message, and no second copy of the frame
as websockets' own framing makes).

The bytes are exactly those of :func:`~plugrl_env_client.protocol.codec.packb`, framed as a masked, final binary
frame: what the writer does not lay out itself (numbers, None, numpy scalars, non-str keys, arrays that are not
plain, C-contiguous and of a kind the buffer protocol exports) goes to a msgpack packer with the codec's hook, which
is what packb is. A message that holds a container msgpack would nest (a list, a tuple, a dict subclass), or maps
nested deeper than :data:`MAX_DEPTH`, is packed by msgpack whole, so that msgpack's own nesting limit counts every
level as it does in packb (PlugRL's infer and feedback messages hold neither outside ``info``). The tests compare the
bytes with packb's, framed by websockets.

A :data:`SLOT` as a map's value stays a piece of its own: :meth:`FramePacker.pack_parts` fills it with a part laid
out (and timed) apart, which is how a feedback's observation and info costs are measured in the one encoding the
message gets.
"""

from __future__ import annotations

import os
import struct
import time
from collections.abc import Sequence
from typing import Any

import msgpack
import numpy as np
from websockets.frames import apply_mask

from plugrl_env_client.protocol import codec

__all__ = ["BIG_ARRAY", "MAX_DEPTH", "SLOT", "WALK_MIN", "FramePacker", "MessageWriter", "bin_header", "frame_header"]

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
                raise RuntimeError("a message holding slots: fill them (FramePacker.pack_parts)") from None
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


WALK_MIN = 1 << 17
"""Messages whose arrays hold fewer bytes than this are joined, then masked (two copies of little): laying a frame
out costs some microseconds more, which only pays from a few hundred kB on."""
BIG_ARRAY = 1 << 14
"""Arrays of at least this many bytes are masked straight from their own memory; smaller ones go with the msgpack
bytes around them."""
_HEAD_ROOM = 16  # the payload starts here in the buffer (8-aligned); the header (at most 14 bytes) ends here
_MSGPACK_ERRORS = (OverflowError, UnicodeEncodeError, ValueError, TypeError)
_BINARY_FIN = 0x82  # FIN | opcode 2: a final binary frame, no RSV bits (no extensions)
_MASKED = 0x80


def frame_header(length: int) -> bytes:
    """The first bytes of a masked, final binary frame of ``length`` payload bytes (without the key), with the
    shortest length encoding."""
    if length < 126:
        return struct.pack("!BB", _BINARY_FIN, _MASKED | length)
    if length < 1 << 16:
        return struct.pack("!BBH", _BINARY_FIN, _MASKED | 126, length)
    return struct.pack("!BBQ", _BINARY_FIN, _MASKED | 127, length)


class FramePacker:
    """Packs messages into masked client frames (see the module docstring); a frame is valid until the next
    :meth:`pack`. Not thread-safe: one per connection, kept across its reconnects."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._keys = b""
        self._next_key = 0
        self._writer = MessageWriter()

    def _key(self) -> bytes:
        if self._next_key >= len(self._keys):
            self._keys, self._next_key = os.urandom(4 * 1024), 0  # one system call per 1024 frames
        self._next_key += 4
        return self._keys[self._next_key - 4:self._next_key]

    def pack(self, msg: Any, size_hint: int = 0, key: bytes | None = None) -> memoryview:
        """The whole frame (header, key, masked payload) of ``msg``. ``size_hint`` is the bytes of its arrays
        (what makes laying it out worth it); ``key`` is for tests. Raises
        :class:`~plugrl_env_client.protocol.codec.ProtocolError` for what the codec cannot carry."""
        key = self._key() if key is None else key
        try:
            if size_hint < WALK_MIN:
                return _masked(self._writer.write(msg), key)
            return self._framed(self._writer.pieces(msg), size_hint, key)
        except codec.ProtocolError:
            raise
        except _MSGPACK_ERRORS as exc:
            raise codec.unencodable(exc) from None

    def pack_parts(self, skeleton: Any, parts: Sequence[Any], size_hint: int = 0, key: bytes | None = None
                   ) -> tuple[memoryview, list[float]]:
        """The frame of ``skeleton`` with its :data:`SLOT` s replaced by ``parts`` (in the order the slots come in
        the message: dicts keep their order), and the seconds spent laying out each part. The bytes are those of
        :meth:`pack` on the whole message. Slots are values of plain maps (``dict``), as a feedback's obs and info
        are."""
        seconds: list[float] = []
        try:
            laid = []
            for part in parts:
                start = time.perf_counter()
                laid.append(self._writer.pieces(part))
                seconds.append(time.perf_counter() - start)
            pieces = self._writer.pieces(skeleton)
            slots = [i for i, piece in enumerate(pieces) if piece is SLOT]
            if len(slots) != len(laid):
                raise RuntimeError(f"the skeleton holds {len(slots)} slots for {len(laid)} parts")
            for i, part_pieces in zip(reversed(slots), reversed(laid)):
                pieces[i:i + 1] = part_pieces
            return self._framed(pieces, size_hint, self._key() if key is None else key), seconds
        except codec.ProtocolError:
            raise
        except _MSGPACK_ERRORS as exc:
            raise codec.unencodable(exc) from None

    def _framed(self, pieces: list[Any], size_hint: int, key: bytes) -> memoryview:
        """The frame of a message's pieces: laid out in the kept buffer when it holds big arrays."""
        if size_hint < WALK_MIN:
            return _masked(b"".join(pieces), key)
        runs = _runs(pieces)
        return self._frame(runs, key) if len(runs) > 1 else _masked(runs[0], key)

    def _frame(self, pieces: list[Any], key: bytes) -> memoryview:
        sizes = [p.nbytes if isinstance(p, np.ndarray) else len(p) for p in pieces]
        n = sum(sizes)
        end = _HEAD_ROOM + 8 + n
        if len(self._buffer) < end:
            # A new buffer rather than a resize: a view of the old frame may still be alive in the caller's hands.
            self._buffer = bytearray(end + end // 64)
        buf = self._buffer
        out = np.frombuffer(buf, np.uint8)
        base = out.ctypes.data
        first = _HEAD_ROOM + _alignment(pieces, sizes, base + _HEAD_ROOM)
        head = frame_header(n) + key
        start = first - len(head)
        buf[start:first] = head
        at = first
        for piece, size in zip(pieces, sizes):
            phase = (at - first) % 4
            turned = key[phase:] + key[:phase]  # the key as it lines up with this piece's first byte
            if size >= BIG_ARRAY:
                _xor_into(piece if isinstance(piece, np.ndarray) else np.frombuffer(piece, np.uint8), turned,
                          out[at:at + size], base + at)
            elif size:
                buf[at:at + size] = apply_mask(piece, turned)
            at += size
        return memoryview(buf)[start:first + n]


def _masked(payload: bytes, key: bytes) -> memoryview:
    return memoryview(frame_header(len(payload)) + key + apply_mask(payload, key))


def _runs(pieces: list[Any]) -> list[Any]:
    """``pieces`` as runs: each big array as its flat bytes (a uint8 view of its own memory), the pieces between
    two of them joined into one bytes (a few hundred bytes: one mask call instead of one per piece)."""
    runs: list[Any] = []
    small: list[Any] = []
    for piece in pieces:
        if type(piece) is np.ndarray and piece.nbytes >= BIG_ARRAY:
            runs.append(b"".join(small))
            small = []
            runs.append(piece.reshape(-1).view(np.uint8))
        else:
            small.append(piece)
    runs.append(b"".join(small))
    return runs


def _alignment(pieces: list[Any], sizes: list[int], base: int) -> int:
    """How far (0-7 bytes) to move the payload from ``base`` so that the largest array's bytes land at the same
    address modulo 8 as they sit in the array: numpy then masks it in aligned words on both sides (half again as
    fast as from a misaligned source)."""
    largest = max(range(len(pieces)), key=sizes.__getitem__)
    piece = pieces[largest]
    if not isinstance(piece, np.ndarray):
        return 0
    offset = sum(sizes[:largest])
    return int((piece.ctypes.data - base - offset) % 8)


def _xor_into(src: np.ndarray, key: bytes, out: np.ndarray, address: int) -> None:
    """``out = src XOR key`` (``key`` repeated from ``out``'s first byte; ``out`` starts at ``address``), eight
    bytes at a time from the first 8-aligned byte of ``out`` (numpy then writes whole aligned words; ``src`` may
    be misaligned)."""
    n = src.size
    lead = min(n, -address % 8)
    if lead:
        out[:lead] = np.frombuffer(apply_mask(src[:lead].tobytes(), key), np.uint8)
    turned = key[lead % 4:] + key[:lead % 4]
    words = (n - lead) // 8 * 8
    if words:
        word_key = np.frombuffer(turned * 2, np.uint64)[0]  # bytewise XOR: the same in either byte order
        np.bitwise_xor(src[lead:lead + words].view(np.uint64), word_key, out=out[lead:lead + words].view(np.uint64))
    rest = lead + words
    if rest < n:
        tail_key = key[rest % 4:] + key[:rest % 4]
        out[rest:] = np.frombuffer(apply_mask(src[rest:].tobytes(), tail_key), np.uint8)
