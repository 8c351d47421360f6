"""What the recorder left in a run folder: sampled observations (``sampled/``) and episode videos (``videos/``).

Only file names and headers are read here: the page links to the files where they are, so a report never copies
a video and never decodes one. Samples are found in PlugRL's layout, ``sampled/ep_<episode>/env_<env>/obs/
<first|last>/{images/<key>.png, states/<key>.npy, text.txt}`` (episodes numbered by completion, from 1), and in the
flat layout of older runs, ``sampled/ep<episode>_env<env>_<first|last>_<key>.<ext>`` (numbered by start, from 0;
the ``_env<env>`` part is missing in the oldest); files named otherwise are still listed, under their plain name.
"""

from __future__ import annotations

import dataclasses
import re
import struct
from pathlib import Path

import numpy as np

from plugrl_env_client.outputs.recording.encoders import PNG_SIGNATURE

SAMPLE_NAME = re.compile(r"^ep(?P<episode>\d+)(?:_env(?P<env>\d+))?_(?P<moment>first|last)_(?P<key>.+)$")
"""A sample of the older, flat layout (its stem)."""
SAMPLE_PATH = re.compile(r"^ep_(?P<episode>\d+)/env_(?P<env>\d+)/obs/(?P<moment>first|last)/"
                         r"(?:(?:images|states)/(?P<key>[^/]+)|(?P<text>text))\.[^./]+$")
"""A sample of PlugRL's layout (its path under ``sampled/``)."""
SAMPLE_KINDS = {".png", ".npy", ".txt"}
TEXT_PREVIEW_CHARS = 400


@dataclasses.dataclass(frozen=True)
class Sample:
    """One sampled observation file: an image (``.png``), a state (``.npy``) or a text (``.txt``)."""

    path: Path
    process_id: int
    episode: int | None
    moment: str | None
    """``first`` or ``last`` observation of the episode, when the name says."""
    key: str
    env: int | None = None
    """The env's index in its process, when the name says."""

    @property
    def kind(self) -> str:
        return self.path.suffix.lower().lstrip(".")

    @property
    def label(self) -> str:
        if self.episode is None:
            return self.path.name
        env = "" if self.env is None else f", env {self.env}"
        return f"episode {self.episode}{env}, {self.moment}, {self.key}"


@dataclasses.dataclass(frozen=True)
class Video:
    path: Path
    process_id: int


@dataclasses.dataclass(frozen=True)
class RunMedia:
    samples: list[Sample]
    videos: list[Video]

    @property
    def images(self) -> list[Sample]:
        return [s for s in self.samples if s.kind == "png"]

    def __bool__(self) -> bool:
        return bool(self.samples or self.videos)


def find_media(proc_folders: list[tuple[int, Path]]) -> RunMedia:
    """Sampled observations and videos of every process folder, in episode order."""
    samples: list[Sample] = []
    videos: list[Video] = []
    for pid, folder in proc_folders:
        sampled = folder / "sampled"
        if sampled.is_dir():
            found = [_sample(pid, f) for f in sampled.iterdir() if f.is_file() and f.suffix.lower() in SAMPLE_KINDS]
            found += [_nested_sample(pid, sampled, f) for f in sampled.glob("ep_*/env_*/obs/*/**/*")
                      if f.is_file() and f.suffix.lower() in SAMPLE_KINDS]
            samples.extend(sorted(found, key=_sample_order))
        video_dir = folder / "videos"
        if video_dir.is_dir():
            videos.extend(Video(f, pid) for f in sorted(video_dir.iterdir()) if f.is_file() and f.suffix.lower() == ".mp4")
    return RunMedia(samples, videos)


def _sample(pid: int, path: Path) -> Sample:
    match = SAMPLE_NAME.match(path.stem)
    if match is None:
        return Sample(path, pid, None, None, path.stem)
    env = match.group("env")
    return Sample(path, pid, int(match.group("episode")), match.group("moment"), match.group("key"),
                  None if env is None else int(env))


def _nested_sample(pid: int, sampled: Path, path: Path) -> Sample:
    rel = path.relative_to(sampled).as_posix()
    match = SAMPLE_PATH.match(rel)
    if match is None:
        return Sample(path, pid, None, None, rel)
    return Sample(path, pid, int(match.group("episode")), match.group("moment"), match.group("key") or "text",
                  int(match.group("env")))


def _sample_order(s: Sample) -> tuple[int, int, int, str, str]:
    return (s.episode if s.episode is not None else 1 << 62, s.env if s.env is not None else -1,
            0 if s.moment == "first" else 1, s.key, str(s.path))


def png_size(path: Path) -> tuple[int, int] | None:
    """(width, height) from a PNG's header, or None when the file is not a PNG."""
    try:
        with open(path, "rb") as f:
            head = f.read(24)
    except OSError:
        return None
    if len(head) < 24 or not head.startswith(PNG_SIGNATURE) or head[12:16] != b"IHDR":
        return None
    width, height = struct.unpack(">II", head[16:24])
    return int(width), int(height)


def describe_state(path: Path) -> str:
    """``shape dtype`` of a saved array, with its values when there are few (the array is memory-mapped)."""
    try:
        array = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as exc:
        return f"unreadable ({exc})"
    text = f"{array.dtype} {tuple(array.shape)}"
    if array.size <= 12 and array.dtype.kind in "biuf":
        values = np.asarray(array)
        if np.isfinite(values).all():  # the page never shows nan or inf
            text += " " + np.array2string(values, precision=4, separator=", ")
        else:
            text += " (holds non-finite values)"
    return text


def text_preview(path: Path) -> str:
    """The start of a saved text observation."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read(TEXT_PREVIEW_CHARS + 1)
    except OSError as exc:
        return f"unreadable ({exc})"
    return text if len(text) <= TEXT_PREVIEW_CHARS else text[:TEXT_PREVIEW_CHARS] + " ..."
