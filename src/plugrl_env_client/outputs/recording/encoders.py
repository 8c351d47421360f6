"""The recorder's file encoders: PNG (written here, no imaging library needed), H.264 MP4 (extra ``video``) and
NPY, with the checks of which images each can hold."""

from __future__ import annotations

import io
import os
import struct
import tempfile
import zlib

import numpy as np

from plugrl_env_client.errors import ConfigError

VIDEO_INSTALL = 'pip install "plugrl-env-client[video]"'
VIDEO_QUALITY = 6
"""imageio-ffmpeg's 0-10 quality scale; 6 is H.264 CRF 20, visually close to the frames at a modest size."""

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_PNG_COLOR_TYPE = {1: 0, 2: 4, 3: 2, 4: 6}  # channels -> gray, gray+alpha, RGB, RGBA


def encode_png(image: np.ndarray) -> bytes:
    """A PNG of a uint8 image, ``(h, w)`` or ``(h, w, c)`` with c in 1..4 (gray, gray+alpha, RGB, RGBA).

    Written here (zlib and struct) so that sampling images needs no imaging library. Every row uses PNG's "Up"
    filter, computed for the whole image at once with numpy: cheap, and it compresses smooth images well.
    """
    if not png_compatible(image):
        raise ValueError(f"encode_png needs a non-empty uint8 (h, w) or (h, w, 1..4) array, got {image.dtype} "
                         f"{image.shape}")
    img = image if image.ndim == 3 else image[:, :, None]
    h, w, c = img.shape
    rows = np.ascontiguousarray(img).reshape(h, w * c)
    filtered = np.empty((h, w * c + 1), np.uint8)
    filtered[:, 0] = 2  # filter type Up: each byte minus the byte above it, modulo 256
    filtered[0, 1:] = rows[0]
    np.subtract(rows[1:], rows[:-1], out=filtered[1:, 1:])

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))

    header = struct.pack(">IIBBBBB", w, h, 8, _PNG_COLOR_TYPE[c], 0, 0, 0)
    return (PNG_SIGNATURE + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(filtered.tobytes(), 6))
            + chunk(b"IEND", b""))


def encode_mp4(images: list[np.ndarray], fps: float) -> bytes:
    """An H.264 MP4 of uint8 frames (gray, RGB or RGBA; one size), padded to even width and height.

    H.264 with 4:2:0 chroma (what players accept) needs even sizes; frames are padded by repeating their last row
    and column rather than resized, so the picture is unchanged. Needs the extra ``video`` (imageio-ffmpeg).
    """
    import imageio_ffmpeg

    frames = [_even(_rgb(image)) for image in images]
    h, w = frames[0].shape[:2]
    with tempfile.TemporaryDirectory(prefix="plugrl-video-") as folder:
        path = os.path.join(folder, "video.mp4")
        writer = imageio_ffmpeg.write_frames(
            path, (w, h), pix_fmt_in="rgb24", pix_fmt_out="yuv420p", fps=fps, codec="libx264",
            quality=VIDEO_QUALITY, macro_block_size=1, ffmpeg_log_level="error",
            output_params=["-movflags", "+faststart"])
        writer.send(None)
        try:
            for frame in frames:
                writer.send(np.ascontiguousarray(frame))
        finally:
            writer.close()
        with open(path, "rb") as f:
            return f.read()


def encode_npy(array: np.ndarray) -> bytes:
    """``array`` as a ``.npy`` file, loadable without pickle."""
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


def require_video() -> None:
    """A :class:`ConfigError` that says how to install the video extra when MP4s cannot be encoded here."""
    try:
        import imageio_ffmpeg

        imageio_ffmpeg.get_ffmpeg_exe()
    except (ImportError, RuntimeError) as exc:
        raise ConfigError(f"--recorder.record-video needs imageio with its ffmpeg binary ({exc}). Install the "
                          f"video extra: {VIDEO_INSTALL}") from exc


def png_compatible(image: np.ndarray) -> bool:
    """Whether :func:`encode_png` takes ``image``."""
    if image.dtype != np.uint8 or image.ndim not in (2, 3) or image.shape[0] == 0 or image.shape[1] == 0:
        return False
    return image.ndim == 2 or image.shape[2] in _PNG_COLOR_TYPE


def video_compatible(images: list[np.ndarray]) -> bool:
    """Whether :func:`encode_mp4` takes ``images`` (one size, 1, 3 or 4 channels)."""
    if not images or any(im.shape != images[0].shape for im in images):
        return False
    first = images[0]
    return png_compatible(first) and (first.ndim == 2 or first.shape[2] in (1, 3, 4))


def _rgb(image: np.ndarray) -> np.ndarray:
    if image.ndim == 2:
        image = image[:, :, None]
    if image.shape[2] == 1:
        return np.repeat(image, 3, axis=2)
    return image[:, :, :3]


def _even(frame: np.ndarray) -> np.ndarray:
    h, w = frame.shape[:2]
    if h % 2 == 0 and w % 2 == 0:
        return frame
    return np.pad(frame, ((0, h % 2), (0, w % 2), (0, 0)), mode="edge")
