"""Episodes per hour against openpi's own loop: this client on openpi's policy servers, batched and pipelined.

Run from the repository root (the first run installs openpi's packages into a folder of their own, about 20 s)::

    python bench/openpi.py --quick          # 2 rounds of 5 s cells: under a minute
    python bench/openpi.py                  # 3 rounds of 12 s cells: about 3 minutes
    python bench/openpi.py --inference-ms 100 --step-ms 5
    python bench/openpi.py --libero         # the same on a LIBERO task (LIBERO-v1 with --env.render false)

The workload: ``OpenpiBench-v1`` (defined here on :class:`openpi_peer.CamsSim`), an env whose step spins the CPU
for ``--step-ms`` (2 ms) and renders two 224 x 224 cameras, with episodes of 50 steps; a scripted policy whose
every call blocks for ``--inference-ms`` (50 ms, about pi0 on one GPU) and answers chunks of 10 actions, of which
the first 5 are executed (``--runner.replan-steps 5``, as openpi's LIBERO example does). An episode is 50 env
steps in every row, so episodes per hour are env-steps/s x 3600 / 50.

Rows, each a fresh run per round, the rows alternated (a b c d a b c d ...), each figure the median over rounds:

* ``(a)`` the peer: openpi's own client library (``WebsocketClientPolicy``) in the loop structure of openpi's
  LIBERO example (one env, sequential, an inference every 5 steps), written in :mod:`openpi_peer`, in a child with
  openpi's packages on its path, against ``openpi-server`` serving the scripted policy;
* ``(b)`` this client, ``--envs`` (8) envs in ``--pipeline`` (2) groups, ``--protocol openpi``, one openpi server;
* ``(c)`` the same over 2 replicas of the openpi server (the connections spread over both);
* ``(d)`` the same against the reference server in openpi mode (``plugrl-run-policy-server --protocol openpi``)
  serving :class:`BatchSleepPolicy`, which blocks once per batched call however many connections' requests it
  answers (not ``--policy.latency-ms``, which delays each connection on its own).

Each row's limit is the lower of the server-bound rate (replicas x executed steps per inference / inference time,
times the envs one call can serve for (d)) and the env-bound rate (env-steps/s of the env object stepped alone, 1
env for (a), ``--envs`` for the others; best of five slices). Targets: (b) and (c) at least 0.8 of their limit and
at least (a); (d) at least 4 x (a); ratios to (a) are medians of the per-round ratios. The client (and the peer)
run on one CPU and the servers on another when two are usable.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import json
import multiprocessing as mp
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from machine import ReferenceServer, StepClock, free_port, load_avg, machine_line, stop
from openpi_peer import ACTION_DIM, INSTRUCTION, STATE_DIM, CamsSim

from plugrl_env_client.config import ClientConfig, ConnectionConfig, RunnerConfig
from plugrl_env_client.connection_flags import OpenpiConfig
from plugrl_env_client.envs.base_env import (
    Action,
    BaseEnv,
    BaseEnvConfig,
    BoolArray,
    Observation,
    RewardArray,
    observation_space,
)
from plugrl_env_client.envs.discovery import discover_envs
from plugrl_env_client.envs.registry import get_spec, make_env, register_env, registered_ids
from plugrl_env_client.launch.local import LocalLauncher
from plugrl_env_client.launch.process import ProcessJob
from plugrl_env_client.outputs.run_dir import RunDir
from plugrl_env_client.outputs.run_writer import RunWriter
from plugrl_env_client.rollout.budget import EpisodeBudget
from plugrl_env_client.server import InferCall, Policy, PolicySetup, register_policy

BENCH = Path(__file__).resolve().parent
PEER = BENCH / "openpi_peer.py"
SUPPORT = BENCH.parent / "tests" / "_support"
DEFAULT_SITE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "plugrl-bench" / "openpi-site"
ENV_ID = "OpenpiBench-v1"
POLICY = "bench-batch-sleep"
LIBERO_ID = "LIBERO-v1"
COUNTED_LIBERO_ID = "OpenpiBenchLibero-v1"
EPISODE_STEPS = 50
HORIZON = 10
REPLAN = 5
LIMIT_TARGET = 0.8
"""(b) and (c): env-steps/s over their limit."""
PEER_TARGET = 1.0
"""(b) and (c): env-steps/s over (a)'s."""
BATCHED_TARGET = 4.0
"""(d): env-steps/s over (a)'s."""


