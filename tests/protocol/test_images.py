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
    with pytest.raises(ValueError, match=r"images\['depth'\]: jpeg carries images of 1 or 3 channels, not 4 \(uint8 \[2, 8, 8, 4\]\)"):
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


@pytest.mark.parametrize("codec,shape,dtype,words", [
    ("jpeg", (1, 1, 65535, 3), np.uint8, "jpeg carries images of 1 to 65500 pixels a side, not 1x65535"),
    ("jpeg", (1, 65501, 2, 1), np.uint8, "1 to 65500 pixels a side, not 65501x2"),
    ("jpeg", (1, 0, 8, 3), np.uint8, "1 to 65500 pixels a side, not 0x8"),
    ("qoi", (1, 8, 0, 4), np.uint8, "qoi carries images of 1 to 400000000 pixels a side, not 8x0"),
    ("qoi", (1, 20001, 20000, 3), np.uint8, "qoi carries images of at most 400000000 pixels, not 20001x20000"),
    ("jpeg", (1, 8, 8, 4), np.uint8, "jpeg carries images of 1 or 3 channels, not 4"),
    ("qoi", (1, 8, 8, 1), np.uint8, "qoi carries images of 3 or 4 channels, not 1"),
    ("jpeg", (1, 8, 8, 3), np.uint16, "jpeg carries uint8 images, not uint16"),
    ("qoi", (8, 8, 3), np.uint8, "qoi carries [n, h, w, c] image batches, not 3-d arrays"),
])
def test_every_limit_of_a_codec_is_checked_in_one_place(codec, shape, dtype, words):
    why = images.refusal(shape, dtype, codec)
    assert why is not None and words in why
    assert not images.encodable(shape, codec, dtype)


@pytest.mark.parametrize("codec,shape", [("jpeg", (1, 1, 65500, 3)), ("jpeg", (1, 65500, 1, 1)), ("qoi", (1, 1, 1, 4))])
def test_an_image_at_a_limit_is_carried(codec, shape):
    assert images.refusal(shape, np.uint8, codec) is None
    data = np.zeros(shape, np.uint8)
    np.testing.assert_array_equal(images.decode(images.encode(data, codec), codec, shape), data)


def test_the_libraries_refuse_what_refusal_refuses():
    """The limits are the libraries' own: one pixel past each, the library raises."""
    import qoi
    import simplejpeg

    with pytest.raises(ValueError, match="65500"):
        simplejpeg.encode_jpeg(np.zeros((1, 65501, 3), np.uint8), colorspace="RGB")
    with pytest.raises(RuntimeError):
        qoi.encode(np.zeros((0, 4, 3), np.uint8))


@pytest.mark.parametrize("codec,shape", [("jpeg", (1, 1, 65535, 3)), ("jpeg", (2, 4, 4, 4)), ("qoi", (1, 0, 4, 3))])
def test_a_camera_past_a_limit_travels_raw(codec, shape):
    """The wire map of an observation keeps such a camera as its array instead of failing the run."""
    from plugrl_env_client.protocol import messages

    class Obs:
        images = {"wide": np.zeros(shape, np.uint8), "cam": np.zeros((shape[0], 8, 8, 3), np.uint8)}
        states: dict = {}
        text = np.array([""] * shape[0])

    wire = messages.wire_observation(Obs(), codec)
    assert wire["images"]["wide"] is Obs.images["wide"]
    assert isinstance(wire["images"]["cam"], dict) and wire["images"]["cam"]["codec"] == codec


def test_a_declared_shape_over_the_pixel_bound_is_refused_before_anything_is_read_or_allocated():
    crafted = jpeg_claiming(6000, 6000)
    tracemalloc.start()
    try:
        with pytest.raises(images.ImagesTooLarge) as info:
            images.decode([crafted], "jpeg", (1, 6000, 6000, 3), field="images['cam']", max_pixels=1 << 20)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert str(info.value) == ("images['cam']: the declared shape [1, 6000, 6000, 3] is 36000000 pixels of encoded "
                               "images, over the 1048576 pixels one message may declare here")
    assert peak < 10_000_000
    assert images.DEFAULT_MAX_PIXELS < 6000 * 6000, "the default bound refuses it too"
    with pytest.raises(images.ImagesTooLarge):
        images.decode([crafted], "jpeg", (1, 6000, 6000, 3))
