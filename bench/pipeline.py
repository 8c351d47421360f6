"""The client against raw stepping of a real simulator, with the reference server in another process.

Run from the repo root (extra ``mujoco``)::

    python bench/pipeline.py            # about 6 minutes on 2 cores
    python bench/pipeline.py --quick    # about 2 minutes: shorter cells, fewer rounds, noisier numbers

On a user's machine the server runs elsewhere (a GPU box), so what matters is what the client itself costs next to
the simulator. With two or more usable cores the bench pins the server process to one core and this process (and the
client processes it spawns) to another (``os.sched_setaffinity``), and it measures raw stepping and the client cell
by cell in turn (A B A B ...): each client figure is the median over rounds of client / raw measured back to back,
so a load change on a shared machine moves both sides of a ratio. Every figure is printed next to its target:

1. Hopper-v5 (Gymnasium backend, early terminations: episodes end at different steps, so chunk boundaries drift
   apart) at n=16, H=8, no server latency: the client / raw stepping of the same env object (resets of finished envs
   included). Target >= 0.9 without ``--runner.align-chunks`` (it changes which chunk steps a policy's actions are
   used for); the aligned rows are information.
2. The same with the server holding each action back for about one batch step of the env (``--policy.latency-ms``
   set to the batch step measured at the start), as a GPU policy would. Target: pipelined (align allowed: hiding a
   slow server is what it is for) / raw stepping without latency >= 0.85; pipelined / lockstep as information.
   ``--runner.pipeline auto`` is a row of cells 1 and 2: its probe runs once against each server (its choice, why,
   and the probe's time are printed), and its cells run with the groups it chose. Targets: auto / raw stepping
   without latency >= 0.85 in cell 2; auto / lockstep >= 0.95 in cell 1 (not slower, within the noise).
3. The client's CPU time per group step outside the env (this process's CPU time minus the env's own step and reset
   CPU time, from the first step on), as a share of the env's own CPU per group step (a loaded or slower machine
   stretches both, so the share holds across hosts where microseconds do not), pipelined with 2 groups of 8 envs
   (target <= 20 %; the long-run one <= 10 %), and as information the same with ``--runner.align-chunks 4`` and
   lockstep with one group of 16. Most of the client's work comes with each exchange (a feedback, an infer and its
   reply), so each row prints its exchanges per group step too: without align, chunk ends scatter as episodes end
   at different steps, and nearly every group step has one. The rollout runs in this process for it.
4. The package's own Python calls per batch step (cProfile of the rollout's thread, Point-v1 x16 in lockstep; calls
   into Point-v1's own package are the env's and counted apart): targets <= 80 at H=1 and <= 70 at H=8 (fewer calls
   is what a shorter walk of an observation buys).
5. The package's lockstep against ``minimal_client.py`` (a minimal protocol-correct client, the Python floor) in
   the same rounds, same server and cores (Hopper-v5 x16, H=8, no latency), both measured at Gymnasium's vector env
   (``SyncVectorEnv.step`` and ``reset`` are the env; the package's env wrapper counts as client work). Targets:
   package / minimal env-steps/s >= 1 (median of the pair ratios), and the package's CPU per batch step outside the
   vector env lower than the minimal client's.

Near-term targets are printed as rows of their own beside the long-run ones: the client's CPU per 8-env group step,
pipelined, <= 20 % of the env's (part 3; long-run 10 %); pipelined, 2 groups, no align / raw >= 0.8 (part 1; long-run
0.9); and part 5. Lockstep's
ratio to the tree before (>= 0.97) takes runs of both trees in turn (bench/README.md, "How to compare two trees").
Targets are measured with a 1-minute load average below 1.5; the first lines say when it is not.

``--profile`` adds the wall time of the rollout's named steps per group step for cell 1's pipelined run.

The client runs the real launch code (``launch.local.LocalLauncher``, in this process for one process: env groups, sessions over loopback
WebSockets, the run's writer in a temp dir); a timer ends each cell through the budget's stop flag. The server is
``plugrl-run-policy-server`` (random policy, horizon 8) in a subprocess, so client and server do not share one
interpreter. Numbers depend on the machine and its load: compare them within one run only.
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import functools
import inspect
import multiprocessing as mp
import os
import pstats
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import minimal_client
import numpy as np
from machine import ReferenceServer, load_avg, machine_line, usable_cpus

from plugrl_env_client.config import ClientConfig, RunnerConfig
from plugrl_env_client.envs import discover_envs
from plugrl_env_client.envs.mujoco.mujoco_env import MujocoEnvConfig
from plugrl_env_client.launch.local import LocalLauncher
from plugrl_env_client.launch.process import PipelineChoice, ProcessJob, choose_pipeline
from plugrl_env_client.outputs.run_dir import RunDir
from plugrl_env_client.outputs.run_writer import RunWriter
from plugrl_env_client.rollout.budget import EpisodeBudget
from plugrl_env_client.utils.registration import make_env

TASK = "Hopper-v5"
NUM_ENVS = 16
HORIZON = 8
ACTION_DIM = 3
EPISODE_CAP = 1000  # Hopper's own limit; random actions end episodes after ~20-40 steps anyway
AUTO_VS_LOCKSTEP = 0.95
"""``--runner.pipeline auto`` / lockstep with a server that answers at once: not slower (5 % of noise allowed)."""
PIPELINED_VS_RAW = 0.8
"""Pipelined, 2 groups, no align / raw stepping, no latency: near-term target (the long-run one is 0.9)."""
CLIENT_SHARE = 0.20
"""The client's CPU per 8-env group step, pipelined, as a share of the env's own CPU per group step: near-term target
(a 150-line client without checks, seeds and episode records uses about half the package's CPU)."""
CLIENT_SHARE_LONG_RUN = 0.10
"""The same share: long-run target."""
CALLS_PER_BATCH_STEP = {1: 80.0, 8: 70.0}
"""The package's Python calls per batch step (Point-v1 x16, lockstep), by action horizon: targets."""
LOCKSTEP_VS_MINIMAL = 1.0
"""The package's lockstep / ``minimal_client.py``, env-steps/s: at least as fast as a minimal client."""
QUIET_LOAD = 1.5
"""Targets are measured with the 1-minute load average below this before the run."""

CORES: tuple[set[int], set[int]] | None = None
"""(this process and its client processes, the server) when the machine has two usable cores or more."""


def pin() -> None:
    """Pin this process (and so every process it spawns later) to its first usable core, leaving the second to the
    server, when there are two or more."""
    global CORES
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if len(cores) >= 2:
        CORES = ({cores[0]}, {cores[1]})
        os.sched_setaffinity(0, CORES[0])


def Server(latency_ms: float = 0.0, action_dim: int = ACTION_DIM, horizon: int = HORIZON) -> ReferenceServer:
    """The reference server on the server's core, answering ``action_dim`` actions in chunks of ``horizon``."""
    return ReferenceServer(["--policy.action-dim", str(action_dim), "--policy.action-horizon", str(horizon),
                            "--policy.latency-ms", f"{latency_ms:g}"], CORES[1] if CORES else None)


def raw_rate(seconds: float, num_envs: int = NUM_ENVS) -> tuple[float, float]:
    """Env-steps/s of the env object alone (random actions, finished envs reset as the runner does), and the
    seconds of one batch step. Best of 3 slices."""
    env = make_env("MuJoCo-v1", num_envs=num_envs, config=MujocoEnvConfig(task=TASK))
    rng = np.random.default_rng(0)
    actions = rng.uniform(-1, 1, (64, num_envs, ACTION_DIM)).astype(np.float32)
    env.reset(seed=0)
    lengths = np.zeros(num_envs, int)
    best = 0.0
    try:
        for _ in range(3):
            steps, start = 0, time.perf_counter()
            while time.perf_counter() - start < seconds / 3:
                _, _, terminated, truncated, _ = env.step(actions[steps % 64])
                lengths += 1
                done = terminated | truncated | (lengths >= EPISODE_CAP)
                if done.any():
                    env.reset(options={"reset_mask": done, "reset_indices": np.flatnonzero(done)})
                    lengths[done] = 0
                steps += 1
            best = max(best, steps * num_envs / (time.perf_counter() - start))
    finally:
        env.close()
    return best, num_envs / best


def _config(port: int, pipeline: int | str = 1, num_procs: int = 1, align: int = 0, env: str = "MuJoCo-v1",
            num_envs: int = NUM_ENVS) -> ClientConfig:
    from plugrl_env_client.envs.point.point_env import PointEnvConfig

    added = {"env": MujocoEnvConfig(task=TASK) if env == "MuJoCo-v1" else PointEnvConfig()}
    return ClientConfig(num_envs=num_envs, num_procs=num_procs, server_port=port, progress=False, **added,
                        runner=RunnerConfig(pipeline=pipeline, max_episode_steps=EPISODE_CAP, align_chunks=align))


def auto_choice(port: int) -> PipelineChoice:
    """What ``--runner.pipeline auto`` picks against the server on ``port`` (its probe, run here once, as the
    client's run does before collecting); the cells then run with the groups it chose, so they measure the steady
    state, and the probe's own time is printed apart."""
    job = ProcessJob("MuJoCo-v1", _config(port, pipeline="auto"), 0, f"ws://127.0.0.1:{port}")
    started = time.perf_counter()
    choice = choose_pipeline(job)
    probe = choice.probe
    figures = "" if probe is None else (f"; probe {time.perf_counter() - started:.2f} s: batch step "
                                        f"{probe.batch_step_s * 1e3:.2f} ms, waiting {probe.wait_per_batch_step_s * 1e3:.2f}"
                                        f" ms per batch step")
    print(f"  auto chose {choice.groups} group(s): {choice.why}{figures}")
    return choice


def client_rate(port: int, seconds: float, pipeline: int | str = 1, num_procs: int = 1, align: int = 0) -> float:
    """Env-steps/s of the client (``num_procs`` processes of NUM_ENVS envs) against the server on ``port``. One
    process runs in this one, and its rate is taken from its first env step to its last (a loaded machine can spend
    seconds building the env and connecting); several are spawned, and their rate is the run's own."""
    if num_procs == 1:
        from plugrl_env_client.envs.mujoco.mujoco_env import MujocoEnv

        with EnvMeter(MujocoEnv) as meter:
            run_here(_config(port, pipeline, align=align), "MuJoCo-v1", port, seconds, meter)
        return meter.steps * (NUM_ENVS // pipeline) / max(1e-9, meter.last_wall - meter.first_wall)
    config = _config(port, pipeline, num_procs, align)
    ctx = mp.get_context("spawn")
    budget = EpisodeBudget(None, ctx, num_procs)
    with tempfile.TemporaryDirectory(prefix="plugrl-bench-") as tmp:
        writer = RunWriter(RunDir(Path(tmp) / "run").create(), "bench", num_procs)
        jobs = [ProcessJob("MuJoCo-v1", config, p, f"ws://127.0.0.1:{port}") for p in range(num_procs)]
        timer = threading.Timer(seconds, budget.stop.set)
        timer.start()
        try:
            LocalLauncher(config).launch(jobs, budget, writer)
        finally:
            timer.cancel()
        summary = writer.close()
    if summary["status"] not in ("interrupted", "finished"):
        raise RuntimeError(f"the client run ended {summary['status']}: {summary.get('errors')}")
    return float(summary["timing"]["effective_fps"])


def run_here(config: ClientConfig, env_id: str, port: int, seconds: float, meter: EnvMeter | None = None
             ) -> dict[str, Any]:
    """One process's rollout in this process (so it can be measured from inside), ended by a timer; its timing.
    With a ``meter``, the timer starts at the env's first step, so that ``seconds`` are all steady state."""
    budget = EpisodeBudget(None, mp.get_context("spawn"), 1)
    timer = threading.Timer(seconds, budget.stop.set)
    with tempfile.TemporaryDirectory(prefix="plugrl-bench-") as tmp:
        writer = RunWriter(RunDir(Path(tmp) / "run").create(), "bench", 1)
        if meter is None:
            timer.start()
        else:
            meter.on_first_step.append(timer.start)
        try:
            LocalLauncher(config).launch([ProcessJob(env_id, config, 0, f"ws://127.0.0.1:{port}")], budget, writer)
        finally:
            timer.cancel()
        summary = writer.close()
    if summary["status"] not in ("interrupted", "finished"):
        raise RuntimeError(f"the client run ended {summary['status']}: {summary.get('errors')}")
    return summary["timing"]


class EnvMeter:
    """Wraps an env class's ``step`` and ``reset`` for one run in this process: counts the steps and adds up the
    CPU time this thread spends inside them (the env's own), and reads the process's CPU clock and the wall clock
    at the first step and after the last, so setup and teardown are left out. ``on_first_step`` runs once, before the first step."""

    def __init__(self, cls: type) -> None:
        self.cls = cls
        self.on_first_step: list[Callable[[], None]] = []
        self.steps = 0
        self.env_cpu = 0.0
        self.first = self.last = 0.0
        self.first_wall = self.last_wall = 0.0
        self._originals = {name: getattr(cls, name) for name in ("step", "reset")}

    def __enter__(self) -> EnvMeter:
        for name, fn in self._originals.items():
            setattr(self.cls, name, self._wrap(name, fn))
        return self

    def __exit__(self, *exc: object) -> None:
        for name, fn in self._originals.items():
            setattr(self.cls, name, fn)

    def _wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        meter = self

        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            if name == "step" and not meter.steps:
                for hook in meter.on_first_step:
                    hook()
                meter.first = time.process_time()
                meter.first_wall = time.perf_counter()
            inside = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                if meter.first:
                    meter.env_cpu += time.thread_time() - inside
                    if name == "step":
                        meter.steps += 1
                    meter.last = time.process_time()
                    meter.last_wall = time.perf_counter()
        return call

    def client_cpu_per_step(self) -> float:
        """CPU seconds of the process outside the env per env step call (a group step), in the steady state."""
        return max(0.0, (self.last - self.first - self.env_cpu) / max(1, self.steps))

    def env_cpu_per_step(self) -> float:
        """The env's own CPU seconds (its step and resets) per env step call."""
        return self.env_cpu / max(1, self.steps)


def client_cpu(port: int, seconds: float, pipeline: int, align: int = 0) -> tuple[float, float, float]:
    """Client CPU per group step outside the env's step and reset (Hopper-v5, NUM_ENVS envs in ``pipeline``
    groups), the rollout in this process; the env's own CPU per group step; and the exchanges (an infer and its
    reply, with the feedback before it) per group step."""
    from plugrl_env_client.envs.mujoco.mujoco_env import MujocoEnv

    with EnvMeter(MujocoEnv) as meter:
        timing = run_here(_config(port, pipeline, align=align), "MuJoCo-v1", port, seconds, meter)
    exchanges = timing["infer_calls"] / max(1, timing["batch_steps"])
    return meter.client_cpu_per_step(), meter.env_cpu_per_step(), exchanges


def lockstep_at_vector_env(port: int, seconds: float) -> tuple[float, float]:
    """Env-steps/s of the package's lockstep (Hopper-v5, NUM_ENVS envs, in this process) and its CPU per batch step
    outside Gymnasium's vector env (``SyncVectorEnv.step`` and ``reset`` are the env; the package's env wrapper is
    client work), measured where ``minimal_client.run`` measures itself."""
    with EnvMeter(gym.vector.SyncVectorEnv) as meter:
        run_here(_config(port), "MuJoCo-v1", port, seconds, meter)
    return meter.steps * NUM_ENVS / max(1e-9, meter.last_wall - meter.first_wall), meter.client_cpu_per_step()


def versus_minimal(seconds: float, rounds: int) -> None:
    """Part 5: the package's lockstep and ``minimal_client.py`` in turn (minimal, package, per round), same server
    and cores; the rate's pair ratios and both CPU figures per batch step, next to their targets."""
    package_cpu: list[float] = []
    minimal_cpu: list[float] = []
    with Server() as server:
        def minimal() -> float:
            result = minimal_client.run(f"ws://127.0.0.1:{server.port}", NUM_ENVS, HORIZON, seconds, TASK)
            minimal_cpu.append(result["cpu_per_batch_step_s"])
            return float(result["env_steps_per_s"])

        def package() -> float:
            rate, cpu = lockstep_at_vector_env(server.port, seconds)
            package_cpu.append(cpu)
            return rate

        _, ratios = alternated(rounds, minimal, {"lockstep": package})
    print(ratio_row("client lockstep / minimal client", ratios["lockstep"], "minimal", LOCKSTEP_VS_MINIMAL))
    cpu_ratios = [p / m for p, m in zip(package_cpu, minimal_cpu) if m > 0]
    med = statistics.median(cpu_ratios) if cpu_ratios else float("nan")
    print(f"  {'client CPU per batch step':<34} package {statistics.median(package_cpu) * 1e6:.1f} us, minimal "
          f"{statistics.median(minimal_cpu) * 1e6:.1f} us (outside the vector env): {med:.2f} x minimal (pairs "
          f"{min(cpu_ratios, default=0):.2f}-{max(cpu_ratios, default=0):.2f}) target < 1 (package lower): "
          f"{'met' if med < 1 else 'NOT MET'}")


def python_calls(port: int, seconds: float) -> tuple[float, float, float]:
    """The package's own Python function calls per batch step (Point-v1 x16, lockstep, in this process, from the
    first step on; the env contract's checks count as the client's), the env's own (calls into Point-v1's package),
    and the steps profiled."""
    from plugrl_env_client.envs.point.point_env import PointEnv

    profiler = cProfile.Profile()
    with EnvMeter(PointEnv) as meter:
        meter.on_first_step.append(profiler.enable)
        try:
            run_here(_config(port, env="Point-v1"), "Point-v1", port, seconds, meter)
        finally:
            profiler.disable()
    env_dir = os.path.dirname(inspect.getfile(PointEnv)).replace(os.sep, "/") + "/"
    own = env = 0
    for (filename, _, _), (_, calls, *_rest) in pstats.Stats(profiler).stats.items():  # type: ignore[attr-defined]
        path = filename.replace(os.sep, "/")
        if path.startswith(env_dir):
            env += calls
        elif "/plugrl_env_client/" in path:
            own += calls
    steps = max(1, meter.steps)
    return own / steps, env / steps, meter.steps


def profile(port: int, seconds: float, pipeline: int = 2, align: int = 4) -> None:
    """Wall time of each named step of the rollout per group step, for one pipelined run in this process (the
    steps are wrapped with timers; the timers themselves cost about a microsecond per call). Steps a version of
    the package does not have are left out."""
    try:
        from plugrl_env_client.envs.contract import EnvChecks
    except ImportError:  # a tree that kept the checks across calls apart
        from plugrl_env_client.envs.invariants import EnvChecks  # type: ignore[no-redef]
    from plugrl_env_client.envs.mujoco.mujoco_env import MujocoEnv
    from plugrl_env_client.outputs.run_writer import RunWriter
    from plugrl_env_client.protocol.session import Session
    from plugrl_env_client.rollout.group import EnvGroup
    from plugrl_env_client.rollout.loop import Rollout
    from plugrl_env_client.rollout.seeds import SeedGroups

    spent: dict[str, float] = collections.defaultdict(float)
    calls: collections.Counter[str] = collections.Counter()
    wrapped = [(EnvGroup, "step"), (EnvGroup, "step_envs"), (EnvGroup, "send_feedback"), (EnvGroup, "finish_episodes"),
               (EnvGroup, "request_actions"), (EnvGroup, "ask_for_actions"), (EnvGroup, "take_actions"),
               (EnvGroup, "_reset"), (Rollout, "_done"), (Session, "send_infer"), (Session, "receive_actions"),
               (Session, "feedback"),
               # what an episode's end costs: the env's own reset, the checks around it, the record, the seeds
               (MujocoEnv, "reset"), (EnvChecks, "before_reset"), (EnvChecks, "after_reset"),
               (EnvChecks, "reset"), (EnvGroup, "_record"),
               (RunWriter, "episode"), (SeedGroups, "restart")]
    originals = [(cls, name, getattr(cls, name)) for cls, name in wrapped if name in vars(cls)]

    def timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[name] += time.perf_counter() - start
                calls[name] += 1
        return call

    for cls, name, fn in originals:
        setattr(cls, name, timed(f"{cls.__name__}.{name}", fn))
    try:
        timing = run_here(_config(port, pipeline, align=align), "MuJoCo-v1", port, seconds)
    finally:
        for cls, name, fn in originals:
            setattr(cls, name, fn)
    steps = timing["batch_steps"]
    raw, _ = raw_rate(seconds, NUM_ENVS // pipeline)
    group = NUM_ENVS // pipeline
    per = timing["collect_time_s"] / steps
    print(f"\nwhere the time goes: pipelined, {pipeline} groups, align {align}, in this process, {steps} group steps of "
          f"{group} envs, {timing['infer_calls'] / steps:.2f} infers per group step")
    print(f"  {'a group step, all in':<34} {per * 1e6:8.1f} us  (raw stepping of a {group}-env object, resets "
          f"included: {group / raw * 1e6:.1f} us)")
    print(f"  {'env.step alone':<34} {timing['env_step_s'] / steps * 1e6:8.1f} us")
    for name, total in sorted(spent.items(), key=lambda item: -item[1]):
        print(f"  {name:<34} {total / steps * 1e6:8.1f} us  ({calls[name]} calls, {total / calls[name] * 1e6:.1f} us "
              "each)")


def _name(pipeline: int, align: int) -> str:
    mode = "lockstep" if pipeline == 1 else f"pipelined, {pipeline} groups"
    return f"client {mode}" + (f", align {align}" if align else "")


def verdict(value: float, target: float | None, at_most: bool = False) -> str:
    if target is None:
        return "(information)"
    met = value <= target if at_most else value >= target
    return f"target {'<=' if at_most else '>='} {target:g}: {'met' if met else 'NOT MET'}"


def alternated(rounds: int, anchor: Callable[[], float], cells: dict[Any, Callable[[], float]]
               ) -> tuple[list[float], dict[Any, list[float]]]:
    """``rounds`` rounds of: the anchor, then each cell, each cell's ratio to the anchor measured just before it
    (A B A C ... per round). Returns the anchors and each cell's ratios."""
    anchors: list[float] = []
    ratios: dict[Any, list[float]] = {key: [] for key in cells}
    for _ in range(rounds):
        for key, cell in cells.items():
            a = anchor()
            anchors.append(a)
            ratios[key].append(cell() / a if a > 0 else 0.0)
    return anchors, ratios


def ratio_row(label: str, ratios: list[float], anchor_name: str, target: float | None) -> str:
    med = statistics.median(ratios)
    spread = f"{min(ratios):.2f}-{max(ratios):.2f}"
    return f"  {label:<34} {med:5.2f} x {anchor_name:<10} (pairs {spread:<9}) {verdict(med, target)}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="shorter cells, fewer rounds (noisier)")
    parser.add_argument("--profile", action="store_true", help="also time the rollout's named steps (pipelined)")
    args = parser.parse_args()
    cell, rounds = (2.0, 2) if args.quick else (4.0, 3)
    discover_envs()
    machine = machine_line("gymnasium", "mujoco", "websockets")  # before pinning: it counts the usable cores
    pin()
    where = (f"client on core {min(CORES[0])}, server on core {min(CORES[1])}" if CORES
             else f"not pinned ({usable_cpus()} usable core)")
    print(f"{machine}; "
          f"{TASK} n={NUM_ENVS} H={HORIZON}; cells of {cell:g} s, {rounds} rounds (raw and client alternated, "
          f"median of the pair ratios); {where}")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    if load >= QUIET_LOAD:
        print(f"load average {load:.2f} >= {QUIET_LOAD:g} before the run: too busy for the targets' figures to count")
    started = time.perf_counter()

    raw, batch_s = raw_rate(cell)
    print(f"\n1. early terminations, no server latency (raw: {raw:,.0f} env-steps/s, {batch_s * 1e3:.2f} ms per "
          "batch step)")
    variants = ((1, 0), (2, 0), (2, 4)) if args.quick else ((1, 0), (2, 0), (4, 0), (2, 4), (4, 4))
    with Server() as server:
        fast_auto = auto_choice(server.port).groups
        _, fast = alternated(rounds, lambda: raw_rate(cell)[0],
                             {**{v: functools.partial(client_rate, server.port, cell, pipeline=v[0], align=v[1])
                                 for v in variants},
                              ("auto", fast_auto): functools.partial(client_rate, server.port, cell, pipeline=fast_auto)})
    for (k, a), ratios in fast.items():
        if k == "auto":
            print(ratio_row(f"client auto ({a} group(s))", ratios, "raw", None))
            print(f"  {'client auto / lockstep':<34} {statistics.median(ratios) / statistics.median(fast[(1, 0)]):5.2f} x"
                  f"            {verdict(statistics.median(ratios) / statistics.median(fast[(1, 0)]), AUTO_VS_LOCKSTEP)}"
                  " (not slower than lockstep, within the noise of a shared machine)")
            continue
        print(ratio_row(_name(k, a), ratios, "raw", None if a else 0.9))
        if (k, a) == (2, 0):
            print(ratio_row(_name(k, a), ratios, "raw", PIPELINED_VS_RAW) + " (near-term)")
    if args.profile:
        with Server() as server:
            profile(server.port, cell)

    latency_ms = batch_s * 1e3
    print(f"\n2. server latency {latency_ms:.2f} ms per infer (about one batch step); ratios to raw stepping "
          "without latency")
    slow_variants = ((1, 0), (2, 0), (2, 4)) if args.quick else ((1, 0), (2, 0), (2, 4), (4, 4), (4, 7))
    with Server(latency_ms) as server:
        slow_auto = auto_choice(server.port).groups
        _, slow = alternated(rounds, lambda: raw_rate(cell)[0],
                             {**{v: functools.partial(client_rate, server.port, cell, pipeline=v[0], align=v[1])
                                 for v in slow_variants},
                              ("auto", slow_auto): functools.partial(client_rate, server.port, cell, pipeline=slow_auto)})
    for (k, a), ratios in slow.items():
        label = f"client auto ({a} group(s))" if k == "auto" else _name(k, a)
        print(ratio_row(label, ratios, "raw", None if k == 1 else 0.85))
    lock = statistics.median(slow[(1, 0)])
    for (k, a), ratios in slow.items():
        if k == "auto" or k > 1:
            label = f"client auto ({a} group(s))" if k == "auto" else _name(k, a)
            print(f"  {label + ' / lockstep':<34} {statistics.median(ratios) / lock:5.2f} x            "
                  f"{verdict(0, None)}")

    print("\n3. client CPU per group step outside the env's step and reset (Hopper-v5, no latency, in this process)")
    with Server() as server:
        for k, align, target in ((2, 0, CLIENT_SHARE_LONG_RUN), (2, 4, None), (1, 0, None)):
            runs = [client_cpu(server.port, cell, k, align) for _ in range(rounds)]
            values = [client * 1e6 for client, _, _ in runs]
            share = statistics.median(client / env for client, env, _ in runs if env > 0)
            label = f"{_name(k, align)} ({NUM_ENVS // k} envs a group)"
            print(f"  {label:<40} {share:6.1%} of the env's own CPU per group step ({statistics.median(values):.1f} "
                  f"us, rounds {min(values):.1f}-{max(values):.1f}; the env "
                  f"{statistics.median(env for _, env, _ in runs) * 1e6:.0f} us; "
                  f"{statistics.median(x for _, _, x in runs):.2f} exchanges a group step) "
                  f"{verdict(share, target, at_most=True)}")
            if (k, align) == (2, 0):
                print(f"  {label:<40} {share:6.1%}  {verdict(share, CLIENT_SHARE, at_most=True)} (near-term)")

    print("\n4. the package's own Python calls per batch step (cProfile, Point-v1 x16, lockstep)")
    for horizon in (1, 8):
        with Server(action_dim=2, horizon=horizon) as server:
            own, env, steps = python_calls(server.port, cell)
        print(f"  H={horizon}: {own:6.1f} calls of the client per batch step, {env:5.1f} of the env "
              f"({steps:.0f} steps profiled) {verdict(own, CALLS_PER_BATCH_STEP[horizon], at_most=True)}")

    print(f"\n5. {TASK} x{NUM_ENVS} H={HORIZON}, no latency: the package's lockstep against a minimal client "
          "(bench/minimal_client.py) in the same rounds; CPU outside Gymnasium's vector env")
    versus_minimal(cell, rounds)
    print(f"\ntotal bench time {time.perf_counter() - started:.0f} s, load avg {load_avg()}")


if __name__ == "__main__":
    main()
