"""protocol/images.py: camera images encoded per env row and decoded back, the declared shape checked from each
row's header before anything is decoded or allocated. The images are bench/link.py's MuJoCo frames."""

from __future__ import annotations

import struct
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from extras import need

from plugrl_env_client.errors import ConfigError, ProtocolError
from plugrl_env_client.protocol import images

need("simplejpeg")
need("qoi")

FRAMES = Path(__file__).resolve().parents[2] / "bench" / "frames" / "halfcheetah.npz"


@pytest.fixture(scope="module")
def frames() -> np.ndarray:
    return np.load(FRAMES)["cam224"][:4]


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b) ** 2)
    return float(10 * np.log10(255.0**2 / mse))


def test_jpeg_round_trip_keeps_shape_and_is_close(frames):
    """Quality 90 is visually lossless: above 35 dB of PSNR and within a couple of levels on average (JPEG's error
    is quantisation, bounded in the mean, not per pixel: sharp edges move more)."""
    rows = images.encode(frames, "jpeg", quality=90)
    assert len(rows) == 4 and all(row[:2] == b"\xff\xd8" for row in rows)
    assert sum(map(len, rows)) * 4 < frames.nbytes, "compressed"
    back = images.decode(rows, "jpeg", frames.shape)
    assert back.shape == frames.shape and back.dtype == np.uint8
    assert psnr(back, frames) > 35
    assert np.abs(back.astype(int) - frames).mean() < 3
    assert psnr(images.decode(images.encode(frames, "jpeg", quality=30), "jpeg", frames.shape), frames) < psnr(back, frames)


def test_jpeg_carries_one_channel_images(frames):
    gray = np.ascontiguousarray(frames[..., 1:2])
    back = images.decode(images.encode(gray, "jpeg"), "jpeg", gray.shape)
    assert back.shape == gray.shape and psnr(back, gray) > 35


@pytest.mark.parametrize("channels", [3, 4])
def test_qoi_is_lossless(frames, channels):
    data = frames if channels == 3 else np.concatenate([frames, frames[..., :1]], axis=-1)
    rows = images.encode(data, "qoi")
    np.testing.assert_array_equal(images.decode(rows, "qoi", data.shape), data)
    assert sum(map(len, rows)) < data.nbytes


@pytest.mark.parametrize("codec,channels,carried", [
    ("jpeg", 1, True), ("jpeg", 3, True), ("jpeg", 4, False), ("jpeg", 2, False),
    ("qoi", 3, True), ("qoi", 4, True), ("qoi", 1, False), ("none", 3, False),
])
def test_which_images_a_codec_carries(codec, channels, carried):
    assert images.encodable((2, 8, 8, channels), codec) is carried


def test_an_image_a_codec_cannot_carry_is_refused_by_encode():
    with pytest.raises(ValueError, match=r"images\['depth'\]: jpeg encodes .* c in \(1, 3\), not uint8 \[2, 8, 8, 4\]"):
        images.encode(np.zeros((2, 8, 8, 4), np.uint8), "jpeg", field="images['depth']")
    with pytest.raises(ValueError, match="float32"):
        images.encode(np.zeros((2, 8, 8, 3), np.float32), "qoi")
    with pytest.raises(ValueError, match="quality must be 1..100"):
        images.encode(np.zeros((2, 8, 8, 3), np.uint8), "jpeg", quality=0)


@pytest.mark.parametrize("codec", ["jpeg", "qoi"])
def test_the_header_tells_the_size_without_decoding(frames, codec):
    row = images.encode(frames[:1], codec)[0]
    assert images.header_shape(row, codec) == (224, 224, 3)


@pytest.mark.parametrize("codec", ["jpeg", "qoi"])
def test_a_size_other_than_declared_is_refused_naming_the_field_and_row(frames, codec):
    big = np.repeat(np.repeat(frames[:1], 2, axis=1), 2, axis=2)  # 448x448
    rows = images.encode(frames[:1], codec) + images.encode(big, codec)
    with pytest.raises(ProtocolError, match=r"images\['cam224'\] row 1: the encoded image is 448x448x3, the declared "
                                            r"shape says 224x224x3"):
        images.decode(rows, codec, (2, 224, 224, 3), field="images['cam224']")


def jpeg_claiming(height: int, width: int) -> bytes:
    """A small JPEG whose frame header (SOF0) claims ``height`` x ``width``: the shape of a decompression bomb."""
    data = bytearray(images.encode(np.zeros((1, 8, 8, 3), np.uint8), "jpeg")[0])
    sof = data.index(b"\xff\xc0")
    struct.pack_into(">HH", data, sof + 5, height, width)
    return bytes(data)


def qoi_claiming(height: int, width: int) -> bytes:
    return struct.pack(">4sIIBB", b"qoif", width, height, 3, 0) + b"\x00" * 7 + b"\x01"


@pytest.mark.parametrize("codec,crafted", [("jpeg", jpeg_claiming(60000, 60000)), ("qoi", qoi_claiming(60000, 60000))])
def test_a_crafted_huge_image_is_refused_before_anything_is_allocated(codec, crafted):
    """60000x60000x3 is 10.8 GB decoded: the header says so, and the decoder never runs (memory stays small)."""
    tracemalloc.start()
    try:
        with pytest.raises(ProtocolError, match=r"images\['cam'\] row 0: the encoded image is 60000x60000x3"):
            images.decode([crafted], codec, (1, 224, 224, 3), field="images['cam']")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 10_000_000


@pytest.mark.parametrize("rows,shape,words", [
    ([b"hello"], (1, 8, 8, 3), "images row 0: not a JPEG image"),
    ([b"\xff\xd8" + b"\x00" * 20], (1, 8, 8, 3), "images row 0: not a JPEG image"),
    (["text"], (1, 8, 8, 3), "an encoded image is bytes, got str"),
    ([], (1, 8, 8, 3), "0 encoded rows for a declared shape of 1 rows"),
    ([b""], (1, 8, 8, 4), "declared shape [1, 8, 8, 4] cannot be jpeg-encoded"),
])
def test_bad_rows_are_protocol_errors(rows, shape, words):
    with pytest.raises(ProtocolError) as info:
        images.decode(rows, "jpeg", shape)
    assert words in str(info.value)


def test_a_right_header_on_a_broken_body_is_a_protocol_error():
    row = images.encode(np.full((1, 16, 16, 3), 128, np.uint8), "qoi")[0]
    with pytest.raises(ProtocolError, match="row 0: "):
        images.decode([row[:20]], "qoi", (1, 16, 16, 3))
    with pytest.raises(ProtocolError, match="not a QOI image"):
        images.decode([b"qoi"], "qoi", (1, 16, 16, 3))


def test_the_libraries_are_imported_only_when_a_codec_is_used():
    code = ("import sys, plugrl_env_client.protocol.images as m; "
            "print(' '.join(x for x in ('simplejpeg', 'qoi') if x in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == []


def test_a_missing_library_says_which_extra_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "simplejpeg", None)  # an import of it now fails, as when not installed
    with pytest.raises(ConfigError, match=r"pip install 'plugrl-env-client\[images\]'"):
        images.encode(np.zeros((1, 8, 8, 3), np.uint8), "jpeg")
