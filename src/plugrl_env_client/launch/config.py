"""What the launchers read of a run's config: :class:`LaunchConfig` (every launcher) and the Ray launcher's section
of the command line (``--ray.*``, :class:`RayConfig`), apart from the launchers so that reading the command line
never imports Ray (``launch/ray/`` is imported when a run asks for ``--launcher ray``)."""

from __future__ import annotations

import dataclasses
from typing import Literal, Protocol

from plugrl_env_client.launch.process import RunConfig


@dataclasses.dataclass
class RayConfig:
    """Where and how --launcher ray places the processes (extra ray)."""

    address: str = "auto"
    """auto (a running cluster), ray://host:port, or local (start a private instance on this machine)."""
    num_cpus_per_proc: float = 1.0
    """CPUs Ray reserves for each process (fractions allowed)."""
    num_gpus_per_proc: float = 0.0
    """GPUs Ray reserves for each process (fractions share a GPU; 0: none)."""
    resources: str = "{}"
    """Custom resources each process needs, as a JSON object, e.g. '{"sim": 1}'."""
    placement: Literal["spread", "pack"] = "spread"
    """spread: processes on as many nodes as possible; pack: on as few as possible."""
    max_restarts: int = 3
    """How often Ray restarts a process whose actor died (killed, node lost) before the run goes on without it."""


class LaunchConfig(RunConfig, Protocol):
    """What the launchers read of a run's config besides what each process reads: the command line's
    ``ClientConfig`` is one (this layer does not import it)."""

    @property
    def ray(self) -> RayConfig: ...
