"""Where the actors go: what one process asks of Ray (``--ray.num-cpus-per-proc``, ``--ray.num-gpus-per-proc``,
``--ray.resources``), and one placement-group bundle per process, spread over nodes or packed onto few."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import time
from typing import Any

from plugrl_env_client.errors import ConfigError
from plugrl_env_client.launch.config import RayConfig
from plugrl_env_client.rollout.signals import shielded

logger = logging.getLogger(__name__)

PLACEMENT_WARNING_S = 30.0
"""How long placement may take before the driver says what it is waiting for (and again every so often)."""


@dataclasses.dataclass(frozen=True)
class Demand:
    """What one process asks of Ray."""

    cpus: float
    gpus: float
    resources: dict[str, float]

    @classmethod
    def from_config(cls, config: RayConfig) -> Demand:
        try:
            resources = json.loads(config.resources or "{}")
        except json.JSONDecodeError as exc:
            raise ConfigError(f"--ray.resources must be a JSON object such as '{{\"sim\": 1}}', got "
                              f"{config.resources!r} ({exc})") from None
        if not isinstance(resources, dict) or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
                for v in resources.values()):
            raise ConfigError(f"--ray.resources must map resource names to amounts >= 0, got {config.resources!r}")
        for reserved in ("CPU", "GPU"):
            if reserved in resources:
                raise ConfigError(f"--ray.resources: ask for {reserved}s with --ray.num-{reserved.lower()}s-per-proc")
        if config.num_cpus_per_proc < 0 or config.num_gpus_per_proc < 0:
            raise ConfigError("--ray.num-cpus-per-proc and --ray.num-gpus-per-proc must be >= 0")
        if config.max_restarts < 0:
            raise ConfigError(f"--ray.max-restarts must be >= 0, got {config.max_restarts}")
        return cls(config.num_cpus_per_proc, config.num_gpus_per_proc,
                   {str(k): float(v) for k, v in resources.items() if v > 0})

    def bundle(self) -> dict[str, float]:
        out = {"CPU": self.cpus, "GPU": self.gpus, **self.resources}
        return {k: v for k, v in out.items() if v > 0}


class Placement:
    """Where the actors go: one placement-group bundle per process (SPREAD or PACK), or Ray's own spread/default
    scheduling when a process asks for no resources at all."""

    def __init__(self, ray: Any, group: Any, strategy: str) -> None:
        self._ray, self.group, self._strategy = ray, group, strategy

    @classmethod
    def create(cls, ray: Any, demand: Demand, placement: str, num_procs: int) -> Placement:
        bundle = demand.bundle()
        if not bundle:
            return cls(ray, None, "SPREAD" if placement == "spread" else "DEFAULT")
        from ray.util.placement_group import placement_group

        group = placement_group([dict(bundle) for _ in range(num_procs)], strategy=placement.upper())
        try:
            _wait_placed(ray, group, bundle, num_procs, placement)
        except BaseException:
            with shielded():
                ray.util.remove_placement_group(group)
            raise
        return cls(ray, group, placement.upper())

    def strategy(self, process_id: int) -> Any:
        if self.group is None:
            return self._strategy
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        return PlacementGroupSchedulingStrategy(self.group, placement_group_bundle_index=process_id)

    def remove(self) -> None:
        if self.group is not None:
            with contextlib.suppress(Exception):
                self._ray.util.remove_placement_group(self.group)


def _wait_placed(ray: Any, group: Any, bundle: dict[str, float], num_procs: int, placement: str) -> None:
    ready = group.ready()
    started = time.monotonic()
    warned_at = started
    while not ray.wait([ready], timeout=1.0)[0]:
        if time.monotonic() - warned_at >= PLACEMENT_WARNING_S:
            warned_at = time.monotonic()
            available = {k: round(v, 3) for k, v in ray.available_resources().items()
                         if k in bundle or k in ("CPU", "GPU")}
            logger.warning(
                "waiting %.0fs for Ray to place %d processes (%s each, %s); the cluster has %s available: add "
                "nodes, or lower --num-procs / --ray.num-cpus-per-proc (Ctrl-C to give up)",
                warned_at - started, num_procs, bundle, placement, available,
            )
