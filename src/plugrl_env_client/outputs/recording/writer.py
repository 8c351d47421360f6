"""The recorder's writer thread: finished episodes come to it over a bounded hand-off, and it writes their files.

Why a writer thread and a bounded hand-off: the rollout must never wait for PNG, MP4 or NPZ encoding, nor for the
disk. The rollout thread only copies the rows of the envs being recorded (:mod:`.recorder`: a one-array mask test
decides that, so steps of other envs, and every step of a disabled recorder, copy nothing); a finished episode is
handed to one writer thread. When the writer is behind and the hand-off is full, the episode is dropped and counted
instead of blocking the rollout; the report and a log warning say how many.
"""

from __future__ import annotations

import collections
import io
import json
import logging
import re
import threading
from typing import Any

import numpy as np

from plugrl_env_client.errors import OutputError
from plugrl_env_client.outputs.recording.config import RecorderConfig
from plugrl_env_client.outputs.recording.encoders import (
    encode_mp4,
    encode_npy,
    encode_png,
    png_compatible,
    video_compatible,
)
from plugrl_env_client.outputs.recording.episode import FinishedEpisode, RecordedEpisode
from plugrl_env_client.outputs.recording.sinks import AppendableSink, ArtifactSink
from plugrl_env_client.outputs.recording.statistics import phase_stats
from plugrl_env_client.outputs.run_dir import finite_json

logger = logging.getLogger(__name__)

QUEUE_EPISODES = 32
"""Finished episodes waiting for the writer at most; one more is dropped."""
QUEUE_BYTES = 1 << 30
"""Bytes of frames waiting for the writer at most (an episode is always accepted when nothing waits)."""

OBS_STATS_FILE = "metrics/obs_stats.jsonl"
EPISODE_METRICS_FILE = "metrics/episode_metrics.jsonl"

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


class HandOff:
    """A bounded FIFO between the rollout and the writer thread that never blocks the side that offers."""

    def __init__(self, max_items: int, max_bytes: int) -> None:
        self.max_items, self.max_bytes = max(int(max_items), 1), int(max_bytes)
        self._items: collections.deque[tuple[FinishedEpisode, int]] = collections.deque()
        self._bytes = 0
        self._closed = False
        self._cond = threading.Condition()

    def offer(self, job: FinishedEpisode, nbytes: int) -> bool:
        """Queue ``job`` unless the queue is full; an empty queue takes any size (the frames are in memory
        already, so refusing them would lose the episode without saving memory)."""
        with self._cond:
            if self._items and (len(self._items) >= self.max_items or self._bytes + nbytes > self.max_bytes):
                return False
            self._items.append((job, nbytes))
            self._bytes += nbytes
            self._cond.notify()
            return True

    def take(self) -> FinishedEpisode | None:
        """The next job; None once closed and drained."""
        with self._cond:
            while not self._items and not self._closed:
                self._cond.wait()
            if not self._items:
                return None
            job, nbytes = self._items.popleft()
            self._bytes -= nbytes
            return job

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def pending(self) -> tuple[int, int]:
        with self._cond:
            return len(self._items), self._bytes


