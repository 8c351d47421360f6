"""The local launcher: the rollout in this process, or one spawned process per ``--num-procs``.

Spawned processes do not write the run folder's results themselves: they send finished episodes, timing snapshots,
recorder files, log records and their final :class:`ProcessResult` home as reports (:mod:`.reports`) over one
queue, and a listener thread here delivers them to the run's :class:`RunWriter` in the order they were sent. The
queue is a ``SimpleQueue`` (a ``put`` is in the pipe when it returns, with no feeder thread that a killed process
could take down with unsent items): what a process sent before it was killed is all there, whole JSON lines
included. A process that dies without a result is reported from its exit code; what it sent before stays counted.

With several processes, a process that fails sets the shared stop flag: the others finish their current step,
report, and exit. A process whose launcher died stops too, within seconds (:mod:`.lifeline`).
"""

from __future__ import annotations

import logging
import logging.handlers
import multiprocessing as mp
import pickle
import signal
import threading
import time
from collections.abc import Iterable
from typing import Any, ClassVar

from plugrl_env_client.envs.base_env import BaseEnv
from plugrl_env_client.envs.discovery import EnvSources
from plugrl_env_client.errors import OutputError
from plugrl_env_client.launch.lifeline import Lifeline
from plugrl_env_client.launch.process import ProcessJob, RunConfig, run_process
from plugrl_env_client.launch.reports import LogReporter, Report, Reporter
from plugrl_env_client.outputs.logs import forward_logging
from plugrl_env_client.outputs.run_writer import RunWriter
from plugrl_env_client.records import ProcessResult, ProcessStatus
from plugrl_env_client.rollout.budget import EpisodeBudget
from plugrl_env_client.rollout.signals import (
    STOP_SIGNALS,
    Interrupted,
    blocked,
    interrupt_handlers,
    raise_swallowed,
    shielded,
)

logger = logging.getLogger(__name__)

DRAIN_TIMEOUT_S = 30.0
STOP_GRACE_S = 30.0
"""How long children get to stop after a stop was requested (Ctrl-C, a failed sibling) before they are terminated
(SIGTERM, which they answer by reporting and exiting), then killed 5 s later: a child stuck in an env's C code must
not keep the run from ending."""


class ReportListener(logging.handlers.QueueListener):
    """The thread that delivers what the spawned processes put on the queue, report by report, to the writer.

    A ``QueueListener`` whose records are reports (log records among them, as
    :class:`~plugrl_env_client.launch.reports.LogReport`): one queue keeps a process's lines and results in order.
    A report that cannot be read or written is logged, and the ones after it still count.
    """

    def __init__(self, queue: Any, writer: RunWriter) -> None:
        super().__init__(queue)
        self._put = queue.put
        self._writer = writer
        self._done = threading.Event()

    def dequeue(self, block: bool) -> Any:
        while True:
            try:
                report = self.queue.get()
            except (EOFError, OSError):  # the queue itself is gone
                logger.exception("the rollout processes' report queue broke")
                report = None
            except Exception:  # a report that cannot be unpickled: the ones after it still count
                logger.exception("could not read a report from a rollout process")
                continue
            if report is None:  # the end (QueueListener's sentinel)
                self._done.set()
            return report

    def handle(self, report: Report) -> None:  # type: ignore[override]  # its records are reports
        try:
            report.deliver(self._writer)
        except OutputError:  # the run folder can take no more: the writer says so once, and the run stops
            pass
        except Exception:  # a report that cannot be written must not stop the others from being written
            logger.exception("could not record a report from a rollout process")

    def enqueue_sentinel(self) -> None:
        self._put(None)

    def finish(self, timeout: float) -> bool:
        """Deliver what is queued and stop (at most ``timeout`` s); call it once no process puts anymore. Whether
        everything was delivered."""
        self.enqueue_sentinel()
        return self._done.wait(timeout)


def _child_main(process_id: int, job_bytes: bytes, budget: EpisodeBudget, env_lock: Any, queue: Any,
                sources: EnvSources) -> None:
    """Entry point of a spawned process: it rebuilds logging and the env registry first.

    The job arrives pickled, and is unpickled only once the env files are imported: its env config may be a class
    from a user's env file, which exists in this process only after discovery.
    """
    with interrupt_handlers():
        home = Lifeline(f"proc_{process_id:03d}").start().guarded(queue)  # ends with the launcher
        sink = Reporter(home.put)
        forward_logging(LogReporter(home))
        try:
            # Held since the parent started us: a stop signal that came meanwhile is raised here, and ends this
            # process as an interrupted one.
            signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
            sources.load()
            job: ProcessJob = pickle.loads(job_bytes)
        except KeyboardInterrupt as exc:  # stopped while importing the env files
            result = ProcessResult(process_id, ProcessStatus.INTERRUPTED, signum=getattr(exc, "signum", signal.SIGINT))
        except Exception as exc:  # the process cannot even begin: its summary says why, not only its stderr
            logger.debug("process %d could not start", process_id, exc_info=True)
            result = ProcessResult(process_id, ProcessStatus.FAILED,
                                   f"could not load the env sources or the job: {type(exc).__name__}: {exc}")
        else:
            result = run_process(job, budget, sink, env_lock)
        with shielded():
            sink.result(result)
    if result.error is not None:
        budget.stop.set()
        raise SystemExit(1)
    if result.signum is not None:
        raise SystemExit(128 + result.signum)


