"""``<command> <env-id> [flags]``: one subcommand per registered env, built when the command runs.

The command line of every command that takes an env (``plugrl-run-env-client``, ``plugrl-check-env``): each
command's front gives its own dataclass as ``base`` to :func:`parse_with`, and this module adds the env's config as
``env``. It sits below the fronts, so none of them imports another.

Building the parser at call time (not import time) is what lets an env file end with
``if __name__ == "__main__": from plugrl_env_client.cli import main; main()`` and be run directly: its envs are
registered by then, whatever was imported first. Env files outside the package are imported before the parser is
built, from ``--env-path`` / ``$PLUGRL_ENV_PATH`` or the one-off form ``path/to/my_env.py:My-v1``.

tyro parses the command line; what it is given first, and why tyro cannot do it itself:

* :func:`prepare` reads ``--env-path`` and a ``file.py:Env-Id`` id and imports those files before the parser is
  built: the subcommands are the registered envs, so the parser can only exist once they are registered;
* :func:`_normalize_env_id` accepts an env id in any case (``Point-v1`` for ``point-v1``) and says which ids exist
  when none matches: tyro matches subcommand names exactly (``_`` and ``-`` aside) and only lists the choices;
* :func:`_normalize_bools` turns ``--env.flag False`` into ``--env.no-flag``: a tyro bool is either a flag pair
  (``--x`` / ``--no-x``) or an option that needs a value, never both, and PlugRL's commands write both forms.

The rest is tyro's: ``_`` for ``-`` in flag names, and ``--env.max-episode-steps`` as an alias of
``--runner.max-episode-steps`` for envs whose config has no such field (:func:`config_class`). The help texts are
the config dataclasses' field docstrings, joined into paragraphs (:data:`~plugrl_env_client.cli_support.HELP_RULES`);
each env's line in the list of envs is the first paragraph of its class docstring, without reST markup
(:func:`summary_line`).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import sys
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any, ClassVar, Protocol, TypeVar

import tyro

from plugrl_env_client.cli_support import HELP_RULES, VERSION_FLAG, VERSION_HELP, joined_help
from plugrl_env_client.envs.discovery import EnvSources, unknown_id_help
from plugrl_env_client.envs.registry import UnknownEnvError, get_spec, registered_ids
from plugrl_env_client.errors import ConfigError
from plugrl_env_client.rollout.settings import TIME_LIMIT_DEFAULT

C = TypeVar("C")

TIME_LIMIT_ALIAS = "--env.max-episode-steps"
"""PlugRL's spelling of ``--runner.max-episode-steps``, for envs whose config has no field of that name."""

_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")


class WithPaths(Protocol):
    """A command's config with the paths :meth:`CommandLine.with_absolute_paths` fixes."""

    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]
    output_dir: Path
    env_path: tuple[str, ...]


PathsT = TypeVar("PathsT", bound=WithPaths)


