"""One rollout process from its job: build the env and the session, run the rollout, report how it ended.

Process p uses env indices 0..N-1 on its own connection and seeds its first reset with ``seed + p * num_envs``,
so processes never share a seed when envs derive per-env seeds from it. A process of a resumed run gets, per env,
the episodes it completed before (``ProcessJob.first_episodes``): each env continues its episode numbering there.
Under the static split each env runs a fixed share of the process's episodes (:func:`shares_of_envs`), so which
episodes a run has depends only on its flags. Whatever happens, the process reports its final timing and a
:class:`ProcessResult` (user errors become its message; bugs are logged with their traceback), and closes its env
once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
from typing import Any, ClassVar, Literal, Protocol, TypeVar
from urllib.parse import urlsplit

from plugrl_env_client.connection_flags import ConnectionConfig, OpenpiConfig
from plugrl_env_client.envs import contract
from plugrl_env_client.envs.base_env import BaseEnv, BaseEnvConfig
from plugrl_env_client.envs.calls import call_env
from plugrl_env_client.envs.registry import EnvSpec, get_spec, make_env
from plugrl_env_client.errors import ConfigError, EnvCrashedError, EnvExitError, PlugRLError
from plugrl_env_client.outputs.recording.config import RecorderConfig
from plugrl_env_client.outputs.recording.recorder import EpisodeRecorder
from plugrl_env_client.protocol.dialing import ServerUnreachable, SessionConfig
from plugrl_env_client.protocol.openpi_keys import MissingKey
from plugrl_env_client.protocol.protocols import open_session
from plugrl_env_client.records import ProcessResult, ProcessStatus
from plugrl_env_client.rollout.budget import Budget, env_shares
from plugrl_env_client.rollout.group import EnvGroup
from plugrl_env_client.rollout.interfaces import ResultSink
from plugrl_env_client.rollout.loop import Rollout
from plugrl_env_client.rollout.pipeline_auto import Probe, ProbeBudget, ProbeSink, allowed_groups, choose_split
from plugrl_env_client.rollout.seeds import listed_share
from plugrl_env_client.rollout.settings import LoopConfig, LoopSettings
from plugrl_env_client.rollout.signals import shielded
from plugrl_env_client.server.embedded import local_policy_flag, server_command
from plugrl_env_client.timing import Timing
from plugrl_env_client.websocket.keepalive import Keepalive

logger = logging.getLogger(__name__)

PROGRESS_PERIOD_S = 2.0


@dataclasses.dataclass(frozen=True)
class RunnerConfig(LoopConfig):
    """How the rollout steps its envs, builds them, and shares the work between processes."""

    # The loop's choices are LoopConfig's fields (inherited); these are read by the launcher and process setup.

    pass_proc_id: bool = False
    """Pass process_id and total_processes to the env's constructor."""
    use_env_lock: bool = False
    """Build envs one process at a time (for simulators whose setup is not safe to run concurrently)."""
    start_method: Literal["spawn", "forkserver", "fork"] = "spawn"
    """How --num-procs processes are started."""
    pipeline: int | Literal["auto"] = 1
    """Split each process's envs into this many groups, each with its own env object and connection, and step one
    group while the others wait for their actions (1: every env in lockstep). auto: a short lockstep probe against
    the server before collecting measures the env's batch step and the wait for actions, and picks 1, 2 or 4
    groups once (logged, and recorded as runner.pipeline_chosen in client_config.json and pipeline in the summary);
    unless --runner.align-chunks is given, a second probe with chunks aligned at half the server's horizon decides
    whether aligning them too is faster (then it is set, lockstep included). A split or aligned chunks must save 5 %
    of lockstep's time, and of two options within 5 % of each other the one with fewer groups (then plain chunks)
    is taken. An env registered single_instance=True is never split."""
    episode_split: Literal["static", "shared"] = "static"
    """With --num-episodes: static gives each process a fixed share (shares differ by at most one) and each of its
    envs a fixed share of that, so the episodes depend only on the seed; shared lets whichever process or env
    finishes first take the next one."""


