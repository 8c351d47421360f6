"""The launchers by name: what ``--launcher`` chooses from, and the one protocol every launcher follows.

A launcher runs a run's rollout processes somewhere (:mod:`.local`: this process or spawned ones; :mod:`.ray`: Ray
actors) and delivers everything they report to the run's :class:`~plugrl_env_client.outputs.run_writer.RunWriter`.
The command line's choices are this table's names, and a run asks the table for its launcher, so a new launcher is
one entry here and nothing else. The Ray launcher's modules are imported only when a run picks it (Ray itself only
when it connects).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import ClassVar, Protocol

from plugrl_env_client.envs.base_env import BaseEnv
from plugrl_env_client.envs.discovery import EnvSources
from plugrl_env_client.errors import ConfigError
from plugrl_env_client.launch.config import LaunchConfig
from plugrl_env_client.launch.local import LocalLauncher
from plugrl_env_client.launch.process import ProcessJob
from plugrl_env_client.outputs.run_writer import RunWriter
from plugrl_env_client.rollout.budget import EpisodeBudget


class Launcher(Protocol):
    """Runs a run's rollout processes and delivers every report and result to the writer."""

    in_process: ClassVar[bool]
    """Whether a run of one process (one env group) runs in this very process: its caller may then build the env
    once (to read its action space, say) and hand it to :meth:`launch`."""

    def launch(self, jobs: list[ProcessJob], budget: EpisodeBudget, writer: RunWriter,
               sources: EnvSources = EnvSources(), env: BaseEnv | None = None) -> None:
        """Run ``jobs`` (``env``: the one job's env, built by the caller, when :attr:`in_process`); every report and
        result lands in ``writer``. Raises the interrupt when this process was interrupted."""
        ...


def _ray(config: LaunchConfig) -> Launcher:
    from plugrl_env_client.launch.ray.launcher import RayLauncher  # its modules load only for a Ray run

    return RayLauncher(config)


LAUNCHERS: Mapping[str, Callable[[LaunchConfig], Launcher]] = {"local": LocalLauncher, "ray": _ray}
"""Each launcher's name (the value of ``--launcher``) and how it is made from the run's config."""


def make_launcher(name: str, config: LaunchConfig) -> Launcher:
    """The launcher called ``name``, for a run of ``config``; an unknown name is a :class:`ConfigError`."""
    if name not in LAUNCHERS:
        raise ConfigError(f"--launcher {name!r} is not a launcher; use one of: {', '.join(LAUNCHERS)}")
    return LAUNCHERS[name](config)


__all__ = ["LAUNCHERS", "LaunchConfig", "Launcher", "make_launcher"]