# ------------------------------------------------------------------------------------------ the env and the policy


@dataclasses.dataclass
class OpenpiBenchConfig(BaseEnvConfig):
    step_ms: float = 2.0
    """CPU time of one env's step (the CPU spins)."""
    camera_size: int = 224
    """Height and width of both cameras."""
    episode_steps: int = EPISODE_STEPS
    """Steps of every episode."""


CLOCK = StepClock()


@register_env(ENV_ID, config=OpenpiBenchConfig)
class OpenpiBenchEnv(BaseEnv[OpenpiBenchConfig]):
    """A batch of :class:`CamsSim`, stepped one after another as a simulator's envs are; shaped like LIBERO-v1
    (cameras ``agentview`` and ``wrist``, ``states.state``, an instruction, 7-d actions), so the ``libero`` preset
    maps it."""

    def __init__(self, config: OpenpiBenchConfig, num_envs: int = 1, **kwargs: Any) -> None:
        super().__init__(config, num_envs=num_envs, **kwargs)
        size = config.camera_size
        self.sims = [CamsSim(config.step_ms, size, config.episode_steps, seed=i) for i in range(num_envs)]
        self.single_action_space = gym.spaces.Box(-1.0, 1.0, (ACTION_DIM,), np.float32)
        self.single_observation_space = observation_space(
            images={"agentview": (size, size, 3), "wrist": (size, size, 3)},
            states={"state": np.zeros(STATE_DIM, np.float32)})
        self.last = [sim.observe() for sim in self.sims]

    def _observe(self) -> Observation:
        return Observation(images={"agentview": np.stack([o["agentview"] for o in self.last]),
                                   "wrist": np.stack([o["wrist"] for o in self.last])},
                           states={"state": np.stack([o["state"] for o in self.last])}, text=INSTRUCTION)

    def reset(self, *, seed: int | list[int | None] | None = None,
              options: dict[str, Any] | None = None) -> tuple[Observation, dict]:
        self.seed_rngs(seed)
        for i in np.flatnonzero(self.reset_mask(options)):
            self.last[i] = self.sims[i].reset()
        return self._observe(), {}

    def step(self, actions: Action) -> tuple[Observation, RewardArray, BoolArray, BoolArray, dict]:
        done = np.zeros(self.num_envs, bool)
        for i, sim in enumerate(self.sims):
            self.last[i], done[i] = sim.step(actions[i])
        CLOCK.tick(self.num_envs)
        return self._observe(), np.zeros(self.num_envs, np.float32), done, np.zeros(self.num_envs, bool), {}


@dataclasses.dataclass
class BatchSleepConfig:
    inference_ms: float = 50.0
    """How long every call blocks, however many connections' requests it answers."""
    calls_log: str = ""
    """A file to which every call appends the number of envs it answered, one line each ("": none)."""


@register_policy(POLICY, config=BatchSleepConfig)
class BatchSleepPolicy(Policy):
    """Small constant actions after ``--policy.inference-ms`` of blocking per call: a model's batched forward pass,
    which costs about the same for one env as for the few a server batches."""

    batches = True

    def __init__(self, setup: PolicySetup, config: BatchSleepConfig | None = None) -> None:
        super().__init__(setup)
        config = config or BatchSleepConfig()
        self.sleep_s, self.calls_log = config.inference_ms / 1e3, config.calls_log

    def _chunk(self, n: int) -> np.ndarray:
        return np.full((self.horizon, n, *self.action_shape), 0.1, self.dtype)

    def _call(self, envs: int) -> None:
        time.sleep(self.sleep_s)
        if self.calls_log:
            with open(self.calls_log, "a") as log:
                log.write(f"{envs}\n")

    def act(self, obs: dict[str, Any], n: int) -> np.ndarray:
        self._call(n)
        return self._chunk(n)

    def infer_batch(self, calls: list[InferCall]) -> list[np.ndarray]:
        self._call(sum(len(call.env_indices) for call in calls))
        return [self._chunk(len(call.env_indices)) for call in calls]