class RunConfig(Protocol):
    """What a rollout process reads of its run's config: the command line's ``ClientConfig`` is one, and so is any
    dataclass with these sections (this layer does not import the command line's config tree, which sits above it).
    A dataclass, so that a launcher can ``dataclasses.replace`` a section (the Ray launcher gives a restarted actor
    fresh seeds)."""

    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]

    @property
    def num_envs(self) -> int: ...
    @property
    def num_episodes(self) -> int | None: ...
    @property
    def num_procs(self) -> int: ...
    @property
    def env(self) -> BaseEnvConfig: ...
    @property
    def runner(self) -> RunnerConfig: ...
    @property
    def recorder(self) -> RecorderConfig: ...
    @property
    def connection(self) -> ConnectionConfig: ...
    @property
    def openpi(self) -> OpenpiConfig: ...


RunConfigT = TypeVar("RunConfigT", bound=RunConfig)


@dataclasses.dataclass
class ProcessJob:
    """Everything a rollout process needs to know (picklable: it crosses to spawned processes)."""

    env_id: str
    config: RunConfig
    process_id: int
    url: str
    """The (first) policy server's URL."""
    first_episodes: tuple[int, ...] = ()
    """Per env: the episodes it completed in earlier segments of a resumed run (empty: none)."""
    urls: tuple[str, ...] = ()
    """Every policy server of the run, ``url`` first, when several were named; empty: ``url`` alone."""

    @property
    def servers(self) -> tuple[str, ...]:
        """The URLs of the run's policy servers."""
        return self.urls or (self.url,)


def process_seed(seed: int | None, process_id: int, num_envs: int) -> int | None:
    return None if seed is None else seed + process_id * num_envs


def build_env(job: ProcessJob, spec: EnvSpec, env_lock: Any = None, num_envs: int | None = None) -> BaseEnv:
    """The process's env batch (``num_envs`` of them: a pipelined process builds one batch per group) of the env
    ``spec``; an exception in the env's constructor names the env and the call."""
    cfg = job.config
    ids = {"process_id": job.process_id, "total_processes": cfg.num_procs} if cfg.runner.pass_proc_id else {}
    with env_lock if (env_lock is not None and cfg.runner.use_env_lock) else contextlib.nullcontext():
        return call_env(spec.uid, "__init__", lambda: make_env(spec.uid, num_envs=num_envs or cfg.num_envs,
                                                               config=cfg.env, **ids), passthrough=(PlugRLError,))


