"""``--launcher ray``: connect to Ray, place the processes, supervise them, and leave nothing behind."""

from __future__ import annotations

import sys

from plugrl_env_client.envs.discovery import EnvSources
from plugrl_env_client.envs.registry import get_spec
from plugrl_env_client.launch.process import ProcessJob
from plugrl_env_client.launch.ray import sources as ray_sources
from plugrl_env_client.launch.ray.cluster import connected, import_ray
from plugrl_env_client.launch.ray.config import RayConfig
from plugrl_env_client.launch.ray.placement import Demand, Placement
from plugrl_env_client.launch.ray.signals import signals_remembered
from plugrl_env_client.launch.ray.supervisor import Supervisor
from plugrl_env_client.outputs.run_writer import RunWriter
from plugrl_env_client.rollout.budget import EpisodeBudget
from plugrl_env_client.rollout.signals import shielded


def launch_ray(jobs: list[ProcessJob], budget: EpisodeBudget, writer: RunWriter, sources: EnvSources,
               ray_config: RayConfig) -> None:
    """Run ``jobs`` as Ray actors; every report lands in ``writer`` and ``budget``'s counters stay current for
    the progress bar. Raises the interrupt when this process was interrupted."""
    ray = import_ray()
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