class EpisodeWriter:
    """One process's writer thread: takes finished episodes from the hand-off and writes their files to the sink.

    What it did is read once :meth:`close` has returned: :attr:`files`, :attr:`written`, :attr:`errors` and
    :attr:`not_written` belong to the thread until then.
    """

    def __init__(self, config: RecorderConfig, process_id: int, sink: ArtifactSink | None, queue_episodes: int,
                 queue_bytes: int) -> None:
        self.config = config
        self.process_id = process_id
        self._sink = sink
        self._handoff = HandOff(queue_episodes, queue_bytes)
        self._thread: threading.Thread | None = None
        self.files: dict[str, None] = {}  # insertion-ordered set
        """Every file written, in the order first written."""
        self.written = 0
        """Episodes whose files were all written."""
        self.errors: list[str] = []
        """Files that could not be written, with the reason."""
        self.not_written = 0
        """Episodes not written because the output folder had failed before their turn."""
        self._folder_failed = False  # the output folder failed (OutputError): nothing more is tried
        self._lines: dict[str, list[bytes]] = {}  # JSON lines so far, for sinks that cannot append

    def start(self) -> EpisodeWriter:
        self._thread = threading.Thread(target=self._serve, name=f"recorder-proc{self.process_id}", daemon=True)
        self._thread.start()
        return self

    def offer(self, job: FinishedEpisode, nbytes: int) -> bool:
        """Hand ``job`` (``nbytes`` of frames) to the thread; False, at once, when the hand-off is full."""
        return self._handoff.offer(job, nbytes)

    def pending(self) -> tuple[int, int]:
        """Episodes and bytes of frames waiting for the thread."""
        return self._handoff.pending()

    def close(self) -> None:
        """Write every episode already handed over, then stop the thread."""
        self._handoff.close()
        if self._thread is not None:
            self._thread.join()

    def _serve(self) -> None:
        while (job := self._handoff.take()) is not None:
            ok = self._write_episode(job)
            self.written += int(ok)

    def _write_episode(self, job: FinishedEpisode) -> bool:
        """Every output of one episode; a failing output is logged and the others still written, unless the output
        folder itself failed (a full disk): the run writer has said so once and stops the run, so this stops too."""
        if self._folder_failed:
            self.not_written += 1
            return False
        ok = True
        episode = job.episode
        outputs: list[tuple[str, Any]] = [("samples", lambda ep: self._write_samples(ep, job.info))]
        if self.config.record_video:
            outputs.append(("video", self._write_videos))
        if self.config.record_full_rollout:
            outputs.append(("rollout", self._write_rollout))
        if self.config.record_obs_stats:
            outputs.append(("obs stats", lambda ep: self._write_obs_stats(ep, job.info)))
        if self.config.record_episode_metrics:
            outputs.append(("episode metrics", lambda ep: self._write_metrics(ep, job)))
        for what, write in outputs:
            try:
                write(episode)
            except OutputError as exc:  # said once by the run writer, which stops the run: no trace per file
                self.errors.append(f"{episode.stem} {what}: {exc}")
                self._folder_failed = True
                self.not_written += 1
                return False
            except Exception as exc:  # a broken file must not end the run; it is reported instead
                ok = False
                message = f"{episode.stem} {what}: {type(exc).__name__}: {exc}"
                self.errors.append(message)
                logger.warning("recorder: could not write %s", message, exc_info=True)
        return ok

    def _emit(self, relpath: str, data: bytes) -> None:
        assert self._sink is not None
        self._sink.write_bytes(relpath, data)
        self.files[relpath] = None

    def _append_line(self, relpath: str, row: dict[str, Any]) -> None:
        line = (json.dumps(finite_json(row), allow_nan=False) + "\n").encode()
        sink = self._sink
        assert sink is not None
        if isinstance(sink, AppendableSink):
            sink.append_bytes(relpath, line)
        else:
            lines = self._lines.setdefault(relpath, [])
            lines.append(line)
            sink.write_bytes(relpath, b"".join(lines))
        self.files[relpath] = None

    def _write_samples(self, episode: RecordedEpisode, info: dict[str, Any]) -> None:
        """PlugRL's layout: ``<folder>/obs/{first,last}/images/<key>.png``, ``.../states/<key>.npy``,
        ``.../text.txt`` and ``.../last/info.json``."""
        for moment, frame in (("first", episode.first), ("last", episode.last)):
            phase = f"{episode.folder}/obs/{moment}"
            used: set[str] = set()  # keys that differ only in unsafe characters must not overwrite each other
            for key, image in frame.images.items():
                if png_compatible(image):
                    self._emit(_unique(f"{phase}/images/{_safe(key)}", ".png", used), encode_png(image))
                else:  # a float depth map, say: kept as the env made it
                    self._emit(_unique(f"{phase}/images/{_safe(key)}", ".npy", used), encode_npy(image))
            for key, state in frame.states.items():
                self._emit(_unique(f"{phase}/states/{_safe(key)}", ".npy", used), encode_npy(state))
            self._emit(f"{phase}/text.txt", frame.text.encode("utf-8"))
        self._emit(f"{episode.folder}/obs/last/info.json",
                   (json.dumps(info, indent=2, allow_nan=False) + "\n").encode("utf-8"))

    def _write_videos(self, episode: RecordedEpisode) -> None:
        frames = episode.frames
        for key in episode.first.images:
            images = [f.images[key] for f in frames if key in f.images]
            if not video_compatible(images):
                logger.info("recorder: no video of image %r (needs uint8 frames of one size, 1, 3 or 4 channels)",
                            key)
                continue
            self._emit(f"videos/{episode.stem}_{_safe(key)}.mp4", encode_mp4(images, self.config.video_fps))

    def _write_rollout(self, episode: RecordedEpisode) -> None:
        frames = episode.frames
        arrays: dict[str, np.ndarray] = {}
        for key in episode.first.images:
            arrays[f"images/{key}"] = np.stack([f.images[key] for f in frames])
        for key in episode.first.states:
            arrays[f"states/{key}"] = np.stack([f.states[key] for f in frames])
        arrays["text"] = np.array([f.text for f in frames], dtype=str)
        arrays["actions"] = _stack_actions(episode.actions)
        arrays["rewards"] = np.asarray(episode.rewards, dtype=np.float64)
        arrays["episode"] = np.asarray(episode.completed)
        arrays["env_episode"] = np.asarray(episode.env_episode)
        arrays["env_index"] = np.asarray(episode.env_id)
        arrays["process_id"] = np.asarray(self.process_id)
        arrays["num_steps"] = np.asarray(episode.num_steps)
        buf = io.BytesIO()
        np.savez_compressed(buf, **arrays)  # type: ignore[arg-type]  # numpy's stub types the first positional
        self._emit(f"rollouts/{episode.stem}.npz", buf.getvalue())

    def _ids(self, episode: RecordedEpisode) -> dict[str, Any]:
        """The fields that name an episode in PlugRL's JSON lines."""
        return {"completed_episode": episode.completed, "process_id": self.process_id, "env_id": episode.env_id,
                "env_episode_id": episode.env_episode}

    def _write_obs_stats(self, episode: RecordedEpisode, info: dict[str, Any]) -> None:
        self._append_line(OBS_STATS_FILE, {**self._ids(episode), "first": phase_stats(episode.first),
                                           "last": phase_stats(episode.last), "last_info": info,
                                           "num_steps": episode.num_steps})

    def _write_metrics(self, episode: RecordedEpisode, job: FinishedEpisode) -> None:
        """PlugRL's fields (``episode_success`` false for an env without a success rule, as PlugRL writes it;
        ``has_success_rule`` says which), then ours."""
        record = job.record
        ours = {k: v for k, v in record.to_json().items() if k not in ("env_index", "process_id", "return", "success")}
        self._append_line(EPISODE_METRICS_FILE, {
            **self._ids(episode), "episode_return": record.episode_return, "episode_success": bool(record.success),
            **job.means, "has_success_rule": record.success is not None, **ours})


def _stack_actions(actions: list[np.ndarray]) -> np.ndarray:
    """The actions as one array; text actions become a unicode array, so the NPZ loads without pickle."""
    if not actions:
        return np.zeros((0,))
    stacked = np.stack(actions)
    if stacked.dtype == object and all(isinstance(a, str) for a in stacked.reshape(-1)):
        stacked = stacked.astype(str)
    return stacked


def _safe(key: str) -> str:
    return _UNSAFE.sub("_", key) or "_"


def _unique(base: str, ext: str, used: set[str]) -> str:
    """``base + ext``, or ``base_2 + ext`` (3, ...) when that name is already in ``used``; the name is added to it."""
    name, k = base + ext, 1
    while name in used:
        k += 1
        name = f"{base}_{k}{ext}"
    used.add(name)
    return name
