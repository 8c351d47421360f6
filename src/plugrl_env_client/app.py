"""One client run from start to end: run folder, optional embedded server, processes, aggregated summary.

Returns the process exit code: 0 when the run finished or the server ended it, 1 on an error (the message is
printed, the traceback is in ``logs/client.log``), 130 / 143 when interrupted by SIGINT / SIGTERM. Outputs are
written in every case.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import multiprocessing as mp
import signal
import sys
from typing import Any

from plugrl_env_client.config import ClientConfig
from plugrl_env_client.envs.registry import get_spec, make_env
from plugrl_env_client.errors import ConfigError
from plugrl_env_client.outputs.progress import Periodic, Progress, summary_table
from plugrl_env_client.outputs.recorder import aggregate, summary_from_episodes
from plugrl_env_client.outputs.run_dir import RunDir, default_exp_name, setup_logging, write_json_atomic
from plugrl_env_client.rollout import checks
from plugrl_env_client.rollout.budget import EpisodeBudget
from plugrl_env_client.rollout.launch import SUMMARY_PERIOD_S, WorkerJob, launch
from plugrl_env_client.rollout.signals import interrupt_handlers, shielded
from plugrl_env_client.server.server import PolicyServer

logger = logging.getLogger(__name__)


def run_client(config: ClientConfig, env_id: str) -> int:
    spec = get_spec(env_id)
    _validate(config)
    run_dir = _new_run_dir(config, spec.uid)
    setup_logging(run_dir.log_file)
    write_json_atomic(run_dir.client_config, _recorded_config(config, spec.uid, spec.kwargs))
    server = _start_local_policy(config, spec.uid) if config.local_policy else None
    url = server.url if server is not None else config.resolved_url()
    logger.info("run %s: env %s, %d proc x %d envs, server %s", run_dir.root, spec.uid, config.num_procs, config.num_envs, url)
    ctx = mp.get_context(config.runner.start_method)
    budget = EpisodeBudget(config.num_episodes, ctx)
    jobs = [WorkerJob(spec.uid, config, p, url, run_dir.root) for p in range(config.num_procs)]
    progress = Progress(budget).start() if config.progress else None
    refresher = Periodic(SUMMARY_PERIOD_S, lambda: _write_aggregate(run_dir, config.num_procs, {}, final=False)).start()
    failed: dict[int, str] = {}
    signum = None
    with interrupt_handlers():
        try:
            failed = launch(jobs, budget, ctx)
        except KeyboardInterrupt as exc:
            signum = getattr(exc, "signum", signal.SIGINT)
            print(f"\ninterrupted ({signal.Signals(signum).name}); writing outputs", file=sys.stderr)
        with shielded():  # the outputs are written whatever else arrives
            refresher.stop()
            if progress is not None:
                progress.stop()
            if server is not None:
                server.shutdown()
            summary = _write_aggregate(run_dir, config.num_procs, failed, interrupted=signum is not None)
    return _report(spec.uid, run_dir, summary, failed, signum)


def _new_run_dir(config: ClientConfig, uid: str) -> RunDir:
    run_dir = RunDir(config.output_dir / (config.exp_name or default_exp_name(uid, config.num_envs)))
    if run_dir.client_config.exists():
        raise ConfigError(
            f"{run_dir.root} already holds a run; pick another --exp-name (or leave it out for a fresh name), "
            "or delete that folder"
        )
    return run_dir.create()


def _report(uid: str, run_dir: RunDir, summary: dict[str, Any], failed: dict[int, str], signum: int | None) -> int:
    """Print the end-of-run table and errors; returns the exit code."""
    print(f"\n{uid}: {summary['completed_episodes']} episodes\n{summary_table(summary)}\nsummary: {run_dir.summary}")
    if failed:
        for pid in sorted(failed):
            print(f"error: process {pid} failed: {failed[pid]}", file=sys.stderr)
        print(f"details (tracebacks included) are in {run_dir.log_file}", file=sys.stderr)
        return 1
    return 0 if signum is None else 128 + signum


def _recorded_config(config: ClientConfig, env_id: str, env_kwargs: dict[str, Any]) -> dict[str, Any]:
    """Every flag of the run for ``client_config.json``; the API key is not written to disk."""
    flags = dataclasses.asdict(config)
    flags["output_dir"] = str(config.output_dir)
    if flags.get("api_key"):
        flags["api_key"] = "<redacted>"
    return {"env_id": env_id, "env_kwargs": env_kwargs, **flags}


def _validate(config: ClientConfig) -> None:
    for name in ("num_envs", "num_procs"):
        if getattr(config, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(config, name)}")
    if config.num_episodes is not None and config.num_episodes < 1:
        raise ConfigError(f"--num-episodes must be >= 1, got {config.num_episodes}")
    for flag, value in (("--runner.replan-steps", config.runner.replan_steps),
                        ("--runner.max-episode-steps", config.runner.max_episode_steps),
                        ("--local-policy-horizon", config.local_policy_horizon)):
        if value is not None and value < 1:
            raise ConfigError(f"{flag} must be >= 1, got {value}")


def _start_local_policy(config: ClientConfig, env_id: str) -> PolicyServer:
    from plugrl_env_client.server.embedded import start_local_server

    probe = make_env(env_id, num_envs=1, config=config.env)
    try:
        space = checks.action_space_of(probe)
    finally:
        probe.close()
    server = start_local_server(config.local_policy, space, config.local_policy_horizon, seed=config.runner.seed)
    logger.info("embedded %s policy serving on %s", config.local_policy, server.url)
    return server


def _write_aggregate(run_dir: RunDir, num_procs: int, failed: dict[int, str], final: bool = True,
                     interrupted: bool = False) -> dict[str, Any]:
    """Aggregate the per-process summaries into ``summary.json`` (periodically while the run goes on, then once
    at the end, when a process that died without a final summary is counted from its ``episodes.jsonl``)."""
    summaries = [_process_summary(run_dir, pid, failed, final, interrupted) for pid in range(num_procs)]
    summary = aggregate(summaries, failed)
    write_json_atomic(run_dir.summary, summary)
    return summary


def _process_summary(run_dir: RunDir, pid: int, failed: dict[int, str], final: bool, interrupted: bool) -> dict[str, Any]:
    path = run_dir.proc_dir(pid) / "summary.json"
    episodes = path.with_name("episodes.jsonl")
    summary = json.loads(path.read_text()) if path.exists() else None
    if not final:
        return summary or summary_from_episodes(episodes, pid, "starting", {})
    if summary is not None and summary["status"].startswith("failed: "):
        if pid in failed:
            failed[pid] = summary["status"][len("failed: "):]
        return summary
    if summary is None and interrupted and pid not in failed:  # stopped before it got going
        return summary_from_episodes(episodes, pid, "interrupted", {})
    if summary is None or pid in failed:  # died without its final summary: its episodes file is the record
        failed.setdefault(pid, "no summary written")
        timing = summary["timing"] if summary is not None else {}
        return summary_from_episodes(episodes, pid, f"failed: {failed[pid]}", timing)
    return summary


__all__ = ["run_client"]
