"""Client-side WebSocket framing of one binary message into a buffer the connection keeps.

RFC 6455 makes a client mask every payload it sends with a fresh 4-byte key. websockets does this by masking the
payload into new bytes and writing header and masked bytes into a ``BytesIO``: two fresh copies of each message,
on top of the encoder's buffer. For a camera batch (tens of MB) those copies were the difference between about
three and about five observation batches of peak memory, and their page faults a large share of the time to send
(see bench/README.md, "memory.py"). :class:`MaskedFramer` writes header, key and masked payload into one buffer that
lives as long as the connection, masking four bytes at a time with numpy: one pass over the payload, no fresh
memory once the buffer has the size of the largest message.

The bytes are a plain RFC 6455 frame: FIN set, opcode 2 (binary), no RSV bits (no extensions), the shortest length
encoding, the mask bit and key. What the peer receives is exactly what websockets' own framing would send.
"""

from __future__ import annotations

import os
import struct

import numpy as np
from websockets.frames import apply_mask

_BINARY_FIN = 0x82  # FIN | opcode 2
_MASKED = 0x80
_ALIGN = 8  # the payload starts 8-byte aligned in the buffer, so numpy masks whole aligned words
SMALL = 1 << 16
"""Payloads below this many bytes are masked by websockets' C helper into fresh bytes: for a small message the
numpy calls cost more than the copy they avoid (3 us against 1.5 us per message of 1 kB)."""


def frame_header(length: int) -> bytes:
    """The first bytes of a masked, final binary frame of ``length`` payload bytes (without the key)."""
    if length < 126:
        return struct.pack("!BB", _BINARY_FIN, _MASKED | length)
    if length < 1 << 16:
        return struct.pack("!BBH", _BINARY_FIN, _MASKED | 126, length)
    return struct.pack("!BBQ", _BINARY_FIN, _MASKED | 127, length)


class MaskedFramer:
    """Frames binary messages into one reused buffer; a frame is valid until the next :meth:`frame` call.

    Not thread-safe: one per connection, used under the connection's send lock.
    """

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._keys = b""  # mask keys drawn from the OS's random source 1024 at a time (one system call, not 1024)
        self._next_key = 0

    def _key(self) -> bytes:
        if self._next_key >= len(self._keys):
            self._keys, self._next_key = os.urandom(4 * 1024), 0
        self._next_key += 4
        return self._keys[self._next_key - 4:self._next_key]

    def frame(self, payload: bytes | bytearray | memoryview, key: bytes | None = None) -> memoryview:
        """The whole frame of ``payload``, masked with ``key`` (4 random bytes when not given): a view into the
        framer's buffer (or, for a payload below :data:`SMALL` bytes, of fresh bytes)."""
        data = memoryview(payload).cast("B")
        n = data.nbytes
        key = self._key() if key is None else key
        head = frame_header(n) + key
        if n < SMALL:
            return memoryview(head + apply_mask(data, key))
        start = -len(head) % _ALIGN  # leading pad so that the payload starts aligned
        end = start + len(head) + n
        if len(self._buffer) < end:
            # A new buffer rather than a resize: a view of the old one may still be alive in the caller's hands.
            self._buffer = bytearray(end + end // 64)
        buf = self._buffer
        buf[start:start + len(head)] = head
        at = start + len(head)
        if n:
            _mask_into(np.frombuffer(data, np.uint8), key, np.frombuffer(buf, np.uint8, n, at))
        return memoryview(buf)[start:end]


def _mask_into(src: np.ndarray, key: bytes, out: np.ndarray) -> None:
    """``out = src XOR key`` (the key repeated over the payload), four bytes at a time."""
    words = src.size // 4 * 4
    if words:
        word_key = np.frombuffer(key, np.uint32)[0]  # same byte order on both sides: the XOR is bytewise
        np.bitwise_xor(src[:words].view(np.uint32), word_key, out=out[:words].view(np.uint32))
    for i in range(words, src.size):
        out[i] = src[i] ^ key[i % 4]
