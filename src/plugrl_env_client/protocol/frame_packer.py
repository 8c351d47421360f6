"""The client's WebSocket frames: a message's msgpack pieces, masked into one final binary frame.

RFC 6455 makes a client mask every byte it sends with the frame's 4-byte key, so masking is a copy anyway; it is the
only one here. :class:`FramePacker` takes a message's pieces from the one encoder
(:class:`~plugrl_env_client.protocol.codec.MessageWriter`: its msgpack bytes, with arrays as their own memory),
writes a small message's frame in one call of the compiled :mod:`~plugrl_env_client.protocol._frames` (its msgpack
bytes through the writer's own array layouts, masked and framed: the pieces are never a Python list) or, without it or
for what it does not lay out, joins the writer's pieces and masks them with websockets' C helper; and it lays a big
message out in a frame buffer it keeps for the connection's life, masking each big array's bytes from the array
itself (no fresh memory once the buffer has the size of the largest message, and no second copy of the frame as
websockets' own framing makes). Both ways of a small message write the same bytes (the tests hold them to it). One key
pool.
"""

from __future__ import annotations

import os
import struct
import time
from types import ModuleType
from typing import Any

import numpy as np
from websockets.frames import apply_mask

from plugrl_env_client.protocol import codec
from plugrl_env_client.protocol.codec import MessageWriter, Timed

_frames: ModuleType | None
try:
    from plugrl_env_client.protocol import _frames
except ImportError:  # built without a C compiler: the writer's pieces, joined and masked
    _frames = None

__all__ = ["BIG_ARRAY", "COMPILED", "WALK_MIN", "FramePacker", "control_frame", "frame_header"]

COMPILED = _frames is not None
"""Whether the compiled framer was built with the package (it needs a C compiler at install time)."""

WALK_MIN = 1 << 17
"""Messages whose arrays hold fewer bytes than this are joined, then masked (two copies of little): laying a frame
out costs some microseconds more, which only pays from a few hundred kB on."""
BIG_ARRAY = 1 << 14
"""Arrays of at least this many bytes are masked straight from their own memory; smaller ones go with the msgpack
bytes around them."""
_HEAD_ROOM = 16  # the payload starts here in the buffer (8-aligned); the header (at most 14 bytes) ends here
_MSGPACK_ERRORS = (OverflowError, UnicodeEncodeError, ValueError, TypeError)
_FIN = 0x80  # a final frame, no RSV bits (no extensions)
_BINARY = 0x2
_MASKED = 0x80


def frame_header(length: int, opcode: int = _BINARY) -> bytes:
    """The first bytes of a masked, final frame (binary unless ``opcode`` says otherwise) of ``length`` payload
    bytes (without the key), with the shortest length encoding."""
    first = _FIN | opcode
    if length < 126:
        return struct.pack("!BB", first, _MASKED | length)
    if length < 1 << 16:
        return struct.pack("!BBH", first, _MASKED | 126, length)
    return struct.pack("!BBQ", first, _MASKED | 127, length)


def control_frame(opcode: int, payload: bytes) -> bytes:
    """A whole masked control frame (a pong, a close: at most 125 payload bytes) with a key of its own: they are
    rare, so they take no key from a packer's pool."""
    key = os.urandom(4)
    return frame_header(len(payload), opcode) + key + apply_mask(payload, key)


class FramePacker:
    """Packs messages into masked client frames (see the module docstring); a frame is valid until the next
    :meth:`pack`. Not thread-safe: one per connection, kept across its reconnects."""

    def __init__(self, compiled: bool = True) -> None:
        """``compiled=False`` writes small messages in Python even when the compiled framer is there (tests)."""
        self._buffer = bytearray()
        self._keys = b""
        self._next_key = 0
        self._writer = writer = MessageWriter()
        self._compiled = (_frames.frame if compiled and _frames is not None else None)
        self._compiled_args = (writer.layouts, writer.layout_of, np.ndarray, Timed, time.perf_counter)

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
                if self._compiled is not None:
                    frame = self._compiled(msg, key, *self._compiled_args)
                    if frame is not None:
                        return memoryview(frame)
                return _masked(self._writer.write(msg), key)
            runs = _runs(self._writer.pieces(msg))  # big arrays: laid out in the kept buffer
            return self._frame(runs, key) if len(runs) > 1 else _masked(runs[0], key)
        except codec.ProtocolError:
            raise
        except _MSGPACK_ERRORS as exc:
            raise codec.unencodable(exc) from None

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
