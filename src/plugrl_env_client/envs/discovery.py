"""Finding envs: the built-in families, env files and folders named by the user, and installed plugins.

Importing an env module is what registers its envs, so discovery is importing the right modules, in this order:

1. built-in families, ``plugrl_env_client/envs/<family>/<family>_env.py`` (any ``*/*_env.py``);
2. installed plugins: every entry point of the group ``plugrl_env_client.envs`` names a module that registers envs
   (e.g. ``line = "lineplug.line_env"`` in the plugin's ``pyproject.toml``);
3. ``$PLUGRL_ENV_PATH`` (``os.pathsep``-separated) and ``--env-path``: ``*_env.py`` files, or folders searched
   (recursively) for them; a file's folder is added to ``sys.path`` so it can import its neighbours.

Discovery is explicit (the CLI calls it before building its parser) rather than done at import, so importing this
package stays cheap. A module that fails to import, for any reason (a missing optional dependency, or a bug), is
skipped with one line on stderr and remembered, so that an unknown env id can point at the file that failed. A
module that calls ``sys.exit`` or raises ``KeyboardInterrupt`` while imported fails the same way (only a real
Ctrl-C or SIGTERM, :func:`~plugrl_env_client.envs.calls.is_signal`, goes through). A file given as ``--env-path``
may register policies instead (for ``--local-policy``): one whose source calls ``register_policy`` is said to be a
policy file when it fails, with the line of it that raised (:func:`failure_line`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import importlib.util
import os
import sys
import traceback
from collections.abc import Iterable
from importlib.metadata import entry_points
from pathlib import Path

from plugrl_env_client.envs import registry
from plugrl_env_client.envs.calls import is_signal, signals_marked, what_it_did
from plugrl_env_client.errors import ConfigError

ENTRY_POINT_GROUP = "plugrl_env_client.envs"
ENV_PATH_VARIABLE = "PLUGRL_ENV_PATH"
USER_MODULE_PREFIX = "plugrl_user_envs"
POLICY_MARK = "register_policy"
"""What the source of a policy file calls (the reference server's decorator); envs cannot import the server."""

@dataclasses.dataclass(frozen=True)
class EnvSources:
    """Env modules beyond the built-ins and plugins that a run needs: files/folders, and dotted module names.

    Spawned rollout processes get this and load it before anything else, so they see the same envs.
    """

    paths: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()

    def load(self) -> list[str]:
        return discover_envs(self.paths, self.modules)


_failed: dict[str, tuple[str, str]] = {}  # module name -> (what to call it: module or file, "<Type>: <message>")
_failed_files: dict[str, Path] = {}  # same keys -> the source file, when known


def discover_envs(env_paths: Iterable[str] = (), modules: Iterable[str] = ()) -> list[str]:
    """Import built-in env modules, plugins, ``$PLUGRL_ENV_PATH`` and ``env_paths`` entries, then ``modules``
    (dotted module names); returns the module names that loaded. A path that does not exist is a ConfigError."""
    with signals_marked():  # a Ctrl-C while importing stops discovery; a module's own KeyboardInterrupt skips it
        return _discover(env_paths, modules)


def _discover(env_paths: Iterable[str], modules: Iterable[str]) -> list[str]:
    loaded = [name for name in _builtin_modules() if _import_module(name)]
    for ep in sorted(_plugin_entry_points(), key=lambda e: e.name):
        if _import_module(ep.value.split(":")[0], label=f"{ep.value} (plugin {ep.name!r})"):
            loaded.append(ep.value)
    for path in [*env_path_variable(), *env_paths]:
        loaded.extend(name for name in (_import_file(f) for f in env_files(path)) if name)
    for module in modules:
        if _import_module(module):
            loaded.append(module)
    return loaded


def env_path_variable() -> list[str]:
    """The entries of ``$PLUGRL_ENV_PATH``."""
    return [p for p in os.environ.get(ENV_PATH_VARIABLE, "").split(os.pathsep) if p.strip()]


def env_files(path: str | Path) -> list[Path]:
    """The env files an ``--env-path`` entry names: the file itself, or every ``*_env.py`` below a folder."""
    p = Path(path).expanduser()
    if p.is_file():
        if p.suffix != ".py":
            raise ConfigError(f"--env-path {path}: not a Python file; name a *_env.py file or a folder holding them")
        return [p.resolve()]
    if p.is_dir():
        return sorted(f.resolve() for f in p.rglob("*_env.py")
                      if not any(part.startswith(".") or part == "__pycache__" for part in f.relative_to(p).parts))
    raise ConfigError(f"--env-path {path}: no such file or folder (from --env-path or ${ENV_PATH_VARIABLE})")


def failed_imports() -> dict[str, str]:
    """Env modules that failed to import in this process: module (or file) -> the error."""
    return dict(_failed.values())


def failed_sources_mentioning(text: str) -> list[tuple[str, str]]:
    """(module or file, error) of failed env modules whose source mentions ``text`` (an env id, say)."""
    out = []
    for name, source in _failed_files.items():
        try:
            if text.lower() in source.read_text(errors="replace").lower():
                out.append(_failed[name])
        except OSError:
            continue
    return out


def user_module_name(path: Path) -> str:
    """A stable module name for an env file imported by path (the same in spawned processes)."""
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:8]
    stem = "".join(c if c.isalnum() or c == "_" else "_" for c in path.stem)
    return f"{USER_MODULE_PREFIX}.{stem}_{digest}"