class LocalLauncher:
    """``--launcher local``: one job runs in this process, several in one spawned process each (started as
    ``--runner.start-method`` says)."""

    in_process: ClassVar[bool] = True

    def __init__(self, config: RunConfig) -> None:
        self._ctx: Any = mp.get_context(config.runner.start_method)  # its Process and queues per start method

    def launch(self, jobs: list[ProcessJob], budget: EpisodeBudget, writer: RunWriter,
               sources: EnvSources = EnvSources(), env: BaseEnv | None = None) -> None:
        """Run ``jobs`` (in this process when there is one, with ``env`` if the caller built it); every report and
        result lands in ``writer``. Raises :class:`Interrupted` when this process was interrupted."""
        if len(jobs) == 1:
            result = run_process(jobs[0], budget, writer, env=env)
            writer.result(result)
            if result.signum is not None:
                raise Interrupted(result.signum)
            return
        ctx = self._ctx
        queue = ctx.SimpleQueue()
        listener = ReportListener(queue, writer)
        listener.start()
        env_lock = ctx.Lock()
        procs = {job.process_id: ctx.Process(target=_child_main, name=f"proc_{job.process_id:03d}",
                                             args=(job.process_id, pickle.dumps(job), budget, env_lock, queue, sources))
                 for job in jobs}
        interrupted: KeyboardInterrupt | None = None
        forced: list[int] = []
        try:
            _start_with_signals_held(procs.values())
            deadline = None
            while any(p.is_alive() for p in procs.values()):
                if any(p.exitcode not in (None, 0) for p in procs.values()):
                    budget.stop.set()
                if budget.stop.is_set():
                    deadline = deadline or time.monotonic() + STOP_GRACE_S
                    if time.monotonic() >= deadline:
                        forced = _end(procs)
                        break
                raise_swallowed()  # a Ctrl-C that some library's code swallowed while the run started
                time.sleep(0.1)
        except KeyboardInterrupt as exc:
            interrupted = exc
            budget.stop.set()  # children stop after their current step and report
            end = time.monotonic() + STOP_GRACE_S
            for proc in procs.values():
                proc.join(timeout=max(0.0, end - time.monotonic()))
            forced = _end(procs)
        finally:
            listener.finish(DRAIN_TIMEOUT_S)  # after every child's last report
        for pid in forced:
            writer.result(ProcessResult(pid, ProcessStatus.FAILED, f"did not stop within {STOP_GRACE_S:g} s of the "
                                        "stop request (stuck in the env?); it was terminated"))
        if interrupted is not None:
            for pid in writer.unfinished():  # stopped before it could say so (e.g. while it was starting)
                writer.result(ProcessResult(pid, ProcessStatus.INTERRUPTED))
            raise interrupted
        # Here this process was not interrupted: a child that ended by a signal was stopped from outside.
        for pid, proc in procs.items():
            if proc.exitcode not in (0, None) and pid not in forced:
                writer.result(ProcessResult(pid, ProcessStatus.FAILED, _failure(proc.exitcode)))
        for pid in writer.unfinished():
            writer.result(ProcessResult(pid, ProcessStatus.FAILED, "ended without reporting how (see the log)"))


def _end(procs: dict[int, Any]) -> list[int]:
    """Terminate the children still running (then kill those still there 5 s later); returns their ids."""
    alive = [pid for pid, proc in procs.items() if proc.is_alive()]
    for pid in alive:
        procs[pid].terminate()
    for pid in alive:
        procs[pid].join(timeout=5)
        if procs[pid].is_alive():
            procs[pid].kill()
            procs[pid].join(timeout=5)
    return alive


def _start_with_signals_held(procs: Iterable[Any]) -> None:
    """Start children with the stop signals (SIGINT, SIGTERM, SIGHUP) blocked; each unblocks them once its handlers
    are installed.

    A child inherits the signal mask, so a Ctrl-C while it is still starting waits for it instead of killing it with
    a traceback before it can write any output. The parent unblocks right after the starts, and a signal that came
    meanwhile is delivered to it then.
    """
    if threading.current_thread() is not threading.main_thread():
        for proc in procs:
            proc.start()
        return
    # blocked() holds Python's handler too: a start() is never interrupted halfway (the child would read a
    # truncated pipe).
    with blocked():
        for proc in procs:
            proc.start()


def _failure(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        return f"killed by signal {-exitcode}"
    if exitcode is not None and exitcode > 128 and exitcode - 128 in STOP_SIGNALS:
        return f"stopped by {signal.Signals(exitcode - 128).name}"
    return f"exited with code {exitcode}"
