"""A message encoded straight into its masked client frame: one copy of each array's bytes on the way out.

RFC 6455 makes a client mask every byte it sends with the frame's 4-byte key, so masking is a copy anyway; it is the
only one here: :class:`FramePacker` lays out the msgpack bytes of the message and masks each array's bytes from the
array itself into a frame buffer it keeps for the connection's life (no fresh memory once the buffer has the size
of the largest message, and no second copy of the frame as websockets' own framing makes).

The bytes are exactly those of :func:`~plugrl_env_client.protocol.codec.packb` (the same rules: arrays through
:func:`~plugrl_env_client.protocol.codec.encode_numpy`, everything else through msgpack), framed as a masked,
final binary frame: the tests compare them byte for byte. Small messages (under :data:`WALK_MIN` bytes of arrays)
are written by a :class:`~plugrl_env_client.protocol.writer.MessageWriter` (each array's layout kept from message
to message) and then masked by websockets' C helper: two copies of little cost less than laying a frame out.

:meth:`FramePacker.pack_parts` packs a message whose parts are packed (and timed) one by one, which is how a
feedback's observation and info costs are measured in the one encoding the message gets.
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
from plugrl_env_client.protocol.writer import SLOT, MessageWriter, bin_header

__all__ = ["BIG_ARRAY", "SLOT", "WALK_MIN", "FramePacker"]

WALK_MIN = 1 << 17
"""Messages whose arrays hold fewer bytes than this are packed whole, then masked (two copies of little): laying a
frame out costs some microseconds more, which only pays from a few hundred kB on."""
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
    """Packs messages into masked client frames in one buffer it keeps; a frame is valid until the next
    :meth:`pack`. Not thread-safe: one per connection.

    How a big message is laid out without a copy: msgpack packs it with each big array's bytes replaced by a
    16-byte marker (random, drawn once per packer), which leaves the few hundred bytes around the arrays. Those are
    split at the markers, and each marker's place is filled with the array's real ``bin`` header and, in the frame,
    its bytes. If a marker were ever to turn up anywhere else in a message (a 2**-128 chance), the count of pieces
    says so and the message is packed the plain way.
    """

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._keys = b""
        self._next_key = 0
        self._marker = os.urandom(16)
        self._marked = msgpack.packb(self._marker, use_bin_type=True)  # bin8 header + marker
        self._big: list[Any] = []  # the arrays' bytes standing behind the markers of the message being packed
        # One of each for the connection's life: msgpack.packb makes a new packer (and a 256 KiB buffer) per call.
        self._writer = MessageWriter()
        self._marking_packer = msgpack.Packer(default=self._mark, use_bin_type=True)

    def _key(self) -> bytes:
        if self._next_key >= len(self._keys):
            self._keys, self._next_key = os.urandom(4 * 1024), 0  # one system call per 1024 frames
        self._next_key += 4
        return self._keys[self._next_key - 4:self._next_key]

    def _mark(self, obj: Any) -> Any:
        encoded = codec.encode_numpy(obj)
        if type(obj) is np.ndarray and obj.nbytes >= BIG_ARRAY:
            data = encoded[b"data"]
            # The array's own memory when the codec lends it (a flat view: no copy), else the copy it made.
            self._big.append(obj.reshape(-1).view(np.uint8) if isinstance(data, memoryview) else data)
            encoded[b"data"] = self._marker
        return encoded

    # ------------------------------------------------------------------------------------------ packing

    def pack(self, msg: Any, size_hint: int = 0, key: bytes | None = None) -> memoryview:
        """The whole frame (header, key, masked payload) of ``msg``. ``size_hint`` is the bytes of its arrays
        (what makes laying it out worth it); ``key`` is for tests. Raises
        :class:`~plugrl_env_client.protocol.codec.ProtocolError` for what the codec cannot carry."""
        key = self._key() if key is None else key
        try:
            if size_hint >= WALK_MIN:
                self._big.clear()
                pieces = self._lay_out(self._marking_packer.pack(msg))
                if pieces is not None:
                    return self._frame(pieces, key)
            payload = self._writer.write(msg)
        except codec.ProtocolError:
            raise
        except _MSGPACK_ERRORS as exc:
            raise codec.unencodable(exc) from None
        finally:
            self._big.clear()
        return _masked(payload, key)

    def pack_parts(self, skeleton: Any, parts: Sequence[Any], size_hint: int = 0, key: bytes | None = None
                   ) -> tuple[memoryview, list[float]]:
        """The frame of ``skeleton`` with its :data:`SLOT` s replaced by ``parts`` (in the order the slots come in
        the message: dicts keep their order), and the seconds msgpack spent on each part. The bytes are those of
        :meth:`pack` on the whole message. Slots are values of plain maps (``dict``), as a feedback's obs and info
        are; the skeleton holds no list or tuple."""
        key = self._key() if key is None else key
        seconds: list[float] = []
        try:
            pack = self._marking_packer.pack if size_hint >= WALK_MIN else self._writer.write
            self._big.clear()
            packed = []
            for part in parts:
                start = time.perf_counter()
                packed.append(pack(part))
                seconds.append(time.perf_counter() - start)
            around = self._writer.pieces(skeleton)
            payload = _filled(around, packed)
            if self._big:
                pieces = self._lay_out(payload)
                if pieces is not None:
                    return self._frame(pieces, key), seconds
                payload = _filled(around, [self._writer.write(part) for part in parts])  # a marker showed up
        except codec.ProtocolError:
            raise
        except _MSGPACK_ERRORS as exc:
            raise codec.unencodable(exc) from None
        finally:
            self._big.clear()
        return _masked(payload, key), seconds

    def _lay_out(self, packed: bytes) -> list[Any] | None:
        """``packed`` (with the markers of :attr:`_big` in it) as pieces in order: msgpack bytes (bytes) and the
        big arrays' bytes (flat uint8 arrays or bytes); None when there is no big array (or a marker showed up
        where it should not)."""
        big = self._big
        if not big:
            return None
        around = packed.split(self._marked)
        if len(around) != len(big) + 1:
            return None
        pieces: list[Any] = []
        for before, data in zip(around, big):
            pieces.append(before + bin_header(data.nbytes if isinstance(data, np.ndarray) else len(data)))
            pieces.append(data)
        pieces.append(around[-1])
        return pieces

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


def _filled(pieces: list[Any], parts: list[bytes]) -> bytes:
    """A skeleton's pieces with its slots filled by ``parts`` in order, joined."""
    slots = [i for i, piece in enumerate(pieces) if piece is SLOT]
    if len(slots) != len(parts):
        raise RuntimeError(f"the skeleton holds {len(slots)} slots for {len(parts)} parts")
    filled = list(pieces)
    for i, part in zip(slots, parts):
        filled[i] = part
    return b"".join(filled)


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
