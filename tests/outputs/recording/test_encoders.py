"""The recorder's encoders: PNGs that decode to the image they were made of."""

from __future__ import annotations

import numpy as np
import pytest
from extras import need

from plugrl_env_client.outputs.recording.encoders import encode_png

iio = need("imageio.v3")


@pytest.mark.parametrize("shape", [(5, 7), (5, 7, 1), (5, 7, 2), (5, 7, 3), (5, 7, 4), (1, 1, 3)])
def test_png_encoder_round_trips_every_channel_layout(shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(sum(shape))
    img = rng.integers(0, 256, shape, dtype=np.uint8)
    decoded = iio.imread(encode_png(img), extension=".png")
    np.testing.assert_array_equal(decoded.reshape(img.shape), img)
