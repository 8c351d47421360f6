"""Lockstep vs pipelined rollouts on a real simulator, against the reference server in another process.

Run from the repo root (extra ``mujoco``)::

    python bench/pipeline.py            # about 80 s on 2 cores
    python bench/pipeline.py --quick    # about 35 s: shorter cells, noisier numbers

Every figure is printed next to its target and as a ratio to an anchor measured in the same run:

1. Hopper-v5 (Gymnasium backend, early terminations: episodes end at different steps, so chunk boundaries drift
   apart) at n=16, H=8: the client in lockstep and pipelined (``--runner.pipeline`` 2 and 4), with and without
   ``--runner.align-chunks 4``, against raw stepping of the same env object, resets of finished envs included.
   Target: pipelined >= 0.9 x raw.
2. The same with the server holding each action back for about one batch step of the env (``--policy.latency-ms``
   set to the batch step time measured in cell 1), as a GPU policy would: pipelined vs lockstep. Target: >= 1.7 x.
3. ``--num-procs 2`` vs 1 for the same CPU-bound env (lockstep, separate processes, one core each at best).

``--profile`` adds where the client's time goes in cell 1's pipelined run (2 groups, align 4): the same rollout run
in this process with its named steps timed (wall time per group step, in microseconds), next to raw stepping of a
group's env object alone.

The client runs the real process code (``launch.process.run_process``: env groups, sessions over loopback
WebSockets, the run's writer in a temp dir); a timer ends each cell through the budget's stop flag. The server is
``plugrl-run-policy-server`` (random policy, action dim 3, horizon 8) in a subprocess, so client and server do not
share one interpreter. Numbers depend on the machine and its load: compare them within one run only.
"""

from __future__ import annotations

import argparse
import collections
import functools
import multiprocessing as mp
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
from machine import load_avg, machine_line

from plugrl_env_client.config import ClientConfig, RunnerConfig
from plugrl_env_client.envs import discover_envs
from plugrl_env_client.envs.mujoco.mujoco_env import MujocoEnvConfig
from plugrl_env_client.launch.local import launch
from plugrl_env_client.launch.process import ProcessJob, run_process
from plugrl_env_client.outputs.run_dir import RunDir
from plugrl_env_client.outputs.run_writer import RunWriter
from plugrl_env_client.rollout.budget import EpisodeBudget
from plugrl_env_client.utils.registration import make_env

TASK = "Hopper-v5"
NUM_ENVS = 16
HORIZON = 8
ACTION_DIM = 3
EPISODE_CAP = 1000  # Hopper's own limit; random actions end episodes after ~20-40 steps anyway


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """The reference server in a subprocess, for the duration of a ``with`` block."""

    def __init__(self, latency_ms: float = 0.0) -> None:
        self.port = free_port()
        cmd = [sys.executable, "-c", "from plugrl_env_client.server.cli import main; main()", "--port", str(self.port),
               "--policy.action-dim", str(ACTION_DIM), "--policy.action-horizon", str(HORIZON),
               "--policy.latency-ms", f"{latency_ms:g}", "--policy.seed", "0"]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def __enter__(self) -> Server:
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if "listening" not in line:
            self.proc.kill()
            raise RuntimeError(f"the reference server did not start: {line}")
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


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


def client_rate(port: int, seconds: float, pipeline: int = 1, num_procs: int = 1, align: int = 0) -> float:
    """Env-steps/s of the client (``num_procs`` processes of NUM_ENVS envs) against the server on ``port``."""
    config = ClientConfig(num_envs=NUM_ENVS, num_procs=num_procs, server_port=port, progress=False,
                          env=MujocoEnvConfig(task=TASK),
                          runner=RunnerConfig(pipeline=pipeline, max_episode_steps=EPISODE_CAP, align_chunks=align))
    ctx = mp.get_context("spawn")
    budget = EpisodeBudget(None, ctx, num_procs)
    with tempfile.TemporaryDirectory(prefix="plugrl-bench-") as tmp:
        writer = RunWriter(RunDir(Path(tmp) / "run").create(), "bench", num_procs)
        jobs = [ProcessJob("MuJoCo-v1", config, p, f"ws://127.0.0.1:{port}") for p in range(num_procs)]
        timer = threading.Timer(seconds, budget.stop.set)
        timer.start()
        try:
            launch(jobs, budget, ctx, writer)
        finally:
            timer.cancel()
        summary = writer.close()
    if summary["status"] not in ("interrupted", "finished"):
        raise RuntimeError(f"the client run ended {summary['status']}: {summary.get('errors')}")
    return float(summary["timing"]["effective_fps"])


