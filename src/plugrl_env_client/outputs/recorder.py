"""The episode recorder: what a run keeps of some episodes besides ``episodes.jsonl``, in PlugRL's layout.

For every K-th episode of a process (``--recorder.episode-freq K``) the recorder keeps copies of the episode's
observations while it runs and, once it ends, writes under the process folder (``rollout/proc_NNN/``)::

    sampled/ep_NNNNNN/env_EEE/obs/{first,last}/images/{key}.png   each image key (uint8, 1 to 4 channels; .npy else)
    sampled/ep_NNNNNN/env_EEE/obs/{first,last}/states/{key}.npy   each state key
    sampled/ep_NNNNNN/env_EEE/obs/{first,last}/text.txt           the text (empty when the env gives none)
    sampled/ep_NNNNNN/env_EEE/obs/last/info.json                  the env's part of the last step's info
    videos/epNNNNNN_envEEE_{key}.mp4     --recorder.record-video: each image key, H.264
    rollouts/epNNNNNN_envEEE.npz         --recorder.record-full-rollout
    metrics/obs_stats.jsonl              --recorder.record-obs-stats (on): PlugRL's line per episode
    metrics/episode_metrics.jsonl        --recorder.record-episode-metrics (on): PlugRL's line per episode

``NNNNNN`` is the episode's number by completion in its process (the process's count of completed episodes when
it ended, from 1, as PlugRL numbers it), ``EEE`` the env's index in the process. Keys are used in file names with
every character outside ``[A-Za-z0-9._-]`` replaced by ``_``. The JSON lines start with PlugRL's fields
(``completed_episode``, ``process_id``, ``env_id``, ``env_episode_id``: the env's own episode number from 1); ours
follow them.

Which episodes: the decision is taken when an episode *starts*, so that its frames can be kept from its first
observation on, and its number by completion is known only when it ends. So the recorder records the K-th, 2K-th,
... episode to start in the process (starts counted in the order :meth:`EpisodeRecorder.on_reset` reports them;
within one call, in the order of its ``env_ids``) and names it by its completion number when it ends. Where
episodes end in the order they start (envs of one length, stepped together), these are PlugRL's episodes K, 2K,
...; otherwise the same count of episodes, numbered as they completed. With several env groups
(``--runner.pipeline``) the starts interleave the groups in the order they reset. An episode is written only once
it ends: episodes still running at :meth:`EpisodeRecorder.close`, and episodes whose env is reset again without
having ended, are counted in the report but not written.

Why a writer thread and a bounded hand-off: the rollout must never wait for PNG, MP4 or NPZ encoding, nor for the
disk. The rollout thread only copies the rows of the envs being recorded (a one-array mask test decides that, so
steps of other envs, and every step of a disabled recorder, copy nothing); a finished episode is handed to one
writer thread. When the writer is behind and the hand-off is full, the episode is dropped and counted instead of
blocking the rollout; the report and a log warning say how many.

Memory: an episode's frames stay in memory until it ends. At most ``max_frames`` (10 000 by default) steps of
observations, actions and rewards are kept per episode; later steps only update the last observation (so the
``last`` samples stay right), and the video and the NPZ cover the steps kept. Only the outputs that need every step
(video, full rollout) make the recorder keep them; otherwise it holds two observations per recorded episode.

JSON files are strict JSON (NaN and infinities become null; statistics are over an array's finite values, with
``non_finite`` counting the others); ``.npy`` and ``.npz`` files hold the arrays as the env produced them.

Frames rendered for the recorder only: an env that renders only for the recorder (``--env.render-for-recorder-only``
of Gym-v1 and MuJoCo-v1) sends no frames in its observations and says so with ``frames_for_recorder``;
:meth:`EpisodeRecorder.render_for` hands the recorder such envs, and the recorder asks each for the frames of the
envs it records (``render_frames(rows)``), right after the reset or step whose observation it copies, and keeps
them as images of that observation. Only recorded envs render, and only while they are recorded.

Flags that would do nothing say so, once per run, from process 0 (every run has one; the others stay quiet, so
``--num-procs 4`` warns once, not four times): a record flag without ``--recorder.episode-freq`` (nothing is
recorded), and ``--recorder.record-video`` for an env whose observations hold no image (no video can be made).
"""

