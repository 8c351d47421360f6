"""The rollout's side of the episode recorder: which episodes are recorded, and copies of their observations.

Which episodes: the decision is taken when an episode *starts*, so that its frames can be kept from its first
observation on, and its number by completion is known only when it ends. So the recorder records the K-th, 2K-th,
... episode to start in the process (starts counted in the order :meth:`EpisodeRecorder.on_reset` reports them;
within one call, in the order of its ``env_ids``) and names it by its completion number when it ends. Where
episodes end in the order they start (envs of one length, stepped together), these are PlugRL's episodes K, 2K,
...; otherwise the same count of episodes, numbered as they completed. With several env groups
(``--runner.pipeline``) the starts interleave the groups in the order they reset. An episode is written only once
it ends: episodes still running at :meth:`EpisodeRecorder.close`, and episodes whose env is reset again without
having ended, are counted in the report but not written.

Memory: an episode's frames stay in memory until it ends. At most ``max_frames`` (10 000 by default) steps of
observations, actions and rewards are kept per episode; later steps only update the last observation (so the
``last`` samples stay right), and the video and the NPZ cover the steps kept. Only the outputs that need every step
(video, full rollout) make the recorder keep them; otherwise it holds two observations per recorded episode.

Frames rendered for the recorder only: an env that renders only for the recorder (``--env.render-for-recorder-only``
of Gym-v1 and MuJoCo-v1) sends no frames in its observations and says so with ``frames_for_recorder``;
:meth:`EpisodeRecorder.render_for` hands the recorder such envs, and the recorder asks each for the frames of the
envs it records (``render_frames(rows)``), right after the reset or step whose observation it copies, and keeps
them as images of that observation. Only recorded envs render, and only while they are recorded.

Flags that would do nothing say so, once per run, from process 0 (every run has one; the others stay quiet, so
``--num-procs 4`` warns once, not four times): a record flag without ``--recorder.episode-freq`` (nothing is
recorded), and ``--recorder.record-video`` for an env whose observations hold no image (no video can be made).

Finished episodes go to the writer thread (:mod:`.writer`), which writes their files (the layout is in the
package's docstring).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import numpy as np

from plugrl_env_client.envs.base_env import Observation
from plugrl_env_client.errors import ConfigError
from plugrl_env_client.outputs.recording.config import RecorderConfig, warn_inert_flags
from plugrl_env_client.outputs.recording.encoders import require_video
from plugrl_env_client.outputs.recording.episode import FinishedEpisode, Frame, RecordedEpisode, copy_row
from plugrl_env_client.outputs.recording.sinks import ArtifactSink
from plugrl_env_client.outputs.recording.summary import RecorderSummary
from plugrl_env_client.outputs.recording.writer import QUEUE_BYTES, QUEUE_EPISODES, EpisodeWriter
from plugrl_env_client.outputs.run_dir import PLUGRL_FLOATS, finite_json, with_plugrl_types
from plugrl_env_client.records import EpisodeRecord, EpisodeStats

logger = logging.getLogger(__name__)

MAX_FRAMES_PER_EPISODE = 10_000
"""Steps of one episode kept in memory at most (observations, actions, rewards); see the module docstring."""


@runtime_checkable
class FrameSource(Protocol):
    """An env that renders frames on request only (``--env.render-for-recorder-only``): its observations hold no
    frames, and ``render_frames(rows)`` draws the current ones of batch rows ``rows`` (``{key: (k, ...) uint8}``)."""

    num_envs: int
    frames_for_recorder: bool

    def render_frames(self, rows: np.ndarray) -> dict[str, np.ndarray]: ...


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
            require_video()  # checked in every process, so a run fails at start, not at its first video
        if max_frames < 1:
            raise ValueError(f"max_frames must be >= 1, got {max_frames}")
        self.config = config
        self.process_id = int(process_id)
        self.num_envs = int(num_envs)
        self.max_frames = int(max_frames)
        self.enabled: bool = config.episode_freq > 0 and not (config.thread0_only and self.process_id != 0)
        if self.enabled and sink is None:
            raise ValueError("EpisodeRecorder records in this process but was given no sink to write to")
        self._keep_steps = config.record_video or config.record_full_rollout
        self._recording = np.zeros(self.num_envs, dtype=bool)  # the fast-path mask: envs with a recorded episode
        self._running: dict[int, RecordedEpisode] = {}
        # A resumed run's process continues its numbering (``first_episodes``: each env's episodes before), so its
        # files never take the names of earlier segments' and the K-th episodes stay every K-th of the whole run.
        self._env_starts = np.zeros(self.num_envs, dtype=np.int64)  # each env's episodes so far
        self._env_starts[:len(first_episodes)] = first_episodes
        self._starts = int(self._env_starts.sum())
        self._completed = self._starts  # the process's completed episodes, recorded or not
        self._lock = threading.Lock()
        self._close_lock = threading.Lock()
        self._closed = False
        self._report: RecorderSummary | None = None
        # Counters of the rollout side (under _lock); the writer keeps its own (its thread's only until joined).
        self._dropped = self._frames_dropped = self._truncated = self._unfinished = 0
        self._warned_cap = False
        self._writer = EpisodeWriter(config, self.process_id, sink, queue_episodes, queue_bytes)
        self._sources: list[tuple[int, FrameSource]] = []  # (first process env id, env) of envs that render for us
        # Process 0 speaks for the run (see the module docstring); the image check waits for the first observation.
        self._check_images = self.process_id == 0 and self.enabled and config.record_video
        if self.process_id == 0:
            warn_inert_flags(config)
        self._stats = EpisodeStats(config.metric_window)
        if self.enabled:
            self._writer.start()

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

    def _rendered(self, frames: list[tuple[int, Frame]]) -> None:
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
            started = [(k, int(ids[k]), copy_row(obs, int(rows_[k]))) for k in chosen.tolist()]
            if self._sources:
                self._rendered([(env, frame) for _, env, frame in started])
            for _, env, frame in started:
                self._running[env] = RecordedEpisode(env, int(self._env_starts[env]), frame, frame, nbytes=frame.nbytes)
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
            copied = [(j, episode, copy_row(obs, j)) for j in np.flatnonzero(hit).tolist()
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
            job = FinishedEpisode(episode, record, finite_json(dict(info or {})), means)
            if self._writer.offer(job, episode.nbytes):
                return
            self._dropped += 1
            self._frames_dropped += 1 + episode.num_steps
            first_drop = self._dropped == 1
        if first_drop:
            waiting, nbytes = self._writer.pending()
            logger.warning("recorder: the writer is behind (%d episodes, %.1f MB waiting); episode %d of env %d is not "
                           "recorded. Record fewer episodes with a larger --recorder.episode-freq.",
                           waiting, nbytes / 1e6, episode.completed, episode.env_id)

    def close(self) -> RecorderSummary:
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
            self._writer.close()
            written = self._writer  # its counters are final once its thread has ended
            report = RecorderSummary(
                files=tuple(written.files), episodes_recorded=written.written, episodes_dropped=self._dropped,
                frames_dropped=self._frames_dropped, frames_truncated=self._truncated,
                episodes_unfinished=self._unfinished, errors=tuple(written.errors),
                episodes_not_written=written.not_written)
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