def _builtin_modules() -> list[str]:
    package = __name__.rsplit(".", 1)[0]
    roots = importlib.import_module(package).__path__
    paths = sorted(p for root in roots for p in Path(root).glob("*/*_env.py"))
    return [f"{package}.{p.parent.name}.{p.stem}" for p in paths]


def _plugin_entry_points() -> list:
    return list(entry_points(group=ENTRY_POINT_GROUP))


def unknown_id_help(uid: str, one_off: bool = True) -> str:
    """What to add to an unknown-id error: files that mention the id but failed to import, and the ways to make
    envs outside this package visible (``one_off``: with the command line's ``path/to/my_env.py:Env-Id`` form,
    which only a command that takes an env id has)."""
    failed = "".join(f" {where} mentions {uid!r} but failed to import ({why}): fix it and run again."
                     for where, why in failed_sources_mentioning(uid))
    ways = (f"--env-path path/to/my_env.py (or a folder of *_env.py files), ${ENV_PATH_VARIABLE}"
            f"{',' if one_off else ' or'} an installed plugin (entry point group {ENTRY_POINT_GROUP!r})")
    if one_off:
        ways += f", or the one-off form `plugrl-run-env-client path/to/my_env.py:{uid}`"
    return f"{failed} Envs outside this package are found through {ways}."


def _import_module(name: str, label: str | None = None) -> bool:
    before = registry.snapshot()
    try:
        importlib.import_module(name)
    except BaseException as exc:  # any failure of one env module (sys.exit included) leaves the others working
        if is_signal(exc):
            raise
        registry.restore(before)  # nothing half-registered by a module that did not load
        _skip(name, label or name, exc, _source_of(name))
        return False
    return True


def _import_file(path: Path) -> str | None:
    """Import an env file by path under :func:`user_module_name`; None when it failed."""
    name = user_module_name(path)
    if name in sys.modules:
        return name
    if USER_MODULE_PREFIX not in sys.modules:  # a namespace for user env modules, so pickling finds their classes
        import types

        sys.modules[USER_MODULE_PREFIX] = types.ModuleType(USER_MODULE_PREFIX)
    folder = str(path.parent)
    if folder not in sys.path:
        sys.path.append(folder)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        _skip(name, str(path), ImportError("not importable as a Python module"), path)
        return None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    before = registry.snapshot()
    try:
        spec.loader.exec_module(module)
    except BaseException as exc:
        if is_signal(exc):
            raise
        del sys.modules[name]
        registry.restore(before)
        _skip(name, str(path), exc, path)
        return None
    return name


def failure_line(exc: BaseException, source: Path) -> int | None:
    """The line of ``source`` at which importing it raised ``exc``: a syntax error's own line, else the last frame
    of the traceback in that file (the line that called what failed); None when no frame is in it."""
    target = source.resolve()
    if isinstance(exc, SyntaxError) and exc.filename and exc.lineno and Path(exc.filename).resolve() == target:
        return exc.lineno
    lines = [f.lineno for f in traceback.extract_tb(exc.__traceback__) if Path(f.filename).resolve() == target]
    return lines[-1] if lines else None


def _is_policy_file(source: Path | None) -> bool:
    try:
        return source is not None and POLICY_MARK in source.read_text(errors="replace")
    except OSError:
        return False


def _skip(name: str, label: str, exc: BaseException, source: Path | None) -> None:
    why = f"{type(exc).__name__}: {exc}" if isinstance(exc, Exception) else f"it {what_it_did(exc)} while imported"
    if name not in _failed and source is not None and _is_policy_file(source):
        line = failure_line(exc, source)
        print(f"Could not import policy file {source}{'' if line is None else f':{line}'}: {why} (its policies are "
              "not registered; fix it and run again)", file=sys.stderr)
    elif name not in _failed:  # one line per module, however often discovery runs
        print(f"Skip loading env module {label}: {why}", file=sys.stderr)
    _failed[name] = (label, why)
    if source is not None:
        _failed_files[name] = source


def _source_of(module: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    return Path(spec.origin) if spec is not None and spec.origin else None
