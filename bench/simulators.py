"""Env-steps/s of real MuJoCo simulators, raw and through the full client, on both MuJoCo-v1 backends.

Run from the repo root::

    python bench/simulators.py           # full table, about 70 s on 2 cores (well under 3 min)
    python bench/simulators.py --quick   # short cells, about 20 s: a smoke run, noisier numbers

For HalfCheetah-v5 and Hopper-v5, each backend (``gymnasium``: Gymnasium's sync vector env; ``envpool``: EnvPool's
thread pool, with the same task id, or EnvPool's closest version of it) and num_envs 1, 16 and 64, it measures

* raw: ``env.step`` of a ``MuJoCo-v1`` env in a loop with uniform random actions, resetting finished envs exactly
  as the runner does (``reset(options={"reset_indices": done})``); the best of 3 timed slices;
* client: ``run_client`` in this process with ``--local-policy random`` (the reference server in a thread,
  real loopback WebSockets, action chunks of 4 steps), read back as ``timing.effective_fps`` from the run's
  ``summary.json``;

and prints the ratio client/raw next to its target. Both sides cut episodes at EPISODE_CAP steps, the client
with ``--runner.max-episode-steps``: HalfCheetah never terminates, and its 1000-step episodes would make one
episode per env at n=64 take longer than a whole cell should.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.metadata
import importlib.util
import io
import json
import math
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from machine import load_avg, machine_line

from plugrl_env_client.app import run_client
from plugrl_env_client.config import ClientConfig, RunnerConfig
from plugrl_env_client.envs import discover_envs
from plugrl_env_client.envs.mujoco.mujoco_env import MujocoEnvConfig
from plugrl_env_client.utils.registration import make_env

TASKS = ("HalfCheetah-v5", "Hopper-v5")
BACKENDS = ("gymnasium", "envpool")
NUM_ENVS = (1, 16, 64)
EPISODE_CAP = 250
"""Steps after which both the raw loop and the client end an episode (truncated)."""
HORIZON = 4
"""Action chunk length of the embedded random policy (the client's default ``--local-policy-horizon``)."""
TARGET_RATIO = 0.5
"""Target of client/raw for n >= 16: the client's own work and its round trips take at most as long as the env."""


@dataclasses.dataclass(frozen=True)
class Durations:
    raw_s: float  # seconds of raw stepping per cell
    client_s: float  # wanted length of a client run, in seconds (it is sized in episodes, so this is approximate)


FULL = Durations(raw_s=2.0, client_s=4.0)
QUICK = Durations(raw_s=0.4, client_s=0.8)


def expected_ratio(n: int) -> float:
    """Guess of client/raw, to size a client run in episodes before it is measured (one env pays a round trip
    per chunk of 4 steps, which costs more than the steps)."""
    return 0.25 if n == 1 else 0.6


@dataclasses.dataclass
class Raw:
    rate: float  # env steps per second
    mean_length: float  # of the episodes the loop finished (EPISODE_CAP when none finished)


@dataclasses.dataclass
class Client:
    rate: float
    episodes: int
    mean_length: float
    env_steps: int
    seconds: float


def env_config(task: str, backend: str) -> MujocoEnvConfig:
    return MujocoEnvConfig(task=task, backend=backend)


RAW_SLICES = 3


def bench_raw(task: str, backend: str, n: int, seconds: float) -> Raw:
    """Raw env-steps/s: the best of RAW_SLICES timed slices of ``seconds`` (a burst of load from other processes
    then lowers one slice, not the reference), and the mean length of the episodes finished meanwhile."""
    env = make_env("MuJoCo-v1", num_envs=n, config=env_config(task, backend))
    try:
        space = env.single_action_space
        rng = np.random.default_rng(0)
        low, high = np.asarray(space.low), np.asarray(space.high)
        shape = (n, *space.shape)
        env.reset(seed=0)
        lengths = np.zeros(n, np.int64)
        finished, finished_steps, best = 0, 0, 0.0
        for _ in range(RAW_SLICES):
            batches = 0
            start = now = time.perf_counter()
            deadline = start + seconds / RAW_SLICES
            while now < deadline:
                for _ in range(8):
                    # fresh uniform actions each step, as the random policy sends (a numpy draw costs ~1 us)
                    _, _, terminated, truncated, _ = env.step(rng.uniform(low, high, shape).astype(np.float32))
                    batches += 1
                    lengths += 1
                    done = terminated | truncated | (lengths >= EPISODE_CAP)
                    if done.any():  # what the runner does with finished envs
                        finished += int(done.sum())
                        finished_steps += int(lengths[done].sum())
                        lengths[done] = 0
                        env.reset(options={"reset_indices": np.flatnonzero(done)})
                now = time.perf_counter()
            best = max(best, batches * n / (now - start))
        return Raw(best, finished_steps / finished if finished else float(EPISODE_CAP))
    finally:
        env.close()


def episodes_for(raw: Raw, n: int, seconds: float) -> int:
    """Episodes that take the client about ``seconds``, from the raw rate and episode length; whole rounds of n
    when every episode runs to the cap (all envs then finish on the same step)."""
    steps = raw.rate * expected_ratio(n) * seconds
    if raw.mean_length >= EPISODE_CAP:
        return n * max(1, round(steps / (n * EPISODE_CAP)))
    return max(n, math.ceil(steps / raw.mean_length))


def bench_client(task: str, backend: str, n: int, episodes: int, root: Path) -> Client:
    name = f"{task}-{backend}-n{n}"
    config = ClientConfig(
        num_envs=n,
        num_episodes=episodes,
        local_policy="random",
        local_policy_horizon=HORIZON,
        output_dir=root,
        exp_name=name,
        progress=False,
        runner=RunnerConfig(max_episode_steps=EPISODE_CAP),
        env=env_config(task, backend),
    )
    with contextlib.redirect_stdout(io.StringIO()):  # the end-of-run table
        code = run_client(config, "MuJoCo-v1")
    summary = json.loads((root / name / "summary.json").read_text())
    if code != 0:
        raise RuntimeError(f"the client exited with {code}: {summary.get('errors') or summary.get('status')}")
    timing = summary["timing"]
    return Client(float(timing["effective_fps"]), int(summary["completed_episodes"]), float(summary["mean_length"]),
                  int(timing["env_steps"]), float(timing["collect_time_s"]))


# ------------------------------------------------------------------------------------------------ table


COLUMNS = ("task", "backend", "n", "raw st/s", "client st/s", "cl/raw", "target", "episodes", "len raw", "len cl", "client s")
WIDTHS = (14, 9, 3, 9, 11, 6, 8, 8, 7, 6, 8)


def _row(values: list[str]) -> str:
    return "  ".join(v.rjust(w) if i > 1 else v.ljust(w) for i, (v, w) in enumerate(zip(values, WIDTHS)))


def _num(x: float) -> str:
    return f"{x / 1e3:.1f}k" if x >= 1e4 else f"{x:.0f}"


def _target(n: int, ratio: float) -> str:
    if n < 16:
        return "-"  # one env: a round trip per chunk of 4 steps costs more than the steps themselves
    return f">={TARGET_RATIO:g} " + ("ok" if ratio >= TARGET_RATIO else "LOW")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short cells (a smoke run, noisier numbers)")
    args = parser.parse_args(argv)
    dur = QUICK if args.quick else FULL
    discover_envs()
    # envpool is imported only through MuJoCo-v1, which loads the system libEGL first (see mujoco_env.py).
    backends = [b for b in BACKENDS if b != "envpool" or _has("envpool")]

    print(machine_line("gymnasium", "mujoco", "envpool"))
    print(f"mode: {'quick' if args.quick else 'full'}: raw {dur.raw_s:g} s per cell; client runs sized to about "
          f"{dur.client_s:g} s; episodes cut at {EPISODE_CAP} steps; random policy, chunks of {HORIZON} steps.")
    print("Numbers depend on this machine and its load: compare them within one run only.")
    if len(backends) < len(BACKENDS):
        print("envpool is not installed: its rows are left out (pip install \"plugrl-env-client[envpool]\").")
    print()
    print(_row(list(COLUMNS)))
    print(_row(["-" * w for w in WIDTHS]))
    sys.stdout.flush()
    started = time.perf_counter()
    failures = 0
    with tempfile.TemporaryDirectory(prefix="plugrl-bench-sim-") as tmp:
        for task in TASKS:
            for backend in backends:
                for n in NUM_ENVS:
                    raw = bench_raw(task, backend, n, dur.raw_s)
                    try:
                        client = bench_client(task, backend, n, episodes_for(raw, n, dur.client_s), Path(tmp))
                    except Exception as exc:  # report the cell, go on with the others
                        failures += 1
                        print(_row([task, backend, str(n), _num(raw.rate), "ERROR"] + [""] * 6) + f"  {exc}")
                        continue
                    ratio = client.rate / raw.rate
                    print(_row([task, backend, str(n), _num(raw.rate), _num(client.rate), f"{ratio:.2f}",
                                _target(n, ratio), str(client.episodes), f"{raw.mean_length:.0f}",
                                f"{client.mean_length:.0f}", f"{client.seconds:.2f}"]))
                    sys.stdout.flush()
    print(f"\ntotal bench time {time.perf_counter() - started:.1f} s, load avg {load_avg()}")
    return 1 if failures else 0


def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


if __name__ == "__main__":
    raise SystemExit(main())
