"""The Ray launcher (``--launcher ray``, extra ``ray``): each of ``--num-procs`` processes is a Ray actor.

Ray only places, supervises and reports: an actor runs the same rollout as a local process (its own env batch and
its own WebSocket to the policy server). What the actors report (finished episodes, timing, log lines, their
result) streams home to this process, the driver, which feeds the run's :class:`RunWriter`, so the run folder
looks as for a local run. Where the processes ran is added as ``ray_nodes.json`` (per node: processes, env steps,
episodes, env-steps/s), and every forwarded log line names its process and node (``proc_003@10.0.0.5``).

``--num-episodes`` stays exact through actor deaths: an episode counts when its record reaches the driver, and
actors claim episodes against leases the driver hands out (see :mod:`.ray_budget`). An actor whose process dies
(killed, node lost) is restarted by Ray up to ``--ray.max-restarts`` times; the driver then starts a new epoch on
it with fresh seeds (seed + epoch x num_procs x num_envs, so no episode repeats an earlier one), and its recorded
episodes stay counted once. Beyond the limit the process is reported FAILED with the reason and the others go on.
A process that fails by itself (an env error, a server that refuses the run) stops the run, as locally.

Ctrl-C / SIGTERM: every actor is told to stop (it finishes its step and reports), the driver waits for their
reports (at most ``DRAIN_TIMEOUT_S``; a second signal stops waiting), kills what is left, and re-raises.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import pickle
import signal
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

from plugrl_env_client.envs.discovery import EnvSources
from plugrl_env_client.envs.registry import get_spec
from plugrl_env_client.errors import ConfigError
from plugrl_env_client.launch import ray_sources
from plugrl_env_client.launch.process import ProcessJob
from plugrl_env_client.launch.ray_budget import Grant, LeaseBook
from plugrl_env_client.launch.ray_config import RayConfig
from plugrl_env_client.launch.ray_sources import ShippedSources
from plugrl_env_client.launch.ray_worker import RolloutActor
from plugrl_env_client.outputs.logs import handle_forwarded
from plugrl_env_client.outputs.run_dir import write_json_atomic
from plugrl_env_client.outputs.run_writer import RunWriter
from plugrl_env_client.records import ProcessResult, ProcessStatus
from plugrl_env_client.rollout.budget import EpisodeBudget
from plugrl_env_client.rollout.signals import Interrupted, deferred_interrupts, shielded
from plugrl_env_client.timing import Timing
from plugrl_env_client.version import __version__

logger = logging.getLogger(__name__)

POLL_S = 0.2
"""Longest wait for actor reports before the driver looks at its stop flag and timers again."""
START_RETRY_S = 120.0
"""How long a start is sent again while Ray reports the restarted actor as unavailable (still coming back)."""
DRAIN_TIMEOUT_S = 30.0
"""After a stop: how long actors get to finish their step and report before they are killed."""
PLACEMENT_WARNING_S = 30.0
"""How long placement may take before the driver says what it is waiting for (and again every so often)."""
NODES_PERIOD_S = 10.0
NODES_FILE = "ray_nodes.json"
UPLOAD_EXCLUDES = [".git", "__pycache__", "*.pyc", ".venv", "runs"]
LOOPBACK = ("127.0.0.1", "localhost", "::1", "0.0.0.0")


def launch_ray(jobs: list[ProcessJob], budget: EpisodeBudget, writer: RunWriter, sources: EnvSources,
               ray_config: RayConfig) -> None:
    """Run ``jobs`` as Ray actors; every report lands in ``writer`` and ``budget``'s counters stay current for
    the progress bar. Raises the interrupt when this process was interrupted."""
    ray = _import_ray()
    demand = Demand.from_config(ray_config)
    shipped = ray_sources.prepare(sources, _main_script(jobs[0].env_id))
    with _signals_remembered() as signals:
        try:
            with _connected(ray, ray_config, demand, len(jobs), shipped):
                placement = Placement.create(ray, demand, ray_config.placement, len(jobs))
                try:
                    Supervisor(ray, jobs, budget, writer, shipped, placement, demand, ray_config).run()
                finally:
                    with shielded():
                        placement.remove()
        except KeyboardInterrupt as exc:
            raise signals.named(exc) from None


# ------------------------------------------------------------------------------------------------ connecting


def _import_ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise ConfigError(f"--launcher ray needs Ray: pip install 'plugrl-env-client[ray]' ({exc})") from None
    return ray


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


@contextlib.contextmanager
def _connected(ray: Any, config: RayConfig, demand: Demand, num_procs: int, shipped: ShippedSources) -> Iterator[None]:
    """Connect to Ray as ``--ray.address`` says, for the block. A program that initialized Ray itself keeps its
    connection (then env files are not uploaded: they must exist at the same paths on the workers)."""
    if ray.is_initialized():
        if shipped.uploads:
            logger.info("Ray was initialized by the caller: env files are not uploaded (%s)", ", ".join(shipped.uploads))
        yield
        return
    kwargs: dict[str, Any] = {"logging_level": logging.WARNING, "log_to_driver": True}
    if config.address == "local":
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
    with _signal_handlers_kept():
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


@contextlib.contextmanager
def _signal_handlers_kept() -> Iterator[None]:
    """``ray.init`` installs its own SIGTERM handler; the run's (an orderly stop) must stay."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    kept = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in kept.items():
            if handler is not None:
                signal.signal(sig, handler)


