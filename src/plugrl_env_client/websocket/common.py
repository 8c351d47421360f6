"""What every WebSocket of the package shares: the errors it raises, what one message may be, and the allocator
setting that makes multi-MB messages cheap.

"Transport" means one thing in this package: the WebSocket library a connection runs on (the client always runs
its own frames after websockets' handshake; the reference server runs websockets or picows), and
its errors are the ``Transport*`` ones below.

The errors: the client (:class:`~plugrl_env_client.websocket.client.WebSocketClient`, driven by the rollout's
own thread) and the reference server's WebSocket layer
(:mod:`plugrl_env_client.server.ws_server`, one event loop, websockets or picows) raise the same ones, so callers
handle them once, whatever the library: a closed connection is :class:`WebSocketClosed` (with the close code and
reason the peer sent, or ``None`` when the socket dropped without a close frame); opening one fails with
:class:`HandshakeRefused` (an HTTP status), :class:`CertificateNotVerified`, :class:`InvalidServerURL`, or
:class:`ConnectFailed` (nobody answered, or the handshake broke: worth another try).

Large frames and the allocator: a process that sends or receives multi-MB messages allocates and frees
multi-MB buffers for each one. glibc hands such blocks back to the kernel as soon as they are freed, so the next
message page-faults all its memory in again, which costs many times what framing the message does (bench/transport.py
measures it). :func:`retain_freed_memory` (called by the client's ``connect`` and by the server transport's ``serve``)
raises glibc's thresholds so that freed blocks are reused.
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
    """Base of the transport's errors; the protocol layer turns each into what it means for a run."""


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
