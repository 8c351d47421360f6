"""The policies of the reference server, by name: ``register_policy``, the ``--policy.*`` flags and ``make_policy``.

Every policy the server can answer with, built-in or a user's, is a
:class:`~plugrl_env_client.server.policy.Policy` subclass registered here under a name, with the config dataclass
of its own options and the action horizon it answers when ``--policy.action-horizon`` is not given::

    @dataclasses.dataclass
    class ConstantConfig:
        value: float = 0.5
        \"\"\"The value of every action.\"\"\"

    @register_policy("constant", config=ConstantConfig)
    class ConstantPolicy(Policy):
        def __init__(self, setup: PolicySetup, config: ConstantConfig) -> None: ...

The server builds the policy named by ``--policy.name`` (or ``--local-policy``) as ``cls(setup, config)``: the
:class:`PolicySetup` says what actions to answer (from the common ``--policy.*`` flags, or from the env's action
space for the embedded server), ``config`` is the policy's own config, its fields given as ``--policy.<field>``.

The command line (:func:`flags_class`) is built once the policies are registered: ``--policy-path`` files
(:func:`load_policy_files`) are imported before the parser exists, as ``--env-path`` files are for envs, so a
user's policy is a choice of ``--policy.name`` and its fields are flags like the built-ins' ones. A field of one
policy's config given to another policy is an error that names the policy reading it. The client's embedded
server takes the same fields as its ``--policy.*`` section (:func:`options_class`, :func:`options_from_flags`).

A policy registered with ``default=True`` is the one offered for the action spaces it accepts
(:meth:`~plugrl_env_client.server.policy.Policy.refuses`): :func:`default_policy` is what the client's hints and
``plugrl-check-env``'s rollout use, so no module outside the policies names one.

This module knows no policy: the built-ins register themselves when :mod:`plugrl_env_client.server` (the package,
which any import of this module runs first) imports :mod:`~plugrl_env_client.server.policies`.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import re
import sys
import types
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar

import numpy as np
import tyro

from plugrl_env_client.envs.discovery import USER_MODULE_PREFIX, failure_line, user_module_name
from plugrl_env_client.errors import ConfigError
from plugrl_env_client.server.policy import Policy, PolicySetup

if TYPE_CHECKING:
    import gymnasium as gym

PolicyT = TypeVar("PolicyT", bound=type)

DEFAULT_HORIZON = 4
"""The action horizon of a policy registered without one, when --policy.action-horizon is not given."""
POLICY_PATH_FLAG = "--policy-path"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


@dataclasses.dataclass
class PolicyFlags:
    """The ``--policy.*`` flags every policy shares (each policy adds the fields of its own config)."""

    name: str = "random"
    """random: uniform in [low, high]; zero: all zeros; text: one of --policy.choices per env and step; ars: learns
    a linear policy on the env's states (Augmented Random Search), actions clipped to [low, high]; or the name of a
    policy registered by a --policy-path file."""
    action_dim: int = 7
    """Length of each action vector; 0 means scalar actions (discrete policies), sent as [horizon, n]."""
    action_horizon: int | None = None
    """Steps per action chunk (with ars, a longer chunk repeats the action for its first observation)."""
    dtype: str = "float32"
    """numpy dtype of the actions (float32, float64, int64, ...); an integer dtype draws integers in [low, high]."""
    low: float = -1.0
    """Smallest action value: random and integer actions are drawn from [low, high], ars clips to it."""
    high: float = 1.0
    """Largest action value (see --policy.low)."""
    seed: Annotated[int | None, tyro.conf.arg(help_behavior_hint="(default: fresh entropy)")] = None
    """Seed of the random and text policies' generator, and of ARS's directions."""
    latency_ms: float = 0.0
    """Milliseconds the server waits before answering each infer, simulating inference time (the wait blocks only
    that client's connection)."""


@dataclasses.dataclass
class PolicyConfig(PolicyFlags):
    """What the reference server answers infers with: the shared flags, and ``options``, the named policy's own
    config (an instance of the config class it was registered with; None: that class's defaults)."""

    options: Any = None


@dataclasses.dataclass
class PolicySpec:
    """What the registry knows about one policy name."""

    name: str
    policy_cls: type[Policy]
    config: type | None
    horizon: int
    module: str
    default: bool = False
    """Offered for the action spaces the policy accepts (:func:`default_policy`)."""


_POLICIES: dict[str, PolicySpec] = {}


def snapshot() -> dict[str, PolicySpec]:
    """The registrations now, for :func:`restore` (tests that register policies of their own)."""
    return dict(_POLICIES)


def restore(snap: dict[str, PolicySpec]) -> None:
    """Forget every registration made since ``snap``."""
    _POLICIES.clear()
    _POLICIES.update(snap)


def register_policy(name: str, config: type | None = None, horizon: int = DEFAULT_HORIZON,
                    override: bool = False, default: bool = False) -> Callable[[PolicyT], PolicyT]:
    """Class decorator registering a :class:`~plugrl_env_client.server.policy.Policy` subclass under ``name``.

    ``config`` is the dataclass of the policy's own options (every field with a default; each is a
    ``--policy.<field>`` flag); the server builds the policy as ``cls(setup, config_instance)``. ``horizon`` is
    its action horizon when --policy.action-horizon is not given. ``default``: offer it, with its options' defaults,
    for the env action spaces it accepts (:func:`default_policy`), e.g. a policy for a kind of space no other
    serves. A name another module registered already is an error unless ``override=True``.
    """
    if not _NAME.fullmatch(name):
        raise ConfigError(f"register_policy({name!r}): a policy name is letters, digits, '_', '-' and '.', starting "
                          "with a letter or digit (it is typed as --policy.name NAME)")
    if horizon < 1:
        raise ConfigError(f"register_policy({name!r}, horizon={horizon}): the horizon must be >= 1")
    if config is not None:
        _check_config_class(name, config)

    def decorate(cls: PolicyT) -> PolicyT:
        if not (isinstance(cls, type) and issubclass(cls, Policy)):
            raise ConfigError(f"register_policy({name!r}) decorates {cls!r}, which is not a subclass of Policy "
                              "(from plugrl_env_client.server import Policy)")
        old = _POLICIES.get(name)
        if old is not None and not override and old.module != cls.__module__:
            raise ConfigError(f"policy name {name!r} is already registered by {_module_file(old.module)}, and "
                              f"{_module_file(cls.__module__)} registers it too; rename one of them, or pass "
                              "override=True to replace it")
        _POLICIES[name] = PolicySpec(name, cls, config, horizon, cls.__module__, default)
        return cls

    return decorate


def _check_config_class(name: str, cls: Any) -> None:
    where = f"register_policy({name!r}, config=...)"
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise ConfigError(f"{where}: {getattr(cls, '__name__', cls)!r} must be a @dataclasses.dataclass")
    fields = dataclasses.fields(cls)
    missing = [f.name for f in fields if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        raise ConfigError(f"{where}: {cls.__name__} cannot be built without arguments; give these fields a default: "
                          f"{', '.join(missing)}")
    shared = sorted({f.name for f in fields} & {f.name for f in dataclasses.fields(PolicyConfig)})
    if shared:
        raise ConfigError(f"{where}: {cls.__name__} has fields named like flags every policy shares "
                          f"({', '.join('--policy.' + s.replace('_', '-') for s in shared)}); rename them")
    for spec in _POLICIES.values():
        if spec.config is None or spec.name == name:
            continue
        for field in dataclasses.fields(spec.config):
            mine = next((f for f in fields if f.name == field.name), None)
            if mine is not None and (mine.type != field.type or _default(mine) != _default(field)):
                raise ConfigError(f"{where}: {cls.__name__}.{mine.name} and the {spec.name} policy's "
                                  f"{spec.config.__name__}.{field.name} are both --policy.{mine.name.replace('_', '-')}"
                                  " but differ in type or default; rename one of them")


def _default(field: dataclasses.Field) -> Any:
    return field.default_factory() if field.default_factory is not dataclasses.MISSING else field.default


def _module_file(module: str) -> str:
    path = getattr(sys.modules.get(module), "__file__", None)
    return module if path is None else str(path)


def registered_names() -> list[str]:
    """Every registered policy name: the built-ins first, then the others in the order they registered."""
    return list(_POLICIES)


def default_policy(space: gym.Space) -> str | None:
    """The first policy registered with ``default=True`` that accepts the env action space ``space`` (the
    built-ins first; None when none does): what a hint offers and ``plugrl-check-env``'s rollout runs."""
    return next((s.name for s in _POLICIES.values() if s.default and s.policy_cls.refuses(space) is None), None)


def able_policies(space: gym.Space) -> list[str]:
    """Every registered policy that accepts the env action space ``space``, in registration order."""
    return [s.name for s in _POLICIES.values() if s.policy_cls.refuses(space) is None]


def get_spec(name: str) -> PolicySpec:
    """The spec of policy ``name``; an unknown name is a ConfigError with close matches and how to add one."""
    spec = _POLICIES.get(name)
    if spec is not None:
        return spec
    raise ConfigError(f"{unknown_policy(name)} A policy of your own is registered with @register_policy in a file "
                      f"given as {POLICY_PATH_FLAG} (plugrl-run-policy-server) or --env-path (plugrl-run-env-client "
                      "--local-policy)")


def unknown_policy(name: str) -> str:
    """What is wrong with the policy name ``name`` that nobody registered: close matches and the registered names."""
    close = difflib.get_close_matches(name, list(_POLICIES), n=3, cutoff=0.5)
    hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    return f"unknown policy {name!r}.{hint} Registered policies: {', '.join(_POLICIES)}."


def horizon_of(config: PolicyFlags) -> int:
    """The action horizon ``config`` asks for: --policy.action-horizon, else the policy's default."""
    if config.action_horizon is not None:
        return config.action_horizon
    return get_spec(config.name).horizon


# ----------------------------------------------------------------------------------------------- the flags


def name_choice() -> Any:
    """``Literal[<every registered name>]``: the type of ``--policy.name``, built when the parser is."""
    return Literal[tuple(registered_names())]


def optional_name_choice() -> Any:
    """``Literal[<every registered name>] | None``: the type of ``--local-policy``, built when the parser is."""
    return name_choice() | None


def flags_class() -> type[PolicyFlags]:
    """The ``--policy.*`` section of the command line: the shared flags and every registered policy's own fields
    (a dataclass inheriting them all, so each field keeps its docstring as its help)."""
    names = registered_names()
    configs = list(dict.fromkeys(s.config for s in _POLICIES.values() if s.config is not None))
    horizons = "; ".join(f"{s.name}: {s.horizon}" for s in _POLICIES.values() if s.horizon != DEFAULT_HORIZON)
    fields: list[tuple[str, Any, Any]] = [
        ("name", Literal[tuple(names)], dataclasses.field(default="random")),
        ("action_horizon", Annotated[int | None, tyro.conf.arg(
            help_behavior_hint=f"(default: {DEFAULT_HORIZON}{'; ' + horizons if horizons else ''})")],
         dataclasses.field(default=None)),
    ]
    # Bases in reverse: a dataclass orders the fields of its bases from the last one, so the shared flags come first.
    cls = dataclasses.make_dataclass("PolicyConfig", fields, bases=(*reversed(configs), PolicyFlags))
    cls.__doc__ = "What the reference server answers infers with: the policy named by --policy.name, its own fields " \
        "among these."
    return cls


def config_from_flags(flags: PolicyFlags) -> PolicyConfig:
    """The :class:`PolicyConfig` a parsed :func:`flags_class` instance says: the shared flags, and the named
    policy's own config from its fields. A field only other policies read, given a value other than its default,
    is a ConfigError that names the policies reading it."""
    spec = get_spec(flags.name)
    own = _own_fields(spec)
    _refuse_strays(spec.name, flags, own, "--policy.name")
    options = spec.config(**{k: getattr(flags, k) for k in own}) if spec.config is not None else None
    shared = {f.name: getattr(flags, f.name) for f in dataclasses.fields(PolicyFlags)}
    return PolicyConfig(**shared, options=options)


def options_class() -> type:
    """The client's ``--policy.*`` section: the own fields of every registered policy (a dataclass inheriting
    their configs, so each field keeps its docstring as its help), read by the policy ``--local-policy`` names. The
    shared flags are not among them: the embedded server takes the actions' shape, dtype and bounds from the env's
    action space, the seed from ``--runner.seed`` and the horizon from ``--local-policy-horizon``."""
    configs = list(dict.fromkeys(s.config for s in _POLICIES.values() if s.config is not None))
    cls = dataclasses.make_dataclass("PolicyOptions", [], bases=tuple(reversed(configs)))
    cls.__doc__ = ("The own options of the embedded policy named by --local-policy: the fields of every "
                   "registered policy, as plugrl-run-policy-server takes them.")
    return cls


def options_from_flags(name: str | None, flags: Any, flag: str = "--local-policy") -> dict[str, Any]:
    """The own options of policy ``name`` (None: no policy) in a parsed :func:`options_class` instance, by field
    name. A field only other policies read, given a value other than its default, is a ConfigError naming them
    (``flag`` is how the command line names the policy)."""
    spec = get_spec(name) if name is not None else None
    own = _own_fields(spec) if spec is not None else set()
    _refuse_strays(name, flags, own, flag)
    return {k: getattr(flags, k) for k in sorted(own)}


def options_config(name: str, options: Mapping[str, Any] | None) -> Any:
    """An instance of policy ``name``'s config from ``options`` (its own fields by name, the others at their
    defaults; None for a policy without a config). A name its config lacks is a ConfigError listing those it has."""
    spec = get_spec(name)
    options = dict(options or {})
    own = _own_fields(spec)
    unknown = sorted(set(options) - own)
    if unknown:
        has = f"its options are {', '.join(sorted(own))}" if own else "it has no options of its own"
        raise ConfigError(f"the {name} policy has no option{'s' if len(unknown) > 1 else ''} "
                          f"{', '.join(unknown)}: {has}")
    return spec.config(**options) if spec.config is not None else None


def _own_fields(spec: PolicySpec) -> set[str]:
    return {f.name for f in dataclasses.fields(spec.config)} if spec.config is not None else set()


def _refuse_strays(name: str | None, flags: Any, own: set[str], flag: str) -> None:
    """A ConfigError when ``flags`` gives a field that policy ``name`` does not read (only others do) a value
    other than its default, naming the policies reading it and how ``flag`` picks one of them."""
    readers: dict[str, list[str]] = {}
    for other in _POLICIES.values():
        if other.config is None:
            continue
        for field in dataclasses.fields(other.config):
            if field.name not in own and hasattr(flags, field.name) and getattr(flags, field.name) != _default(field):
                readers.setdefault(field.name, []).append(other.name)
    if not readers:
        return
    given = ", ".join(f"--policy.{k.replace('_', '-')}" for k in readers)
    users = sorted({n for names in readers.values() for n in names})
    one = len(readers) == 1
    it = "it" if one else "them"
    ignored = f"{flag} {name} ignores {it}" if name is not None else f"no {flag} is given"
    raise ConfigError(f"{given} {'is' if one else 'are'} for {flag} {' or '.join(users)}; {ignored} (pass {flag} "
                      f"{users[0]} to use {it})")


def config_of(**flags: Any) -> PolicyConfig:
    """The :class:`PolicyConfig` of ``--policy.*`` values given as the command line names them, the policy's own
    fields among the shared ones (``config_of(name="ars", action_dim=2, directions=4)``), checked as the command
    line's are (:func:`config_from_flags`)."""
    cls = flags_class()
    unknown = sorted(set(flags) - {f.name for f in dataclasses.fields(cls)})
    if unknown:
        raise ConfigError(f"no policy has the option{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}")
    return config_from_flags(cls(**flags))


# ------------------------------------------------------------------------------------------- building one


def make_policy(config: PolicyConfig, action_shape: tuple[int, ...] | None = None, low: Any = None, high: Any = None,
                space: gym.Space | None = None, run_dir: Path | None = None) -> Policy:
    """Build the policy named in ``config``; ``action_shape``/``low``/``high`` override the config's and
    ``space``/``run_dir`` are the env's action space and the run folder (the embedded server knows them)."""
    spec = get_spec(config.name)
    options = config.options
    if spec.config is None and options is not None:
        raise ValueError(f"the {spec.name} policy has no options of its own, got {options!r}")
    if spec.config is not None:
        if options is None:
            options = spec.config()
        elif not isinstance(options, spec.config):
            raise ValueError(f"the {spec.name} policy's options are a {spec.config.__name__}, got "
                             f"{type(options).__name__}")
    if config.action_dim < 0:
        raise ValueError(f"--policy.action-dim must be >= 0 (0: scalar actions), got {config.action_dim}")
    try:
        dtype = np.dtype(config.dtype)
    except TypeError:
        raise ValueError(f"--policy.dtype {config.dtype!r} is not a numpy dtype; use e.g. float32, float64 or int64") from None
    if dtype.kind not in "biuf":
        raise ValueError(f"--policy.dtype {config.dtype!r} is not numeric; actions are numbers")
    shape = action_shape if action_shape is not None else ((config.action_dim,) if config.action_dim > 0 else ())
    setup = PolicySetup(tuple(shape), dtype, horizon_of(config), config.low if low is None else low,
                        config.high if high is None else high, config.seed, space, run_dir)
    return spec.policy_cls(setup, options)


# ------------------------------------------------------------------------------------------ --policy-path


def policy_paths(args: Sequence[str]) -> list[str]:
    """The values of every ``--policy-path`` on a command line (``--policy-path X``, ``--policy-path=X``)."""
    found = []
    for i, arg in enumerate(args):
        if arg in (POLICY_PATH_FLAG, "--policy_path") and i + 1 < len(args):
            found.append(args[i + 1])
        elif arg.startswith((POLICY_PATH_FLAG + "=", "--policy_path=")):
            found.append(arg.split("=", 1)[1])
    return found


def load_policy_files(paths: Sequence[str]) -> list[str]:
    """Import each policy file (registering its policies); returns the names they registered.

    A path that is no Python file, a file that fails to import (nothing it registered stays) and a file that
    registers no policy are ConfigErrors saying which and what to do.
    """
    added: list[str] = []
    for entry in paths:
        path = Path(entry).expanduser()
        if not path.is_file() or path.suffix != ".py":
            what = "no such file" if not path.exists() else "not a Python file"
            raise ConfigError(f"{POLICY_PATH_FLAG} {entry}: {what}; name the .py file that registers your policy "
                              "with @register_policy")
        before = dict(_POLICIES)
        module = _import_file(path.resolve(), entry)
        new = [name for name, spec in _POLICIES.items() if spec.module == module]
        if not new and module not in {s.module for s in before.values()}:
            raise ConfigError(f"{POLICY_PATH_FLAG} {entry} registers no policy: decorate your Policy subclass with "
                              "@register_policy('NAME') (from plugrl_env_client.server import register_policy)")
        added.extend(n for n in new if n not in added)
    return added


def _import_file(path: Path, shown: str) -> str:
    """Import ``path`` under the module name an env file of that path gets (a file given both as --env-path and
    as --policy-path is one module, imported once)."""
    name = user_module_name(path)
    if name in sys.modules:
        return name
    sys.modules.setdefault(USER_MODULE_PREFIX, types.ModuleType(USER_MODULE_PREFIX))
    folder = str(path.parent)
    if folder not in sys.path:  # the file may import its neighbours
        sys.path.append(folder)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"{POLICY_PATH_FLAG} {shown}: not importable as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    before = dict(_POLICIES)
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as exc:  # a Ctrl-C goes through; anything else the file raised is its error
        del sys.modules[name]
        _POLICIES.clear()
        _POLICIES.update(before)
        line = failure_line(exc, path)
        at = "" if line is None else f"{shown}:{line}: "
        raise ConfigError(f"{POLICY_PATH_FLAG} {shown} failed to import ({at}{type(exc).__name__}: {exc}); fix it "
                          "and run again") from exc
    return name
