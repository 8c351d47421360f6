"""``plugrl-run-env-client <env-id> [flags]``: one subcommand per registered env, built when ``main()`` runs.

Building the parser at call time (not import time) is what lets an env file end with
``if __name__ == "__main__": from plugrl_env_client.cli import main; main()`` and be run directly: its envs are
registered by then, whatever was imported first. Env files outside the package are imported before the parser is
built, from ``--env-path`` / ``$PLUGRL_ENV_PATH`` or the one-off form ``path/to/my_env.py:My-v1``.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

import tyro

from plugrl_env_client.config import ClientConfig
from plugrl_env_client.envs.discovery import EnvSources, unknown_id_help
from plugrl_env_client.envs.registry import UnknownEnvError, get_spec, registered_ids
from plugrl_env_client.errors import ConfigError, PlugRLError
from plugrl_env_client.version import __version__

C = TypeVar("C")

_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")


@dataclasses.dataclass(frozen=True)
class CommandLine:
    """A command line after the steps that must happen before the parser exists."""

    args: list[str]
    sources: EnvSources


def program_name(default: str) -> str:
    """``python path/to/my_env.py`` when an env file called ``main()`` itself, else ``default``."""
    main_file = getattr(sys.modules.get("__main__"), "__file__", None)
    if main_file and main_file.endswith(".py"):
        package_dir = Path(__file__).resolve().parent
        path = Path(main_file).resolve()
        if package_dir not in path.parents:
            try:
                shown = os.path.relpath(path)
            except ValueError:
                shown = str(path)
            return f"python {shown}"
    return default


def prepare(args: Sequence[str]) -> CommandLine:
    """Find the env sources a command line names (``--env-path``, ``file.py:Env-Id``) and import every env.

    The env id stays first; a ``source:Env-Id`` id becomes ``Env-Id`` with its source imported.
    """
    args = list(args)
    env_paths: list[str] = []
    modules: list[str] = []
    for i, arg in enumerate(args):
        if arg in ("--env-path", "--env_path") and i + 1 < len(args):
            env_paths.append(args[i + 1])
        elif arg.startswith(("--env-path=", "--env_path=")):
            env_paths.append(arg.split("=", 1)[1])
    position = _env_id_position(args)
    if position is not None and ":" in args[position]:
        source, _, uid = args[position].rpartition(":")
        if source.endswith(".py") or os.sep in source or Path(source).exists():
            env_paths.append(source)
        else:
            modules.append(source)
        args[position] = uid
    sources = EnvSources(tuple(env_paths), tuple(modules))
    sources.load()
    return CommandLine(args, sources)


def config_class(uid: str, base: type[C]) -> type[C]:
    """A subclass of the dataclass ``base`` whose ``env`` field is the env's own config dataclass."""
    spec = get_spec(uid)
    cls = dataclasses.make_dataclass(
        f"{spec.env_cls.__name__}{base.__name__}",
        [("env", spec.config_cls, dataclasses.field(default_factory=spec.config_cls))],
        bases=(base,),
    )
    doc = spec.env_cls.__doc__ or sys.modules[spec.env_cls.__module__].__doc__ or f"Run {uid}."
    cls.__doc__ = doc.strip().splitlines()[0]
    return cls


def subcommand_name(uid: str) -> str:
    """The subcommand of env ``uid``: its id lowercased, so ``Point-v1`` is run as ``point-v1``."""
    return uid.lower()


def _same_name_key(name: str) -> str:
    """What two subcommand names must differ in to stay apart: case aside, ``_`` and ``-`` count as one (tyro
    reads them as one in flag names, and a user cannot tell ``my_env-v1`` from ``my-env-v1`` at a glance)."""
    return name.lower().replace("_", "-")


