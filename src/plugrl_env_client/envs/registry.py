"""The env registry: ``register_env`` / ``register_env_config`` and ``make_env``.

Registering an env also registers it with gymnasium (as a vector entry point), so
``gymnasium.make_vec(uid, num_envs=N, config=cfg)`` builds the same object the runner uses.

Precedence: an env file run directly (module ``__main__``; ``__mp_main__`` in spawned processes) may register a uid
a built-in already uses; the file's class wins with a one-line warning, whichever of the two is imported first. Any
other clash needs ``override=True``.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import json
import logging
import os
import sys
import typing
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

import gymnasium as gym

from plugrl_env_client.envs.base_env import BaseEnv, BaseEnvConfig
from plugrl_env_client.envs.time_limit import EpisodeTimeLimit
from plugrl_env_client.errors import ConfigError

logger = logging.getLogger(__name__)

EnvT = TypeVar("EnvT", bound=type)


@dataclasses.dataclass
class EnvSpec:
    """What the registry knows about one env id."""

    uid: str
    env_cls: type[BaseEnv]
    module: str
    max_episode_steps: int | None = None
    best_reward_threshold_for_success: float | None = None
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    config: type[BaseEnvConfig] | None = None
    """The config class given as ``register_env(uid, config=...)``, if any."""
    single_instance: bool = False
    """The env can exist only once per process (a simulator with global state): never split into pipeline groups."""

    @property
    def config_cls(self) -> type[BaseEnvConfig]:
        """The env's config dataclass: ``register_env(config=...)``, else ``register_env_config(uid)``, else the
        annotation of ``config`` in the env's ``__init__``, else ``BaseEnvConfig`` (no ``--env.*`` flags).

        A config registered under another id that belongs to this env (it is this env's ``__init__`` annotation,
        or its id is a near miss of this one) is an error naming both ids: otherwise the ``--env.*`` flags would
        silently vanish.
        """
        registered = _CONFIGS.get(self.uid)
        if self.config is not None:
            if registered is not None and registered[0] is not self.config:
                raise ConfigError(
                    f"env {self.uid!r} names two config classes: register_env(config={self.config.__name__}) and "
                    f"register_env_config({self.uid!r}) on {registered[0].__name__}; keep one"
                )
            return self.config
        if registered is not None:
            return registered[0]
        annotated = _annotated_config(self.env_cls)
        stray = [cuid for cuid, (cls, _) in _CONFIGS.items() if cuid not in _ENVS
                 and (cls is annotated or difflib.get_close_matches(cuid.lower(), [self.uid.lower()], cutoff=0.8))]
        if stray:
            raise ConfigError(
                f"register_env_config({stray[0]!r}) and register_env({self.uid!r}) name different ids; use the same "
                f"id in both decorators (without it the env gets no --env.* flags)"
            )
        return annotated or BaseEnvConfig


def _annotated_config(env_cls: type) -> type[BaseEnvConfig] | None:
    """The config dataclass named by the annotation of ``config`` in ``env_cls.__init__``, if it is one."""
    try:
        hints = typing.get_type_hints(env_cls.__init__)  # type: ignore[misc]
    except Exception:  # an annotation that does not resolve: nothing to infer
        return None
    hint = hints.get("config")
    if isinstance(hint, type) and issubclass(hint, BaseEnvConfig) and dataclasses.is_dataclass(hint):
        return hint
    return None


class UnknownEnvError(ConfigError):
    """No env is registered under this id (the message lists close matches and the registered ids)."""

    def __init__(self, uid: str, message: str) -> None:
        super().__init__(message)
        self.uid = uid


_ENVS: dict[str, EnvSpec] = {}
_CONFIGS: dict[str, tuple[type[BaseEnvConfig], str]] = {}


# The file being run: ``__main__`` in the process that ran it, ``__mp_main__`` when a spawn/forkserver child
# re-imports it (``--num-procs`` > 1); both must shadow built-ins the same way.
_MAIN_MODULES = ("__main__", "__mp_main__")


def _accept(uid: str, kind: str, new_module: str, old_module: str | None, override: bool) -> bool:
    """Decide whether a registration from ``new_module`` replaces one from ``old_module``."""
    if old_module is None or override or old_module == new_module:
        return True
    if new_module in _MAIN_MODULES:
        _warn_shadowing(uid, kind, new_module, old_module)
        return True
    if old_module in _MAIN_MODULES:
        _warn_shadowing(uid, kind, old_module, new_module)
        return False
    raise ConfigError(
        f"{kind} id {uid!r} is already registered by {_module_file(old_module)}, and {_module_file(new_module)} "
        f"registers it too; the first one stays: rename the id in one of them, or pass override=True to replace it"
    )


def _module_file(module: str) -> str:
    """Where ``module`` comes from, for a message: its file when it has one (an env file imported by path has a
    made-up module name, plugrl_user_envs.<stem>_<hash>, that names nothing a user wrote), else its name."""
    path = getattr(sys.modules.get(module), "__file__", None)
    return module if path is None else str(path)


def _warn_shadowing(uid: str, kind: str, main_module: str, other: str) -> None:
    """One line, once per run: the file being run replaces ``other``'s registration of ``uid``.

    Spawned rollout processes re-import that file as ``__mp_main__``; they stay quiet. The warning is attributed
    to the user's file (line 0, so no source line is printed under it).
    """
    if main_module != "__main__" or kind != "env":
        return
    path = getattr(sys.modules.get("__main__"), "__file__", None) or "<the file being run>"
    other_path = getattr(sys.modules.get(other), "__file__", None)
    if other_path is not None and os.path.realpath(other_path) == os.path.realpath(path):
        return  # a built-in env file run directly: it is the same class, nothing is shadowed
    warnings.warn_explicit(f"env {uid!r} defined here shadows the built-in one in {other}", UserWarning, path, 0)


def register_env(
    uid: str,
    max_episode_steps: int | None = None,
    best_reward_threshold_for_success: float | None = None,
    override: bool = False,
    config: type[BaseEnvConfig] | None = None,
    single_instance: bool = False,
    **kwargs: Any,
) -> Callable[[EnvT], EnvT]:
    """Class decorator registering a :class:`BaseEnv` subclass under ``uid``.

    ``config`` is the env's config dataclass (or use ``register_env_config(uid)`` on it, or annotate ``config`` in
    ``__init__``). ``single_instance=True`` says the env can exist only once per process (a simulator with global
    state): ``--runner.pipeline`` then never splits it into several env objects (``auto`` keeps one group, a number
    above 1 is an error). ``kwargs`` are passed to the env's constructor and written to ``client_config.json``; they must
    therefore be JSON-serializable (pass a string key and look the object up inside the env otherwise).
    """
    if config is not None:
        _check_config_class(uid, config, "register_env(config=...)")
    try:
        json.dumps(kwargs)
    except (TypeError, ValueError) as exc:
        raise RuntimeError(
            f"register_env({uid!r}) kwargs must be JSON-serializable ({exc}); pass a string key instead and "
            "look the object up inside the env"
        ) from None

    def decorate(cls: EnvT) -> EnvT:
        if not (isinstance(cls, type) and issubclass(cls, BaseEnv)):
            raise ConfigError(f"register_env({uid!r}) decorates {cls!r}, which is not a subclass of BaseEnv")
        old = _ENVS.get(uid)
        if _accept(uid, "env", cls.__module__, old.module if old else None, override):
            _ENVS[uid] = EnvSpec(uid, cls, cls.__module__, max_episode_steps, best_reward_threshold_for_success, kwargs,
                                 config, single_instance)
            _register_with_gymnasium(uid)
        return cls

    return decorate


def register_env_config(uid: str, override: bool = False) -> Callable[[EnvT], EnvT]:
    """Class decorator registering the config dataclass of env ``uid``; every field needs a default."""

    def decorate(cls: EnvT) -> EnvT:
        _check_config_class(uid, cls, f"register_env_config({uid!r})")
        old = _CONFIGS.get(uid)
        if _accept(uid, "env config", cls.__module__, old[1] if old else None, override):
            _CONFIGS[uid] = (cls, cls.__module__)
        return cls

    return decorate


def _check_config_class(uid: str, cls: Any, where: str) -> None:
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise ConfigError(f"{where}: {getattr(cls, '__name__', cls)!r} must be a @dataclasses.dataclass")
    missing = [f.name for f in dataclasses.fields(cls)
               if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        raise ConfigError(
            f"{where}: {cls.__name__} cannot be built without arguments; give these fields a default: "
            f"{', '.join(missing)}"
        )


def _register_with_gymnasium(uid: str) -> None:
    spec = _ENVS[uid]

    def vector_entry_point(num_envs: int = 1, config: BaseEnvConfig | None = None,
                           max_episode_steps: int | None = None, **kwargs: Any) -> gym.vector.VectorEnv:
        env = make_env(uid, num_envs=num_envs, config=config, **kwargs)
        # The runner applies the time limit itself; plain gymnasium code gets it from this wrapper (gymnasium's
        # convention: max_episode_steps=-1 asks for none).
        return EpisodeTimeLimit(env, max_episode_steps) if max_episode_steps and max_episode_steps > 0 else env

    gym.registry.pop(uid, None)
    gym.register(id=uid, vector_entry_point=vector_entry_point, max_episode_steps=spec.max_episode_steps)


@dataclasses.dataclass(frozen=True)
class RegistrySnapshot:
    """The registry at one moment, to go back to (a module that failed halfway through registering)."""

    envs: dict[str, EnvSpec]
    configs: dict[str, tuple[type[BaseEnvConfig], str]]
    gymnasium_ids: frozenset[str]


def snapshot() -> RegistrySnapshot:
    return RegistrySnapshot(dict(_ENVS), dict(_CONFIGS), frozenset(_ENVS))


def restore(snap: RegistrySnapshot) -> None:
    """Forget every registration made since ``snap`` (ours and the matching gymnasium ids)."""
    for uid in set(_ENVS) - snap.gymnasium_ids:
        gym.registry.pop(uid, None)
    _ENVS.clear()
    _ENVS.update(snap.envs)
    _CONFIGS.clear()
    _CONFIGS.update(snap.configs)
    for uid in _ENVS:
        _register_with_gymnasium(uid)


def registered_ids() -> list[str]:
    """All registered env ids, sorted."""
    return sorted(_ENVS)


def get_spec(uid: str) -> EnvSpec:
    """The spec of ``uid`` (case-insensitive); unknown ids raise ConfigError with close matches."""
    spec = _ENVS.get(uid)
    if spec is not None:
        return spec
    by_lower = {k.lower(): k for k in _ENVS}
    if uid.lower() in by_lower:
        return _ENVS[by_lower[uid.lower()]]
    close = difflib.get_close_matches(uid.lower(), list(by_lower), n=3, cutoff=0.5)
    hint = f" Did you mean {', '.join(repr(by_lower[c]) for c in close)}?" if close else ""
    known = ", ".join(registered_ids()) or "(none)"
    raise UnknownEnvError(uid, f"Unknown env id {uid!r}.{hint} Registered envs: {known}.")


def make_env(
    uid: str,
    num_envs: int = 1,
    config: BaseEnvConfig | None = None,
    process_id: int | None = None,
    total_processes: int | None = None,
    **kwargs: Any,
) -> BaseEnv:
    """Build env ``uid`` with ``num_envs`` copies; ``config`` defaults to the registered config's defaults."""
    spec = get_spec(uid)
    cfg = config if config is not None else spec.config_cls()
    ids = {} if process_id is None else {"process_id": process_id, "total_processes": total_processes}
    arguments = {**ids, **spec.kwargs, **kwargs}
    _check_signature(spec, arguments)
    env = spec.env_cls(cfg, num_envs=num_envs, **arguments)
    env.spec = gym.registry.get(spec.uid)
    return env


def _check_signature(spec: EnvSpec, arguments: dict[str, Any]) -> None:
    """The env's ``__init__`` must take ``(config, num_envs=..., **kwargs)``; say so before a TypeError does."""
    try:
        signature = inspect.signature(spec.env_cls.__init__)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(None, None, num_envs=1, **arguments)
    except TypeError as exc:
        raise ConfigError(
            f"{spec.env_cls.__name__}.__init__{signature} cannot be called as __init__(config, num_envs=N"
            f"{''.join(', ' + k + '=...' for k in arguments)}) ({exc}). Write "
            "`def __init__(self, config: MyConfig, num_envs: int = 1, **kwargs)` and call "
            "`super().__init__(config, num_envs=num_envs, **kwargs)`; the old worker_id / total_workers parameters "
            "are now process_id / total_processes (passed with --runner.pass-proc-id)."
        ) from None
