"""One rollout process, or many: building each process's env, session and recorder, and watching them.

Process p uses env indices 0..N-1 on its own connection and seeds its first reset with ``seed + p * num_envs``,
so processes never share a seed when envs derive per-env seeds from it. With several processes, a process that
fails sets the shared stop flag: the others finish their current step, write their outputs and exit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

from plugrl_env_client.config import ClientConfig
from plugrl_env_client.envs.registry import get_spec, make_env
from plugrl_env_client.errors import PlugRLError
from plugrl_env_client.outputs.recorder import ProcessRecorder
from plugrl_env_client.outputs.run_dir import RunDir, setup_logging
from plugrl_env_client.protocol.session import Session, SessionConfig
from plugrl_env_client.rollout.budget import EpisodeBudget
from plugrl_env_client.rollout.loop import LoopSettings, Rollout
from plugrl_env_client.rollout.signals import Interrupted, deferred_interrupts, interrupt_handlers, shielded

logger = logging.getLogger(__name__)

SUMMARY_PERIOD_S = 10.0
HELD_SIGNALS = {signal.SIGINT, signal.SIGTERM}


@dataclasses.dataclass
class WorkerJob:
    env_id: str
    config: ClientConfig
    process_id: int
    url: str
    run_root: Path


@dataclasses.dataclass
class WorkerResult:
    process_id: int
    status: str
    error: str | None = None
    signum: int | None = None  # set when a signal interrupted the process


def process_seed(seed: int | None, process_id: int, num_envs: int) -> int | None:
    return None if seed is None else seed + process_id * num_envs


def run_worker(job: WorkerJob, budget: EpisodeBudget, env_lock: Any = None) -> WorkerResult:
    """Run one process's rollout to its end; never raises for user errors (they become the result's error)."""
    cfg, spec = job.config, get_spec(job.env_id)
    run_dir = RunDir(job.run_root)
    recorder = ProcessRecorder(run_dir.proc_dir(job.process_id), job.process_id)
    rollout: Rollout | None = None
    result = WorkerResult(job.process_id, "starting")
    try:
        with env_lock if (env_lock is not None and cfg.runner.use_env_lock) else contextlib.nullcontext():
            ids = {"process_id": job.process_id, "total_processes": cfg.num_procs} if cfg.runner.pass_proc_id else {}
            env = make_env(spec.uid, num_envs=cfg.num_envs, config=cfg.env, **ids)
        settings = LoopSettings(
            env_id=spec.uid,
            seed=process_seed(cfg.runner.seed, job.process_id, cfg.num_envs),
            max_episode_steps=spec.max_episode_steps if cfg.runner.max_episode_steps is None else cfg.runner.max_episode_steps,
            replan_steps=cfg.runner.replan_steps,
            success_threshold=spec.best_reward_threshold_for_success,
            non_finite_actions=cfg.runner.non_finite_actions,
            summary_period_s=SUMMARY_PERIOD_S,
            reuse_feedback_obs=cfg.reuse_feedback_obs,
        )
        session = Session(SessionConfig(
            url=job.url,
            api_key=cfg.api_key or os.environ.get("PLUGRL_API_KEY") or None,
            reconnect_on_stop=cfg.reconnect_on_server_stop,
            max_reconnects=cfg.max_reconnects,
            connect_timeout_s=cfg.connect_timeout,
            reconnect_timeout_s=cfg.reconnect_timeout,
        ), should_stop=budget.finished)
        rollout = Rollout(env, session, settings, budget, recorder)
        result.status = rollout.run()
    except PlugRLError as exc:
        # The user sees the message (printed by the CLI); the traceback is for the log file only.
        logger.debug("process %d failed: %s", job.process_id, exc, exc_info=True)
        result.status, result.error = "failed", str(exc)
    except KeyboardInterrupt as exc:
        logger.warning("process %d interrupted", job.process_id)
        result.status, result.signum = "interrupted", getattr(exc, "signum", signal.SIGINT)
    except Exception as exc:  # a bug: keep the traceback in the log, the message for the user
        logger.exception("process %d crashed", job.process_id)
        result.status, result.error = "failed", f"internal error {type(exc).__name__}: {exc}"
    finally:
        with shielded():  # a second Ctrl-C must not lose the summary
            timing = rollout.timing_dict() if rollout is not None else {}
            recorder.write_summary(timing, result.status if result.error is None else f"failed: {result.error}")
            recorder.close()
    return result


def _child_main(job: WorkerJob, budget: EpisodeBudget, env_lock: Any) -> None:
    """Entry point of a spawned process: it must rebuild logging and the env registry first."""
    from plugrl_env_client.envs import discover_envs

    with interrupt_handlers():
        signal.pthread_sigmask(signal.SIG_UNBLOCK, HELD_SIGNALS)  # held since the parent started us
        setup_logging(RunDir(job.run_root).log_file)
        discover_envs()
        result = run_worker(job, budget, env_lock)
    if result.error is not None:
        budget.stop.set()
        raise SystemExit(1)
    if result.signum is not None:
        raise SystemExit(128 + result.signum)


def launch(jobs: list[WorkerJob], budget: EpisodeBudget, ctx: Any) -> dict[int, str]:
    """Run ``jobs`` (in this process when there is one); returns ``{process_id: error}`` for failed processes."""
    if len(jobs) == 1:
        result = run_worker(jobs[0], budget)
        if result.signum is not None:
            raise Interrupted(result.signum)
        return {result.process_id: result.error} if result.error else {}
    env_lock = ctx.Lock()
    procs = {job.process_id: ctx.Process(target=_child_main, args=(job, budget, env_lock), name=f"proc_{job.process_id:03d}")
             for job in jobs}
    try:
        _start_with_signals_held(procs.values())
        while any(p.is_alive() for p in procs.values()):
            if any(p.exitcode not in (None, 0) for p in procs.values()):
                budget.stop.set()
            time.sleep(0.1)
    except KeyboardInterrupt:
        budget.stop.set()  # children stop after their current step and write their outputs
        for proc in procs.values():
            proc.join(timeout=30)
        raise
    # Here the parent was not interrupted: a child that ended by a signal of its own was stopped from outside.
    return {pid: _failure(p.exitcode) for pid, p in procs.items() if p.exitcode not in (0, None)}


def _start_with_signals_held(procs: Any) -> None:
    """Start children with SIGINT/SIGTERM blocked; each unblocks them once its handlers are installed.

    A child inherits the signal mask, so a Ctrl-C while it is still starting waits for it instead of killing it with
    a traceback before it can write any output. The parent unblocks right after the starts, and a signal that came
    meanwhile is delivered to it then.
    """
    if threading.current_thread() is not threading.main_thread():
        for proc in procs:
            proc.start()
        return
    # Deferred too: a signal that arrived just before the block is still run by Python's handler a little later,
    # and must not interrupt a start() halfway (the child would read a truncated pipe).
    with deferred_interrupts():
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, HELD_SIGNALS)
        try:
            for proc in procs:
                proc.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _failure(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        return f"killed by signal {-exitcode}"
    if exitcode is not None and exitcode > 128 and exitcode - 128 in (signal.SIGINT, signal.SIGTERM):
        return f"stopped by {signal.Signals(exitcode - 128).name}"
    return f"exited with code {exitcode}"
