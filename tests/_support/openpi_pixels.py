"""What :mod:`openpi_env` renders, in numpy alone, so that a child with openpi's own packages (and no plugrl) can
build the same images to check what reached it."""

from __future__ import annotations

import numpy as np

LENGTH = 12
"""Steps of an episode."""
HEIGHT, WIDTH = 24, 40
INSTRUCTION = "put the bowl on the plate"


def camera(row: int, step: int, wrist: bool = False) -> np.ndarray:
    """The ``(HEIGHT, WIDTH, 3)`` uint8 image env ``row`` renders at ``step`` of its episode."""
    y, x, c = np.meshgrid(np.arange(HEIGHT), np.arange(WIDTH), np.arange(3), indexing="ij")
    return ((row * 31 + step * 7 + y * 3 + x * 5 + c * 50 + (128 if wrist else 0)) % 256).astype(np.uint8)
