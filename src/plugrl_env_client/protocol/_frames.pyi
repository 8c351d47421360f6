from collections.abc import Callable
from typing import Any

def frame(msg: Any, key: bytes, layouts: dict[Any, tuple[bytes, bytes]],
          miss: Callable[[Any], tuple[bytes, bytes] | None], ndarray: type, timed: type,
          clock: Callable[[], float]) -> bytes | memoryview | None: ...
