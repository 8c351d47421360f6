"""``--launcher ray``: connect to Ray, place the processes, supervise them, and leave nothing behind."""

from __future__ import annotations

import sys
from typing import ClassVar

from plugrl_env_client.envs.base_env import BaseEnv
from plugrl_env_client.envs.discovery import EnvSources
from plugrl_env_client.envs.registry import get_spec
from plugrl_env_client.launch.config import LaunchConfig
from plugrl_env_client.launch.process import ProcessJob
from plugrl_env_client.launch.ray import sources as ray_sources
from plugrl_env_client.launch.ray.cluster import connected, import_ray
from plugrl_env_client.launch.ray.placement import Demand, Placement
from plugrl_env_client.launch.ray.signals import signals_remembered
from plugrl_env_client.launch.ray.supervisor import Supervisor
from plugrl_env_client.outputs.run_writer import RunWriter
from plugrl_env_client.rollout.budget import EpisodeBudget
from plugrl_env_client.rollout.signals import shielded


class RayLauncher:
    """``--launcher ray``: each job is a Ray actor, placed and supervised as ``--ray.*`` says."""

    in_process: ClassVar[bool] = False

    def __init__(self, config: LaunchConfig) -> None:
        self._config = config.ray

    def launch(self, jobs: list[ProcessJob], budget: EpisodeBudget, writer: RunWriter,
               sources: EnvSources = EnvSources(), env: BaseEnv | None = None) -> None:
        """Run ``jobs`` as Ray actors (``env`` is never used: every actor builds its own); every report lands in
        ``writer`` and ``budget``'s counters stay current for the progress bar. Raises the interrupt when this
        process was interrupted."""
        ray, ray_config = import_ray(), self._config
        demand = Demand.from_config(ray_config)
        shipped = ray_sources.prepare(sources, _main_script(jobs[0].env_id))
        with signals_remembered() as signals:
            try:
                with connected(ray, ray_config, demand, len(jobs), shipped):
                    placement = Placement.create(ray, demand, ray_config.placement, len(jobs))
                    try:
                        Supervisor(ray, jobs, budget, writer, shipped, placement, demand, ray_config).run()
                    finally:
                        with shielded():
                            placement.remove()
            except KeyboardInterrupt as exc:
                raise signals.named(exc) from None


def _main_script(env_id: str) -> str | None:
    """The script the env was defined in, when it is this process's ``__main__`` (``python my_env.py ...``)."""
    spec = get_spec(env_id)
    if "__main__" not in (spec.env_cls.__module__, spec.config_cls.__module__):
        return None
    return getattr(sys.modules.get("__main__"), "__file__", None)
