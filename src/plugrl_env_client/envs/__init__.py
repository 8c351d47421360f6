"""Built-in env families, one ``<family>/<family>_env.py`` module each, found by :func:`discover_envs`.

Discovery is explicit (called by the CLI when it starts) rather than done at import, so importing this package
stays cheap and a family whose optional dependency is missing only hides itself.
"""

from __future__ import annotations

import importlib
from pathlib import Path


def discover_envs() -> list[str]:
    """Import every ``*_env.py`` module below this package; returns the module names that loaded.

    A module whose import fails with ImportError (an optional dependency is not installed) is skipped with a
    one-line message; any other error is a bug in that env module and propagates.
    """
    loaded = []
    root = Path(__file__).parent
    for path in sorted(root.glob("*/*_env.py")):
        module = f"{__name__}.{path.parent.name}.{path.stem}"
        try:
            importlib.import_module(module)
        except ImportError as exc:
            print(f"Skip loading env module {module}: {exc}")
            continue
        loaded.append(module)
    return loaded


__all__ = ["discover_envs"]
