"""The WebSocket layer under both wire protocols and the reference server: the client's frames on its owner's
thread (RFC 6455), the errors every WebSocket of the package raises, and the keepalive of long env calls."""