def subcommand_ids() -> dict[str, str]:
    """Subcommand name -> env id, for every registered env.

    The pairing is by name, never by position: ids that meet in one name would otherwise shift every pairing
    after them and run another env than the one asked for. Two ids that meet (``My_Env-v1`` and ``my-env-v1``)
    raise ConfigError naming both and where each was registered.
    """
    names: dict[str, str] = {}
    by_key: dict[str, str] = {}
    for uid in registered_ids():
        key = _same_name_key(uid)
        other = by_key.get(key)
        if other is not None:
            names_of = sorted({subcommand_name(other), subcommand_name(uid)})
            shared = " / ".join(repr(n) for n in names_of)
            raise ConfigError(
                f"env ids {other!r} (registered in {_registered_in(other)}) and {uid!r} (registered in "
                f"{_registered_in(uid)}) name the same subcommand {shared}: the command line does not tell case, "
                "or '_' from '-', apart; rename one of them (in its register_env and register_env_config)"
            )
        by_key[key] = uid
        names[subcommand_name(uid)] = uid
    return names


def _registered_in(uid: str) -> str:
    """The file that registered env ``uid`` (its module's name when it has no file)."""
    module = get_spec(uid).module
    path = getattr(sys.modules.get(module), "__file__", None)
    return module if path is None else path


def build_subcommands(base: type[C], ids: dict[str, str] | None = None) -> dict[str, type[C]]:
    """One subcommand per registered env (its name from :func:`subcommand_ids`, or from ``ids`` when given), each
    a ``base`` with the env's config as ``env``."""
    ids = subcommand_ids() if ids is None else ids
    return {name: config_class(uid, base) for name, uid in ids.items()}


def parse_with(base: type[C], args: list[str], prog: str, description: str) -> tuple[str, C]:
    """Parse ``<env-id> [flags]`` into (env id, a plain ``base`` instance) with one subcommand per env."""
    ids = subcommand_ids()
    subcommands = build_subcommands(base, ids)
    args = _normalize_env_id(args, ids, prog)
    position = _env_id_position(args)
    if position is not None:
        args = _normalize_bools(args, subcommands[args[position]])
        args = _time_limit_alias(args, subcommands[args[position]])
    config = tyro.extras.subcommand_cli_from_dict(
        dict[str, Callable[..., C]](subcommands), prog=prog, description=description, args=args)
    # Hand on a plain instance: the per-env subclass exists only in this process and cannot be pickled for spawned
    # rollout processes; the env config inside it is an ordinary importable dataclass.
    plain = base(**{f.name: getattr(config, f.name) for f in dataclasses.fields(base)})  # type: ignore[arg-type]
    env_ids = {cls: ids[name] for name, cls in subcommands.items()}
    return env_ids[type(config)], plain


def parse(args: Sequence[str] | None = None) -> tuple[str, ClientConfig, CommandLine]:
    """Parse a client command line into (env id, config, what was imported for it)."""
    line = prepare(sys.argv[1:] if args is None else args)
    env_id, config = parse_with(
        ClientConfig, line.args, program_name("plugrl-run-env-client"),
        "Run batched envs against a PlugRL policy server (or an embedded one with --local-policy).",
    )
    return env_id, config, line


def _env_id_position(args: list[str]) -> int | None:
    """Index of the env id: the first argument that is neither a flag nor the value of ``--env-path``."""
    skip = False
    for i, arg in enumerate(args):
        if skip:
            skip = False
        elif arg in ("--env-path", "--env_path"):
            skip = True
        elif not arg.startswith("-"):
            return i
    return None


def _normalize_env_id(args: list[str], ids: dict[str, str], prog: str) -> list[str]:
    """Accept an env id in any case and with ``_`` or ``-`` (``Point-v1``, ``point_v1`` for ``point-v1``): the
    subcommand it names is unique (:func:`subcommand_ids`). An id that matches nothing raises with suggestions."""
    position = _env_id_position(args)
    if position is None or args[position] in ids:
        return args
    before = [a for i, a in enumerate(args[:position])
              if not (a.startswith(("--env-path", "--env_path")) or (i > 0 and args[i - 1] in ("--env-path", "--env_path")))]
    if before:
        raise ConfigError(f"the env id comes first: {prog} <env-id> {' '.join(args[:position])} ...")
    by_key = {_same_name_key(name): name for name in ids}
    name = by_key.get(_same_name_key(args[position]))
    if name is None:
        try:
            get_spec(args[position])  # an id no subcommand names is unknown: this raises, with close matches
        except UnknownEnvError as exc:
            raise ConfigError(f"{exc}{unknown_id_help(exc.uid)}") from None
    return [*args[:position], name or args[position], *args[position + 1:]]