class _Signals:
    last: int | None = None

    def named(self, exc: KeyboardInterrupt) -> KeyboardInterrupt:
        """The interrupt with the signal that caused it (Ray turns one that arrives inside its calls into a plain
        KeyboardInterrupt, which would make a SIGTERM exit as a SIGINT)."""
        if getattr(exc, "signum", None) is not None or self.last is None:
            return exc
        return Interrupted(self.last)


@contextlib.contextmanager
def _signals_remembered() -> Iterator[_Signals]:
    """Note which of SIGINT / SIGTERM arrived, then let the run's own handler act on it."""
    signals = _Signals()
    if threading.current_thread() is not threading.main_thread():
        yield signals
        return
    previous = {sig: handler for sig in (signal.SIGINT, signal.SIGTERM)
                if callable(handler := signal.getsignal(sig))}  # a default or ignored signal stays as it is

    def note(signum: int, frame: Any) -> None:
        signals.last = signum
        previous[signal.Signals(signum)](signum, frame)

    for sig in previous:
        signal.signal(sig, note)
    try:
        yield signals
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _main_script(env_id: str) -> str | None:
    """The script the env was defined in, when it is this process's ``__main__`` (``python my_env.py ...``)."""
    spec = get_spec(env_id)
    if "__main__" not in (spec.env_cls.__module__, spec.config_cls.__module__):
        return None
    return getattr(sys.modules.get("__main__"), "__file__", None)


# ------------------------------------------------------------------------------------------------ placement


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


# ------------------------------------------------------------------------------------------------ supervision


@dataclasses.dataclass
class _Epoch:
    """One run of one actor: where it ran and what it did there."""

    node: dict[str, Any] | None = None
    timing: Timing = dataclasses.field(default_factory=Timing)
    episodes: int = 0