from __future__ import annotations

import collections
import dataclasses
import io
import json
import logging
import os
import re
import secrets
import struct
import tempfile
import threading
import zlib
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any, Protocol, runtime_checkable

import numpy as np

from plugrl_env_client.envs.base_env import Observation
from plugrl_env_client.errors import ConfigError, OutputError
from plugrl_env_client.outputs.run_dir import PLUGRL_FLOATS, finite_json, with_plugrl_types
from plugrl_env_client.records import DEFAULT_METRIC_WINDOW, EpisodeRecord, EpisodeStats

logger = logging.getLogger(__name__)

MAX_FRAMES_PER_EPISODE = 10_000
"""Steps of one episode kept in memory at most (observations, actions, rewards); see the module docstring."""
QUEUE_EPISODES = 32
"""Finished episodes waiting for the writer at most; one more is dropped."""
QUEUE_BYTES = 1 << 30
"""Bytes of frames waiting for the writer at most (an episode is always accepted when nothing waits)."""
VIDEO_INSTALL = 'pip install "plugrl-env-client[video]"'
VIDEO_QUALITY = 6
"""imageio-ffmpeg's 0-10 quality scale; 6 is H.264 CRF 20, visually close to the frames at a modest size."""

OBS_STATS_FILE = "metrics/obs_stats.jsonl"
EPISODE_METRICS_FILE = "metrics/episode_metrics.jsonl"

RECORD_FLAGS = ("record_video", "record_full_rollout", "record_obs_stats", "record_episode_metrics", "thread0_only")
"""The recorder's flags that take effect only on recorded episodes (with ``--recorder.episode-freq K``)."""

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_PNG_COLOR_TYPE = {1: 0, 2: 4, 3: 2, 4: 6}  # channels -> gray, gray+alpha, RGB, RGBA


# ---------------------------------------------------------------------------------------------------- config


@dataclasses.dataclass
class RecorderConfig:
    """What is recorded of the episodes, besides episodes.jsonl (names as PlugRL's client has them)."""

    episode_freq: int = 0
    """Record every K-th episode of each process: the K-th, 2K-th, ... episode to start (0: record nothing)."""
    thread0_only: bool = True
    """Record in process 0 only (--recorder.no-thread0-only: in every process)."""
    record_video: bool = False
    """An MP4 of each recorded episode's images (extra video)."""
    video_fps: float = 30.0
    """Frames per second of the videos (--recorder.record-video)."""
    record_full_rollout: bool = False
    """Every step's observation, action and reward of each recorded episode, as NPZ."""
    record_obs_stats: bool = True
    """Per-key statistics (shape, dtype, mean, std, min, max) of each recorded episode's first and last
    observations and its last info, as JSON lines."""
    record_episode_metrics: bool = True
    """Each recorded episode's return and success with the window's means, as JSON lines."""
    metric_window: int = DEFAULT_METRIC_WINDOW
    """Episodes the summaries' windowed means (mean_return, mean_success_rate) are taken over."""



# ---------------------------------------------------------------------------------------------------- sinks


@runtime_checkable
class FrameSource(Protocol):
    """An env that renders frames on request only (``--env.render-for-recorder-only``): its observations hold no
    frames, and ``render_frames(rows)`` draws the current ones of batch rows ``rows`` (``{key: (k, ...) uint8}``)."""

    num_envs: int
    frames_for_recorder: bool

    def render_frames(self, rows: np.ndarray) -> dict[str, np.ndarray]: ...


class ArtifactSink(Protocol):
    """Where the recorder's files go: a process folder on disk, or anything that can take named bytes."""

    def write_bytes(self, relpath: str, data: bytes) -> None:
        """Create or replace the file ``relpath`` (``/``-separated, under the process's folder) with ``data``."""
        ...


@runtime_checkable
class AppendableSink(Protocol):
    """A sink that can also append to a file. The recorder uses it for its JSON-lines files when the sink has it
    (otherwise it rewrites the whole file for each new line)."""

    def write_bytes(self, relpath: str, data: bytes) -> None: ...

    def append_bytes(self, relpath: str, data: bytes) -> None: ...


