"""One rollout process as a Ray actor: the same :func:`run_process` as a local process, reporting home in batches.

The actor's ``run`` is a generator that Ray streams to the driver: the rollout runs in a thread of the actor and
hands every report (finished episodes, timing snapshots, log records, lease requests, its result) to an
:class:`Outbox`; the generator sends what piled up every ``FLUSH_PERIOD_S`` (at once for a lease request or the
result). The driver writes the run folder; nothing here touches it, so the actor may be on any machine.

``control`` is the driver's way in (stop, and lease grants, see :mod:`.ray_budget`). Both stay local to the
rollout loop: ``Budget.finished`` reads flags that ``control`` sets, so no remote call happens per loop iteration.

Each ``run`` call is an epoch. Ray restarts an actor whose process died (the driver then calls ``run`` again, with
a fresh seed): the new epoch builds its env and connects with a fresh infer, exactly as a new process would.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import platform
import socket
import tempfile
import threading
from collections.abc import Iterator
from typing import Any

from plugrl_env_client.envs.registry import UnknownEnvError, get_spec
from plugrl_env_client.errors import ConfigError, PlugRLError
from plugrl_env_client.launch import ray_sources
from plugrl_env_client.launch.process import run_process
from plugrl_env_client.launch.ray_budget import Grant, LeasedBudget
from plugrl_env_client.launch.ray_sources import ShippedSources
from plugrl_env_client.outputs.logs import forward_logging
from plugrl_env_client.outputs.results import EpisodeRecord, ProcessResult, ProcessStatus
from plugrl_env_client.timing import Timing
from plugrl_env_client.version import __version__

logger = logging.getLogger(__name__)

FLUSH_PERIOD_S = 0.25
"""How often reports go home (a lease request and the result go at once)."""

Message = tuple[Any, ...]


class Outbox:
    """The rollout's :class:`~plugrl_env_client.rollout.loop.ResultSink` inside an actor: reports wait here for
    the next batch."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._items: list[Message] = []
        self._urgent = False
        self._closed = False

    def episode(self, record: EpisodeRecord) -> None:
        self._put(("episode", record))

    def progress(self, process_id: int, status: ProcessStatus, timing: Timing) -> None:
        self._put(("progress", process_id, status, timing))

    def artifact(self, process_id: int, relpath: str, data: bytes, append: bool = False) -> None:
        self._put(("artifact", process_id, relpath, data, append))

    def log(self, record: logging.LogRecord) -> None:
        self._put(("log", record))

    def ask(self, seq: int) -> None:
        """A lease request (numbered within the epoch)."""
        self._put(("lease", seq), urgent=True)

    def result(self, result: ProcessResult) -> None:
        self._put(("result", result), urgent=True)

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

    def _put(self, message: Message, urgent: bool = False) -> None:
        with self._cond:
            self._items.append(message)
            if urgent:
                self._urgent = True
                self._cond.notify_all()


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


class RolloutActor:
    """A rollout process on a Ray worker (the class the driver wraps with ``ray.remote``)."""

    def __init__(self, process_id: int, shipped: ShippedSources, lock_name: str | None = None) -> None:
        # Kept cheap: an exception here would make Ray give the actor up without restarts.
        self.process_id = process_id
        self._shipped = shipped
        self._lock_name = lock_name
        self._remap: dict[str, str] | None = None
        self._state = threading.Lock()
        self._epoch = -1
        self._budget: LeasedBudget | None = None
        self._early: dict[int, Grant] = {}  # grants that arrived before their epoch's run call
        self._stopping = False

    def run(self, job_bytes: bytes, epoch: int, target: int | None, grant: Grant) -> Iterator[list[Message]]:
        """One epoch: the rollout of the pickled job, streamed home as batches of reports."""
        outbox = Outbox()
        forward_logging(outbox.log)  # this worker's log lines go home with its reports
        info = node_info()
        budget = self._begin(epoch, target, grant, outbox)
        yield [("node", info)]
        thread = threading.Thread(target=self._rollout, args=(job_bytes, budget, outbox, info),
                                  name=f"plugrl-rollout-{self.process_id}", daemon=True)
        thread.start()
        sent_steps = 0
        closed = False
        while not closed:
            items, closed = outbox.take(FLUSH_PERIOD_S)
            steps = budget.env_steps
            if steps != sent_steps:
                items.insert(0, ("steps", steps - sent_steps))
                sent_steps = steps
            if items:
                yield items
        thread.join()

    def control(self, epoch: int, grant: Grant | None = None, stop: bool = False) -> None:
        """From the driver: stop collecting (after the current step), and/or a grant for ``epoch``."""
        with self._state:
            if stop:
                self._stopping = True
                if self._budget is not None:
                    self._budget.stop.set()
                    self._budget.release()
            if grant is None or epoch < self._epoch:
                return
            if epoch == self._epoch and self._budget is not None:
                self._budget.update(grant)
            else:
                early = self._early.get(epoch)
                self._early[epoch] = grant if early is None or grant.total >= early.total else early

    # ------------------------------------------------------------------------------------------ internals

    def _begin(self, epoch: int, target: int | None, grant: Grant, outbox: Outbox) -> LeasedBudget:
        """Make ``epoch`` the current one; an older epoch still running here (the driver lost sight of it) stops."""
        with self._state:
            if self._budget is not None:
                self._budget.stop.set()
                self._budget.release()
            budget = LeasedBudget(target, grant, ask=outbox.ask)
            early = self._early.pop(epoch, None)
            if early is not None:
                budget.update(early)
            self._early = {e: g for e, g in self._early.items() if e > epoch}
            if self._stopping:
                budget.stop.set()
            self._epoch, self._budget = epoch, budget
            return budget

    def _rollout(self, job_bytes: bytes, budget: LeasedBudget, outbox: Outbox, info: dict[str, Any]) -> None:
        result = ProcessResult(self.process_id, ProcessStatus.FAILED, "the rollout did not start")
        try:
            if self._remap is None:
                self._remap = ray_sources.load(self._shipped)
            job = ray_sources.loads_job(job_bytes, self._remap)
            _check_env_known(job.env_id, info)
            lock = _NodeLock(self._lock_name) if (self._lock_name and job.config.runner.use_env_lock) else None
            result = run_process(job, budget, outbox, env_lock=lock)
        except PlugRLError as exc:
            logger.debug("process %d could not start on node %s", self.process_id, info["ip"], exc_info=True)
            result = ProcessResult(self.process_id, ProcessStatus.FAILED, str(exc))
        except Exception as exc:  # a bug: the traceback goes to the log, the message to the user
            logger.exception("process %d crashed on node %s", self.process_id, info["ip"])
            result = ProcessResult(self.process_id, ProcessStatus.FAILED, f"internal error {type(exc).__name__}: {exc}")
        finally:
            outbox.result(result)
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