def group_sizes(config: RunConfig, spec: EnvSpec | None = None) -> list[int]:
    """Envs per pipeline group: ``--num-envs`` split into ``--runner.pipeline`` equal groups, each a whole number
    of ``--runner.group-size`` seed groups (otherwise a clear error). ``auto`` is checked as lockstep (the probe
    picks only splits that fit); an env registered single-instance (``spec``) takes only one group."""
    n, k, g = config.num_envs, config.runner.pipeline, config.runner.group_size
    if k == "auto":
        k = 1
    if k > 1 and spec is not None and spec.single_instance:
        raise ConfigError(f"{spec.uid} can exist only once per process (registered single_instance=True), "
                          f"so it cannot be split into --runner.pipeline {k} groups; use --runner.pipeline 1 (or auto)")
    if k < 1:
        raise ConfigError(f"--runner.pipeline must be >= 1, got {k}")
    if g < 1:
        raise ConfigError(f"--runner.group-size must be >= 1, got {g}")
    if n % k:
        raise ConfigError(f"--num-envs {n} does not split into --runner.pipeline {k} equal groups; use a multiple of "
                          f"{k} (e.g. --num-envs {n + k - n % k}) or another --runner.pipeline")
    if (n // k) % g:
        raise ConfigError(f"--runner.group-size {g} must divide the envs of each pipeline group ({n // k} = "
                          f"--num-envs {n} / --runner.pipeline {k})")
    return [n // k] * k


def loop_settings(job: ProcessJob, spec: EnvSpec, with_shares: bool = True) -> LoopSettings:
    """The rollout settings of ``job``'s process: the runner's choices, with its seed, time limit and env (its
    ``spec``). ``with_shares``: each env runs its share of the run's episodes (:func:`shares_of_envs`); False for a
    probe, whose episodes are not the run's."""
    cfg = job.config
    first = _per_env(job.first_episodes, cfg.num_envs)
    per_env = shares_of_envs(cfg, job.process_id) if with_shares else ()
    if per_env and any(done > share for done, share in zip(first, per_env)):
        # a run folder whose envs were not given shares of their own: the budget alone ends the process, which
        # still collects its share exactly
        logger.warning("process %d: its episodes on disk (%s per env) do not follow the static split's per-env "
                       "shares (%s); its envs collect the rest of its share first come, first served",
                       job.process_id, list(first), list(per_env))
        per_env = ()
    return LoopSettings.of(
        cfg.runner,
        seed=process_seed(cfg.runner.seed, job.process_id, cfg.num_envs),
        max_episode_steps=spec.max_episode_steps if cfg.runner.max_episode_steps is None else cfg.runner.max_episode_steps,
        env_id=spec.uid,
        process_id=job.process_id,
        success_threshold=spec.best_reward_threshold_for_success,
        reuse_feedback_obs=cfg.connection.reuse_feedback_obs,
        progress_period_s=PROGRESS_PERIOD_S,
        start_seeds=listed_share(cfg.runner.start_seeds, job.process_id, cfg.num_procs),
        process_envs=cfg.num_envs,
        first_episodes=first,
        env_shares=per_env,
    )


def shares_of_envs(config: RunConfig, process_id: int) -> tuple[int, ...]:
    """How many episodes each env of process ``process_id`` runs in the whole run: its share of the static split
    (``--runner.episode-split static`` with ``--num-episodes``) or of the listed start seeds, the smaller when
    both apply; empty when neither does (``shared``, or no episode count)."""
    runner = config.runner
    limits = [len(runner.start_seeds)] if runner.start_seeds else []
    if config.num_episodes is not None and runner.episode_split == "static":
        limits.append(config.num_episodes)
    if not limits:
        return ()
    return tuple(env_shares(min(limits), config.num_procs, process_id, config.num_envs))


def episodes_of_run(config: RunConfig) -> int | None:
    """How many episodes the run has in all, the one rule of when a run is finished whatever ends it: one per
    listed start seed (``--runner.start-seeds``), ``--num-episodes``, the fewer when both are given; None when
    neither is (the run collects until the server ends it, and is never finished by its count)."""
    limits = [len(config.runner.start_seeds)] if config.runner.start_seeds else []
    if config.num_episodes is not None:
        limits.append(config.num_episodes)
    return min(limits) if limits else None


@dataclasses.dataclass(frozen=True)
class PipelineChoice:
    """``--runner.pipeline auto``'s pick for a run: the number of groups, why, and the probe's figures (None when
    nothing needed measuring)."""

    groups: int
    why: str
    probe: Probe | None = None

    def to_json(self) -> dict[str, Any]:
        return {"groups": self.groups, "why": self.why,
                "probe": None if self.probe is None else self.probe.to_json()}


def choose_pipeline(job: ProcessJob, stop: Any = None, env: BaseEnv | None = None) -> PipelineChoice:
    """``--runner.pipeline auto``: the number of groups for ``job``'s run, from a short lockstep probe of its env
    batch against its server (see :mod:`~plugrl_env_client.rollout.pipeline_auto`). The probe steps ``env`` (the
    run's lockstep env, left open for the run, which starts every env afresh) or an env batch of its own, closed
    before it returns; its connection is closed and its episodes are not the run's. ``stop`` (the run's stop flag)
    ends it early."""
    cfg, spec = job.config, get_spec(job.env_id)
    allowed = allowed_groups(cfg.num_envs, cfg.runner.group_size, spec.single_instance)
    if len(allowed) == 1:
        why = ("the env can exist only once per process" if spec.single_instance
               else f"--num-envs {cfg.num_envs} allows no other split")
        return PipelineChoice(1, why)
    probed = env if env is not None else build_env(job, spec, num_envs=cfg.num_envs)
    try:
        probe = _probe(job, probed, stop, spec)
    finally:
        if probed is not env:
            close_env(probed, spec.uid)
    groups, why = choose_split(probe, allowed)
    return PipelineChoice(groups, why, probe)


def _probe(job: ProcessJob, env: BaseEnv, stop: Any, spec: EnvSpec) -> Probe:
    """A lockstep probe of ``env`` against ``job``'s server: its figures."""
    timing = Timing()
    budget = ProbeBudget(timing, stop=stop, seed_group=job.config.runner.group_size)
    settings = loop_settings(job, spec, with_shares=False)
    connect = session_config(job, 0, 1, server_hints(env, _port_of(job.url)))
    session = open_session(connect, env.num_envs, lambda: budget.finished(job.process_id), timing)
    sink = ProbeSink()
    Rollout([EnvGroup(env, session, settings, budget, sink, timing)], settings, budget, sink).run()
    return budget.probe()


def with_pipeline(config: RunConfigT, groups: int) -> RunConfigT:
    """``config`` with ``--runner.pipeline`` set to ``groups`` (what auto chose)."""
    return dataclasses.replace(config, runner=dataclasses.replace(config.runner, pipeline=groups))


def run_process(job: ProcessJob, budget: Budget, sink: ResultSink, env_lock: Any = None,
                env: BaseEnv | None = None) -> ProcessResult:
    """Run one process's rollout to its end (with ``env`` when the caller built it already, in lockstep); never
    raises for user errors or interrupts: they become the result. The env's spec is resolved here, once, and
    handed to what needs it; ``--runner.pipeline auto`` is chosen once per run, before its processes start
    (:func:`choose_pipeline`, by the client's run), so a process takes the chosen number. Setup reads the job
    first (group sizes, the server's port, the loop settings), then makes the recorder and the envs, and hands
    each group its ready session config, so no part built later has to reach back for the job."""
    cfg = job.config
    if cfg.runner.start_seeds and not listed_share(cfg.runner.start_seeds, job.process_id, cfg.num_procs):
        return ProcessResult(job.process_id, ProcessStatus.FINISHED)  # more processes than listed seeds: none here
    spec = get_spec(job.env_id)
    timings: list[Timing] = []
    envs: list[BaseEnv] = [] if env is None else [env]
    status, error, signum = ProcessStatus.STARTING, None, None
    recorder: EpisodeRecorder | None = None
    rollout: Rollout | None = None
    keepalive: Keepalive | None = None
    hints: tuple[str, str] | None = None
    try:
        if cfg.runner.pipeline == "auto":
            raise ValueError("--runner.pipeline auto reached a process unresolved: choose_pipeline() picks the "
                             "number of groups once per run, before its processes start")
        sizes = group_sizes(cfg, spec)
        port = _port_of(job.url)
        settings = loop_settings(job, spec)
        recorder = EpisodeRecorder(cfg.recorder, job.process_id, cfg.num_envs, sink.artifacts(job.process_id),
                                   first_episodes=_per_env(job.first_episodes, cfg.num_envs))
        hooks = recorder if recorder.enabled else None
        while len(envs) < len(sizes):
            envs.append(build_env(job, spec, env_lock, sizes[len(envs)]))
        hints = server_hints(envs[0], port)
        connects = [session_config(job, g, len(envs), hints) for g in range(len(envs))]
        recorder.render_for(envs)  # envs that render only the recorded episodes' frames, when asked for them
        keepalive = Keepalive()  # answers the server's pings while an env call of any group runs long (SPEC C2)
        groups = []
        for g, (group_env, connect) in enumerate(zip(envs, connects)):
            timings.append(Timing())
            session = open_session(connect, group_env.num_envs, lambda: budget.finished(job.process_id), timings[g],
                                   keepalive)
            groups.append(EnvGroup(group_env, session, settings, budget, sink, timings[g], g * sizes[0], hooks,
                                   guard=keepalive))
        rollout = Rollout(groups, settings, budget, sink)
        status = rollout.run()
    except PlugRLError as exc:
        # The user sees the message (printed by the CLI); the traceback is for the log file only.
        logger.debug("process %d failed: %s", job.process_id, exc, exc_info=True)
        status, error = ProcessStatus.FAILED, said(exc, hints)
    except KeyboardInterrupt as exc:
        logger.warning("process %d interrupted", job.process_id)
        status, signum = ProcessStatus.INTERRUPTED, getattr(exc, "signum", signal.SIGINT)
    except Exception as exc:  # a bug: keep the traceback in the log, the message for the user
        logger.exception("process %d crashed", job.process_id)
        status, error = ProcessStatus.FAILED, f"internal error {type(exc).__name__}: {exc}"
    finally:
        if keepalive is not None:
            keepalive.close()
        with shielded():  # a second Ctrl-C must not lose the final report
            sink.progress(job.process_id, status, rollout.timing() if rollout is not None else Timing.total(timings))
            report = recorder.close().to_json() if recorder is not None and recorder.enabled else None
            for built in envs:
                ended = close_env(built, spec.uid)
                if ended is not None and error is None:  # env code that ends the process fails it, even here
                    status, error, signum = ProcessStatus.FAILED, ended, None
    return ProcessResult(job.process_id, status, error, signum, report)


def _per_env(counts: tuple[int, ...], num_envs: int) -> tuple[int, ...]:
    """``counts`` (episodes per env of a resumed process) padded with zeros to ``num_envs`` (empty stays empty)."""
    return (tuple(counts) + (0,) * num_envs)[:num_envs] if counts else ()


def session_config(job: ProcessJob, group: int, groups: int, hints: tuple[str, str]) -> SessionConfig:
    """How group ``group`` of ``groups`` of the process connects: the run's server flags, and the ``hints`` that fit
    its env (:func:`server_hints`). With several servers the groups of the run take them in turn (a PlugRL group
    connects to its one; an openpi group spreads its connections over all of them, starting from it); with openpi's
    protocol the process's ``--openpi.connections`` are shared out between its groups."""
    connection, cfg = job.config.connection, job.config
    command, flag = hints
    servers = job.servers
    openpi = None
    if connection.protocol == "openpi":
        openpi = cfg.openpi
        if openpi.connections is not None:
            openpi = dataclasses.replace(openpi, connections=max(1, openpi.connections // groups))
    return connection.session(
        api_key=connection.api_key or os.environ.get("PLUGRL_API_KEY") or None,
        url=servers[(job.process_id * groups + group) % len(servers)],
        urls=servers,
        openpi=openpi,
        waiting_hint=f"Start one with `{command}`, or run with `{flag}` to use the embedded one.",
        stream=(job.process_id, group),
    )


def server_hints(env: BaseEnv, port: int | str) -> tuple[str, str]:
    """How to start a policy server that fits ``env`` at ``port`` (the job's), and the flag that embeds one
    instead."""
    space = contract.action_space_of(env)
    return server_command(space, port), local_policy_flag(space)


def said(exc: PlugRLError, hints: tuple[str, str] | None) -> str:
    """What the user reads of ``exc``: its message, and for a server that never answered, what to do about it
    (``hints``: :func:`server_hints` of the process's env, None before it has one)."""
    if isinstance(exc, MissingKey):
        return (f"{exc}; map it with --openpi.key {exc.key}={exc.source.group}.<name> (or leave it out with "
                f"--openpi.key {exc.key}=), or pick another --openpi.preset")
    if not isinstance(exc, ServerUnreachable) or hints is None:
        return str(exc)
    if not exc.first:
        return f"{exc}; it went away and did not come back"
    command, flag = hints
    return f"{exc}; start one with `{command}` or use `{flag}`"


def _port_of(url: str) -> int | str:
    try:
        return urlsplit(url).port or "<port>"
    except ValueError:  # a malformed URL: the session says so when it connects
        return "<port>"


def close_env(env: BaseEnv, uid: str) -> str | None:
    """Close ``env``; the message when its ``close`` tried to end the process (``sys.exit``, a ``BaseException``),
    which fails the process. A close that raises an ordinary exception is one warning line on the terminal, not a
    traceback after a successful run's table (the traceback goes to the log file only): the run's results are safe
    by then."""
    try:
        call_env(uid, "close", env.close)
    except EnvExitError as exc:
        logger.debug("%s", exc, exc_info=True)
        return str(exc)
    except EnvCrashedError as exc:
        logger.warning("%s (the run's results are written; the traceback is in the run's logs/client.log)", exc)
        logger.debug("env %s raised in close()", uid, exc_info=exc.__cause__ or exc)  # the env's own traceback
    return None
