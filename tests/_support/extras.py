"""Tests that need an optional family skip when it is not installed, naming the extra that brings it.

The fast tier runs on the ``test-core`` extra alone (no simulator, transport or tool family); a test that needs
one asks for it with :func:`need`, which imports it or skips the test with a reason that says what to install:
``needs imageio: pip install -e ".[video]"``. ``tests/test_extras.py`` checks that every family module a test or
the package imports is named here, and that tests import them through :func:`need`.
"""

from __future__ import annotations

from types import ModuleType

import pytest

EXTRA_OF = {
    "envpool": "envpool",
    "gem": "gem",
    "gym_pusht": "pusht",
    "imageio": "video",
    "imageio_ffmpeg": "video",
    "libero": "libero",
    "matplotlib": "report",
    "mujoco": "mujoco",
    "PIL": "openpi",
    "picows": "fast",
    "robosuite": "libero",
    "qoi": "images",
    "ray": "ray",
    "simplejpeg": "images",
    "tensorboardX": "tensorboard",
    # Tools only the tests use: TensorBoard's own event reader reads --tracking's files back, and pygame draws
    # Gymnasium's classic-control frames (CartPole's); the test extra brings both.
    "pygame": "test",
    "tensorboard": "test",
}
"""The top-level module of each optional family -> the extra of pyproject.toml that installs it."""


def install_hint(module: str) -> str:
    """``needs <module>: pip install -e ".[<extra>]"`` for a module of :data:`EXTRA_OF` (or a submodule of one)."""
    top = module.partition(".")[0]
    return f'needs {top}: pip install -e ".[{EXTRA_OF[top]}]"'


def need(module: str) -> ModuleType:
    """``module`` imported, or the calling test (or test module, at its top) skipped naming the extra it needs."""
    return pytest.importorskip(module, reason=install_hint(module))