class DirectorySink:
    """Writes under one folder (a process's ``rollout/proc_NNN/``).

    Whole files are written atomically (temp file in the same folder, then a rename), so a reader never sees half
    an image; appended lines are flushed one write at a time, so a crash can cut only the last line short.
    """

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def path(self, relpath: str) -> Path:
        """The file ``relpath`` names, refusing paths that would leave the folder."""
        rel = PurePosixPath(relpath)
        if rel.is_absolute() or not rel.parts or ".." in rel.parts:
            raise ValueError(f"artifact path {relpath!r} must be relative and stay inside {self.root}")
        return self.root.joinpath(*rel.parts)

    def write_bytes(self, relpath: str, data: bytes) -> None:
        path = self.path(relpath)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def append_bytes(self, relpath: str, data: bytes) -> None:
        path = self.path(relpath)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "ab") as f:
            f.write(data)


# ---------------------------------------------------------------------------------------------------- report


@dataclasses.dataclass(frozen=True)
class RecorderReport:
    """What the recorder did over a run (returned by :meth:`EpisodeRecorder.close`)."""

    files: tuple[str, ...] = ()
    """Every file written, as relpaths under the process folder, in the order first written."""
    episodes_recorded: int = 0
    """Episodes whose files were all written."""
    episodes_dropped: int = 0
    """Recorded episodes not written because the writer was behind (the hand-off was full)."""
    frames_dropped: int = 0
    """Observations of the dropped episodes."""
    frames_truncated: int = 0
    """Steps not kept because an episode ran past ``max_frames``."""
    episodes_unfinished: int = 0
    """Recorded episodes that never ended: running at close, or reset again without an end."""
    errors: tuple[str, ...] = ()
    """Files that could not be written, with the reason (also in the log)."""
    episodes_not_written: int = 0
    """Recorded episodes not written because the output folder had failed (a full disk) before their turn."""

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "files": list(self.files), "errors": list(self.errors)}


# ---------------------------------------------------------------------------------------------------- the recorder


@dataclasses.dataclass
class _Frame:
    """One observation row of one env, copied out of the batch."""

    images: dict[str, np.ndarray]
    states: dict[str, np.ndarray]
    text: str

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.images.values()) + sum(a.nbytes for a in self.states.values())


def _copy_row(obs: Observation, row: int) -> _Frame:
    """Copies (never views) of row ``row`` of every array, so later changes to the batch do not reach them."""
    return _Frame(
        images={k: np.array(v[row]) for k, v in obs.images.items()},
        states={k: np.array(v[row]) for k, v in obs.states.items()},
        text=str(obs.text[row]),
    )


@dataclasses.dataclass
class _Episode:
    """A recorded episode in progress: its first and latest observation, and the steps kept."""

    env_id: int
    env_episode: int
    """The env's own episode number, from 1."""
    first: _Frame
    last: _Frame
    steps: list[_Frame] = dataclasses.field(default_factory=list)
    actions: list[np.ndarray] = dataclasses.field(default_factory=list)
    rewards: list[float] = dataclasses.field(default_factory=list)
    num_steps: int = 0
    nbytes: int = 0
    completed: int = 0
    """The process's count of completed episodes when this one ended (its number by completion, from 1)."""

    @property
    def stem(self) -> str:
        """The episode in flat file names (videos, rollouts)."""
        return f"ep{self.completed:06d}_env{self.env_id:03d}"

    @property
    def folder(self) -> str:
        """The episode's folder under ``sampled/``, as PlugRL's client names it."""
        return f"sampled/ep_{self.completed:06d}/env_{self.env_id:03d}"

    @property
    def frames(self) -> list[_Frame]:
        """The observations kept, first one included."""
        return [self.first, *self.steps]


@dataclasses.dataclass
class _Job:
    episode: _Episode
    record: EpisodeRecord
    info: dict[str, Any]
    """The env's part of the info of the episode's last step, JSON-safe."""
    means: dict[str, float]
    """``mean_return`` and ``mean_success_rate`` over the metric window when the episode ended (PlugRL's floats)."""


