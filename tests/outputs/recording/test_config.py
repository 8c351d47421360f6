"""The recorder's flags: PlugRL's defaults, and the warning for record flags that do nothing."""

from __future__ import annotations

import pytest
from recording_rollouts import MemorySink, recorder, warnings_of

from plugrl_env_client.outputs.recording.config import RecorderConfig


def test_recorders_defaults_are_plugrls() -> None:
    config = RecorderConfig()
    assert (config.thread0_only, config.record_obs_stats, config.record_episode_metrics) == (True, True, True)
    assert isinstance(config.video_fps, float) and config.episode_freq == 0


def test_record_flags_without_an_episode_freq_are_named_once_by_process_zero(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("WARNING", logger="plugrl_env_client.outputs.recording")
    for pid in (0, 1, 2):
        recorder(MemorySink(), k=0, process_id=pid, record_video=True, record_full_rollout=True).close()
    (message,) = warnings_of(caplog, "--recorder.episode-freq")
    assert message.startswith("--recorder.record-video, --recorder.record-full-rollout record nothing without")
    assert "add --recorder.episode-freq 1" in message
    caplog.clear()
    recorder(MemorySink(), k=0, process_id=0).close()  # nothing asked for (PlugRL's defaults on): nothing to say
    recorder(MemorySink(), k=2, process_id=0, record_full_rollout=True).close()
    assert warnings_of(caplog, "--recorder.episode-freq") == []
