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
import json
import logging
import os
import sys
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

import gymnasium as gym

from plugrl_env_client.envs.base_env import BaseEnv, BaseEnvConfig
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

    @property
    def config_cls(self) -> type[BaseEnvConfig]:
        """The config dataclass registered for this uid (``BaseEnvConfig`` when there is none)."""
        entry = _CONFIGS.get(self.uid)
        return entry[0] if entry is not None else BaseEnvConfig


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
        f"{kind} id {uid!r} is already registered by {old_module}; pick another id or pass override=True"
    )


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
    **kwargs: Any,
) -> Callable[[EnvT], EnvT]:
    """Class decorator registering a :class:`BaseEnv` subclass under ``uid``.

    ``kwargs`` are passed to the env's constructor and written to ``client_config.json``; they must therefore be
    JSON-serializable (pass a string key and look the object up inside the env otherwise).
    """
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
            _ENVS[uid] = EnvSpec(uid, cls, cls.__module__, max_episode_steps, best_reward_threshold_for_success, kwargs)
            _register_with_gymnasium(uid)
        return cls

    return decorate


def register_env_config(uid: str, override: bool = False) -> Callable[[EnvT], EnvT]:
    """Class decorator registering the config dataclass of env ``uid``; every field needs a default."""

    def decorate(cls: EnvT) -> EnvT:
        if not dataclasses.is_dataclass(cls):
            raise ConfigError(f"register_env_config({uid!r}): {cls.__name__} must be a @dataclasses.dataclass")
        missing = [
            f.name
            for f in dataclasses.fields(cls)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING  # type: ignore[misc]
        ]
        if missing:
            raise ConfigError(
                f"register_env_config({uid!r}): {cls.__name__} cannot be built without arguments; give these "
                f"fields a default: {', '.join(missing)}"
            )
        old = _CONFIGS.get(uid)
        if _accept(uid, "env config", cls.__module__, old[1] if old else None, override):
            _CONFIGS[uid] = (cls, cls.__module__)
        return cls

    return decorate


def _register_with_gymnasium(uid: str) -> None:
    def vector_entry_point(num_envs: int = 1, config: BaseEnvConfig | None = None, **kwargs: Any) -> BaseEnv:
        return make_env(uid, num_envs=num_envs, config=config, **kwargs)

    gym.registry.pop(uid, None)
    gym.register(id=uid, vector_entry_point=vector_entry_point)


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
    raise ConfigError(f"Unknown env id {uid!r}.{hint} Registered envs: {known}")


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
    env = spec.env_cls(cfg, num_envs=num_envs, **ids, **{**spec.kwargs, **kwargs})
    env.spec = gym.registry.get(spec.uid)
    return env
