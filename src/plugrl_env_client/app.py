"""One client run from start to end: run folder, optional embedded server, processes, summaries.

With ``--resume`` the run folder is a stopped run's, continued where it stopped (its flags that define the episodes
must be the same; see :func:`_open_stopped_run`); a resumed run that is finished already says so and returns 0.

Returns the process exit code: 0 when the run finished or the server ended it, 1 on an error (the message is
printed, the traceback is in ``logs/client.log``), 130 / 143 / 129 when interrupted by SIGINT / SIGTERM / SIGHUP. Outputs are
written in every case once the run folder exists; a run that cannot start says why in its ``summary.json``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import multiprocessing as mp
import os
import signal
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from plugrl_env_client.config import ClientConfig
from plugrl_env_client.envs import contract
from plugrl_env_client.envs.base_env import BaseEnv, BaseEnvConfig
from plugrl_env_client.envs.calls import what_it_did
from plugrl_env_client.envs.discovery import EnvSources
from plugrl_env_client.envs.registry import get_spec
from plugrl_env_client.errors import ConfigError, EnvExitError, OutputError, PlugRLError
from plugrl_env_client.launch.launchers import Launcher, make_launcher
from plugrl_env_client.launch.process import (
    ProcessJob,
    build_env,
    choose_pipeline,
    close_env,
    episodes_of_run,
    group_sizes,
    with_pipeline,
)
from plugrl_env_client.launch.ray.nodes import NODES_FILE
from plugrl_env_client.outputs.logs import run_log, setup_logging, stop_file_logging
from plugrl_env_client.outputs.progress import Periodic, Progress, summary_table
from plugrl_env_client.outputs.run_dir import (
    RunDir,
    RunLock,
    default_exp_name,
    describe_write_error,
    finite_json,
    with_plugrl_config_keys,
    write_json_atomic,
)
from plugrl_env_client.outputs.run_writer import RunWriter, stopped_episodes
from plugrl_env_client.outputs.tracking import make_tracker, require
from plugrl_env_client.protocol import images
from plugrl_env_client.protocol.openpi_keys import KeyMap
from plugrl_env_client.records import ProcessResult, ProcessStatus
from plugrl_env_client.redaction import REDACTED, add_secret, redact_text, redact_url
from plugrl_env_client.rollout.budget import EpisodeBudget
from plugrl_env_client.rollout.signals import blocked, deferred_interrupts, interrupt_handlers, shielded
from plugrl_env_client.server.registry import options_config
from plugrl_env_client.server.server import PolicyServer
from plugrl_env_client.websocket.common import api_key_problem

logger = logging.getLogger(__name__)

SUMMARY_PERIOD_S = 10.0
API_KEY_VARIABLE = "PLUGRL_API_KEY"


def run_client(config: ClientConfig, env_id: str, sources: EnvSources | None = None) -> int:
    """Run ``env_id`` as ``config`` says; ``sources`` are the env files and modules spawned processes must import
    (besides ``config.env_path``) to see the env."""
    # Where the run's outputs go, fixed before any env code runs: an env that changes the working folder (in its
    # constructor, say) does not move them.
    config = dataclasses.replace(config, output_dir=config.output_dir.absolute())
    sources = EnvSources(tuple(config.env_path) + (sources.paths if sources else ()),
                         sources.modules if sources else ())
    spec = get_spec(env_id)
    if type(config.env) is BaseEnvConfig and spec.config_cls is not BaseEnvConfig:
        # A config built in code without `env=`: the env's own defaults, as the CLI gives them.
        config = dataclasses.replace(config, env=spec.config_cls())
    check_config(config, spec.uid)
    launcher = make_launcher(config.launcher, config)
    exp_name = config.exp_name or default_exp_name(spec.uid, config.num_envs)
    limit = spec.max_episode_steps if config.runner.max_episode_steps is None else config.runner.max_episode_steps
    env: BaseEnv | None = None
    server: PolicyServer | None = None
    signum = None
    with interrupt_handlers(), contextlib.ExitStack() as starting:
        # A signal while the run folder is made waits for it: the run then ends with its outputs written.
        starting.enter_context(deferred_interrupts())
        try:
            run_dir, writer = _start_run_folder(config, exp_name, spec.uid, spec.kwargs, limit)
        except RunFinished as finished:
            print(finished)
            return 0
        try:
            writer.write_summaries()  # the run's summary exists from its start (status running, no episodes yet)
            starting.close()  # a signal held meanwhile ends the run from here
            # One local process in lockstep: its env is built here, once, and also tells the embedded server the
            # action space (pipeline groups build their own envs, of num_envs / pipeline copies each; Ray actors
            # build theirs where they run).
            jobs = [ProcessJob(spec.uid, config, p, "", writer.episodes_per_env(p)) for p in range(config.num_procs)]
            if config.num_procs == 1 and config.runner.pipeline in (1, "auto") and launcher.in_process:
                env = build_env(jobs[0], spec)
            server = _start_local_policy(config, spec.uid, env, run_dir) if config.local_policy else None
            urls = (server.url,) if server is not None else config.resolved_urls()
            recorded = _served_at(config, urls[0]) if server is not None else config
            if server is not None:  # its port is known only now: the file says where the run's server really was
                _write_client_config(run_dir, recorded, spec.uid, spec.kwargs, limit)
            jobs = [dataclasses.replace(job, url=urls[0], urls=urls if len(urls) > 1 else ()) for job in jobs]
            writer.notes["protocol"] = config.connection.protocol
            if config.runner.pipeline == "auto":
                config, env = _choose_pipeline(jobs[0], env, writer)
                _write_client_config(run_dir, recorded, spec.uid, spec.kwargs, limit,
                                     {"pipeline_chosen": config.runner.pipeline,
                                      "align_chunks_chosen": config.runner.align_chunks})
                jobs = [dataclasses.replace(job, config=config) for job in jobs]
            _run(config, launcher, spec.uid, run_dir, writer, jobs, sources, env)
        except PlugRLError as exc:  # the run could not start: say why in its summary
            logger.debug("the run could not start: %s", exc, exc_info=True)
            for p in range(config.num_procs):
                writer.result(ProcessResult(p, ProcessStatus.FAILED, str(exc)))
            if env is not None:
                close_env(env, spec.uid)
        except KeyboardInterrupt as exc:
            signum = getattr(exc, "signum", signal.SIGINT)
            print(f"\ninterrupted ({signal.Signals(signum).name}); writing outputs", file=sys.stderr)
            for p in writer.unfinished():  # interrupted before it got going
                writer.result(ProcessResult(p, ProcessStatus.INTERRUPTED))
        except (Exception, SystemExit) as exc:  # a bug or a problem nobody foresaw: still a summary that says so
            logger.debug("internal error: %s: %s", type(exc).__name__, exc, exc_info=True)  # the traceback, in the log
            why = f"{type(exc).__name__}: {exc}" if isinstance(exc, Exception) else f"something {what_it_did(exc)}"
            for p in writer.unfinished():
                writer.result(ProcessResult(p, ProcessStatus.FAILED, f"internal error: {why}"))
            if env is not None:
                close_env(env, spec.uid)
        finally:
            with shielded():  # the outputs are written whatever else arrives
                if server is not None:
                    server.shutdown()
                summary = writer.close()
    code = _report(spec.uid, run_dir, summary, writer, signum)
    if server is not None and server.failure is not None:  # the embedded policy could not serve this env
        print(f"error: --local-policy {config.local_policy} stopped the run: {redact_text(server.failure)}",
              file=sys.stderr)
        return 1
    return code


def _run(config: ClientConfig, launcher: Launcher, uid: str, run_dir: RunDir, writer: RunWriter,
         jobs: list[ProcessJob], sources: EnvSources, env: BaseEnv | None) -> None:
    logger.info("run %s: env %s, %d proc x %d envs, server %s (%s)", run_dir.root, uid, config.num_procs,
                config.num_envs, ", ".join(map(redact_url, jobs[0].servers)), config.connection.protocol)
    if config.local_policy and episodes_of_run(config) is None:
        logger.warning("--local-policy without --num-episodes: collecting until Ctrl-C (the embedded server never "
                       "ends a run)")
    ctx = mp.get_context(config.runner.start_method)
    with blocked():
        # The budget's shared counters start multiprocessing's resource tracker (spawn, forkserver), which inherits
        # this mask: it ignores SIGINT and SIGTERM itself, and a SIGHUP held keeps it alive when a closed terminal
        # hangs up the whole process group, so it still sees the budget's semaphores released at the end instead
        # of dying (or warning of leaked semaphores).
        budget = EpisodeBudget(config.num_episodes, ctx, config.num_procs, config.runner.episode_split,
                               writer.episodes_per_process())
    writer.when_failed(budget.stop.set)  # a full disk stops every process
    progress = Progress(budget).start() if config.progress else None
    refresher = Periodic(SUMMARY_PERIOD_S, writer.write_summaries).start()
    try:
        launcher.launch(jobs, budget, writer, sources, env)
    finally:
        with shielded():
            refresher.stop()
            if progress is not None:
                progress.stop()


def _start_run_folder(config: ClientConfig, exp_name: str, uid: str, env_kwargs: dict[str, Any],
                      limit: int | None) -> tuple[RunDir, RunWriter]:
    """The run folder, its log and ``client_config.json``, and the writer of its results; a folder that cannot be
    written (a file in the way, a read-only or full disk) is an :class:`OutputError` that says so. The folder is
    made exclusively, or with ``--resume`` it is the stopped run's (:func:`_open_stopped_run`); either way this
    process holds its :class:`RunLock` until the writer closes."""
    run_dir = RunDir(config.output_dir / exp_name)
    lock = RunLock(run_dir.root)
    try:
        try:
            if config.resume:
                on_disk = _open_stopped_run(config, run_dir, lock, uid, env_kwargs, limit)
            else:
                run_dir.create()
                lock.acquire()  # a folder just made: nobody else holds it
        except FileExistsError:
            if not run_dir.root.is_dir():  # a file in the way: said below
                raise
            # Another run's folder, or one being made this very moment by a run started with the same name.
            held = "already holds a run" if run_dir.client_config.exists() else "already exists"
            raise ConfigError(f"{run_dir.root} {held}; to continue that run where it stopped add --resume, or pick "
                              "another --exp-name (or leave it out for a fresh name), or delete that folder") from None
        setup_logging(run_dir.log_file)
        if config.resume:
            logger.info("resuming run %s: %d episodes on disk", run_dir.root, on_disk)
        else:
            _write_client_config(run_dir, config, uid, env_kwargs, limit)
        tracker = make_tracker(config.tracking, run_dir.root)
        try:
            writer = RunWriter(run_dir, exp_name, config.num_procs, config.recorder.metric_window,
                               num_envs=config.num_envs, recorder_args=dataclasses.asdict(config.recorder),
                               tracker=tracker, resume=config.resume, lock=lock)
        except BaseException:
            tracker.close()  # its timer thread would keep the command alive
            raise
        if config.resume:
            _keep_segment_files(run_dir, writer.segments[-2]["segment"])
    except OSError as exc:
        lock.release()
        where = Path(exc.filename) if isinstance(exc.filename, str) else None
        raise OutputError(f"--output-dir {config.output_dir}: cannot write the run folder: "
                          f"{describe_write_error(exc, run_dir.root, where)}; pick another --output-dir (a folder on "
                          "a writable disk with free space)") from None
    except BaseException:
        lock.release()
        raise
    writer.when_failed(lambda: stop_file_logging("the run folder's disk can take no more"))
    return run_dir, writer


def _keep_segment_files(run_dir: RunDir, segment: int) -> None:
    """Files a segment writes whole (``ray_nodes.json``, where a Ray run's processes ran) kept under the name of
    the segment that wrote them (``ray_nodes.segment-<n>.json``), before the next one writes its own."""
    nodes = run_dir.root / NODES_FILE
    if nodes.exists():
        os.replace(nodes, nodes.with_name(f"{nodes.stem}.segment-{segment}{nodes.suffix}"))


class RunFinished(Exception):
    """``--resume`` of a run that has all its episodes: its message says so (the command then exits 0)."""


RUN_DEFINING: tuple[tuple[str, ...], ...] = (
    ("env_id",), ("env_kwargs",), ("num_envs",), ("num_procs",), ("num_episodes",), ("runner", "seed"),
    ("runner", "start_seeds"), ("runner", "episode_split"), ("runner", "max_episode_steps"), ("runner", "pipeline"),
    ("runner", "group_size"), ("runner", "pass_proc_id"), ("env",),
)
"""The keys of ``client_config.json`` that decide which episodes a run has (which envs, built how, run which
episodes from which seeds, and how many): a ``--resume`` must give them the stopped run's values. ``env`` stands
for each of its keys (the env's config, ``--env.*``). The others (the server's address, the API key, progress,
tracking, the launcher, ...: :data:`MAY_CHANGE`) may change."""

MAY_CHANGE: tuple[tuple[str, ...], ...] = (
    ("exp_name",), ("output_dir",), ("resume",), ("server_host",), ("server_port",), ("server_url",),
    ("local_policy",), ("local_policy_choices",), ("local_policy_options",), ("local_policy_horizon",), ("transport",),
    ("progress",), ("env_path",), ("launcher",), ("tracking",), ("connection",), ("openpi",), ("recorder",), ("ray",),
    ("runner", "replan_steps"),
    ("runner", "non_finite_actions"), ("runner", "non_finite_rewards"), ("runner", "non_finite_observations"),
    ("runner", "check_partial_reset"), ("runner", "instruction"), ("runner", "align_chunks"),
    ("runner", "use_env_lock"), ("runner", "start_method"),
)
"""The keys of ``client_config.json`` a ``--resume`` may change: where the run's server, policy, files and processes
are, what it shows, records and tracks, and how its loop asks for actions and handles odd values; none of them
decides which episodes the run has. Every flag is in this table or in :data:`RUN_DEFINING`, never in both."""

FLAG_NAMES = {("env_id",): "the env id", ("env_kwargs",): "the env's registered kwargs",
              ("env", "max_episode_steps"): "the time limit (--runner.max-episode-steps, or the env's registered one)"}
"""What a refusal calls the keys of :data:`RUN_DEFINING` that are not named by the rule of :func:`_flag`."""


def _flag(path: tuple[str, ...]) -> str:
    """The flag that sets the key ``path`` of ``client_config.json`` (``("runner", "start_seeds")`` is
    ``--runner.start-seeds``)."""
    return FLAG_NAMES.get(path) or "--" + ".".join(part.replace("_", "-") for part in path)


def _run_defining(record: dict[str, Any]) -> dict[str, Any]:
    """Flag -> value of every key of :data:`RUN_DEFINING` in a ``client_config.json`` record (``env`` split into
    its keys; a key the record lacks is None)."""
    out: dict[str, Any] = {}
    for path in RUN_DEFINING:
        value = _at(record, path)
        if path == ("env",) and isinstance(value, dict):
            out.update({_flag(("env", key)): value[key] for key in value})
        else:
            out[_flag(path)] = value
    return out


def _open_stopped_run(config: ClientConfig, run_dir: RunDir, lock: RunLock, uid: str, env_kwargs: dict[str, Any],
                      limit: int | None) -> int:
    """Check that ``run_dir`` holds a stopped run this command may continue, and take its lock: the folder holds a
    run (its ``client_config.json``), no live process runs it, the flags that define its episodes are its own
    (:data:`RUN_DEFINING`), every line of its ``episodes.jsonl`` files is an episode of it, and it still needs
    episodes (otherwise :class:`RunFinished`, by :func:`~plugrl_env_client.launch.process.episodes_of_run`). Each
    refusal is a :class:`ConfigError` that says what to do; none of them, nor the finished case, changes the
    folder. Returns the episodes on disk."""
    root = run_dir.root
    if not root.is_dir():
        raise ConfigError(f"--resume: {root} holds no run to resume (no such folder); check --output-dir and "
                          "--exp-name, or leave out --resume to start a new run")
    if not run_dir.client_config.is_file():
        raise ConfigError(f"--resume: {root} holds no run to resume (no client_config.json: its run never got "
                          "going); delete that folder and start the run again without --resume")
    if not lock.acquire():
        raise ConfigError(f"--resume: {root} is in use by a run that is still alive (process {lock.holder()} holds "
                          f"{lock.path.name}); wait for it to end, or stop it, then --resume")
    try:
        try:
            stopped = json.loads(run_dir.client_config.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ConfigError(f"--resume: cannot read {run_dir.client_config} ({exc}); the run cannot be "
                              "resumed without it") from None
        now = json.loads(json.dumps(finite_json(
            with_plugrl_config_keys(_recorded_config(config, uid, env_kwargs), uid, limit))))
        _refuse_changed(root, _run_defining(stopped), _run_defining(now))
        done = sum(len(stopped_episodes(run_dir.episodes_file(p), p, config.num_envs).episodes)
                   for p in range(config.num_procs))
        target = episodes_of_run(config)
        if target is not None and done >= target:
            raise RunFinished(_finished(root, config, done))
        return done
    except BaseException:
        lock.release()
        raise


def _finished(root: Path, config: ClientConfig, done: int) -> str:
    """What a ``--resume`` of a run that has its ``done`` episodes, all it needs, says."""
    seeds = len(config.runner.start_seeds)
    if seeds and (config.num_episodes is None or seeds <= config.num_episodes):
        has = f"its {done} episodes, one per seed of --runner.start-seeds"
    else:
        has = f"its {done} of --num-episodes {config.num_episodes} episodes"
    return f"{root} is finished: it has {has}; nothing to resume"


def _at(record: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        record = record.get(key) if isinstance(record, dict) else None
    return record


def _refuse_changed(root: Path, then: dict[str, Any], now: dict[str, Any]) -> None:
    """A ConfigError naming every flag whose value ``now`` is not the stopped run's (``then``), in the order of
    :data:`RUN_DEFINING`."""
    changed = [f"{flag} is {json.dumps(now.get(flag))} now but {json.dumps(then.get(flag))}"
               for flag in [*now, *(f for f in then if f not in now)] if then.get(flag) != now.get(flag)]
    if changed:
        raise ConfigError(f"--resume: {'; '.join(changed)} in {root}'s client_config.json; a resumed run keeps the "
                          "flags that define its episodes: pass the stopped run's "
                          f"{'value' if len(changed) == 1 else 'values'}, or start a new run with another --exp-name")


def _report(uid: str, run_dir: RunDir, summary: dict[str, Any], writer: RunWriter, signum: int | None) -> int:
    """Print the end-of-run table and errors; returns the exit code. A run folder that could not be written is one
    message (each process stopped by it would only repeat it)."""
    episodes = summary["completed_episodes"]
    print(f"\n{uid}: {episodes} episode{'' if episodes == 1 else 's'}\n{summary_table(summary)}\n"
          f"summary: {run_dir.summary}")
    if writer.failure is not None:
        print(f"error: {writer.failure_message()}", file=sys.stderr)
    log = run_log()
    if log is not None and log.failure is not None and writer.failure is None:
        print(f"warning: {run_dir.log_file} stops short: {log.failure}", file=sys.stderr)
    failed = {pid: why for pid, why in writer.failures().items() if why != writer.failure_message()}
    if failed:
        for pid in sorted(failed):
            print(f"error: process {pid} failed: {failed[pid]}", file=sys.stderr)
        print(f"details (tracebacks included) are in {run_dir.log_file}", file=sys.stderr)
    if failed or writer.failure is not None:
        return 1
    return 0 if signum is None else 128 + signum


def _write_client_config(run_dir: RunDir, config: ClientConfig, uid: str, env_kwargs: dict[str, Any],
                         limit: int | None, chosen: dict[str, Any] | None = None) -> None:
    recorded = _recorded_config(config, uid, env_kwargs)
    recorded["runner"].update(chosen or {})  # what --runner.pipeline auto chose, beside the flags as given
    write_json_atomic(run_dir.client_config, with_plugrl_config_keys(recorded, uid, limit))


def _choose_pipeline(job: ProcessJob, env: BaseEnv | None, writer: RunWriter) -> tuple[ClientConfig, BaseEnv | None]:
    """``--runner.pipeline auto``: probe (with the run's lockstep env when it is built here), log the choice, note
    it for the summary; the run's config with the groups chosen, and the env still to use (None once split)."""
    choice = choose_pipeline(job, env=env)
    logger.info("--runner.pipeline auto: %d group(s) of %d envs (%s)%s", choice.groups,
                job.config.num_envs // choice.groups, choice.why,
                "" if choice.probe is None else
                f"; probe: batch step {choice.probe.batch_step_s * 1e3:.2f} ms, waiting "
                f"{choice.probe.wait_per_batch_step_s * 1e3:.2f} ms and the client's work "
                f"{choice.probe.overhead_s * 1e3:.2f} ms per batch step, round trip "
                f"{choice.probe.round_trip_s * 1e3:.2f} ms")
    writer.notes["pipeline"] = choice.to_json()
    if choice.groups > 1 and env is not None:  # each group builds its own env
        close_env(env, job.env_id)
        env = None
    assert isinstance(job.config, ClientConfig)
    return with_pipeline(job.config, choice.groups), env


def _served_at(config: ClientConfig, url: str) -> ClientConfig:
    """``config`` with the server flags of the server at ``url`` (the embedded one, on a port of its own)."""
    parts = urlsplit(url)
    return dataclasses.replace(config, server_url=(url,), server_host=parts.hostname or config.server_host,
                               server_port=parts.port or config.server_port)


def _recorded_config(config: ClientConfig, env_id: str, env_kwargs: dict[str, Any]) -> dict[str, Any]:
    """Every flag of the run for ``client_config.json``; the API key and the server URL's password are not
    written to disk."""
    flags = dataclasses.asdict(config)
    flags["output_dir"] = str(config.output_dir)
    if flags["connection"].get("api_key"):
        flags["connection"]["api_key"] = REDACTED
    urls = [redact_url(url) for url in config.server_url]
    flags["server_url"] = (urls[0] if len(urls) == 1 else urls) if urls else None  # one URL as one string
    return {"env_id": env_id, "env_kwargs": env_kwargs, **flags}


def check_config(config: ClientConfig, env_id: str) -> None:
    """The checks of a run's flags that need nothing built yet (a ConfigError saying what to change): a suite makes
    them for every task before the first one runs."""
    if config.exp_name is not None:
        _check_exp_name(config.exp_name)
    elif config.resume:
        raise ConfigError("--resume continues the run in --output-dir/<exp-name>: pass the stopped run's --exp-name "
                          "(its folder's name)")
    if not config.local_policy:
        for url in config.server_url or (None,):
            _check_server_port(config, url)
    else:
        try:  # the embedded policy's own options, as its config reads them
            options_config(config.local_policy, config.embedded_options())
        except ConfigError as exc:
            raise ConfigError(f"--local-policy {config.local_policy}: {exc}") from None
    _check_openpi(config)
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
    connection = config.connection
    images.check_choice(connection.image_codec, connection.image_quality, connection.word)  # and its extra
    _check_api_key(config)
    group_sizes(config, get_spec(env_id))  # pipeline and seed groups must split the envs evenly
    require(config.tracking)  # its library, before the run folder exists


def _check_api_key(config: ClientConfig) -> None:
    """The API key (``--api-key``, else ``$PLUGRL_API_KEY``) must fit an HTTP header; it is hidden in every text the
    run shows or writes from now on. A key that does not fit is refused before the run starts, saying where it came
    from and what is wrong with it, never the key."""
    flag = config.connection.api_key
    key = flag or os.environ.get(API_KEY_VARIABLE) or None
    if key is None:
        return
    add_secret(key)
    problem = api_key_problem(key)
    if problem is not None:
        source = "--api-key" if flag else f"${API_KEY_VARIABLE}"
        raise ConfigError(f"the API key in {source} cannot be sent in the handshake's Authorization header: "
                          f"{problem}; give the key alone, printable ASCII without spaces (a key read from a file "
                          "saved with CR LF line ends: remove the CR, e.g. with tr -d '\\r')")


def _check_exp_name(name: str) -> None:
    """A run folder's name, never a path: ``--exp-name ../x`` (or ``a/b``, or an absolute path) would write outside
    --output-dir."""
    separators = {"/", os.sep, os.altsep or "/"}
    if name in ("", ".", "..") or any(sep in name for sep in separators):
        last = name.replace(os.altsep or "/", "/").replace(os.sep, "/").rstrip("/").rsplit("/", 1)[-1]
        raise ConfigError(
            f"--exp-name {name!r} must be a folder name, without '/' and other than '.' or '..': the run goes to "
            "--output-dir/<exp-name>; to write somewhere else, set --output-dir (e.g. --output-dir ../elsewhere "
            f"--exp-name {last if last not in ('', '.', '..') else 'my-run'})"
        )


def _check_openpi(config: ClientConfig) -> None:
    """The --openpi.* flags of a run with --protocol openpi, worded for the command line."""
    if config.connection.protocol != "openpi":
        return
    openpi = config.openpi
    if openpi.image_size < 0:
        raise ConfigError(f"--openpi.image-size must be >= 0 pixels (0: as the env renders them), got "
                          f"{openpi.image_size}")
    for item in openpi.key:
        try:
            KeyMap.of("none", (item,))
        except ValueError as exc:
            raise ConfigError(f"--openpi.key: {exc}") from None
    try:
        KeyMap.of(openpi.preset, openpi.key, openpi.image_size)
    except ValueError as exc:
        raise ConfigError(f"--openpi.preset: {exc}") from None
    if openpi.connections is not None and not 1 <= openpi.connections:
        raise ConfigError(f"--openpi.connections must be >= 1 (default: one per env), got {openpi.connections}")
    if config.connection.image_codec != "none":
        raise ConfigError(f"--image-codec {config.connection.image_codec} is a PlugRL feature; openpi's protocol "
                          "sends raw uint8 images (--openpi.image-size sets their size): leave --image-codec out")


def _check_server_port(config: ClientConfig, url: str | None) -> None:
    """The port of an external server: 1..65535 (port 0 is "any free port" to a server, and no address to
    connect to: the client would wait for ever)."""
    if url is not None:
        try:
            port, flag = urlsplit(url).port, f"--server-url {redact_url(url)}"
        except ValueError:  # a port that is no number, or out of range
            port, flag = -1, f"--server-url {redact_url(url)}"
    else:
        port, flag = config.server_port, f"--server-port {config.server_port}"
    if port is not None and not 1 <= port <= 65535:
        raise ConfigError(
            f"{flag}: the server's port must be from 1 to 65535; give the port the server listens on (the one "
            "plugrl-run-policy-server --port N was started with), or use --local-policy random to start a server "
            "in this process"
        )


def _start_local_policy(config: ClientConfig, env_id: str, env: BaseEnv | None, run_dir: RunDir) -> PolicyServer:
    """The embedded reference server, matched to the env's action space (read from ``env`` when it is built
    already; otherwise from a one-env probe, for runs whose envs are built in other processes). ARS saves its
    policy into the run folder and answers one action per step unless --local-policy-horizon says otherwise (the
    flag's default, 4, is the other policies' horizon)."""
    from plugrl_env_client.server.embedded import start_local_server

    probe = env if env is not None else build_env(ProcessJob(env_id, dataclasses.replace(config, num_envs=1), 0, ""),
                                                       get_spec(env_id))
    try:
        space = contract.action_space_of(probe)
    finally:
        ended = close_env(probe, env_id) if probe is not env else None
    if ended is not None:
        raise EnvExitError(ended)
    assert config.local_policy is not None
    openpi = (KeyMap.of(config.openpi.preset, config.openpi.key) if config.connection.protocol == "openpi"
              else None)
    server = start_local_server(config.local_policy, space, config.local_policy_horizon, seed=config.runner.seed,
                                options=config.embedded_options(), transport=config.transport,
                                run_root=run_dir.root, openpi=openpi)
    logger.info("embedded %s policy serving on %s", config.local_policy, server.url)
    return server


__all__ = ["check_config", "run_client"]