class _HandOff:
    """A bounded FIFO between the rollout and the writer thread that never blocks the side that offers."""

    def __init__(self, max_items: int, max_bytes: int) -> None:
        self.max_items, self.max_bytes = max(int(max_items), 1), int(max_bytes)
        self._items: collections.deque[tuple[_Job, int]] = collections.deque()
        self._bytes = 0
        self._closed = False
        self._cond = threading.Condition()

    def offer(self, job: _Job, nbytes: int) -> bool:
        """Queue ``job`` unless the queue is full; an empty queue takes any size (the frames are in memory
        already, so refusing them would lose the episode without saving memory)."""
        with self._cond:
            if self._items and (len(self._items) >= self.max_items or self._bytes + nbytes > self.max_bytes):
                return False
            self._items.append((job, nbytes))
            self._bytes += nbytes
            self._cond.notify()
            return True

    def take(self) -> _Job | None:
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


class EpisodeRecorder:
    """Keeps copies of every K-th episode of a process and writes them through a sink on a writer thread.

    The hooks are called by the rollout (one env group per call, rows in the order of the call's ``env_ids``);
    they are thread-safe, so groups stepped from different threads may share one recorder. With ``enabled``
    False every hook returns at once.
    """

    def __init__(self, config: RecorderConfig, process_id: int, num_envs: int, sink: ArtifactSink | None,
                 *, max_frames: int = MAX_FRAMES_PER_EPISODE, queue_episodes: int = QUEUE_EPISODES,
                 queue_bytes: int = QUEUE_BYTES, first_episodes: tuple[int, ...] = ()) -> None:
        if config.episode_freq < 0:
            raise ConfigError(f"--recorder.episode-freq must be >= 0 (0 records nothing), got {config.episode_freq}")
        if config.episode_freq > 0 and config.record_video:
            if config.video_fps <= 0:
                raise ConfigError(f"--recorder.video-fps must be a positive number of frames per second, "
                                  f"got {config.video_fps}")
            _require_video()  # checked in every process, so a run fails at start, not at its first video
        if max_frames < 1:
            raise ValueError(f"max_frames must be >= 1, got {max_frames}")
        self.config = config
        self.process_id = int(process_id)
        self.num_envs = int(num_envs)
        self.max_frames = int(max_frames)
        self.enabled: bool = config.episode_freq > 0 and not (config.thread0_only and self.process_id != 0)
        if self.enabled and sink is None:
            raise ValueError("EpisodeRecorder records in this process but was given no sink to write to")
        self._sink = sink
        self._keep_steps = config.record_video or config.record_full_rollout
        self._recording = np.zeros(self.num_envs, dtype=bool)  # the fast-path mask: envs with a recorded episode
        self._running: dict[int, _Episode] = {}
        # A resumed run's process continues its numbering (``first_episodes``: each env's episodes before), so its
        # files never take the names of earlier segments' and the K-th episodes stay every K-th of the whole run.
        self._env_starts = np.zeros(self.num_envs, dtype=np.int64)  # each env's episodes so far
        self._env_starts[:len(first_episodes)] = first_episodes
        self._starts = int(self._env_starts.sum())
        self._completed = self._starts  # the process's completed episodes, recorded or not
        self._stats = EpisodeStats(config.metric_window)
        self._lock = threading.Lock()
        self._close_lock = threading.Lock()
        self._closed = False
        self._report: RecorderReport | None = None
        # Counters of the rollout side (under _lock) and of the writer side (writer thread only until joined).
        self._dropped = self._frames_dropped = self._truncated = self._unfinished = 0
        self._warned_cap = False
        self._written = 0
        self._files: dict[str, None] = {}  # insertion-ordered set
        self._errors: list[str] = []
        self._folder_failed = False  # the output folder failed (OutputError): nothing more is tried
        self._not_written = 0
        self._lines: dict[str, list[bytes]] = {}  # JSON lines so far, for sinks that cannot append
        self._handoff = _HandOff(queue_episodes, queue_bytes)
        self._thread: threading.Thread | None = None
        self._sources: list[tuple[int, FrameSource]] = []  # (first process env id, env) of envs that render for us
        # Process 0 speaks for the run (see the module docstring); the image check waits for the first observation.
        self._check_images = self.process_id == 0 and self.enabled and config.record_video
        if self.process_id == 0:
            _warn_inert_flags(config)
        if self.enabled:
            self._thread = threading.Thread(target=self._serve, name=f"recorder-proc{self.process_id}", daemon=True)
            self._thread.start()

    def render_for(self, envs: list[Any]) -> None:
        """The process's env groups, in env-id order (group g holds the next ``envs[g].num_envs`` ids): those that
        render for the recorder only (see the module docstring) are asked for the recorded envs' frames."""
        offset = 0
        for env in envs:
            if isinstance(env, FrameSource) and env.frames_for_recorder:
                self._sources.append((offset, env))
            offset += int(env.num_envs)
        if self._sources and self.process_id == 0 and self.config.episode_freq == 0:
            logger.warning("--env.render-for-recorder-only renders nothing without --recorder.episode-freq K (record "
                           "every K-th episode); add it, or drop the flag")

    def _rendered(self, frames: list[tuple[int, _Frame]]) -> None:
        """Add the frames the envs that render for the recorder draw to ``frames`` ((process env id, frame))."""
        for offset, env in self._sources:
            mine = [(env_id - offset, frame) for env_id, frame in frames if 0 <= env_id - offset < env.num_envs]
            if not mine:
                continue
            drawn = env.render_frames(np.array([row for row, _ in mine], dtype=np.intp))
            for k, (_, frame) in enumerate(mine):
                for key, batch in drawn.items():
                    frame.images[key] = np.array(batch[k])

    # ------------------------------------------------------------------------------------------- rollout hooks

    def on_reset(self, obs: Observation, env_ids: np.ndarray, rows: np.ndarray) -> None:
        """Episodes start at ``env_ids``; their first observations are rows ``rows`` of ``obs``."""
        if not self.enabled:
            return
        ids = np.asarray(env_ids, dtype=np.intp).reshape(-1)
        rows_ = np.asarray(rows, dtype=np.intp).reshape(-1)
        if ids.shape != rows_.shape:
            raise ValueError(f"on_reset got {ids.size} env ids but {rows_.size} rows")
        if ids.size and (ids.min() < 0 or ids.max() >= self.num_envs):
            raise ValueError(f"env ids must be the process's env indices 0..{self.num_envs - 1}; got {ids.tolist()}")
        with self._lock:
            if self._closed:
                return
            first = self._starts
            self._starts += int(ids.size)
            np.add.at(self._env_starts, ids, 1)
            for env in ids.tolist():  # a reset ends whatever was recorded there without an end
                if self._running.pop(env, None) is not None:
                    self._unfinished += 1
            self._recording[ids] = False
            if self._check_images:
                self._check_images = False
                if not obs.images and not self._sources:
                    logger.warning("--recorder.record-video: this env's observations hold no image, so no video is "
                                   "written; envs that can render (gym-v1, mujoco-v1) draw frames with --env.render, "
                                   "or for the recorder alone with --env.render-for-recorder-only; others need "
                                   "images in their observations")
            chosen = np.flatnonzero((first + 1 + np.arange(ids.size)) % self.config.episode_freq == 0)
            started = [(k, int(ids[k]), _copy_row(obs, int(rows_[k]))) for k in chosen.tolist()]
            if self._sources:
                self._rendered([(env, frame) for _, env, frame in started])
            for _, env, frame in started:
                self._running[env] = _Episode(env, int(self._env_starts[env]), frame, frame, nbytes=frame.nbytes)
                self._recording[env] = True

    def on_step(self, obs: Observation, actions: np.ndarray, rewards: np.ndarray, env_ids: np.ndarray) -> None:
        """One batch step of the envs ``env_ids`` (rows of ``obs``, ``actions``, ``rewards`` in that order)."""
        if not self.enabled:
            return
        ids = np.asarray(env_ids, dtype=np.intp)
        hit = self._recording[ids]
        if not hit.any():  # the common case: nothing of this step is recorded, nothing is copied
            return
        with self._lock:
            copied = [(j, episode, _copy_row(obs, j)) for j in np.flatnonzero(hit).tolist()
                      if (episode := self._running.get(int(ids[j]))) is not None]  # None: ended or closed since
            if self._sources:
                self._rendered([(episode.env_id, frame) for _, episode, frame in copied])
            for j, episode, frame in copied:
                episode.last = frame
                episode.num_steps += 1
                if not self._keep_steps:
                    continue
                if len(episode.steps) >= self.max_frames:
                    self._truncated += 1
                    if not self._warned_cap:
                        self._warned_cap = True
                        logger.warning("recorder: episode %d of env %d ran past %d steps; later steps are not kept "
                                       "(only its last observation is)", episode.env_episode, episode.env_id,
                                       self.max_frames)
                    continue
                episode.steps.append(frame)
                episode.nbytes += frame.nbytes
                if self.config.record_full_rollout:
                    episode.actions.append(np.array(actions[j]))
                    episode.rewards.append(float(rewards[j]))

    def on_episode_end(self, record: EpisodeRecord, info: Mapping[str, Any] | None = None) -> None:
        """The episode of ``record.env_index`` ended (``info``: the env's part of its last step's info). Every
        episode counts in the process's completion numbering and the metric window; a recorded one goes to the
        writer (or is dropped if it is behind)."""
        if not self.enabled:
            return
        with self._lock:
            if self._closed:
                return
            self._completed += 1
            self._stats.add_record(record)
            episode = self._running.pop(record.env_index, None)
            if episode is None:
                return
            self._recording[record.env_index] = False
            episode.completed = self._completed
            means = with_plugrl_types({k: v for k, v in self._stats.window_means().items() if k in PLUGRL_FLOATS})
            job = _Job(episode, record, finite_json(dict(info or {})), means)
            if self._handoff.offer(job, episode.nbytes):
                return
            self._dropped += 1
            self._frames_dropped += 1 + episode.num_steps
            first_drop = self._dropped == 1
        if first_drop:
            waiting, nbytes = self._handoff.pending()
            logger.warning("recorder: the writer is behind (%d episodes, %.1f MB waiting); episode %d of env %d is not "
                           "recorded. Record fewer episodes with a larger --recorder.episode-freq.",
                           waiting, nbytes / 1e6, episode.completed, episode.env_id)

    def close(self) -> RecorderReport:
        """Stop recording, write every episode already handed over, stop the writer, and report. Idempotent."""
        with self._close_lock:
            if self._report is not None:
                return self._report
            with self._lock:
                self._closed = True
                self.enabled = False
                self._recording[:] = False
                self._unfinished += len(self._running)
                self._running.clear()
            self._handoff.close()
            if self._thread is not None:
                self._thread.join()
            report = RecorderReport(
                files=tuple(self._files), episodes_recorded=self._written, episodes_dropped=self._dropped,
                frames_dropped=self._frames_dropped, frames_truncated=self._truncated,
                episodes_unfinished=self._unfinished, errors=tuple(self._errors),
                episodes_not_written=self._not_written)
            if report.episodes_dropped:
                logger.warning("recorder: %d recorded episodes (%d observations) were dropped because the writer was "
                               "behind", report.episodes_dropped, report.frames_dropped)
            if report.episodes_not_written:
                logger.warning("recorder: %d recorded episodes were not written: the output folder had failed (the "
                               "run's error says why)", report.episodes_not_written)
            elif report.errors:
                logger.warning("recorder: %d files could not be written (first: %s)", len(report.errors),
                               report.errors[0])
            self._report = report
            return report

    # ------------------------------------------------------------------------------------------- writer thread

    def _serve(self) -> None:
        while (job := self._handoff.take()) is not None:
            ok = self._write_episode(job)
            self._written += int(ok)

    def _write_episode(self, job: _Job) -> bool:
        """Every output of one episode; a failing output is logged and the others still written, unless the output
        folder itself failed (a full disk): the run writer has said so once and stops the run, so this stops too."""
        if self._folder_failed:
            self._not_written += 1
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
                self._errors.append(f"{episode.stem} {what}: {exc}")
                self._folder_failed = True
                self._not_written += 1
                return False
            except Exception as exc:  # a broken file must not end the run; it is reported instead
                ok = False
                message = f"{episode.stem} {what}: {type(exc).__name__}: {exc}"
                self._errors.append(message)
                logger.warning("recorder: could not write %s", message, exc_info=True)
        return ok

    def _emit(self, relpath: str, data: bytes) -> None:
        assert self._sink is not None
        self._sink.write_bytes(relpath, data)
        self._files[relpath] = None

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
        self._files[relpath] = None

    def _write_samples(self, episode: _Episode, info: dict[str, Any]) -> None:
        """PlugRL's layout: ``<folder>/obs/{first,last}/images/<key>.png``, ``.../states/<key>.npy``,
        ``.../text.txt`` and ``.../last/info.json``."""
        for moment, frame in (("first", episode.first), ("last", episode.last)):
            phase = f"{episode.folder}/obs/{moment}"
            used: set[str] = set()  # keys that differ only in unsafe characters must not overwrite each other
            for key, image in frame.images.items():
                if _png_compatible(image):
                    self._emit(_unique(f"{phase}/images/{_safe(key)}", ".png", used), encode_png(image))
                else:  # a float depth map, say: kept as the env made it
                    self._emit(_unique(f"{phase}/images/{_safe(key)}", ".npy", used), _npy(image))
            for key, state in frame.states.items():
                self._emit(_unique(f"{phase}/states/{_safe(key)}", ".npy", used), _npy(state))
            self._emit(f"{phase}/text.txt", frame.text.encode("utf-8"))
        self._emit(f"{episode.folder}/obs/last/info.json",
                   (json.dumps(info, indent=2, allow_nan=False) + "\n").encode("utf-8"))

    def _write_videos(self, episode: _Episode) -> None:
        frames = episode.frames
        for key in episode.first.images:
            images = [f.images[key] for f in frames if key in f.images]
            if not _video_compatible(images):
                logger.info("recorder: no video of image %r (needs uint8 frames of one size, 1, 3 or 4 channels)",
                            key)
                continue
            self._emit(f"videos/{episode.stem}_{_safe(key)}.mp4", encode_mp4(images, self.config.video_fps))

    def _write_rollout(self, episode: _Episode) -> None:
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

    def _ids(self, episode: _Episode) -> dict[str, Any]:
        """The fields that name an episode in PlugRL's JSON lines."""
        return {"completed_episode": episode.completed, "process_id": self.process_id, "env_id": episode.env_id,
                "env_episode_id": episode.env_episode}

    def _write_obs_stats(self, episode: _Episode, info: dict[str, Any]) -> None:
        self._append_line(OBS_STATS_FILE, {**self._ids(episode), "first": _phase_stats(episode.first),
                                           "last": _phase_stats(episode.last), "last_info": info,
                                           "num_steps": episode.num_steps})

    def _write_metrics(self, episode: _Episode, job: _Job) -> None:
        """PlugRL's fields (``episode_success`` false for an env without a success rule, as PlugRL writes it;
        ``has_success_rule`` says which), then ours."""
        record = job.record
        ours = {k: v for k, v in record.to_json().items() if k not in ("env_index", "process_id", "return", "success")}
        self._append_line(EPISODE_METRICS_FILE, {
            **self._ids(episode), "episode_return": record.episode_return, "episode_success": bool(record.success),
            **job.means, "has_success_rule": record.success is not None, **ours})


