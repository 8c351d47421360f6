"""Layout of a run directory and the small file-writing rules everything in it follows.

``<root>/<exp-name>/client_config.json``, ``logs/client.log``, ``rollout/proc_NNN/{episodes.jsonl,summary.json}``
and the aggregated ``summary.json``; ``.plugrl-run.lock`` is held (:class:`RunLock`) by the process that runs it, for
as long as it runs. JSON files are written atomically (temp file + rename) so a crash never
leaves a half-written summary behind.

A full disk must not cost the summaries: a run keeps a :class:`SpaceReserve` in its folder and gives it back when
a write fails for want of space, so the final summaries still fit; where even that space is gone, a summary is
rewritten in place (:func:`write_text_in_place`) if it fits the blocks its file already holds.
:func:`describe_write_error` says what a failed write means in words a user can act on.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import errno
import fcntl
import json
import math
import os
import secrets
from pathlib import Path
from typing import Any

from plugrl_env_client.outputs.results import count_episodes


def default_exp_name(uid: str, num_envs: int) -> str:
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return f"{uid.lower()}-nenv{num_envs}-{stamp}-{secrets.token_hex(4)}"


def with_plugrl_config_keys(record: dict[str, Any], uid: str, max_episode_steps: int | None) -> dict[str, Any]:
    """``client_config.json``'s record with the keys PlugRL's client writes there too, so a script written for
    PlugRL's file reads ours: ``uid`` (the env id, first, as PlugRL has it), ``reconnect_on_server_stop`` at the top
    level (ours keeps it under ``connection`` too, where its flag lives), ``runner.uid``, and
    ``env.max_episode_steps`` (the run's time limit, null for none) unless the env's config has a field of that
    name already (its value is then the one the env got). ``record`` itself is left as it was."""
    out = {"uid": uid, **record}
    connection = out.get("connection")
    if isinstance(connection, dict) and "reconnect_on_server_stop" in connection:
        out.setdefault("reconnect_on_server_stop", connection["reconnect_on_server_stop"])
    if isinstance(out.get("runner"), dict):
        out["runner"] = {**out["runner"]}
        out["runner"].setdefault("uid", uid)
    if isinstance(out.get("env"), dict):
        out["env"] = {**out["env"]}
        out["env"].setdefault("max_episode_steps", max_episode_steps)
    return out


PLUGRL_FLOATS = ("mean_return", "mean_success_rate")
"""The means PlugRL's client writes as floats whatever the episodes were (0.0 over none)."""


def with_plugrl_types(statistics: dict[str, Any]) -> dict[str, Any]:
    """``statistics`` for one of PlugRL's files: PlugRL's means as floats, 0.0 where ours are null (a count of
    episodes and ``has_success_rule`` beside them say which 0.0 means nothing to average)."""
    return {k: (0.0 if v is None else v) if k in PLUGRL_FLOATS else v for k, v in statistics.items()}


def write_json_atomic(path: Path, data: Any) -> None:
    """Write ``data`` as strict JSON to ``path`` via a temp file in the same folder and a rename.

    Strict: a NaN or infinite float becomes ``null`` (JSON has neither, and many readers refuse them).
    """
    write_text_atomic(path, json.dumps(finite_json(data), indent=2, allow_nan=False) + "\n")


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` via a temp file in the same folder and a rename: a reader sees the old
    file or the new one, never half of it. The temp file is created with mode 0o666 (less the umask), like any
    file ``open()`` makes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text_in_place(path: Path, text: str) -> None:
    """Overwrite the existing file ``path`` with ``text`` where it lies, for when a temp file no longer fits on the
    disk: only if ``text`` fits the blocks the file holds already (so the write needs no new space and cannot stop
    halfway for want of it); otherwise raises ENOSPC and leaves the file as it was."""
    data = text.encode("utf-8")
    held = getattr(os.stat(path), "st_blocks", 0) * 512
    if len(data) > held:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
    fd = os.open(path, os.O_WRONLY)
    try:
        written = 0
        while written < len(data):
            written += os.pwrite(fd, data[written:], written)
        os.ftruncate(fd, len(data))
    finally:
        os.close(fd)


NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
"""Errors of a write that needed space the disk (or the user's quota) does not have."""


def describe_write_error(exc: OSError, folder: Path, path: Path | None = None) -> str:
    """What the failure ``exc`` of writing ``path`` (in the run folder ``folder``, or making it) means: "no space
    left on device in <folder> (writing <file>)", "<x> is a file, not a folder", a read-only file system, no
    permission; otherwise the system's own words."""
    where = "" if path is None or path == folder else f" (writing {_relative(path, folder)})"
    if exc.errno in NO_SPACE:
        return f"no space left on device in {folder}{where}"
    if exc.errno == errno.EROFS:
        return f"{folder} is on a read-only file system{where}"
    if exc.errno in (errno.ENOTDIR, errno.EEXIST):
        blocker = next((p for p in (folder, *folder.parents) if p.exists() and not p.is_dir()), None)
        if blocker is not None:
            return f"{blocker} is a file, not a folder"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return f"no permission to write in {folder}{where}"
    return f"cannot write {path or folder}: {exc.strerror or exc}"


def _relative(path: Path, folder: Path) -> str:
    try:
        return str(path.relative_to(folder))
    except ValueError:
        return str(path)


class SpaceReserve:
    """A hidden file holding ``size`` bytes of the run folder's disk, given back (deleted) when the disk is full,
    so that the writes a run cannot do without (its summaries and manifests) still fit."""

    def __init__(self, path: Path, size: int) -> None:
        self.path, self.size = path, size

    def create(self) -> SpaceReserve:
        """Take the space (raises OSError, ENOSPC among others, when the disk does not have it)."""
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            try:
                os.posix_fallocate(fd, 0, self.size)
            except (AttributeError, OSError) as exc:  # no fallocate here (or not on this file system): write zeros
                if isinstance(exc, OSError) and exc.errno in NO_SPACE:
                    raise
                os.ftruncate(fd, 0)
                zeros, written = bytes(self.size), 0
                while written < self.size:
                    written += os.write(fd, zeros[written:])
        except BaseException:
            os.close(fd)
            self.release()
            raise
        os.close(fd)
        return self

    def release(self) -> None:
        """Give the space back (a second call does nothing)."""
        try:
            self.path.unlink(missing_ok=True)
        except OSError:
            pass


def finite_json(value: Any) -> Any:
    """``value`` as plain JSON types, with every NaN or infinite float replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (str, int, bool)) or value is None:
        return value
    if isinstance(value, dict):
        return {str(k): finite_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [finite_json(v) for v in value]
    return finite_json(_json_default(value))


def _json_default(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {"_type": type(value).__name__, **dataclasses.asdict(value)}
    if hasattr(value, "tolist"):  # numpy arrays (any size) and numpy scalars
        return value.tolist()
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, (set, tuple)):
        return list(value)
    return repr(value)


@dataclasses.dataclass(frozen=True)
class RunDir:
    root: Path

    @property
    def log_file(self) -> Path:
        return self.root / "logs" / "client.log"

    @property
    def client_config(self) -> Path:
        return self.root / "client_config.json"

    @property
    def summary(self) -> Path:
        return self.root / "summary.json"

    def proc_dir(self, process_id: int) -> Path:
        return self.root / "rollout" / f"proc_{process_id:03d}"

    def episodes_file(self, process_id: int) -> Path:
        return self.proc_dir(process_id) / "episodes.jsonl"


    def create(self) -> RunDir:
        """Make the run folder with its ``logs/`` and ``rollout/``. Its parents may exist, the folder itself must not
        (``FileExistsError``): made exclusively, so of two runs started at once with one name, one gets it."""
        self.root.parent.mkdir(parents=True, exist_ok=True)
        self.root.mkdir()
        (self.root / "logs").mkdir()
        (self.root / "rollout").mkdir()
        return self


class EpisodeLineCount:
    """The episodes of a run's processes, counted again and again while the run writes them, by the one rule of
    what an episode line is (:func:`~plugrl_env_client.outputs.results.count_episodes`): each count reads only the
    whole lines appended to each ``episodes.jsonl`` since the one before (a file that got shorter is read again
    from its start), so counting a long run every few seconds costs what it wrote meanwhile."""

    def __init__(self, run_dir: RunDir, num_procs: int) -> None:
        self._read = {run_dir.episodes_file(p): (0, 0) for p in range(num_procs)}
        """file -> (bytes counted, episodes in them)"""

    def count(self) -> int:
        """The episodes now (a torn last line is none yet)."""
        total = 0
        for path, (offset, episodes) in self._read.items():
            try:
                if path.stat().st_size < offset:
                    offset, episodes = 0, 0
            except FileNotFoundError:
                offset, episodes = 0, 0
            more, offset = count_episodes(path, offset)
            self._read[path] = (offset, episodes + more)
            total += episodes + more
        return total


LOCK_NAME = ".plugrl-run.lock"
"""The file a run's launching process holds a lock on while the run is alive (in its folder)."""


class RunLock:
    """An exclusive ``flock`` on the run folder's :data:`LOCK_NAME`, held by the process that launched the run for
    as long as the run lives: a ``--resume`` of the same folder meanwhile is refused. The kernel releases it when
    that process dies in any way (SIGKILL included), so a stopped run can always be resumed."""

    def __init__(self, root: Path) -> None:
        self.path = root / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> bool:
        """Take the lock without waiting; False when another live process holds it."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        try:  # who holds it, for the message of a run refused beside it
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError:
            pass  # a full disk: the lock holds all the same
        return True

    def holder(self) -> str:
        """The process id written by the holder ("unknown" when it cannot be read)."""
        try:
            return self.path.read_text(encoding="utf-8").strip() or "unknown"
        except OSError:
            return "unknown"

    def release(self) -> None:
        """Let the lock go (also for forked children that share its file; a second call does nothing)."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            try:
                fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)