@dataclasses.dataclass(frozen=True)
class CommandLine:
    """A command line after the steps that must happen before the parser exists."""

    args: list[str]
    sources: EnvSources
    cwd: Path = dataclasses.field(default_factory=Path.cwd)
    """The working folder the command started in, before any env file was imported (one may change it)."""

    def absolute(self, path: str | Path) -> Path:
        """``path`` as the command line gave it, made absolute against the folder the command started in."""
        return self.cwd / Path(path).expanduser()

    def with_absolute_paths(self, config: PathsT) -> PathsT:
        """``config`` (a dataclass with ``output_dir`` and ``env_path``: the client's config, a suite's command)
        with both absolute as the command line meant them: an env file imported before parsing may have changed
        the working folder, and a run's outputs (and the env files its spawned processes import) must not move
        with it."""
        return dataclasses.replace(config, output_dir=self.absolute(config.output_dir),
                                   env_path=tuple(str(self.absolute(p)) for p in config.env_path))


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

    The env id stays first; a ``source:Env-Id`` id becomes ``Env-Id`` with its source imported. The sources' paths
    are made absolute before any of them is imported (an env file may change the working folder as it is
    imported), and so can the command's other paths be, with :meth:`CommandLine.absolute`.
    """
    args = list(args)
    cwd = Path.cwd()  # before any env file runs: paths on the command line mean what they meant when it was typed
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
    sources = EnvSources(tuple(str(cwd / Path(p).expanduser()) for p in env_paths), tuple(modules))
    sources.load()
    return CommandLine(args, sources, cwd)


def config_class(uid: str, base: type[C]) -> type[C]:
    """A subclass of the dataclass ``base`` whose ``env`` field is the env's own config dataclass (and whose
    ``runner`` section, when ``base`` has one and the env's config has no ``max_episode_steps``, also takes
    ``--env.max-episode-steps``)."""
    spec = get_spec(uid)
    fields: list[tuple[str, Any, Any]] = [
        ("env", spec.config_cls, dataclasses.field(default_factory=spec.config_cls))]
    runner = typing.get_type_hints(base).get("runner")
    if runner is not None and "max_episode_steps" not in {f.name for f in dataclasses.fields(spec.config_cls)}:
        aliased = _with_time_limit_alias(runner)
        fields.append(("runner", aliased, dataclasses.field(default_factory=aliased)))
    # --version is answered before parsing (cli_support.exit_code); the field only lists it in the env's --help,
    # and parse_with hands on the base's fields alone.
    version = Annotated[bool, tyro.conf.FlagCreatePairsOff, tyro.conf.arg(help=VERSION_HELP, help_behavior_hint="")]
    fields.append(("version", version, dataclasses.field(default=False)))
    cls = dataclasses.make_dataclass(f"{spec.env_cls.__name__}{base.__name__}", fields, bases=(base,))
    doc = spec.env_cls.__doc__ or sys.modules[spec.env_cls.__module__].__doc__ or f"Run {uid}."
    cls.__doc__ = summary_line(doc)
    return cls


_ROLE = re.compile(r":[\w:]+:`~?([^`<]*?)(?:\s*<[^>]*>)?`")
_LITERAL = re.compile(r"``([^`]+)``")


def summary_line(doc: str) -> str:
    """What the list of envs shows for a docstring: its first paragraph as one line, reST markup taken off
    (````num_envs```` and ``:class:`~a.b.C``` read ``num_envs`` and ``C``)."""
    first = re.split(r"\n\s*\n", doc.strip(), maxsplit=1)[0]
    text = _ROLE.sub(lambda m: m.group(1).rsplit(".", 1)[-1], _LITERAL.sub(r"\1", first))
    return joined_help(text).replace("\n", " ")


@functools.cache
def _with_time_limit_alias(runner: type) -> type:
    """``runner`` (a frozen dataclass with ``max_episode_steps``) with :data:`TIME_LIMIT_ALIAS` as a tyro alias of
    that flag; its help text and the section's stay the base class's."""
    default = next(f.default for f in dataclasses.fields(runner) if f.name == "max_episode_steps")
    flag = Annotated[int | None, tyro.conf.arg(aliases=(TIME_LIMIT_ALIAS,),
                                               help_behavior_hint=TIME_LIMIT_DEFAULT)]
    cls = dataclasses.make_dataclass(runner.__name__, [("max_episode_steps", flag, dataclasses.field(default=default))],
                                     bases=(runner,), frozen=True)
    cls.__doc__ = runner.__doc__
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
    config = tyro.extras.subcommand_cli_from_dict(
        dict[str, Callable[..., C]](subcommands), prog=prog, description=_with_version_hint(description, prog),
        args=args, registry=HELP_RULES)
    # Hand on plain instances: the per-env classes exist only in this process and cannot be pickled for spawned
    # rollout processes; the env config inside is an ordinary importable dataclass.
    values = {f.name: getattr(config, f.name) for f in dataclasses.fields(base)}  # type: ignore[arg-type]
    runner = typing.get_type_hints(base).get("runner")
    if runner is not None:
        values["runner"] = runner(**{f.name: getattr(values["runner"], f.name) for f in dataclasses.fields(runner)})
    env_ids = {cls: ids[name] for name, cls in subcommands.items()}
    return env_ids[type(config)], base(**values)


def _with_version_hint(description: str, prog: str) -> str:
    """The command's description and where to look next, for the list of envs (an env's own help lists
    ``--version`` with its options)."""
    return f"{description}\n\n{prog} <env-id> --help lists an env's flags; {prog} {VERSION_FLAG} prints the version."


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
    flag form tyro parses (tyro has no bool that takes both a flag pair and a value)."""
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


def _bool_flags(cls: type, prefix: str) -> list[str]:
    """The flag names (without ``--``) of the bool fields of the dataclass ``cls`` and its sections, named as tyro
    names them (a section marked :data:`tyro.conf.OmitArgPrefixes` adds no prefix)."""
    hints = typing.get_type_hints(cls, include_extras=True)
    flags = []
    for field in dataclasses.fields(cls):
        hint, markers = hints.get(field.name), list[object]()
        if typing.get_origin(hint) is Annotated:
            hint, *markers = typing.get_args(hint)
        name = prefix + field.name.replace("_", "-")
        if hint is bool:
            flags.append(name)
        elif isinstance(hint, type) and dataclasses.is_dataclass(hint):
            flags.extend(_bool_flags(hint, prefix if tyro.conf.OmitArgPrefixes in markers else name + "."))
    return flags
