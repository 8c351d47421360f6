"""Where the recorder's files go: the sink protocols, and the process folder on disk that implements them."""

from __future__ import annotations

import os
import secrets
from pathlib import Path, PurePosixPath
from typing import Protocol, runtime_checkable


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