# ------------------------------------------------------------------------------------------ servers and the peer


def openpi_site(site: Path) -> Path:
    """openpi's client and server with numpy below 2, in ``site`` (installed there on first use)."""
    if (site / "openpi_server").is_dir() and (site / "openpi_client").is_dir():
        return site
    sys.path.insert(0, str(SUPPORT))
    from openpi_site import OPENPI_SITE, install_openpi

    print(f"installing {', '.join(OPENPI_SITE)} into {site} (once)", flush=True)
    try:
        return install_openpi(site)
    except AssertionError as exc:
        sys.exit(f"could not install openpi's packages into {site}: {exc}\nInstall them by hand with pip install "
                 f"--target {site} {' '.join(OPENPI_SITE)}, or name another folder with --openpi-site")


def peer_env(site: Path) -> dict[str, str]:
    """The environment of a child that imports openpi's packages (and their numpy) from ``site`` first."""
    return {"PYTHONPATH": str(site), "PATH": os.environ.get("PATH", "/usr/bin:/bin")}


def pinned(cores: set[int] | None) -> Any:
    return (lambda: os.sched_setaffinity(0, cores)) if cores else None


def wait_for_port(port: int, proc: subprocess.Popen, log: Path, seconds: float = 60.0) -> None:
    """Until something accepts connections on ``port``; a child that exits or a wait past ``seconds`` stops the
    bench with the child's log."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"a server of the bench exited with {proc.returncode}:\n{log.read_text()}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    proc.kill()
    sys.exit(f"a server of the bench did not listen on {port} within {seconds:g} s:\n{log.read_text()}")


class OpenpiServer:
    """openpi's ``WebsocketPolicyServer`` serving the scripted policy (:func:`openpi_peer.serve`) in a child with
    openpi's packages, for the length of a ``with`` block."""

    def __init__(self, site: Path, inference_ms: float, logs: Path, cores: set[int] | None) -> None:
        self.port = free_port()
        self.url = f"ws://127.0.0.1:{self.port}"
        self.log = logs / f"openpi-server-{self.port}.log"
        with self.log.open("w") as out:
            self.proc = subprocess.Popen([sys.executable, str(PEER), "serve", str(self.port), str(inference_ms),
                                          str(HORIZON)], env=peer_env(site), stdout=out, stderr=subprocess.STDOUT,
                                         preexec_fn=pinned(cores))

    def __enter__(self) -> OpenpiServer:
        wait_for_port(self.port, self.proc, self.log)
        return self

    def __exit__(self, *exc: object) -> None:
        stop(self.proc)


def peer_cell(site: Path, url: str, seconds: float, step_ms: float, camera: int, env_id: str | None = None) -> float:
    """Row (a): env-steps/s of openpi's loop, first step to last, in a child (on this process's CPUs); with
    ``env_id``, on one env of that registered env, openpi's client then imported after the package's numpy."""
    args = [sys.executable, str(PEER), "loop", url, str(seconds), str(REPLAN), str(step_ms), str(camera),
            str(EPISODE_STEPS)]
    if env_id is None:
        res = subprocess.run(args, env=peer_env(site), capture_output=True, text=True, timeout=seconds + 120)
    else:
        res = subprocess.run([*args, env_id, str(site)], capture_output=True, text=True, timeout=seconds + 300)
    lines = res.stdout.strip().splitlines()
    if res.returncode != 0 or not lines:
        sys.exit(f"openpi's loop failed (exit {res.returncode}):\n{res.stderr[-3000:]}")
    done = json.loads(lines[-1])
    return done["steps"] / done["seconds"] if done["seconds"] > 0 else 0.0


# ------------------------------------------------------------------------------------------ this client


@dataclasses.dataclass(frozen=True)
class Workload:
    env_id: str
    env: BaseEnvConfig
    keys: tuple[str, ...]
    """--openpi.key overrides of the libero preset."""
    envs: int
    pipeline: int


