"""Env code for Ray workers: which files to upload, and how a worker imports them and reads its job.

A worker sees the built-in envs and the plugins installed in its own Python. ``--env-path`` files and folders (and
``$PLUGRL_ENV_PATH`` entries, and the script an env was defined in when the run was started as
``python my_env.py ...``) live on the driver's disk: the driver uploads them with Ray's runtime environment
(``py_modules``: a folder entry as the folder, a file entry as that one file), and each worker finds its copy by
name and content hash on its ``sys.path``. A worker that sees the very same file at the driver's path (one machine,
or a shared file system) imports that one, so a file's neighbours stay importable.

A job crosses pickled, and its env config may be a class from a user's env file. Discovery names a file's module
after its path (:func:`~plugrl_env_client.envs.discovery.user_module_name`), which differs between the driver and a
worker that imports an uploaded copy, so the worker reads the job with those module names mapped (and
``__main__`` mapped to the imported script).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import io
import pickle
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from plugrl_env_client.envs.discovery import EnvSources, env_files, env_path_variable, failed_imports, user_module_name
from plugrl_env_client.errors import ConfigError

MAIN_ALIAS = "__mp_main__"
"""The module name a worker gives the driver's script, as a spawned local process does."""


@dataclasses.dataclass(frozen=True)
class ShippedFile:
    """One env file as the driver has it, and where its uploaded copy sits: ``<pkg>/<root>/<relative>``."""

    driver_path: str
    root: str
    """Name of the uploaded folder holding it ("" for a file uploaded on its own)."""
    relative: str
    digest: str
    is_main: bool = False
    """The driver's ``__main__`` script (``python my_env.py <env-id> ...``)."""


@dataclasses.dataclass(frozen=True)
class ShippedSources:
    """What workers must import besides built-ins and plugins, and what the driver uploads for it."""

    files: tuple[ShippedFile, ...] = ()
    modules: tuple[str, ...] = ()
    """Dotted module names (``module:Env-Id``): they must be installed on the workers."""
    uploads: tuple[str, ...] = ()
    """Driver-side files and folders for the runtime environment's ``py_modules``."""


def prepare(sources: EnvSources, main_script: str | None = None) -> ShippedSources:
    """The env files of ``sources`` and ``$PLUGRL_ENV_PATH`` (plus ``main_script`` if the env was defined there),
    with the folders and files to upload."""
    files: dict[str, ShippedFile] = {}
    uploads: list[str] = []
    for entry in [*env_path_variable(), *sources.paths]:
        base = Path(entry).expanduser().resolve()
        if base.is_dir():
            if str(base) not in uploads:
                uploads.append(str(base))
            for f in env_files(base):
                files.setdefault(str(f), ShippedFile(str(f), base.name, f.relative_to(base).as_posix(), _digest(f)))
        else:
            for f in env_files(entry):  # a file (or a ConfigError naming what is wrong)
                if str(f) not in files:
                    uploads.append(str(f))
                    files[str(f)] = ShippedFile(str(f), "", f.name, _digest(f))
    if main_script is not None:
        main = Path(main_script).resolve()
        known = files.get(str(main))
        if known is None:
            uploads.append(str(main))
            known = ShippedFile(str(main), "", main.name, _digest(main))
        files[str(main)] = dataclasses.replace(known, is_main=True)
    return ShippedSources(tuple(files.values()), tuple(sources.modules), tuple(uploads))


def load(shipped: ShippedSources, search: Iterable[str] | None = None) -> dict[str, str]:
    """On a worker: import every env module (built-ins, plugins, the shipped files, the named modules); returns
    the module names to read the job with (driver's name -> this worker's). ``search``: where uploaded copies are
    looked for (default ``sys.path``)."""
    local = [(f, locate(f, search)) for f in shipped.files]
    remap = {}
    for f, path in local:
        if f.is_main:  # imported as a spawned process imports its parent's script: registered, not run
            _import_main(path)
            remap["__main__"] = MAIN_ALIAS
    EnvSources(tuple(str(path) for f, path in local if not f.is_main), shipped.modules).load()
    for f, path in local:
        if f.is_main:
            continue
        here = user_module_name(path)
        if here not in sys.modules:
            why = failed_imports().get(str(path), "see the log")
            raise ConfigError(f"env file {f.driver_path} failed to import on this node ({why}); install what it "
                              "needs on every Ray node")
        driver_name = user_module_name(Path(f.driver_path))
        if driver_name != here:
            remap[driver_name] = here
    return remap


def locate(f: ShippedFile, search: Iterable[str] | None = None) -> Path:
    """This worker's copy of ``f``: the driver's own path when it holds the same file, else the uploaded copy."""
    own = Path(f.driver_path)
    if _same(own, f.digest):
        return own
    for entry in (sys.path if search is None else search):
        candidate = Path(entry or ".") / f.root / f.relative
        if _same(candidate, f.digest):
            return candidate.resolve()
    raise ConfigError(
        f"env file {f.driver_path} is not on this node: it is uploaded with the run's Ray runtime environment "
        "(when this run connected to Ray itself), or must exist at the same path on every node"
    )


def loads_job(data: bytes, remap: dict[str, str]) -> Any:
    """Unpickle a job pickled on the driver, with module names mapped as :func:`load` found them."""
    try:
        return _Unpickler(io.BytesIO(data), remap).load()
    except (AttributeError, ImportError) as exc:  # a class of the job (the env's config) does not exist here
        raise ConfigError(
            f"the run's settings cannot be read on this node ({type(exc).__name__}: {exc}): the env's config class "
            "must be importable on every Ray node (install its package there, or pass its file with --env-path)"
        ) from None


class _Unpickler(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, remap: dict[str, str]) -> None:
        super().__init__(file)
        self._remap = remap

    def find_class(self, module: str, name: str) -> Any:
        return super().find_class(self._remap.get(module, module), name)


def _import_main(path: Path) -> None:
    """The driver's script as ``__mp_main__`` (its ``if __name__ == "__main__"`` block does not run, and its envs
    may shadow built-ins as they do in the driver). A worker may hold ``__mp_main__`` as an alias of its own
    ``__main__`` (multiprocessing does that); the script takes the name."""
    previous = sys.modules.get(MAIN_ALIAS)
    if previous is not None and getattr(previous, "__file__", None) == str(path):
        return  # imported by an earlier epoch of this actor
    spec = importlib.util.spec_from_file_location(MAIN_ALIAS, path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"{path} cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[MAIN_ALIAS] = module
    folder = str(path.parent)
    if folder not in sys.path:
        sys.path.append(folder)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        if previous is None:
            del sys.modules[MAIN_ALIAS]
        else:
            sys.modules[MAIN_ALIAS] = previous
        raise ConfigError(f"{path} (the script this run was started with) failed to import on this node: "
                          f"{type(exc).__name__}: {exc}; install what it needs on every Ray node") from exc


def _digest(path: Path) -> str:
    return hashlib.sha1(path.read_bytes()).hexdigest()


def _same(path: Path, digest: str) -> bool:
    try:
        return path.is_file() and _digest(path) == digest
    except OSError:
        return False


