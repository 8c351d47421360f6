"""The recorder's tests: every recorder a test starts is closed, so its writer thread has ended."""

from __future__ import annotations

import threading
from typing import Any

import pytest


@pytest.fixture(autouse=True)
def _writer_threads_end() -> Any:
    """Every recorder a test starts is closed, so its writer thread has ended."""
    yield
    assert [t.name for t in threading.enumerate() if t.name.startswith("recorder-")] == []
