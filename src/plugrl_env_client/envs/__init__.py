"""Built-in env families, one ``<family>/<family>_env.py`` module each, found by :func:`discover_envs`.

Discovery is explicit (called by the CLI when it starts) rather than done at import, so importing this package
stays cheap and a family whose optional dependency is missing only hides itself.
"""

from __future__ import annotations

import importlib
from pathlib import Path


def discover_envs(package: str = __name__) -> list[str]:
    """Import every ``<family>/<family>_env.py``-style module (``*/*_env.py``) below ``package`` (default: this
    package); returns the module names that loaded.

    A module whose import fails with ImportError (an optional dependency is not installed) is skipped with a
    one-line message; any other error is a bug in that env module and propagates.
    """
    loaded = []
    paths = sorted(p for root in importlib.import_module(package).__path__ for p in Path(root).glob("*/*_env.py"))
    for path in paths:
        module = f"{package}.{path.parent.name}.{path.stem}"
        try:
            importlib.import_module(module)
        except ImportError as exc:
            print(f"Skip loading env module {module}: {exc}")
            continue
        loaded.append(module)
    return loaded


__all__ = ["discover_envs"]
