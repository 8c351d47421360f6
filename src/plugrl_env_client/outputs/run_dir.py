"""Layout of a run directory and the small file-writing rules everything in it follows.

``<root>/<exp-name>/client_config.json``, ``logs/client.log``, ``rollout/proc_NNN/{episodes.jsonl,summary.json}``
and the aggregated ``summary.json``. JSON files are written atomically (temp file + rename) so a crash never
leaves a half-written summary behind.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
import os
import secrets
from pathlib import Path
from typing import Any


def default_exp_name(uid: str, num_envs: int) -> str:
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return f"{uid.lower()}-nenv{num_envs}-{stamp}-{secrets.token_hex(4)}"


def with_plugrl_config_keys(record: dict[str, Any], uid: str, max_episode_steps: int | None) -> dict[str, Any]:
    """``client_config.json``'s record with the keys PlugRL's client writes there too: ``uid`` (the env id, first,
    as PlugRL has it) and ``env.max_episode_steps`` (the run's time limit, null for none), unless the env's config
    has a field of that name already (its value is then the one the env got)."""
    out = {"uid": uid, **record}
    if isinstance(out.get("env"), dict):
        out["env"] = {**out["env"]}
        out["env"].setdefault("max_episode_steps", max_episode_steps)
    return out


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

    def create(self) -> RunDir:
        (self.root / "logs").mkdir(parents=True, exist_ok=True)
        (self.root / "rollout").mkdir(parents=True, exist_ok=True)
        return self