# ---------------------------------------------------------------------------------------------------- encoders


def encode_png(image: np.ndarray) -> bytes:
    """A PNG of a uint8 image, ``(h, w)`` or ``(h, w, c)`` with c in 1..4 (gray, gray+alpha, RGB, RGBA).

    Written here (zlib and struct) so that sampling images needs no imaging library. Every row uses PNG's "Up"
    filter, computed for the whole image at once with numpy: cheap, and it compresses smooth images well.
    """
    if not _png_compatible(image):
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


def _warn_inert_flags(config: RecorderConfig) -> None:
    """One warning naming the record flags given without ``--recorder.episode-freq``, which then record nothing."""
    if config.episode_freq != 0:
        return
    defaults = RecorderConfig()
    given = [name for name in RECORD_FLAGS if getattr(config, name) and not getattr(defaults, name)]
    if given:
        flags = ", ".join("--recorder." + name.replace("_", "-") for name in given)
        logger.warning("%s record%s nothing without --recorder.episode-freq K (record every K-th episode of each "
                       "process); add --recorder.episode-freq 1 to record every episode, or a larger K for fewer",
                       flags, "s" if len(given) == 1 else "")


def _require_video() -> None:
    try:
        import imageio_ffmpeg

        imageio_ffmpeg.get_ffmpeg_exe()
    except (ImportError, RuntimeError) as exc:
        raise ConfigError(f"--recorder.record-video needs imageio with its ffmpeg binary ({exc}). Install the "
                          f"video extra: {VIDEO_INSTALL}") from exc


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


