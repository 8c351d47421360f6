"""Connecting to Ray as ``--ray.address`` says: a running cluster (``auto``, ``HOST:PORT``, ``ray://...``) or a
private instance on this machine (``local``); with the env files uploaded, and errors that say how to get a cluster.

Ray is imported here, when a run connects, never when the package is imported.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
from collections.abc import Iterator
from typing import Any

from plugrl_env_client.errors import ConfigError
from plugrl_env_client.launch.config import RayConfig
from plugrl_env_client.launch.ray.placement import Demand
from plugrl_env_client.launch.ray.signals import handlers_kept
from plugrl_env_client.launch.ray.sources import ShippedSources
from plugrl_env_client.redaction import hide_secrets_of_this_process
from plugrl_env_client.rollout.signals import shielded

logger = logging.getLogger(__name__)

UPLOAD_EXCLUDES = [".git", "__pycache__", "*.pyc", ".venv", "runs"]

BEYOND_LOOPBACK = ("--ray.address local: the private Ray instance listens on every network interface (its GCS, "
                   "raylet, worker and dashboard-agent gRPC ports, its agents' HTTP and metrics ports): Ray binds "
                   "them to all interfaces and has no setting for loopback only; keep this machine's ports closed "
                   "to untrusted networks (docs/ray.md, 'Network')")
"""Said once per run with a private instance (Ray's own services, which the run needs, cannot be kept off the
network; the dashboard's web UI, which it does not need, is not started)."""


def import_ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise ConfigError(f"--launcher ray needs Ray: pip install 'plugrl-env-client[ray]' ({exc})") from None
    return ray


@contextlib.contextmanager
def connected(ray: Any, config: RayConfig, demand: Demand, num_procs: int, shipped: ShippedSources) -> Iterator[None]:
    """Connect to Ray as ``--ray.address`` says, for the block. A program that initialized Ray itself keeps its
    connection (then env files are not uploaded: they must exist at the same paths on the workers)."""
    if ray.is_initialized():
        if shipped.uploads:
            logger.info("Ray was initialized by the caller: env files are not uploaded (%s)", ", ".join(shipped.uploads))
        yield
        return
    kwargs: dict[str, Any] = {"logging_level": logging.WARNING, "log_to_driver": True}
    # Ray records the driver's command line (as the OS shows it) as the job's entrypoint: no secret may be in it.
    hide_secrets_of_this_process()
    if config.address == "local":
        logger.warning(BEYOND_LOOPBACK)
        cpus = max(os.cpu_count() or 1, math.ceil(demand.cpus * num_procs))
        # Ray runs its workers at nice 15 by default, below everything else on the machine; the processes are this
        # run's main work (and local processes run at the default priority).
        kwargs.update(address="local", include_dashboard=False, num_cpus=cpus,
                      resources={k: v * num_procs for k, v in demand.resources.items()} or None,
                      _system_config={"worker_niceness": 0})
    else:
        kwargs["address"] = config.address
        if shipped.uploads:
            kwargs["runtime_env"] = {"py_modules": list(shipped.uploads), "excludes": UPLOAD_EXCLUDES}
    with handlers_kept():
        try:
            _init(ray, kwargs)
        except ConnectionError as exc:
            _cleanup(ray)
            found = "no running Ray cluster found" if config.address == "auto" else f"no Ray cluster there ({exc})"
            raise ConfigError(
                f"--ray.address {config.address}: {found}. Start one with `ray start --head` (and `ray start "
                "--address HEAD:6379` on the other machines), or pass --ray.address local for a private instance on "
                "this machine"
            ) from None
        except (ValueError, RuntimeError) as exc:
            _cleanup(ray)
            raise ConfigError(f"--ray.address {config.address}: Ray could not start or connect: {exc}") from None
        except BaseException:  # interrupted while starting
            _cleanup(ray)
            raise
    try:
        if config.address == "local" and demand.gpus > 0:
            have = ray.cluster_resources().get("GPU", 0)
            if have < demand.gpus * num_procs:
                raise ConfigError(f"{num_procs} processes x --ray.num-gpus-per-proc {demand.gpus} need "
                                  f"{demand.gpus * num_procs:g} GPUs; this machine has {have:g}")
        yield
    finally:
        _cleanup(ray)


CLIENT_SERVER_FAILED = ("Starting Ray client server failed", "start_specific_server")
"""What a Ray Client proxy answers when the server process it starts for this driver died at once (its message, or
the proxy's traceback through ``start_specific_server``). Seen under load (the proxy forks it while gRPC threads
run); the next connection gets a new one."""


def _init(ray: Any, kwargs: dict[str, Any], attempts: int = 2) -> None:
    """``ray.init``, tried once more when a Ray Client proxy failed to start this driver's server."""
    for attempt in range(1, attempts + 1):
        try:
            ray.init(**kwargs)
            return
        except ConnectionError as exc:
            if not any(sign in str(exc) for sign in CLIENT_SERVER_FAILED) or attempt == attempts:
                raise
            logger.warning("--ray.address %s: the Ray Client server for this run failed to start; connecting again",
                           kwargs.get("address"))
            _cleanup(ray)


def _cleanup(ray: Any) -> None:
    """Disconnect (and stop a private instance), whatever a failed or interrupted start left behind."""
    with shielded(), contextlib.suppress(Exception):
        ray.shutdown()
