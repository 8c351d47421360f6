"""The driver's side of a Ray run: start one actor per process, stream their reports into the run's writer, keep
the episode count exact through actor deaths (new epochs, fresh seeds), and stop them all on a signal or a failure.

The driver keeps one call in flight per actor (``start``, then one ``poll`` after another) and waits on all of
them at once; every report is delivered as a local launcher delivers it (:mod:`plugrl_env_client.launch.reports`),
after the driver has counted what it must count: an episode against the leases (:mod:`.budget`), a process's
timing across its epochs, a log line tagged with its process and node.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import pickle
import time
import uuid
from typing import Any
from urllib.parse import urlsplit

from plugrl_env_client.errors import OutputError
from plugrl_env_client.launch.config import RayConfig
from plugrl_env_client.launch.process import ProcessJob
from plugrl_env_client.launch.ray.budget import Grant, LeaseBook
from plugrl_env_client.launch.ray.nodes import NODES_PERIOD_S, Epoch, write_nodes
from plugrl_env_client.launch.ray.placement import PLACEMENT_WARNING_S, Demand, Placement
from plugrl_env_client.launch.ray.sources import ShippedSources
from plugrl_env_client.launch.ray.worker import LeaseRequest, Message, RolloutActor, StepsReport
from plugrl_env_client.launch.reports import EpisodeReport, LogReport, ProgressReport, ResultReport
from plugrl_env_client.outputs.run_writer import RunWriter
from plugrl_env_client.records import ProcessResult, ProcessStatus
from plugrl_env_client.redaction import redact_url
from plugrl_env_client.rollout.budget import EpisodeBudget
from plugrl_env_client.rollout.signals import deferred_interrupts, shielded
from plugrl_env_client.timing import Timing
from plugrl_env_client.version import __version__

logger = logging.getLogger(__name__)

POLL_S = 0.2
"""Longest wait for actor reports before the driver looks at its stop flag and timers again."""
START_RETRY_S = 120.0
"""How long a start is sent again while Ray reports the restarted actor as unavailable (still coming back)."""
DRAIN_TIMEOUT_S = 30.0
"""After a stop: how long actors get to finish their step and report before they are killed."""
LOOPBACK = ("127.0.0.1", "localhost", "::1", "0.0.0.0")


@dataclasses.dataclass
class _Proc:
    """One process of the run, as the driver follows it: its actor, the call in flight, and its epochs."""

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
    history: list[Epoch] = dataclasses.field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.job.process_id

    @property
    def current(self) -> Epoch:
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
        self.book = LeaseBook(cfg.num_episodes, cfg.num_procs, cfg.runner.episode_split, budget.per_process())
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
        proc.history.append(Epoch())
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
            for report in batch:
                self._deliver(proc, report)
            if closed:
                self._epoch_ended(proc)
                return
        proc.call, proc.calling = proc.actor.poll.remote(proc.epoch), "poll"

    def _deliver(self, proc: _Proc, report: Message) -> None:
        """One report of ``proc``'s current epoch: counted where the driver counts, then delivered to the writer as
        a local launcher delivers it (a result waits for the epoch's end). A run folder that can take no more stops
        the run through the writer, which says so once: the supervisor goes on to stop the actors."""
        try:
            self._dispatch(proc, report)
        except OutputError:
            pass

    def _dispatch(self, proc: _Proc, report: Message) -> None:
        if isinstance(report, EpisodeReport):
            with deferred_interrupts():  # counted and written as one
                if self.book.record(proc.pid, proc.epoch):
                    if self.budget.claim(proc.pid):
                        report.deliver(self.writer)
                        proc.current.episodes += 1
                    else:
                        logger.warning("process %d: an episode beyond the run's budget was dropped", proc.pid)
        elif isinstance(report, StepsReport):
            self.budget.add_env_steps(report.count)
        elif isinstance(report, ProgressReport):
            proc.current.timing = report.timing
            ProgressReport(proc.pid, report.status, proc.timing()).deliver(self.writer)  # over every epoch
        elif isinstance(report, LogReport):
            report.record.processName = proc.tag()
            report.deliver(self.writer)
        elif isinstance(report, LeaseRequest):
            grant = self.book.request(proc.pid, proc.epoch, report.seq)
            if grant is not None:
                self._control(proc, grant=grant)
        elif isinstance(report, ResultReport):
            proc.result = report.result
        else:  # a recorder file: nothing to count
            report.deliver(self.writer)

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
                "ws://<its address>:<port>", proc.pid, node["ip"], redact_url(proc.job.url))

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
        self._nodes_written = time.monotonic()
        if self.writer.failure is not None:  # the run folder can take no more; the writer said so
            return
        write_nodes(self.writer.run_dir.root, {proc.pid: proc.history for proc in self.procs}, final)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".strip()
