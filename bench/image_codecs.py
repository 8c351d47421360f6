"""Which image library the client should encode camera frames with: encode and decode time per batch, and size.

Run from the repo root (the candidates are optional: a missing one is a row that says how to install it)::

    python bench/image_codecs.py            # about 20 s
    python bench/image_codecs.py --quick    # fewer rounds

A batch is what bench/link.py's env sends per step: 16 envs, each with one 224x224x3 and one 112x112x3 camera
frame (bench/frames/halfcheetah.npz, rendered by MuJoCo; each env shows another frame). Each row encodes the 32
images one by one, as the protocol would per env row, then decodes them; the time is the median over rounds of
the whole batch, in this one thread. ``ratio`` is raw bytes / encoded bytes; ``max err`` the largest absolute
difference of a decoded pixel (0: lossless).

JPEG at quality 90 (4:2:0 chroma subsampling, each library's default): simplejpeg, PyTurboJPEG (needs the system's
libturbojpeg, Debian package libturbojpeg0), OpenCV (opencv-python-headless), Pillow. Lossless: PNG through OpenCV
at its fastest level, QOI (``qoi``), and the raw bytes through LZ4 and Zstandard (level 1).

The target: encode + decode of a batch well under the env's own batch step (16 x Hopper-v5 is about 10 ms on this
machine, a camera env's far more), so compression costs less than the link time it saves (3 MB of raw frames take
120 ms at 25 MB/s).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from machine import load_avg, machine_line

FRAMES = Path(__file__).resolve().parent / "frames" / "halfcheetah.npz"
NUM_ENVS = 16
QUALITY = 90


def batch(num_envs: int = NUM_ENVS) -> list[np.ndarray]:
    """The 2 * ``num_envs`` images of one step: env i shows frame i of each camera."""
    frames = np.load(FRAMES)
    out = []
    for i in range(num_envs):
        out += [frames["cam224"][i % len(frames["cam224"])], frames["cam112"][i % len(frames["cam112"])]]
    return out


Codec = tuple[Callable[[np.ndarray], bytes], Callable[[bytes, tuple[int, ...]], np.ndarray]]


def candidates() -> dict[str, Codec | str]:
    """name -> (encode, decode), or the reason it cannot run here."""
    out: dict[str, Codec | str] = {}
    try:
        import simplejpeg

        out["jpeg simplejpeg"] = (
            lambda a: simplejpeg.encode_jpeg(a, quality=QUALITY, colorspace="RGB", colorsubsampling="420"),
            lambda b, shape: simplejpeg.decode_jpeg(b, colorspace="RGB"))
    except ImportError:
        out["jpeg simplejpeg"] = "pip install simplejpeg"
    try:
        import turbojpeg

        tj = turbojpeg.TurboJPEG()
        out["jpeg PyTurboJPEG"] = (
            lambda a: tj.encode(a, quality=QUALITY, pixel_format=turbojpeg.TJPF_RGB, jpeg_subsample=turbojpeg.TJSAMP_420),
            lambda b, shape: tj.decode(b, pixel_format=turbojpeg.TJPF_RGB))
    except (ImportError, OSError, RuntimeError) as exc:
        out["jpeg PyTurboJPEG"] = f"pip install PyTurboJPEG, apt-get install libturbojpeg0 ({exc})"
    try:
        import cv2

        # OpenCV's channel order is BGR: an RGB frame is swapped before encoding and after decoding, as a user's
        # frames would be.
        out["jpeg opencv"] = (
            lambda a: cv2.imencode(".jpg", cv2.cvtColor(a, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, QUALITY])[1]
            .tobytes(),
            lambda b, shape: cv2.cvtColor(cv2.imdecode(np.frombuffer(b, np.uint8), cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB))
        out["png opencv (level 1)"] = (
            lambda a: cv2.imencode(".png", cv2.cvtColor(a, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_PNG_COMPRESSION, 1])[1]
            .tobytes(),
            lambda b, shape: cv2.cvtColor(cv2.imdecode(np.frombuffer(b, np.uint8), cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB))
    except ImportError:
        out["jpeg opencv"] = out["png opencv (level 1)"] = "pip install opencv-python-headless"
    try:
        import io

        from PIL import Image

        def pil_encode(a: np.ndarray) -> bytes:
            buf = io.BytesIO()
            Image.fromarray(a).save(buf, format="JPEG", quality=QUALITY)
            return buf.getvalue()

        out["jpeg Pillow"] = (pil_encode, lambda b, shape: np.asarray(Image.open(io.BytesIO(b)).convert("RGB")))
    except ImportError:
        out["jpeg Pillow"] = "pip install Pillow"
    try:
        import qoi

        out["qoi"] = (lambda a: bytes(qoi.encode(np.ascontiguousarray(a))), lambda b, shape: qoi.decode(b))
    except ImportError:
        out["qoi"] = "pip install qoi"
    try:
        import lz4.frame

        out["lz4 raw bytes"] = (lambda a: lz4.frame.compress(a.tobytes()),
                                lambda b, shape: np.frombuffer(lz4.frame.decompress(b), np.uint8).reshape(shape))
    except ImportError:
        out["lz4 raw bytes"] = "pip install lz4"
    try:
        import zstandard

        zc, zd = zstandard.ZstdCompressor(level=1), zstandard.ZstdDecompressor()
        out["zstd-1 raw bytes"] = (lambda a: zc.compress(a.tobytes()),
                                   lambda b, shape: np.frombuffer(zd.decompress(b), np.uint8).reshape(shape))
    except ImportError:
        out["zstd-1 raw bytes"] = "pip install zstandard"
    return out


def measure(codec: Codec, images: list[np.ndarray], rounds: int) -> tuple[float, float, float, int]:
    """(encode ms, decode ms, ratio, max err) of one batch; times are medians over ``rounds``."""
    encode, decode = codec
    enc_s, dec_s = [], []
    encoded: list[bytes] = []
    decoded: list[np.ndarray] = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        encoded = [encode(a) for a in images]
        t1 = time.perf_counter()
        decoded = [decode(b, a.shape) for b, a in zip(encoded, images)]
        t2 = time.perf_counter()
        enc_s.append(t1 - t0)
        dec_s.append(t2 - t1)
    raw = sum(a.nbytes for a in images)
    err = max(int(np.abs(d.astype(np.int16) - a).max()) for d, a in zip(decoded, images))
    assert all(d.shape == a.shape for d, a in zip(decoded, images))
    return statistics.median(enc_s) * 1e3, statistics.median(dec_s) * 1e3, raw / sum(len(b) for b in encoded), err


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="5 rounds per row instead of 30")
    args = parser.parse_args()
    rounds = 5 if args.quick else 30
    print(machine_line("simplejpeg", "PyTurboJPEG", "opencv-python-headless", "opencv-python", "Pillow",
                       "qoi", "lz4", "zstandard"))
    images = batch()
    raw_mb = sum(a.nbytes for a in images) / 1e6
    print(f"batch: {NUM_ENVS} envs x (224x224x3 + 112x112x3) uint8 = {raw_mb:.2f} MB, {rounds} rounds, JPEG q{QUALITY}")
    print(f"{'codec':<22} {'enc ms':>8} {'dec ms':>8} {'enc+dec':>8} {'ratio':>7} {'max err':>8}")
    for name, codec in candidates().items():
        if isinstance(codec, str):
            print(f"{name:<22} not available: {codec}")
            continue
        enc, dec, ratio, err = measure(codec, images, rounds)
        print(f"{name:<22} {enc:>8.2f} {dec:>8.2f} {enc + dec:>8.2f} {ratio:>7.1f} {err:>8d}")
    print(f"load average {load_avg()}")


if __name__ == "__main__":
    main()
