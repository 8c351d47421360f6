"""The recorder's summary of a run: the files it wrote, the episodes it recorded, dropped or could not write."""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class RecorderSummary:
    """What the recorder did over a run (returned by :meth:`~.recorder.EpisodeRecorder.close`)."""

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