def _png_compatible(image: np.ndarray) -> bool:
    if image.dtype != np.uint8 or image.ndim not in (2, 3) or image.shape[0] == 0 or image.shape[1] == 0:
        return False
    return image.ndim == 2 or image.shape[2] in _PNG_COLOR_TYPE


def _video_compatible(images: list[np.ndarray]) -> bool:
    if not images or any(im.shape != images[0].shape for im in images):
        return False
    first = images[0]
    return _png_compatible(first) and (first.ndim == 2 or first.shape[2] in (1, 3, 4))


def _npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


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


class _Moments:
    """Min, max, mean and (population) std of the finite values of many arrays, combined one array at a time, so
    the statistics of a long episode never need its frames stacked or converted to float at once."""

    def __init__(self) -> None:
        self.count = 0
        self.mean = 0.0
        self.m2 = 0.0
        self.min = np.inf
        self.max = -np.inf
        self.non_finite = 0

    def add(self, array: np.ndarray) -> None:
        values = np.asarray(array)
        if values.dtype.kind == "b":
            values = values.astype(np.uint8)
        if values.dtype.kind not in "iuf":
            return
        if values.dtype.kind == "f":
            finite = np.isfinite(values)
            if not finite.all():
                self.non_finite += int(values.size - np.count_nonzero(finite))
                values = values[finite]
        n = int(values.size)
        if n == 0:
            return
        x = values.astype(np.float64, copy=False)
        mean = float(x.mean())
        m2 = float(np.square(x - mean).sum())
        total = self.count + n
        delta = mean - self.mean
        self.mean += delta * n / total
        self.m2 += m2 + delta * delta * self.count * n / total
        self.count = total
        self.min = min(self.min, float(x.min()))
        self.max = max(self.max, float(x.max()))

    def to_json(self) -> dict[str, Any]:
        """``mean``, ``std``, ``min`` and ``max`` of the finite values (null when there are none), their ``count``
        and the ``non_finite`` values left out."""
        if self.count == 0:
            return {"min": None, "max": None, "mean": None, "std": None, "count": 0, "non_finite": self.non_finite}
        return {"min": self.min, "max": self.max, "mean": self.mean, "std": float(np.sqrt(self.m2 / self.count)),
                "count": self.count, "non_finite": self.non_finite}


def _array_stats(array: np.ndarray) -> dict[str, Any]:
    """PlugRL's statistics of one observation array: ``shape``, ``dtype``, ``mean``, ``std``, ``min``, ``max``
    (over its finite values, so every number is finite; null when it has none), then ours."""
    moments = _Moments()
    moments.add(array)
    out: dict[str, Any] = {"shape": list(array.shape), "dtype": str(array.dtype)}
    if array.dtype.kind in "biuf":
        stats = moments.to_json()
        out.update({k: stats[k] for k in ("mean", "std", "min", "max", "count", "non_finite")})  # PlugRL's order
    return out


def _phase_stats(frame: _Frame) -> dict[str, Any]:
    """One observation's statistics as PlugRL's ``first`` / ``last``: ``images``, ``states`` and ``text`` (its
    ``shape``, ``dtype`` and ``value`` as a batch of one row, as PlugRL writes it)."""
    text = np.array([frame.text])
    return {"images": {k: _array_stats(v) for k, v in frame.images.items()},
            "states": {k: _array_stats(v) for k, v in frame.states.items()},
            "text": {"shape": list(text.shape), "dtype": str(text.dtype), "value": text.tolist()}}
