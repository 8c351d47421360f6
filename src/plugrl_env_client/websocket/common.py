"""What every WebSocket of the package shares: its errors, what one message may be, and the allocator setting that
makes multi-MB messages cheap.

The client (:mod:`~plugrl_env_client.websocket.client`) and the reference server's WebSocket layer
(:mod:`plugrl_env_client.server.ws_server`, websockets or picows) raise the same errors, so callers handle them once,
whatever the library: :class:`WebSocketClosed` (the peer's close code and reason, ``None`` when the socket dropped)
and, when opening, :class:`HandshakeRefused`, :class:`CertificateNotVerified`, :class:`InvalidServerURL` or
:class:`ConnectFailed` (worth another try).

glibc hands multi-MB blocks back to the kernel as soon as they are freed, so each large message would page-fault
its buffers in again (``bench/transport.py`` measures it); :func:`retain_freed_memory` keeps them.
"""

from __future__ import annotations

import ctypes
import functools

__all__ = [
    "CertificateNotVerified",
    "ConnectFailed",
    "Data",
    "HandshakeRefused",
    "InvalidServerURL",
    "WebSocketClosed",
    "WebSocketError",
    "api_key_problem",
    "retain_freed_memory",
]

_NAMED = {"\r": "a carriage return (CR: a key file saved with CR LF line ends?)", "\n": "a line feed (LF)",
          "\t": "a tab", " ": "a space"}


def api_key_problem(key: str) -> str | None:
    """What keeps ``key`` from travelling in an ``Authorization: Api-Key <key>`` header (empty, or a character
    other than printable ASCII without spaces), named with its place but not the key itself; None when it can."""
    if not key:
        return "it is empty"
    for i, c in enumerate(key):
        if not "!" <= c <= "~":
            what = _NAMED.get(c) or (f"the control character U+{ord(c):04X}" if ord(c) < 0x20 or ord(c) == 0x7F
                                     else "a character that is not ASCII")
            return f"it holds {what} at character {i + 1} of {len(key)}"
    return None


Data = bytes | bytearray | memoryview
"""One binary message: anything that exports a contiguous byte buffer."""

# ------------------------------------------------------------------------------------------------------ errors


class WebSocketError(Exception):
    """Base of the WebSocket errors; the protocol layer turns each into what it means for a run."""


class WebSocketClosed(WebSocketError):
    """The connection is closed. ``code``/``reason`` are those of the close frame the peer sent; ``code`` is None
    when the connection ended without one (the socket dropped)."""

    def __init__(self, code: int | None, reason: str = "") -> None:
        super().__init__("connection closed without a close frame" if code is None
                         else f"connection closed with code {code}" + (f", reason {reason!r}" if reason else ""))
        self.code = code
        self.reason = reason


class HandshakeRefused(WebSocketError):
    """The server answered the opening handshake with an HTTP status other than 101."""

    def __init__(self, status: int, detail: str = "") -> None:
        super().__init__(detail or f"server rejected WebSocket connection: HTTP {status}")
        self.status = status


class CertificateNotVerified(WebSocketError):
    """The server's TLS certificate did not verify against the trust store."""

    def __init__(self, verify_message: str) -> None:
        super().__init__(verify_message)
        self.verify_message = verify_message


class InvalidServerURL(WebSocketError):
    """The URL cannot name a WebSocket server (wrong scheme, bad port, malformed host, ...)."""


class ConnectFailed(WebSocketError):
    """Nobody answered, the connection timed out, or the handshake broke off: another try may work."""


@functools.cache
def retain_freed_memory() -> bool:
    """Let glibc keep freed blocks of up to 32 MiB (and up to 256 MiB of free memory at the heap's top) in the
    process instead of returning them to the kernel at once; True when it applied.

    Why: see the module docstring (every large message otherwise page-faults its buffers in again). The cost is
    that a process that once held big messages keeps that much memory mapped. Applied once per process; a no-op
    where the C library has no ``mallopt`` (macOS, Windows) or refuses the values.
    """
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError, TypeError):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # glibc's malloc.h
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(m_mmap_threshold, 32 << 20)) and bool(mallopt(m_trim_threshold, 256 << 20))
