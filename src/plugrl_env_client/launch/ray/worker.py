"""One rollout process as a Ray actor: the same :func:`run_process` as a local process, reporting home in batches.

``start`` runs the rollout in a thread of the actor, which reports (finished episodes, timing snapshots, recorder
files, log records, its result: the reports of :mod:`plugrl_env_client.launch.reports`, and lease requests) into an
:class:`Outbox`. The driver keeps one ``poll`` call in flight per actor; it returns what piled up after
``FLUSH_PERIOD_S`` (at once for a lease request or the result). The driver writes the run folder; nothing here
touches it, so the actor may be on any machine. (Polling rather than a streaming generator: Ray Client,
``--ray.address ray://...``, has no streaming generators.)

``control`` is the driver's way in (stop, and lease grants, see :mod:`.budget`). The rollout loop never waits
on it: ``Budget.finished`` reads flags that ``control`` sets, so no remote call happens per loop iteration.

Each ``start`` call is an epoch. Ray restarts an actor whose process died (the driver then starts a new epoch on
it, with fresh seeds): the new epoch builds its env and connects with a fresh infer, exactly as a new process would.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import logging
import os
import platform
import socket
import tempfile
import threading
from typing import Any

from plugrl_env_client.envs.registry import UnknownEnvError, get_spec
from plugrl_env_client.errors import ConfigError, PlugRLError
from plugrl_env_client.launch.process import run_process
from plugrl_env_client.launch.ray import sources as ray_sources
from plugrl_env_client.launch.ray.budget import Grant, LeasedBudget
from plugrl_env_client.launch.ray.sources import ShippedSources
from plugrl_env_client.launch.reports import LogReporter, Report, Reporter, ResultReport
from plugrl_env_client.outputs.logs import forward_logging
from plugrl_env_client.records import ProcessResult, ProcessStatus
from plugrl_env_client.version import __version__

logger = logging.getLogger(__name__)

FLUSH_PERIOD_S = 0.5
"""How often reports go home (a lease request and the result go at once): often enough for the progress bar,
rarely enough that an idle actor costs next to nothing."""


@dataclasses.dataclass(frozen=True)
class StepsReport:
    """Env steps the epoch took since its last poll (the driver's progress bar counts them)."""

    count: int


@dataclasses.dataclass(frozen=True)
class LeaseRequest:
    """The epoch asks for more episodes (``seq`` numbers its requests, see :class:`~.budget.LeasedBudget`)."""

    seq: int


Message = Report | StepsReport | LeaseRequest
"""What an actor sends its driver: the reports every rollout process sends, and its own two."""


class Outbox:
    """Where the rollout inside an actor reports to (through a :class:`Reporter`): its messages wait here for the
    next poll, which a result or a lease request cuts short."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._items: list[Message] = []
        self._urgent = False
        self._closed = False

    def put(self, message: Message) -> None:
        with self._cond:
            self._items.append(message)
            if isinstance(message, (ResultReport, LeaseRequest)):
                self._urgent = True
                self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def take(self, timeout: float) -> tuple[list[Message], bool]:
        """What piled up, once something is urgent, the outbox closed, or ``timeout`` passed; and whether it is
        closed (then nothing more will come)."""
        with self._cond:
            self._cond.wait_for(lambda: self._urgent or self._closed, timeout)
            items, self._items, self._urgent = self._items, [], False
            return items, self._closed


def node_info() -> dict[str, Any]:
    """Where this actor runs, for the driver's log tags and per-node summary."""
    import ray

    return {
        "node_id": ray.get_runtime_context().get_node_id(),
        "ip": ray.util.get_node_ip_address(),
        "hostname": socket.gethostname(),
        "pid": os.getpid(),
        "version": __version__,
        "python": platform.python_version(),
    }


@dataclasses.dataclass
class _Epoch:
    number: int
    budget: LeasedBudget
    outbox: Outbox
    sent_steps: int = 0


class RolloutActor:
    """A rollout process on a Ray worker (the class the driver wraps with ``ray.remote``)."""

    def __init__(self, process_id: int, shipped: ShippedSources, lock_name: str | None = None) -> None:
        # Kept cheap: an exception here would make Ray give the actor up without restarts.
        self.process_id = process_id
        self._shipped = shipped
        self._lock_name = lock_name
        self._remap: dict[str, str] | None = None
        self._state = threading.Condition()
        self._current: _Epoch | None = None
        self._early: dict[int, Grant] = {}  # grants that arrived before their epoch's start call
        self._stopping = False

    def start(self, job_bytes: bytes, epoch: int, target: int | None, grant: Grant) -> dict[str, Any]:
        """Begin ``epoch``: the rollout of the pickled job, in a thread; returns where this actor runs."""
        outbox = Outbox()
        forward_logging(LogReporter(outbox))  # this worker's log lines go home with its reports
        info = node_info()
        current = self._begin(epoch, target, grant, outbox)
        threading.Thread(target=self._rollout, args=(job_bytes, current.budget, outbox, info),
                         name=f"plugrl-rollout-{self.process_id}", daemon=True).start()
        return info

    def poll(self, epoch: int) -> tuple[list[Message], bool]:
        """The reports of ``epoch`` that piled up (waiting up to ``FLUSH_PERIOD_S`` for one to be urgent), and
        whether the epoch is over (then this was its last batch). The driver has one poll in flight at a time."""
        with self._state:
            self._state.wait_for(lambda: self._current is not None and self._current.number >= epoch, FLUSH_PERIOD_S)
            current = self._current
        if current is None or current.number < epoch:
            return [], False  # the start call has not run yet (calls to a threaded actor may overtake each other)
        if current.number > epoch:
            return [], True
        items, closed = current.outbox.take(FLUSH_PERIOD_S)
        steps = current.budget.env_steps
        if steps != current.sent_steps:
            items.insert(0, StepsReport(steps - current.sent_steps))
            current.sent_steps = steps
        return items, closed

    def control(self, epoch: int, grant: Grant | None = None, stop: bool = False) -> None:
        """From the driver: stop collecting (after the current step), and/or a grant for ``epoch``."""
        with self._state:
            current = self._current
            if stop:
                self._stopping = True
                if current is not None:
                    current.budget.stop.set()
                    current.budget.release()
            if grant is None or (current is not None and epoch < current.number):
                return
            if current is not None and epoch == current.number:
                current.budget.update(grant)
            else:
                early = self._early.get(epoch)
                self._early[epoch] = grant if early is None or grant.total >= early.total else early

    # ------------------------------------------------------------------------------------------ internals

    def _begin(self, epoch: int, target: int | None, grant: Grant, outbox: Outbox) -> _Epoch:
        """Make ``epoch`` the current one; an older epoch still running here (the driver lost sight of it) stops."""
        with self._state:
            if self._current is not None:
                self._current.budget.stop.set()
                self._current.budget.release()
            budget = LeasedBudget(target, grant, ask=lambda seq: outbox.put(LeaseRequest(seq)))
            early = self._early.pop(epoch, None)
            if early is not None:
                budget.update(early)
            self._early = {e: g for e, g in self._early.items() if e > epoch}
            if self._stopping:
                budget.stop.set()
            self._current = _Epoch(epoch, budget, outbox)
            self._state.notify_all()
            return self._current

    def _rollout(self, job_bytes: bytes, budget: LeasedBudget, outbox: Outbox, info: dict[str, Any]) -> None:
        sink = Reporter(outbox.put)
        result = ProcessResult(self.process_id, ProcessStatus.FAILED, "the rollout did not start")
        try:
            if self._remap is None:
                self._remap = ray_sources.load(self._shipped)
            job = ray_sources.loads_job(job_bytes, self._remap)
            _check_env_known(job.env_id, info)
            lock = _NodeLock(self._lock_name) if (self._lock_name and job.config.runner.use_env_lock) else None
            result = run_process(job, budget, sink, env_lock=lock)
        except PlugRLError as exc:
            logger.debug("process %d could not start on node %s", self.process_id, info["ip"], exc_info=True)
            result = ProcessResult(self.process_id, ProcessStatus.FAILED, str(exc))
        except Exception as exc:  # a bug: the traceback goes to the log, the message to the user
            logger.exception("process %d crashed on node %s", self.process_id, info["ip"])
            result = ProcessResult(self.process_id, ProcessStatus.FAILED, f"internal error {type(exc).__name__}: {exc}")
        finally:
            sink.result(result)
            outbox.close()


def _check_env_known(env_id: str, info: dict[str, Any]) -> None:
    """An env the driver knows but this node does not: say what to install, instead of a KeyError later."""
    try:
        get_spec(env_id)
    except UnknownEnvError as exc:
        raise ConfigError(
            f"env {env_id} is not registered on node {info['ip']} ({info['hostname']}): {exc}. Every Ray node needs "
            "plugrl-env-client and the env's plugin or dependencies installed in the Python the workers run "
            "(env files given with --env-path are uploaded with the run)"
        ) from None


class _NodeLock:
    """``--runner.use-env-lock`` across the actors of one machine: an exclusive lock on a file in its temp folder
    (envs that cannot be set up concurrently clash on one machine; actors on other machines do not wait)."""

    def __init__(self, name: str) -> None:
        self.path = os.path.join(tempfile.gettempdir(), f"plugrl-env-lock-{name}")
        self._file: Any = None

    def __enter__(self) -> _NodeLock:
        self._file = open(self.path, "a")
        fcntl.flock(self._file, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(OSError):
            fcntl.flock(self._file, fcntl.LOCK_UN)
        self._file.close()