def client_cell(work: Workload, urls: tuple[str, ...], seconds: float) -> float:
    """Rows (b)-(d): one client run (one process, in this one) of ``seconds`` against ``urls``; its env-steps/s
    from the first env step to the last."""
    global CLOCK
    CLOCK = StepClock()
    config = ClientConfig(num_envs=work.envs, server_url=urls, progress=False, env=work.env,
                          runner=RunnerConfig(replan_steps=REPLAN, pipeline=work.pipeline),
                          connection=ConnectionConfig(protocol="openpi", connect_timeout=30),
                          openpi=OpenpiConfig(preset="libero", key=work.keys))  # type: ignore[arg-type]
    budget = EpisodeBudget(None, mp.get_context("spawn"), 1)
    timer = threading.Timer(seconds, budget.stop.set)
    with tempfile.TemporaryDirectory(prefix="plugrl-bench-") as tmp:
        writer = RunWriter(RunDir(Path(tmp) / "run").create(), "bench", 1)
        timer.start()  # connecting and the first reset are inside the cell, but not inside the rate
        try:
            LocalLauncher(config).launch([ProcessJob(work.env_id, config, 0, urls[0], urls=urls)], budget, writer)
        finally:
            timer.cancel()
        summary = writer.close()
    if summary["status"] not in ("interrupted", "finished"):
        raise RuntimeError(f"the client run ended {summary['status']}: {summary.get('errors')}")
    return CLOCK.rate()


def raw_rate(work: Workload, num_envs: int, seconds: float) -> float:
    """Env-steps/s of the workload's env object alone, ``num_envs`` of them (zero actions, finished envs reset):
    best of five slices."""
    env = make_env(work.env_id, num_envs, work.env)
    env.reset(seed=0)
    actions = np.zeros((env.num_envs, ACTION_DIM), np.float32)
    best = 0.0
    for _ in range(5):
        steps, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds / 5:
            _, _, terminated, truncated, _ = env.step(actions)
            done = terminated | truncated
            if done.any():
                env.reset(options={"reset_mask": done})
            steps += env.num_envs
        best = max(best, steps / (time.perf_counter() - started))
    env.close()
    return best


# ------------------------------------------------------------------------------------------ the table


def verdict(value: float, target: float) -> str:
    return f"target >= {target:g}: {'met' if value >= target else 'NOT MET'}"


def pairs(rates: dict[str, list[float]], row: str, peer: str = "a") -> tuple[float, float, float]:
    """Median and range of ``row``'s rate over ``peer``'s, round by round."""
    ratios = [r / p if p > 0 else float("inf") for r, p in zip(rates[row], rates[peer])]
    return statistics.median(ratios), min(ratios), max(ratios)