def _normalize_bools(args: list[str], config_cls: type) -> list[str]:
    """``--env.flag False`` works as well as ``--env.no-flag``: a bool flag followed by a truth value becomes the
    flag form tyro parses."""
    bools = set(_bool_flags(config_cls, ""))
    out: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        name = arg[2:].replace("_", "-") if arg.startswith("--") else None
        value = args[i + 1].lower() if i + 1 < len(args) else None
        if name in bools and value in _TRUE + _FALSE:
            prefix, _, leaf = name.rpartition(".")
            out.append(f"--{prefix + '.' if prefix else ''}{'' if value in _TRUE else 'no-'}{leaf}")
            i += 2
            continue
        out.append(arg)
        i += 1
    return out


def _time_limit_alias(args: list[str], config_cls: type) -> list[str]:
    """``--env.max-episode-steps N`` (PlugRL's spelling) means ``--runner.max-episode-steps N`` for an env whose
    config has no field of that name."""
    fields = {f.name for f in dataclasses.fields(config_cls)}
    env_fields = {f.name for f in dataclasses.fields(_field_type(config_cls, "env"))} if "env" in fields else set()
    if "runner" not in fields or "max_episode_steps" in env_fields:
        return args
    out = []
    for arg in args:
        if arg in ("--env.max-episode-steps", "--env.max_episode_steps"):
            arg = "--runner.max-episode-steps"
        elif arg.startswith(("--env.max-episode-steps=", "--env.max_episode_steps=")):
            arg = "--runner.max-episode-steps=" + arg.split("=", 1)[1]
        out.append(arg)
    return out


def _field_type(cls: type, name: str) -> type:
    import typing

    return typing.get_type_hints(cls)[name]


def _bool_flags(cls: type, prefix: str) -> list[str]:
    import typing

    hints = typing.get_type_hints(cls, include_extras=True)
    flags = []
    for field in dataclasses.fields(cls):
        hint, markers = hints.get(field.name), list[object]()
        if typing.get_origin(hint) is typing.Annotated:
            hint, *markers = typing.get_args(hint)
        name = prefix + field.name.replace("_", "-")
        if hint is bool:
            flags.append(name)
        elif isinstance(hint, type) and dataclasses.is_dataclass(hint):
            flags.extend(_bool_flags(hint, prefix if tyro.conf.OmitArgPrefixes in markers else name + "."))
    return flags


def run_cli(body: Callable[[], int], args: Sequence[str] | None = None) -> None:
    """Run a command's body: user errors print one line and exit 1, Ctrl-C exits 130, ``--version`` prints the
    version, and a closed pipe (``--help | head``) ends quietly."""
    if "--version" in (sys.argv[1:] if args is None else args):
        print(f"plugrl-env-client {__version__}")
        sys.exit(0)
    try:
        try:
            code = body()
        except PlugRLError as exc:
            print(f"error: {exc}", file=sys.stderr)
            code = 1
        except KeyboardInterrupt as exc:  # before the run had anything to write
            print("interrupted", file=sys.stderr)
            code = 128 + getattr(exc, "signum", signal.SIGINT)
        except SystemExit as exc:  # tyro after --help or a usage error
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away (``--help | head``): silence the interpreter's own flush at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        code = 0
    sys.exit(code)


def main(args: Sequence[str] | None = None) -> None:
    def body() -> int:
        from plugrl_env_client.app import run_client

        env_id, config, line = parse(args)
        return run_client(config, env_id, sources=line.sources)

    run_cli(body, args)
