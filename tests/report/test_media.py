"""Finding the recorder's samples and videos, and describing them without decoding."""

from __future__ import annotations

import struct
import zlib

import numpy as np

from plugrl_env_client.report.media import describe_state, find_media, png_size, text_preview


def tiny_png(width: int, height: int) -> bytes:
    """A valid grey PNG built with zlib alone."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    raw = b"".join(b"\x00" + b"\x80" * width for _ in range(height))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def test_samples_are_parsed_and_ordered_by_episode_then_moment(tmp_path):
    sampled = tmp_path / "proc_000" / "sampled"
    sampled.mkdir(parents=True)
    for name in ("ep000010_last_base.png", "ep000002_last_base.png", "ep000002_first_wrist.png",
                 "ep000002_first_base.png", "extra.txt", "ep000002_first_state.npy", "notes.md"):
        (sampled / name).write_bytes(tiny_png(2, 2))
    videos = tmp_path / "proc_001" / "videos"
    videos.mkdir(parents=True)
    (videos / "ep000001_base.mp4").write_bytes(b"x")
    (videos / "ep000001_base.txt").write_bytes(b"x")
    media = find_media([(0, tmp_path / "proc_000"), (1, tmp_path / "proc_001"), (2, tmp_path / "nothing")])
    assert [s.path.name for s in media.samples] == [
        "ep000002_first_base.png", "ep000002_first_state.npy", "ep000002_first_wrist.png",
        "ep000002_last_base.png", "ep000010_last_base.png", "extra.txt"]
    first = media.samples[0]
    assert (first.episode, first.moment, first.key, first.kind) == (2, "first", "base", "png")
    assert first.label == "episode 2, first, base" and media.samples[-1].label == "extra.txt"
    assert [s.path.name for s in media.images] == ["ep000002_first_base.png", "ep000002_first_wrist.png",
                                                   "ep000002_last_base.png", "ep000010_last_base.png"]
    assert [(v.process_id, v.path.name) for v in media.videos] == [(1, "ep000001_base.mp4")]
    assert media and not find_media([])


def test_samples_in_plugrls_layout_are_parsed_and_ordered_by_episode_env_then_moment(tmp_path):
    sampled = tmp_path / "proc_000" / "sampled"
    names = ["ep_000010/env_001/obs/first/images/base.png", "ep_000002/env_003/obs/last/states/pos.npy",
             "ep_000002/env_003/obs/last/text.txt", "ep_000002/env_003/obs/last/info.json",
             "ep_000002/env_003/obs/first/images/wrist.png", "ep_000002/env_000/obs/first/images/base.png",
             "ep_000002/env_003/obs/first/images/base.png", "ep_000002/env_003/obs/odd/images/x.png"]
    for name in names:
        (sampled / name).parent.mkdir(parents=True, exist_ok=True)
        (sampled / name).write_bytes(tiny_png(2, 2))
    media = find_media([(0, tmp_path / "proc_000")])
    assert [str(s.path.relative_to(sampled)) for s in media.samples] == [
        "ep_000002/env_000/obs/first/images/base.png", "ep_000002/env_003/obs/first/images/base.png",
        "ep_000002/env_003/obs/first/images/wrist.png", "ep_000002/env_003/obs/last/states/pos.npy",
        "ep_000002/env_003/obs/last/text.txt", "ep_000010/env_001/obs/first/images/base.png",
        "ep_000002/env_003/obs/odd/images/x.png"]  # info.json is not a sample; an odd path is listed last
    text = media.samples[4]
    assert (text.episode, text.env, text.moment, text.key, text.kind) == (2, 3, "last", "text", "txt")
    assert media.samples[1].label == "episode 2, env 3, first, base"
    assert media.samples[-1].episode is None and media.samples[-1].label == "x.png"


def test_png_size_reads_the_header(tmp_path):
    (tmp_path / "a.png").write_bytes(tiny_png(37, 5))
    (tmp_path / "b.png").write_bytes(b"GIF89a" + b"\x00" * 30)
    assert png_size(tmp_path / "a.png") == (37, 5)
    assert png_size(tmp_path / "b.png") is None
    assert png_size(tmp_path / "missing.png") is None


def test_describe_state(tmp_path):
    np.save(tmp_path / "small.npy", np.arange(3, dtype=np.int16))
    np.save(tmp_path / "big.npy", np.zeros((20, 7), np.float32))
    np.save(tmp_path / "bad.npy", np.array([np.inf]))
    np.save(tmp_path / "obj.npy", np.array([{"a": 1}], dtype=object))
    assert describe_state(tmp_path / "small.npy") == "int16 (3,) [0, 1, 2]"
    assert describe_state(tmp_path / "big.npy") == "float32 (20, 7)"
    assert describe_state(tmp_path / "bad.npy") == "float64 (1,) (holds non-finite values)"
    assert describe_state(tmp_path / "obj.npy").startswith("unreadable")


def test_text_preview_is_cut(tmp_path):
    (tmp_path / "short.txt").write_text("hello")
    (tmp_path / "long.txt").write_text("y" * 1000)
    assert text_preview(tmp_path / "short.txt") == "hello"
    long = text_preview(tmp_path / "long.txt")
    assert long.endswith(" ...") and len(long) == 404