def per_hour(rate: float) -> float:
    return rate * 3600 / EPISODE_STEPS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 rounds of 5 s cells (default: 3 of 12 s)")
    parser.add_argument("--rounds", type=int, help="rounds of every row (default 3; --quick 2)")
    parser.add_argument("--seconds", type=float, help="stepping time of a cell (default 12; --quick 5)")
    parser.add_argument("--inference-ms", type=float, default=50.0, help="the policy's time per call (default 50)")
    parser.add_argument("--step-ms", type=float, default=2.0, help="one env's step cost, CPU (default 2)")
    parser.add_argument("--envs", type=int, default=8, help="envs of rows (b)-(d) (default 8)")
    parser.add_argument("--pipeline", type=int, default=2, help="--runner.pipeline of rows (b)-(d) (default 2)")
    parser.add_argument("--openpi-site", type=Path, default=DEFAULT_SITE,
                        help=f"folder of openpi's packages, installed there if missing (default {DEFAULT_SITE})")
    parser.add_argument("--libero", action="store_true",
                        help=f"every row on {LIBERO_ID} (its default task) with --env.render false, when it is installed")
    parser.add_argument("--no-pin", action="store_true", help="leave client and servers where the scheduler puts them")
    args = parser.parse_args()
    rounds = args.rounds or (2 if args.quick else 3)
    seconds = args.seconds or (5.0 if args.quick else 12.0)
    if rounds < 1 or not seconds > 0 or args.envs < 1 or args.pipeline < 1 or not args.inference_ms > 0 \
            or not args.step_ms >= 0:
        parser.error("--rounds, --envs and --pipeline must be >= 1, --seconds and --inference-ms > 0, --step-ms >= 0")
    work = Workload(ENV_ID, OpenpiBenchConfig(step_ms=args.step_ms), (), args.envs, args.pipeline)
    if args.libero:
        work = libero_workload(args.envs, args.pipeline)
    site = openpi_site(args.openpi_site)
    print(f"{machine_line('websockets', 'msgpack')}; {site_versions(site)}")
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    client_cores = server_cores = None
    if not args.no_pin and len(cpus) >= 2:
        client_cores, server_cores = {cpus[0]}, {cpus[1]}
        os.sched_setaffinity(0, client_cores)  # the client rows run in this process, the peer in its child
    # the reference server imports this file for its policy, and this file imports its neighbours
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(BENCH), os.environ.get("PYTHONPATH", "")) if p)
    pins = (f"client and peer on CPU {cpus[0]}, servers on CPU {cpus[1]}" if client_cores and server_cores
            else "not pinned")
    what = (f"{LIBERO_ID} (its default task), cameras off, an episode counted as {EPISODE_STEPS} steps" if args.libero
            else f"{work.env_id}: {args.step_ms:g} ms per env step (CPU), two 224x224 cameras, episodes of "
            f"{EPISODE_STEPS} steps")
    print(f"{what}; policy {args.inference_ms:g} ms per call, chunks of {HORIZON}, {REPLAN} executed; rows (b)-(d) "
          f"{args.envs} envs, pipeline {work.pipeline}; {pins}; {rounds} round(s) of {seconds:g} s cells, medians")
    started = time.perf_counter()
    bench_env = OpenpiBenchConfig(step_ms=args.step_ms)
    raw: dict[int, list[float]] = {1: [], args.envs: []}  # env-bound rates, measured every round (the load moves)
    rates: dict[str, list[float]] = {row: [] for row in "abcd"}
    batched: list[float] = []  # (d): envs per call of the reference server's policy, per round
    with tempfile.TemporaryDirectory(prefix="plugrl-bench-openpi-") as tmp:
        logs = Path(tmp)
        calls_log = logs / "calls.txt"
        policy_flags = ["--protocol", "openpi", "--openpi.preset", "libero", "--policy-path",
                        str(Path(__file__).resolve()), "--policy.name", POLICY, "--policy.inference-ms",
                        str(args.inference_ms), "--policy.calls-log", str(calls_log), "--policy.action-dim",
                        str(ACTION_DIM), "--policy.action-horizon", str(HORIZON)]
        with OpenpiServer(site, args.inference_ms, logs, server_cores) as one, \
                OpenpiServer(site, args.inference_ms, logs, server_cores) as two, \
                ReferenceServer(policy_flags, server_cores) as reference:
            for _ in range(rounds):
                for n in raw:
                    raw[n].append(raw_rate(work, n, 0.5))
                rates["a"].append(peer_cell(site, one.url, seconds, args.step_ms, bench_env.camera_size,
                                            work.env_id if args.libero else None))
                rates["b"].append(client_cell(work, (one.url,), seconds))
                rates["c"].append(client_cell(work, (one.url, two.url), seconds))
                calls_log.write_text("")
                rates["d"].append(client_cell(work, (f"ws://127.0.0.1:{reference.port}",), seconds))
                calls = [int(line) for line in calls_log.read_text().split()]
                batched.append(sum(calls) / len(calls) if calls else 0.0)
    env_bound = {n: statistics.median(r) for n, r in raw.items()}
    per_call = REPLAN / (args.inference_ms / 1e3)
    bounds = {"a": (per_call, 1), "b": (per_call, args.envs), "c": (2 * per_call, args.envs),
              "d": (args.envs * per_call, args.envs)}
    limits = {row: min(server, env_bound[n]) for row, (server, n) in bounds.items()}
    kinds = {row: "server" if server <= env_bound[n] else "env" for row, (server, n) in bounds.items()}
    names = {"a": "(a) openpi's loop, WebsocketClientPolicy, 1 env",
             "b": f"(b) this client, {args.envs} envs, 1 openpi server",
             "c": f"(c) this client, {args.envs} envs, 2 openpi servers",
             "d": f"(d) this client, {args.envs} envs, reference server (batching)"}
    print(f"\n{'row':<56} {'env-steps/s':>11} {'episodes/h':>11} {'limit':>7} {'bound':>6} {'of limit':>8}")
    for row in "abcd":
        rate = statistics.median(rates[row])
        print(f"{names[row]:<56} {rate:11.1f} {per_hour(rate):11,.0f} {limits[row]:7.1f} {kinds[row]:>6} "
              f"{rate / limits[row]:8.2f}")
    print()
    for row in "bc":
        of_limit = statistics.median(rates[row]) / limits[row]
        med, lo, hi = pairs(rates, row)
        print(f"({row}) {of_limit:.2f} x its limit ({verdict(of_limit, LIMIT_TARGET)}); {med:.2f} x (a), pairs "
              f"{lo:.2f}-{hi:.2f} ({verdict(med, PEER_TARGET)})")
    med, lo, hi = pairs(rates, "d")
    print(f"(d) {med:.2f} x (a), pairs {lo:.2f}-{hi:.2f} ({verdict(med, BATCHED_TARGET)})")
    envs_per_call = statistics.median(batched)
    print(f"(d) the reference server's calls answered {envs_per_call:.1f} envs each (median over rounds of the mean; "
          f"at most {args.envs}): a server-bound rate of {envs_per_call * per_call:.0f} env-steps/s (information)")
    print(f"env-bound rates (the env object alone, median over rounds): {env_bound[1]:.0f} env-steps/s with 1 env, "
          f"{env_bound[args.envs]:.0f} with {args.envs} (nominal {1e3 / args.step_ms:.0f} with any number)"
          if args.step_ms > 0 else "")
    print(f"\ntotal bench time {time.perf_counter() - started:.0f} s, load avg {load_avg()}")


