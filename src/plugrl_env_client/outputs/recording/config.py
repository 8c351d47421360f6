"""The recorder's section of the command line (``--recorder.*``), and the warning for its flags that do nothing."""

from __future__ import annotations

import dataclasses
import logging

from plugrl_env_client.records import DEFAULT_METRIC_WINDOW

logger = logging.getLogger(__name__)

RECORD_FLAGS = ("record_video", "record_full_rollout", "record_obs_stats", "record_episode_metrics", "thread0_only")
"""The recorder's flags that take effect only on recorded episodes (with ``--recorder.episode-freq K``)."""


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


def warn_inert_flags(config: RecorderConfig) -> None:
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