def profile(port: int, seconds: float, pipeline: int = 2, align: int = 4) -> None:
    """Wall time of each named step of the rollout per group step, for one pipelined run in this process (the
    steps are wrapped with timers; the timers themselves cost about a microsecond per call)."""
    from plugrl_env_client.protocol.session import Session
    from plugrl_env_client.rollout.group import EnvGroup
    from plugrl_env_client.rollout.loop import Rollout

    spent: dict[str, float] = collections.defaultdict(float)
    calls: collections.Counter[str] = collections.Counter()
    wrapped = [(EnvGroup, "step_envs"), (EnvGroup, "send_feedback"), (EnvGroup, "finish_episodes"),
               (EnvGroup, "ask_for_actions"), (EnvGroup, "take_actions"), (EnvGroup, "_reset"), (Rollout, "_done"),
               (Session, "send_infer"), (Session, "receive_actions"), (Session, "feedback")]
    originals = [(cls, name, getattr(cls, name)) for cls, name in wrapped]

    def timed(name: str, fn: object) -> object:
        @functools.wraps(fn)  # type: ignore[arg-type]
        def call(*args: object, **kwargs: object) -> object:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)  # type: ignore[operator]
            finally:
                spent[name] += time.perf_counter() - start
                calls[name] += 1
        return call

    for cls, name, fn in originals:
        setattr(cls, name, timed(f"{cls.__name__}.{name}", fn))
    try:
        config = ClientConfig(num_envs=NUM_ENVS, server_port=port, progress=False, env=MujocoEnvConfig(task=TASK),
                              runner=RunnerConfig(pipeline=pipeline, max_episode_steps=EPISODE_CAP, align_chunks=align))
        budget = EpisodeBudget(None, mp.get_context("spawn"), 1)
        with tempfile.TemporaryDirectory(prefix="plugrl-bench-") as tmp:
            writer = RunWriter(RunDir(Path(tmp) / "run").create(), "bench", 1)
            timer = threading.Timer(seconds, budget.stop.set)
            timer.start()
            try:
                run_process(ProcessJob("MuJoCo-v1", config, 0, f"ws://127.0.0.1:{port}"), budget, writer)
            finally:
                timer.cancel()
            timing = writer.close()["timing"]
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


VARIANTS = ((1, 0), (1, 4), (2, 0), (2, 4), (2, 7), (4, 4), (4, 7))
"""(--runner.pipeline, --runner.align-chunks) of the client cells."""


def _name(pipeline: int, align: int) -> str:
    mode = "lockstep" if pipeline == 1 else f"pipelined, {pipeline} groups"
    return f"client {mode}" + (f", align {align}" if align else "")


def row(label: str, value: float, anchor: float, anchor_name: str, target: float | None) -> str:
    ratio = value / anchor if anchor > 0 else 0.0
    verdict = "" if target is None else (f">= {target:g}  {'met' if ratio >= target else 'NOT MET'}")
    return f"  {label:<34} {value:>10,.0f} st/s   {ratio:5.2f} x {anchor_name:<10} {verdict}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="shorter cells (noisier)")
    parser.add_argument("--profile", action="store_true", help="also time the rollout's named steps (pipelined)")
    args = parser.parse_args()
    cell = 2.0 if args.quick else 5.0
    discover_envs()
    print(f"{machine_line('gymnasium', 'mujoco')}; "
          f"{TASK} n={NUM_ENVS} H={HORIZON}; cells of {cell:g} s")
    started = time.perf_counter()

    raw, batch_s = raw_rate(cell)
    print(f"\n1. early terminations, no server latency (raw: {raw:,.0f} env-steps/s, {batch_s * 1e3:.2f} ms per "
          "batch step)")
    with Server() as server:
        rates = {(k, a): client_rate(server.port, cell, pipeline=k, align=a) for k, a in VARIANTS}
    for (k, a), value in rates.items():
        print(row(_name(k, a), value, raw, "raw", None if k == 1 else 0.9))
    if args.profile:
        with Server() as server:
            profile(server.port, cell)

    latency_ms = batch_s * 1e3
    print(f"\n2. server latency {latency_ms:.2f} ms per infer (about one batch step)")
    with Server(latency_ms) as server:
        slow = {(k, a): client_rate(server.port, cell, pipeline=k, align=a) for k, a in VARIANTS}
    lock = slow[(1, 0)]
    for (k, a), value in slow.items():
        print(row(_name(k, a), value, lock, "lockstep", None if k == 1 else 1.7))

    print("\n3. processes (lockstep)")
    with Server() as server:
        one = client_rate(server.port, cell, num_procs=1)
        two = client_rate(server.port, cell, num_procs=2)
    print(row("--num-procs 1", one, one, "1 proc", None))
    print(row("--num-procs 2", two, one, "1 proc", None))
    print(f"\ntotal bench time {time.perf_counter() - started:.0f} s, load avg {load_avg()}")


if __name__ == "__main__":
    main()
