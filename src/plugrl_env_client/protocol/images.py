"""Camera images encoded per env row for the wire, and decoded back with their size checked first.

An ``[n, h, w, c]`` uint8 camera travels as ``n`` encoded rows in one of the :data:`CODECS`: ``jpeg`` (lossy,
quality 1-100, 1 or 3 channels; simplejpeg) or ``qoi`` (lossless, 3 or 4 channels), both from the extra ``images``,
imported on first use. An image a codec cannot carry travels raw: :func:`refusal` says why, from every limit in
:data:`LIMITS`, so nothing a library would refuse reaches it.

Decoding bounds the declared shape first (:class:`ImagesTooLarge` past the receiver's ``max_pixels``) and reads
each row's header before anything is decompressed or allocated: a small message cannot make the receiver allocate a
huge image. A server offers :data:`FEATURE` in its metadata when it decodes such images.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, Literal

import numpy as np

from plugrl_env_client.errors import ConfigError, ProtocolError

FEATURE = "x-plugrl-env-client-images"
"""The metadata feature of a server that decodes encoded images (this package's own name space)."""

Codec = Literal["none", "jpeg", "qoi"]
CODECS: tuple[str, ...] = ("none", "jpeg", "qoi")
CHANNELS: dict[str, tuple[int, ...]] = {"jpeg": (1, 3), "qoi": (3, 4)}
"""The channel counts each codec carries; other images travel raw."""
DEFAULT_QUALITY = 90


@dataclasses.dataclass(frozen=True)
class Limits:
    """What one codec carries: its channel counts, the longest side and the most pixels (height x width) of one
    image; every side is at least 1 pixel."""

    channels: tuple[int, ...]
    max_side: int
    max_pixels: int


LIMITS: dict[str, Limits] = {
    "jpeg": Limits(CHANNELS["jpeg"], max_side=65500, max_pixels=65500 * 65500),  # libjpeg's JPEG_MAX_DIMENSION
    "qoi": Limits(CHANNELS["qoi"], max_side=400_000_000, max_pixels=400_000_000),  # the QOI format's pixel limit
}
"""Every limit of each codec's format and library; an image past one travels raw."""

DEFAULT_MAX_PIXELS = 1 << 25
"""Pixels (env rows x height x width, all cameras together) the encoded images of one message may declare before a
receiver refuses it unread: 128 MiB decoded at 4 channels, 16 envs of 1448x1448 pixels."""


class ImagesTooLarge(ProtocolError):
    """A message's encoded images declare more pixels than the receiver takes (``max_pixels``): refused before
    anything is decoded or allocated."""

    def __init__(self, field: str, shape: Sequence[int], pixels: int, max_pixels: int, before: int = 0) -> None:
        others = f" ({before + pixels} with the message's cameras before it)" if before else ""
        super().__init__(f"{field}: the declared shape {list(shape)} is {pixels} pixels of encoded images{others}, "
                         f"over the {max_pixels} pixels one message may declare here")
        self.pixels, self.max_pixels = before + pixels, max_pixels

_QOI_HEADER = struct.Struct(">4sIIBB")  # magic, width, height, channels, colorspace (the QOI specification)


def _library(name: str, codec: str, word: Callable[[str], str] = str) -> ModuleType:
    """The codec's library, imported on first use; a clear error when the extra is not installed."""
    import importlib

    try:
        return importlib.import_module(name)
    except ImportError:
        raise ConfigError(f"the {codec} image codec needs the {name} package: pip install "
                          f"'plugrl-env-client[images]' (or pass {word('image_codec')} none)") from None


def check_choice(codec: str, quality: int, word: Callable[[str], str] = str) -> None:
    """A client's ``image_codec`` and ``image_quality``, checked before anything runs: a ConfigError saying what is
    wrong (an unknown codec, a quality outside 1..100, the extra not installed), naming each choice by ``word``
    (how the user sets it)."""
    if codec not in CODECS:
        raise ConfigError(f"{word('image_codec')} must be one of {', '.join(CODECS)}, got {codec!r}")
    if not 1 <= quality <= 100:
        raise ConfigError(f"{word('image_quality')} must be 1..100 (JPEG quality), got {quality}")
    if codec != "none":
        _library(_LIBRARIES[codec], codec, word)


def available() -> bool:
    """Whether every codec's library can be imported here: a server offers :data:`FEATURE` only then."""
    try:
        for codec, name in _LIBRARIES.items():
            _library(name, codec)
    except ConfigError:
        return False
    return True


_LIBRARIES = {"jpeg": "simplejpeg", "qoi": "qoi"}


def refusal(shape: Sequence[int], dtype: Any, codec: str) -> str | None:
    """Why ``codec`` cannot carry images of ``shape`` (``[n, h, w, c]``) and ``dtype``, or None when it can: the one
    check of every limit in :data:`LIMITS`, made before anything is encoded (and of a declared shape before it is
    decoded)."""
    limits = LIMITS.get(codec)
    if limits is None:
        return f"{codec!r} is not an image codec (one of {', '.join(LIMITS)})"
    if np.dtype(dtype) != np.uint8:
        return f"{codec} carries uint8 images, not {np.dtype(dtype)}"
    if len(shape) != 4:
        return f"{codec} carries [n, h, w, c] image batches, not {len(shape)}-d arrays"
    _, height, width, channels = (int(s) for s in shape)
    if channels not in limits.channels:
        return f"{codec} carries images of {' or '.join(map(str, limits.channels))} channels, not {channels}"
    if not 1 <= height <= limits.max_side or not 1 <= width <= limits.max_side:
        return f"{codec} carries images of 1 to {limits.max_side} pixels a side, not {height}x{width}"
    if height * width > limits.max_pixels:
        return f"{codec} carries images of at most {limits.max_pixels} pixels, not {height}x{width}"
    return None


def encodable(shape: Sequence[int], codec: str, dtype: Any = np.uint8) -> bool:
    """Whether ``codec`` carries images of ``shape`` (``[n, h, w, c]``) and ``dtype``; otherwise they travel raw."""
    return refusal(shape, dtype, codec) is None


def encode(images: np.ndarray, codec: str, quality: int = DEFAULT_QUALITY, field: str = "images") -> list[bytes]:
    """``images`` (``[n, h, w, c]`` uint8) as ``n`` encoded rows. ``field`` names them in an error."""
    why = refusal(images.shape, images.dtype, codec)
    if why is not None:
        raise ValueError(f"{field}: {why} ({images.dtype} {list(images.shape)}); check refusal() first")
    if codec == "jpeg":
        if not 1 <= quality <= 100:
            raise ValueError(f"JPEG quality must be 1..100, got {quality}")
        jpeg: Any = _library("simplejpeg", codec)
        gray = images.shape[-1] == 1
        return [jpeg.encode_jpeg(np.ascontiguousarray(row), quality=quality, colorspace="GRAY" if gray else "RGB",
                                 colorsubsampling="Gray" if gray else "420") for row in images]
    qoi: Any = _library("qoi", codec)
    return [bytes(qoi.encode(np.ascontiguousarray(row))) for row in images]


def header_shape(data: bytes, codec: str) -> tuple[int, int, int]:
    """(height, width, channels) an encoded image declares, read from its header alone; a ProtocolError when it is
    not one of ``codec``'s images."""
    if codec == "qoi":
        if len(data) < _QOI_HEADER.size:
            raise ProtocolError(f"not a QOI image ({len(data)} bytes, shorter than its header)")
        magic, width, height, channels, _ = _QOI_HEADER.unpack_from(data)
        if magic != b"qoif":
            raise ProtocolError("not a QOI image (its header does not start with 'qoif')")
        return height, width, channels
    if codec == "jpeg":
        jpeg: Any = _library("simplejpeg", codec)
        try:
            height, width, colorspace, _ = jpeg.decode_jpeg_header(data)
        except ValueError as exc:
            raise ProtocolError(f"not a JPEG image ({exc})") from None
        return height, width, 1 if colorspace == "Gray" else 3
    raise ValueError(f"unknown image codec {codec!r}")


def pixels(shape: Sequence[int]) -> int:
    """The pixels of a declared ``[n, h, w, c]`` shape: env rows x height x width."""
    return int(shape[0]) * int(shape[1]) * int(shape[2])


def decode(rows: Sequence[bytes], codec: str, shape: Sequence[int], field: str = "images",
           max_pixels: int = DEFAULT_MAX_PIXELS, before: int = 0) -> np.ndarray:
    """The ``[n, h, w, c]`` uint8 array of ``rows`` (one encoded image per env row), whose declared ``shape`` is
    bounded by ``max_pixels`` with the ``before`` pixels of the message's other cameras (:class:`ImagesTooLarge`)
    and checked against every row's header before anything is decoded or allocated. A mismatch, a row count that
    differs, or bytes that are not such an image raise a ProtocolError naming ``field`` and the row."""
    shape = tuple(int(s) for s in shape)
    why = refusal(shape, np.uint8, codec)
    if why is not None:
        raise ProtocolError(f"{field}: declared shape {list(shape)} cannot be {codec}-encoded images ({why})")
    if before + pixels(shape) > max_pixels:
        raise ImagesTooLarge(field, shape, pixels(shape), max_pixels, before)
    if len(rows) != shape[0]:
        raise ProtocolError(f"{field}: {len(rows)} encoded rows for a declared shape of {shape[0]} rows")
    for i, data in enumerate(rows):
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise ProtocolError(f"{field} row {i}: an encoded image is bytes, got {type(data).__name__}")
        try:
            found = header_shape(bytes(data[:64]) if codec == "qoi" else bytes(data), codec)
        except ProtocolError as exc:
            raise ProtocolError(f"{field} row {i}: {exc}") from None
        if found != shape[1:]:
            raise ProtocolError(f"{field} row {i}: the encoded image is {found[0]}x{found[1]}x{found[2]}, the "
                                f"declared shape says {shape[1]}x{shape[2]}x{shape[3]}")
    out = np.empty(shape, np.uint8)
    for i, data in enumerate(rows):
        try:
            if codec == "jpeg":
                jpeg: Any = _library("simplejpeg", codec)
                gray = shape[3] == 1
                decoded = jpeg.decode_jpeg(bytes(data), colorspace="GRAY" if gray else "RGB")
            else:
                decoded = _library("qoi", codec).decode(bytes(data))
            out[i] = np.asarray(decoded).reshape(shape[1:])
        except (ValueError, RuntimeError) as exc:
            raise ProtocolError(f"{field} row {i}: the {codec} image does not decode ({exc})") from None
    return out