def site_versions(site: Path) -> str:
    """The versions of openpi's packages and their numpy in ``site``."""
    found = {dist.metadata["Name"].lower(): dist.version
             for dist in importlib.metadata.distributions(path=[str(site)])}
    return ", ".join(f"{name} {found.get(name, 'missing')}" for name in ("openpi-client", "openpi-server", "numpy")) \
        + " (openpi's site)"


def libero_workload(envs: int, pipeline: int) -> Workload:
    """Rows (b)-(d) on LIBERO-v1 with its cameras off (the libero preset's image keys left out), through a subclass
    that counts its steps; the bench stops saying so when LIBERO-v1 is not installed."""
    discover_envs()
    if LIBERO_ID not in registered_ids():
        sys.exit(f"--libero: {LIBERO_ID} is not installed here (it needs the package's libero extra: pip install "
                 "'plugrl-env-client[libero]'); without --libero the bench runs on its own env")
    spec = get_spec(LIBERO_ID)
    config = spec.config_cls()
    if "render" not in {field.name for field in dataclasses.fields(config)}:
        sys.exit(f"--libero: {LIBERO_ID}'s config has no 'render' field, so its cameras cannot be turned off")

    def step(self: Any, actions: Action) -> Any:
        out = spec.env_cls.step(self, actions)
        CLOCK.tick(self.num_envs)
        return out

    if spec.single_instance and pipeline > 1:
        print(f"--libero: {LIBERO_ID} exists once per process, so rows (b)-(d) run lockstep (--pipeline 1)")
        pipeline = 1
    counted = type("CountedLiberoEnv", (spec.env_cls,), {"step": step})
    register_env(COUNTED_LIBERO_ID, config=spec.config_cls, single_instance=spec.single_instance,
                 **spec.kwargs)(counted)
    return Workload(COUNTED_LIBERO_ID, dataclasses.replace(config, render=False),
                    ("observation/image=", "observation/wrist_image="), envs, pipeline)


if __name__ == "__main__":
    main()
