"""Importing a Python file by its path, as a module, for the length of a test (example env files are not in any
package)."""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType


@contextlib.contextmanager
def imported(path: Path, name: str) -> Iterator[ModuleType]:
    """``path`` executed as module ``name``; removed from ``sys.modules`` again afterwards (registrations it made
    are undone by the ``registry`` fixture, which a test using this should take)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(name, None)


BENCH = Path(__file__).resolve().parents[2] / "bench"


@contextlib.contextmanager
def bench_script(script: str) -> Iterator[ModuleType]:
    """``bench/<script>.py`` as module ``bench_<script>``, with ``bench/`` on ``sys.path`` for as long (the scripts
    import their helper module ``machine`` by name)."""
    sys.path.insert(0, str(BENCH))
    try:
        with imported(BENCH / f"{script}.py", f"bench_{script}") as module:
            yield module
    finally:
        sys.path.remove(str(BENCH))