@dataclasses.dataclass
class _Proc:
    job: ProcessJob
    actor: Any
    epoch: int = 0
    deaths: int = 0
    call: Any = None
    """The actor call in flight: ``start`` of the current epoch, then one ``poll`` after another."""
    calling: str = ""
    start_args: tuple[Any, ...] = ()
    """The arguments of the current epoch's ``start`` call (sent again while Ray is still restarting the actor)."""
    started_at: float = 0.0
    start_warned: bool = False
    result: ProcessResult | None = None
    done: bool = False
    history: list[_Epoch] = dataclasses.field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.job.process_id

    @property
    def current(self) -> _Epoch:
        return self.history[-1]

    def timing(self) -> Timing:
        """Over every epoch: counters and seconds summed (epochs run one after the other)."""
        out = Timing()
        for part in self.history:
            for field in dataclasses.fields(Timing):
                setattr(out, field.name, getattr(out, field.name) + getattr(part.timing, field.name))
        return out

    def tag(self) -> str:
        node = self.current.node if self.history else None
        return f"proc_{self.pid:03d}" + (f"@{node['ip']}" if node else "")


class Supervisor:
    """Starts the actors, streams their reports into the writer, restarts epochs of dead actors, stops them."""

    def __init__(self, ray: Any, jobs: list[ProcessJob], budget: EpisodeBudget, writer: RunWriter,
                 shipped: ShippedSources, placement: Placement, demand: Demand, config: RayConfig) -> None:
        self.ray, self.budget, self.writer, self.config = ray, budget, writer, config
        self.shipped, self.placement, self.demand = shipped, placement, demand
        cfg = jobs[0].config
        self.book = LeaseBook(cfg.num_episodes, cfg.num_procs, cfg.runner.episode_split)
        self.jobs = jobs
        self.procs: list[_Proc] = []
        self._controls: list[Any] = []  # control calls in flight (collected, so Ray never warns of lost errors)
        self._stop_sent = False
        self._finals_sent: set[tuple[int, int]] = set()
        self._warned: set[str] = set()
        self._driver_ip = ray.util.get_node_ip_address()
        self._lock_name = uuid.uuid4().hex[:12]
        self._nodes_written = time.monotonic()

    # ------------------------------------------------------------------------------------------ the run

    def run(self) -> None:
        interrupted: KeyboardInterrupt | None = None
        try:
            self._start_actors()
            self._loop(deadline=None)
        except KeyboardInterrupt as exc:
            interrupted = exc
            self._stop_all()
            try:
                self._loop(deadline=time.monotonic() + DRAIN_TIMEOUT_S)
            except KeyboardInterrupt:
                logger.warning("second interrupt: not waiting for the Ray actors to report")
        finally:
            with shielded():
                self._kill_all()
                self._close_results(interrupted is not None)
                self._write_nodes(final=True)
        if interrupted is not None:
            raise interrupted

    def _start_actors(self) -> None:
        remote = self.ray.remote(RolloutActor)
        lock = self._lock_name if self.jobs[0].config.runner.use_env_lock else None
        for job in self.jobs:
            actor = remote.options(
                num_cpus=self.demand.cpus,
                num_gpus=self.demand.gpus,
                resources=self.demand.resources or None,
                max_restarts=self.config.max_restarts,
                max_task_retries=0,
                max_concurrency=4,  # start or poll, control, and a superseded epoch's poll winding down
                scheduling_strategy=self.placement.strategy(job.process_id),
            ).remote(job.process_id, self.shipped, lock)
            self.procs.append(_Proc(job, actor))
        for proc in self.procs:
            self._start_epoch(proc)

    def _start_epoch(self, proc: _Proc) -> None:
        job = proc.job
        cfg = job.config
        if proc.epoch > 0 and cfg.runner.seed is not None:  # fresh seeds: a restart must not replay episodes
            seed = cfg.runner.seed + proc.epoch * cfg.num_procs * cfg.num_envs
            job = dataclasses.replace(job, config=dataclasses.replace(
                cfg, runner=dataclasses.replace(cfg.runner, seed=seed)))
        grant = self.book.start(proc.pid, proc.epoch)
        proc.history.append(_Epoch())
        proc.start_args = (pickle.dumps(job), proc.epoch, cfg.num_episodes, grant)
        proc.call, proc.calling = proc.actor.start.remote(*proc.start_args), "start"
        proc.started_at, proc.start_warned = time.monotonic(), False

    def _loop(self, deadline: float | None) -> None:
        while any(p.call is not None for p in self.procs):
            if deadline is not None and time.monotonic() > deadline:
                return
            calls = {p.call: p for p in self.procs if p.call is not None}
            ready, _ = self.ray.wait(list(calls), num_returns=1, timeout=POLL_S)
            if ready:
                ready, _ = self.ray.wait(list(calls), num_returns=len(calls), timeout=0)
            for ref in ready:
                self._advance(calls[ref])
            self._housekeeping()

    def _advance(self, proc: _Proc) -> None:
        """Take the answer of ``proc``'s call (it is ready) and make the next one; or see how the epoch ended."""
        exceptions = self.ray.exceptions
        try:
            answer = self.ray.get(proc.call)
        except exceptions.RayTaskError as exc:  # our code raised in the actor: a bug, not a lost actor
            self._epoch_failed(proc, f"internal error in the Ray actor: {exc}")
            return
        except exceptions.ActorUnavailableError as exc:
            # Ray is still bringing a restarted actor back (seconds on a loaded machine): that death was counted
            # already, so the start is sent again; Ray ends the wait itself (the actor dies) if it cannot restart.
            if proc.calling == "start" and time.monotonic() - proc.started_at < START_RETRY_S:
                time.sleep(POLL_S)  # Ray answers at once while the actor is down: do not spin on it
                proc.call = proc.actor.start.remote(*proc.start_args)
                return
            self._actor_died(proc, exc)
            return
        except exceptions.RayError as exc:  # the actor died, or its node was lost
            self._actor_died(proc, exc)
            return
        if proc.calling == "start":
            self._placed(proc, answer)
        else:
            batch, closed = answer
            for message in batch:
                self._deliver(proc, message)
            if closed:
                self._epoch_ended(proc)
                return
        proc.call, proc.calling = proc.actor.poll.remote(proc.epoch), "poll"

    def _deliver(self, proc: _Proc, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == "episode":
            with deferred_interrupts():  # counted and written as one
                if self.book.record(proc.pid, proc.epoch):
                    if self.budget.claim(proc.pid):
                        self.writer.episode(message[1])
                        proc.current.episodes += 1
                    else:
                        logger.warning("process %d: an episode beyond the run's budget was dropped", proc.pid)
        elif kind == "steps":
            self.budget.add_env_steps(int(message[1]))
        elif kind == "progress":
            proc.current.timing = message[3]
            self.writer.progress(proc.pid, message[2], proc.timing())
        elif kind == "artifact":
            self.writer.artifact(*message[1:])
        elif kind == "log":
            record = message[1]
            record.processName = proc.tag()
            handle_forwarded(record)
        elif kind == "lease":
            grant = self.book.request(proc.pid, proc.epoch, int(message[1]))
            if grant is not None:
                self._control(proc, grant=grant)
        elif kind == "result":
            proc.result = message[1]

    def _housekeeping(self) -> None:
        if self.budget.stop.is_set() and not self._stop_sent:
            self._stop_all()
        for pid, grant in self.book.finals().items():
            proc = self.procs[pid]
            if (pid, proc.epoch) not in self._finals_sent:
                self._finals_sent.add((pid, proc.epoch))
                self._control(proc, grant=grant)
        if self._controls:
            done, self._controls = self.ray.wait(self._controls, num_returns=len(self._controls), timeout=0)
            for ref in done:
                with contextlib.suppress(self.ray.exceptions.RayError):
                    self.ray.get(ref)
        for proc in self.procs:
            if proc.calling == "start" and proc.call is not None and not proc.start_warned \
                    and time.monotonic() - proc.started_at >= PLACEMENT_WARNING_S:
                proc.start_warned = True
                logger.warning("process %d: Ray has not (re)started its actor for %.0fs; no node may have room for it "
                               "(%s): add nodes, or Ctrl-C to stop", proc.pid, PLACEMENT_WARNING_S, self.demand.bundle())
        if time.monotonic() - self._nodes_written >= NODES_PERIOD_S:
            self._write_nodes()

    # ------------------------------------------------------------------------------------------ how epochs end

    def _epoch_ended(self, proc: _Proc) -> None:
        """The epoch's last batch is in, with its result (or without one, which is a bug)."""
        proc.call = None
        self._push_pool(self.book.end(proc.pid))
        result = proc.result or ProcessResult(proc.pid, ProcessStatus.FAILED, "ended without reporting how")
        if result.status is ProcessStatus.FAILED:
            node = proc.current.node
            where = f" (on node {node['ip']}, {node['hostname']})" if node else ""
            result = dataclasses.replace(result, error=f"{result.error or 'failed'}{where}")
            self.budget.stop.set()  # as with local processes: one failing stops the run
        self._finish(proc, result)

    def _epoch_failed(self, proc: _Proc, error: str) -> None:
        proc.call = None
        self._push_pool(self.book.end(proc.pid))
        logger.error("process %d: %s", proc.pid, error)
        self.budget.stop.set()
        self._finish(proc, ProcessResult(proc.pid, ProcessStatus.FAILED, error))

    def _actor_died(self, proc: _Proc, exc: BaseException) -> None:
        """The actor's process is gone (killed, out of memory, node lost): restart the epoch, or give up on it."""
        proc.call = None
        proc.deaths += 1
        self._push_pool(self.book.end(proc.pid))
        node = proc.current.node
        where = f"on node {node['ip']} ({node['hostname']})" if node else "before it reported its node"
        reason = _first_line(exc)
        if self.budget.stop.is_set():
            self._finish(proc, ProcessResult(proc.pid, ProcessStatus.INTERRUPTED))
        elif self._no_more_needed(proc):
            self._finish(proc, ProcessResult(proc.pid, ProcessStatus.FINISHED))
        elif proc.deaths > self.config.max_restarts:
            error = (f"its Ray actor was lost {where}: it died {proc.deaths} times, more than --ray.max-restarts "
                     f"{self.config.max_restarts} allows (last: {reason})")
            logger.error("process %d: %s; the other processes go on", proc.pid, error)
            with contextlib.suppress(Exception):
                self.ray.kill(proc.actor, no_restart=True)
            self._finish(proc, ProcessResult(proc.pid, ProcessStatus.FAILED, error))
        else:
            logger.warning("process %d: its Ray actor died %s (%s); Ray restarts it (restart %d of %d)",
                           proc.pid, where, reason, proc.deaths, self.config.max_restarts)
            proc.epoch += 1
            self._start_epoch(proc)

    def _no_more_needed(self, proc: _Proc) -> bool:
        if self.book.target is None:
            return False
        if self.book.split == "static":
            return self.book.remaining_share(proc.pid) == 0
        return self.book.reached

    def _finish(self, proc: _Proc, result: ProcessResult) -> None:
        proc.done = True
        proc.result = result
        self.writer.progress(proc.pid, result.status, proc.timing())
        self.writer.result(result)

    # ------------------------------------------------------------------------------------------ talking to actors

    def _placed(self, proc: _Proc, node: dict[str, Any]) -> None:
        proc.current.node = node
        logger.info("process %d (epoch %d) runs on node %s (%s, pid %s)", proc.pid, proc.epoch, node["ip"],
                    node["hostname"], node["pid"])
        if node["version"] != __version__ and f"version:{node['node_id']}" not in self._warned:
            self._warned.add(f"version:{node['node_id']}")
            logger.warning("node %s runs plugrl-env-client %s, this driver %s: install the same version on every "
                           "node", node["ip"], node["version"], __version__)
        host = urlsplit(proc.job.url).hostname or ""
        if host in LOOPBACK and node["ip"] != self._driver_ip and "loopback" not in self._warned:
            self._warned.add("loopback")
            logger.warning(
                "process %d runs on node %s but connects to %s, a loopback address (that node itself, not this "
                "machine): start the policy server with --host 0.0.0.0 and pass --server-url "
                "ws://<its address>:<port>", proc.pid, node["ip"], proc.job.url)

    def _control(self, proc: _Proc, grant: Grant | None = None, stop: bool = False) -> None:
        self._controls.append(proc.actor.control.remote(proc.epoch, grant, stop))

    def _push_pool(self, pushes: dict[int, Grant]) -> None:
        for pid, grant in pushes.items():
            self._control(self.procs[pid], grant=grant)

    def _stop_all(self) -> None:
        """Every actor stops after its current step and reports."""
        self.budget.stop.set()
        self._stop_sent = True
        for proc in self.procs:
            if proc.call is not None:
                self._control(proc, stop=True)

    def _kill_all(self) -> None:
        for proc in self.procs:
            with contextlib.suppress(Exception):
                self.ray.kill(proc.actor, no_restart=True)

    def _close_results(self, interrupted: bool) -> None:
        """Every process gets a result: the actors that did not report were stopped (interrupted) or are a bug."""
        for proc in self.procs:
            if proc.done:
                continue
            proc.call = None
            status = ProcessStatus.INTERRUPTED if interrupted else ProcessStatus.FAILED
            self._finish(proc, ProcessResult(proc.pid, status, None if interrupted else "ended without reporting"))

    # ------------------------------------------------------------------------------------------ where it ran

    def _write_nodes(self, final: bool = False) -> None:
        """``ray_nodes.json``: per node, the processes that ran there and their env steps, episodes and
        env-steps/s (summed over the processes on it); per process, its node(s) and restarts."""
        self._nodes_written = time.monotonic()
        nodes: dict[str, dict[str, Any]] = {}
        processes: dict[str, Any] = {}
        per_node_time: dict[tuple[str, int], list[float]] = {}
        for proc in self.procs:
            placed = [e for e in proc.history if e.node is not None]
            processes[str(proc.pid)] = {
                "node_id": placed[-1].node["node_id"] if placed else None,  # type: ignore[index]
                "ip": placed[-1].node["ip"] if placed else None,  # type: ignore[index]
                "restarts": max(len(proc.history) - 1, 0),
                "nodes": [e.node["node_id"] for e in placed],  # type: ignore[index]
            }
            for e in placed:
                assert e.node is not None
                entry = nodes.setdefault(e.node["node_id"], {
                    "ip": e.node["ip"], "hostname": e.node["hostname"], "processes": [], "env_steps": 0,
                    "completed_episodes": 0, "env_steps_per_s": 0.0})
                if proc.pid not in entry["processes"]:
                    entry["processes"].append(proc.pid)
                entry["env_steps"] += e.timing.env_steps
                entry["completed_episodes"] += e.episodes
                spent = per_node_time.setdefault((e.node["node_id"], proc.pid), [0.0, 0.0])
                spent[0] += e.timing.env_steps
                spent[1] += e.timing.collect_time_s
        for (node_id, _pid), (steps, seconds) in per_node_time.items():
            if seconds > 0:
                nodes[node_id]["env_steps_per_s"] = round(nodes[node_id]["env_steps_per_s"] + steps / seconds, 3)
        try:
            write_json_atomic(self.writer.run_dir.root / NODES_FILE, {"nodes": nodes, "processes": processes})
        except OSError as exc:
            logger.warning("could not write %s: %s", NODES_FILE, exc)
        if final:
            for node_id, entry in nodes.items():
                logger.info("node %s (%s, %s): processes %s, %d env steps, %d episodes, %.0f env-steps/s", entry["ip"],
                            entry["hostname"], node_id[:12], entry["processes"], entry["env_steps"],
                            entry["completed_episodes"], entry["env_steps_per_s"])


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".strip()
