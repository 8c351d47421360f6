"""The client's WebSocket frames: a message's msgpack bytes, masked into one final binary frame.

RFC 6455 makes a client mask every byte it sends with the frame's 4-byte key. There is one route from a message to
its frame: the one encoder (:class:`~plugrl_env_client.protocol.codec.MessageWriter`) writes its msgpack bytes,
websockets' C helper masks them, and the header and the key go in front. The compiled
:mod:`~plugrl_env_client.protocol._frames` (built with the package when a C compiler is at hand) accelerates that same
route: it writes what it lays out (the rollout's messages: maps, scalars, arrays) through the writer's own array
layouts straight into the frame, masked as it goes (each array's data read once), and hands anything else back to
the Python route; the tests hold the two to the same bytes. One key pool.
"""

from __future__ import annotations

import os
import time
from types import ModuleType
from typing import Any

import numpy as np
from websockets.frames import apply_mask

from plugrl_env_client.protocol import codec
from plugrl_env_client.protocol.codec import MessageWriter, Timed
from plugrl_env_client.websocket.client import frame_header

_frames: ModuleType | None
try:
    from plugrl_env_client.protocol import _frames
except ImportError:  # built without a C compiler: the writer's bytes, masked in Python
    _frames = None

__all__ = ["COMPILED", "FramePacker"]

COMPILED = _frames is not None
"""Whether the compiled framer was built with the package (it needs a C compiler at install time)."""

_MSGPACK_ERRORS = (OverflowError, UnicodeEncodeError, ValueError, TypeError)


class FramePacker:
    """Packs messages into masked client frames (see the module docstring). Not thread-safe: one per connection,
    kept across its reconnects."""

    def __init__(self, compiled: bool = True) -> None:
        """``compiled=False`` writes every message in Python even when the compiled framer is there (tests)."""
        self._keys = b""
        self._next_key = 0
        self._writer = writer = MessageWriter()
        self._compiled = (_frames.frame if compiled and _frames is not None else None)
        self._compiled_args = (writer.layouts, writer.layout_of, np.ndarray, Timed, time.perf_counter)

    def pack(self, msg: Any, key: bytes | None = None) -> memoryview:
        """The whole frame (header, key, masked payload) of ``msg``; ``key`` is for tests. Raises
        :class:`~plugrl_env_client.protocol.codec.ProtocolError` for what the codec cannot carry."""
        if key is None:
            at = self._next_key
            if at >= len(self._keys):
                self._keys, at = os.urandom(4 * 1024), 0  # one system call per 1024 frames
            self._next_key = at + 4
            key = self._keys[at:at + 4]
        try:
            if self._compiled is not None:
                frame = self._compiled(msg, key, *self._compiled_args)
                if frame is not None:
                    return memoryview(frame)
            payload = self._writer.write(msg)
        except codec.ProtocolError:
            raise
        except _MSGPACK_ERRORS as exc:
            raise codec.unencodable(exc) from None
        return memoryview(frame_header(len(payload)) + key + apply_mask(payload, key))
