"""Learning through the client: the same ARS in process and through the real client and server, and how fast ARS
learns MuJoCo tasks through the client.

Run from the repo root (extra ``mujoco`` for the MuJoCo tasks)::

    python bench/learning.py --quick      # parity on Point-v1 and InvertedPendulum-v5, and a short Swimmer-v5 run
    python bench/learning.py              # parity, then Swimmer-v5 (twice) and HalfCheetah-v5 to the thresholds
    python bench/learning.py --task HalfCheetah-v5 --max-minutes 40     # one learning run only

1. Parity. One ARS (same seeds, same hyperparameters) is run two ways: :func:`plain_run` steps an env object of this
   package itself with a loop written for the purpose and drives :class:`~plugrl_env_client.server.ars.ArsLearner`
   directly; :func:`client_run` runs ``plugrl-run-env-client`` against ``plugrl-run-policy-server --policy.name ars``
   (separate processes, loopback, horizon 1, one client process in lockstep). If the client hands the server the MDP
   the env defines, the two learners see the same episodes and every episode's return agrees: the script compares
   the client's episodes.jsonl, the server's iteration log and the saved weights with the plain run, and prints
   ``parity: identical (K iterations, E episodes)`` or the first episode where they differ and by how much.
2. Learning. Swimmer-v5 and HalfCheetah-v5 through the client with the paper's hyperparameters for ARS V2-t
   (Mania, Guy & Recht 2018, Table 9), with ``2N`` envs running the rollouts of an iteration and a few more running
   its unperturbed policy (evaluation episodes). Both tasks' episodes always last 1000 steps, so in lockstep every
   iteration's evaluation episodes run the policy of that iteration. The figure is the number of training episodes
   (2N per iteration, evaluations not counted, as in the paper) after which the evaluation return first reaches the
   paper's threshold, next to the paper's Table 1 figure; with the machine's wall time for the whole run. Swimmer
   runs once more with the server's defaults (N = 8, b = 4, alpha 0.02, nu 0.03: what ``--local-policy ars``
   runs), which the paper did not use for it; the paper's own one direction per iteration is fragile. The
   paper's figures are for the -v1 tasks of 2018 (MuJoCo 1.31, Gym 0.9.3), averaged over three seeds; MuJoCo v5
   tasks differ a little (model and reward details), and a single seed varies a lot (the paper's Figure 3).

Numbers depend on the machine and its load (the wall times most): compare them within one run only.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from machine import load_avg, machine_line

from plugrl_env_client.envs import discover_envs
from plugrl_env_client.envs.base_env import BaseEnvConfig
from plugrl_env_client.rollout.seeds import episode_seed
from plugrl_env_client.server.ars import ArsLearner, ArsSettings, Episode, state_layout, state_matrix
from plugrl_env_client.utils.registration import get_spec, make_env

SERVER_DTYPE = "float32"
"""``--policy.dtype`` of the server (its default): the plain loop casts its actions the same way."""


@dataclasses.dataclass(frozen=True)
class Task:
    """An env and the ARS hyperparameters it is learned with."""

    label: str
    env_id: str
    env_flags: tuple[str, ...] = ()
    directions: int = 8
    top_directions: int = 4
    step_size: float = 0.02
    noise: float = 0.03
    eval_envs: int = 0
    """Envs beyond the 2N rollouts of an iteration: they run evaluation episodes."""
    envs: int | None = None
    """The number of envs instead (fewer than 2N: the rollouts of an iteration take turns)."""
    threshold: float | None = None
    paper_episodes: int | None = None
    """ARS V2-t's episodes to the threshold in the paper's Table 1 (-v1 task, mean of three seeds)."""

    @property
    def num_envs(self) -> int:
        return self.envs if self.envs is not None else 2 * self.directions + self.eval_envs

    def env_config(self) -> BaseEnvConfig:
        """The env's config as the client builds it from ``env_flags`` (``--env.field value`` pairs)."""
        cls = get_spec(self.env_id).config_cls
        fields = {self.env_flags[i].removeprefix("--env.").replace("-", "_"): self.env_flags[i + 1]
                  for i in range(0, len(self.env_flags), 2)}
        return cls(**fields)

    def settings(self, seed: int, save: Path | None = None) -> ArsSettings:
        return ArsSettings(directions=self.directions, top_directions=self.top_directions, step_size=self.step_size,
                           noise=self.noise, seed=seed, save=save)


# Point-v1: noise and steps large enough that the point soon reaches its goal, so episodes end at different steps.
POINT = Task("Point-v1", "Point-v1", directions=3, top_directions=2, step_size=0.5, noise=0.5, envs=4)
PENDULUM = Task("InvertedPendulum-v5", "MuJoCo-v1", ("--env.task", "InvertedPendulum-v5"), directions=4,
                top_directions=2, step_size=0.02, noise=0.03, envs=5)
# The paper's Table 9 (ARS V2-t) and Table 1 (V2-t episodes to the threshold).
SWIMMER = Task("Swimmer-v5", "MuJoCo-v1", ("--env.task", "Swimmer-v5"), directions=1, top_directions=1,
               step_size=0.02, noise=0.01, eval_envs=2, threshold=325.0, paper_episodes=427)
CHEETAH = Task("HalfCheetah-v5", "MuJoCo-v1", ("--env.task", "HalfCheetah-v5"), directions=32, top_directions=4,
               step_size=0.02, noise=0.03, eval_envs=4, threshold=3430.0, paper_episodes=1707)
# Not the paper's: the server's defaults, which are also what --local-policy ars runs.
SWIMMER_DEFAULTS = Task("Swimmer-v5-defaults", "MuJoCo-v1", ("--env.task", "Swimmer-v5"), eval_envs=2,
                        threshold=325.0, paper_episodes=427)
LEARNING = {t.label: t for t in (SWIMMER, SWIMMER_DEFAULTS, CHEETAH)}


@dataclasses.dataclass
class Run:
    """What one way of running ARS produced."""

    episodes: list[tuple[int, float, int]]  # (env, return, length) in the order they finished
    iterations: list[dict[str, Any]]  # the learner's records
    weights: np.ndarray
    wall_s: float = 0.0


# ------------------------------------------------------------------------------------------------ the plain loop


def action_bounds(task: Task) -> tuple[int, float, float]:
    """Action size and (uniform) bounds of the task's env: the server's --policy.action-dim/low/high."""
    env = make_env(task.env_id, num_envs=1, config=task.env_config())
    try:
        space = env.single_action_space
        low, high = np.unique(space.low), np.unique(space.high)
        assert low.size == 1 and high.size == 1, "the server's flags take one bound for every action"
        return int(np.prod(space.shape)), float(low[0]), float(high[0])
    finally:
        env.close()


def plain_run(task: Task, iterations: int, seed: int) -> Run:
    """ARS on ``task`` for ``iterations`` updates, stepping the env directly: no client, no server, no sockets.

    It follows the conventions SPEC.md fixes for the client, so that it hands the learner what a server receives:

    - the batch is the env of ``make_env`` with the client's ``num_envs`` and env config;
    - the first reset is seeded with the client's seed (``--runner.seed``; one process, so no offset); each later
      episode of an env that takes per-env seeds starts from the client's derived seed
      (:func:`~plugrl_env_client.rollout.seeds.episode_seed`), the others continue each env's generator;
    - every env gets an action every step (horizon 1), computed from the state arrays of its observation (sorted
      keys, flattened, float64), clipped to the bounds, cast to the server's ``--policy.dtype`` (float32) and then
      to the action space's dtype;
    - rewards are cast to float32 (the client's contract) and an episode's return is their sum in float64, step by
      step: exactly what a server adding up the float32 chunk rewards of its feedback forms;
    - the registered time limit (``max_episode_steps``) truncates an episode that has not terminated; the env's own
      limits show up as its ``truncated``;
    - every env goes on until the run has its episodes, as the client's ``--runner.episode-split shared`` does
      (with the static split an env that ran its share retires, and the learner starts fewer rollouts at the end);
    - the envs done on a step first report their episodes (in env order), then are reset together with a mask
      (``reset(options={"reset_mask": ..., "reset_indices": ...})``), and start their next episodes, in env order,
      with the observation that reset returned.
    """
    dim, low, high = action_bounds(task)
    env = make_env(task.env_id, num_envs=task.num_envs, config=task.env_config())
    limit = get_spec(task.env_id).max_episode_steps
    space = env.single_action_space
    learner = ArsLearner((dim,), low, high, task.settings(seed))
    n = task.num_envs
    start = time.perf_counter()
    episodes: list[tuple[int, float, int]] = []
    running: list[Episode | None] = [None] * n
    lengths = np.zeros(n, np.int64)
    started = np.ones(n, np.int64)  # episodes each env has started
    per_env_seeds = bool(env.metadata.get("per_env_seeds", False))
    try:
        obs, _ = env.reset(seed=seed)
        while learner.iteration < iterations:
            layout = state_layout(obs.states)
            learner.bind(layout)
            x = state_matrix(obs.states, layout, n)
            for j in range(n):
                if running[j] is None:
                    running[j] = Episode(learner.start_episode())
                running[j].observe(x[j])  # type: ignore[union-attr]
            actions = learner.actions([e.rollout for e in running if e is not None], x)
            actions = actions.astype(SERVER_DTYPE).astype(space.dtype)
            obs, rewards, terminated, truncated, _ = env.step(actions)
            rewards = np.asarray(rewards).astype(np.float32)
            terminated, truncated = np.asarray(terminated, bool), np.asarray(truncated, bool)
            lengths += 1
            if limit is not None:
                truncated = truncated | ((lengths >= limit) & ~terminated)
            done = terminated | truncated
            finished = []
            for j in range(n):
                episode = running[j]
                assert episode is not None
                episode.add(float(rewards[j]))
                if done[j]:
                    finished.append((episode, int(lengths[j])))
                    episodes.append((j, episode.ret, int(lengths[j])))
                    running[j] = None
            if finished:
                learner.finish(finished)
                rows = np.flatnonzero(done)
                seeds: list[int | None] | None = None
                if per_env_seeds:
                    seeds = [episode_seed(seed, 0, j, int(started[j])) if done[j] else None for j in range(n)]
                started[rows] += 1
                obs, _ = env.reset(seed=seeds, options={"reset_mask": done.copy(), "reset_indices": rows})  # type: ignore[arg-type]
                lengths[rows] = 0
    finally:
        env.close()
    return Run(episodes, list(learner.records), learner.weights, time.perf_counter() - start)


# ------------------------------------------------------------------------------------------------ through the client


class Server:
    """``plugrl-run-policy-server --policy.name ars`` in a subprocess on a free loopback port."""

    def __init__(self, task: Task, seed: int, save: Path) -> None:
        dim, low, high = action_bounds(task)
        cmd = [sys.executable, "-c", "from plugrl_env_client.server.cli import main; main()", "--port", "0",
               "--policy.name", "ars", "--policy.action-dim", str(dim), "--policy.low", repr(low),
               "--policy.high", repr(high), "--policy.seed", str(seed), "--policy.directions", str(task.directions),
               "--policy.top-directions", str(task.top_directions), "--policy.step-size", repr(task.step_size),
               "--policy.noise", repr(task.noise), "--policy.save", str(save)]
        save.parent.mkdir(parents=True, exist_ok=True)
        self.log = save.with_suffix(".server.log").open("w")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.log, text=True)
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if "listening on ws://" not in line:
            self.stop()
            raise RuntimeError(f"the server did not start: {line!r} (see {self.log.name})")
        self.port = int(line.rsplit(":", 1)[1])
        self.save = save

    def iterations(self) -> list[dict[str, Any]]:
        path = self.save.with_suffix(".jsonl")
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]

    def wait_for(self, count: int, timeout_s: float = 60.0) -> list[dict[str, Any]]:
        """The iteration log once it has ``count`` lines (the last feedback may still be on its way)."""
        deadline = time.monotonic() + timeout_s
        while len(records := self.iterations()) < count:
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"the server logged {len(records)} of {count} iterations (see {self.log.name})")
            time.sleep(0.05)
        return records

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout:
            self.proc.stdout.close()
        self.log.close()


def client_command(task: Task, port: int, seed: int, folder: Path, episodes: int | None) -> list[str]:
    cmd = [sys.executable, "-m", "plugrl_env_client", task.env_id.lower(), *task.env_flags,
           "--num-envs", str(task.num_envs), "--runner.seed", str(seed), "--server-port", str(port),
           "--output-dir", str(folder.parent), "--exp-name", folder.name, "--no-progress",
           "--runner.episode-split", "shared"]
    return cmd + (["--num-episodes", str(episodes)] if episodes is not None else [])


def client_episodes(folder: Path) -> list[tuple[int, float, int]]:
    path = folder / "rollout" / "proc_000" / "episodes.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return [(r["env_index"], r["return"], r["length"]) for r in rows]


def client_run(task: Task, iterations: int, episodes: int, seed: int, work: Path) -> Run:
    """The same ARS through the real client and server: ``episodes`` episodes (those of ``iterations``
    iterations of the plain run), then the server's log and saved policy."""
    save = work / f"{task.label}-s{seed}" / "ars.npz"
    server = Server(task, seed, save)
    start = time.perf_counter()
    try:
        folder = save.parent / "client"
        result = subprocess.run(client_command(task, server.port, seed, folder, episodes), capture_output=True,
                                text=True, timeout=900)
        if result.returncode != 0:
            raise RuntimeError(f"the client failed ({result.returncode}): {result.stderr[-2000:]}")
        records = server.wait_for(iterations)
        wall = time.perf_counter() - start
        with np.load(save) as saved:
            weights = saved["weights"]
        # The policy file is saved at every iteration: when the server got past K, the K-th weights are gone.
        if len(server.iterations()) != iterations:
            weights = np.full_like(weights, np.nan)
    finally:
        server.stop()
    return Run(client_episodes(folder), records[:iterations], weights, wall)


def compare(plain: Run, client: Run, iterations: int) -> tuple[bool, str]:
    """Whether every episode and iteration agrees to float32 precision, and the line that says so."""
    if len(client.episodes) < len(plain.episodes):
        return False, f"parity: the client recorded {len(client.episodes)} episodes, the plain loop {len(plain.episodes)}"
    bitwise = True
    for i, (a, b) in enumerate(zip(plain.episodes, client.episodes)):
        if a[0] != b[0] or a[2] != b[2] or np.float32(a[1]) != np.float32(b[1]):
            return False, (f"parity: episode {i} differs: plain loop env {a[0]} return {a[1]!r} length {a[2]}, client "
                           f"env {b[0]} return {b[1]!r} length {b[2]} (return differs by {abs(a[1] - b[1]):.3g})")
        bitwise &= a[1] == b[1]
    for k, (a, b) in enumerate(zip(plain.iterations, client.iterations)):
        for key in ("returns_plus", "returns_minus"):
            if not np.array_equal(np.float32(a[key]), np.float32(b[key])):
                return False, f"parity: iteration {k + 1} {key} differ: plain {a[key]} server {b[key]}"
    if not np.array_equal(plain.weights, client.weights):
        gap = float(np.nanmax(np.abs(plain.weights - client.weights))) if plain.weights.shape == client.weights.shape else "shape"
        return False, f"parity: the final weights differ (largest gap {gap})"
    exact = "bit for bit" if bitwise else "to float32 precision"
    return True, (f"parity: identical ({iterations} iterations, {len(plain.episodes)} episodes; returns {exact}, "
                  "final weights bit for bit)")


def parity(task: Task, iterations: int, seed: int, work: Path) -> tuple[bool, str]:
    plain = plain_run(task, iterations, seed)
    client = client_run(task, iterations, len(plain.episodes), seed, work)
    ok, line = compare(plain, client, iterations)
    return ok, f"{task.label:<20} {line}  [plain {plain.wall_s:.1f} s, client {client.wall_s:.1f} s]"


# ------------------------------------------------------------------------------------------------ learning


@dataclasses.dataclass
class Learned:
    task: Task
    seed: int
    reached_at: int | None  # training episodes after which the evaluation return first reached the threshold
    iterations: int
    best_eval: float
    best_at: int  # training episodes behind the policy of the best evaluation
    last_eval: float
    env_steps: int
    wall_s: float
    reason: str


def learn(task: Task, seed: int, work: Path, max_minutes: float, max_episodes: int | None = None,
          progress: Callable[[str], None] = print) -> Learned:
    """Run ARS on ``task`` through the client until the evaluation return reaches the threshold (or the time or
    episode cap); the client is stopped with SIGINT, as a user would."""
    save = work / f"{task.label}-learn-s{seed}" / "ars.npz"
    server = Server(task, seed, save)
    start = time.perf_counter()
    folder = save.parent / "client"
    stderr = save.with_suffix(".client.log").open("w")  # a file, not a pipe: a long run must never block on it
    client = subprocess.Popen(client_command(task, server.port, seed, folder, None), stdout=subprocess.DEVNULL,
                              stderr=stderr, text=True)
    reached, reason, seen = None, "time cap", 0
    records: list[dict[str, Any]] = []
    try:
        while time.perf_counter() - start < max_minutes * 60:
            if client.poll() is not None:
                reason = f"the client ended ({client.returncode}; see {stderr.name})"
                break
            records = server.iterations()
            hit = [r for r in records if task.threshold is not None and (r["eval_mean_return"] or -math.inf) >= task.threshold]
            for r in records[seen:]:
                if r["iteration"] % 10 == 0 or r in hit:
                    evaluation = "none" if r["eval_mean_return"] is None else f"{r['eval_mean_return']:.1f}"
                    progress(f"  {task.label} seed {seed}: iteration {r['iteration']}, {r['episodes']} episodes, "
                             f"eval {evaluation}, {time.perf_counter() - start:.0f} s")
            seen = len(records)
            if hit:
                # The evaluation of iteration i ran the policy after i - 1 updates: 2N (i - 1) training episodes.
                reached, reason = 2 * task.directions * (hit[0]["iteration"] - 1), "threshold"
                break
            if max_episodes is not None and records and records[-1]["episodes"] >= max_episodes:
                reason = "episode cap"
                break
            time.sleep(0.5)
    finally:
        wall = time.perf_counter() - start
        if client.poll() is None:
            client.send_signal(signal.SIGINT)
            try:
                client.wait(timeout=60)
            except subprocess.TimeoutExpired:
                client.kill()
                client.wait()
        stderr.close()
        server.stop()
    records = server.iterations() or records
    evaluated = [r for r in records if r["eval_mean_return"] is not None]
    best = max(evaluated, key=lambda r: r["eval_mean_return"], default=None)
    return Learned(task, seed, reached, len(records), best["eval_mean_return"] if best else float("nan"),
                   2 * task.directions * (best["iteration"] - 1) if best else 0,
                   evaluated[-1]["eval_mean_return"] if evaluated else float("nan"),
                   records[-1]["env_steps"] if records else 0, wall, reason)


def learning_table(results: list[Learned]) -> str:
    lines = ["| task (seed) | hyperparameters (N, b, alpha, nu) | envs | threshold | episodes to threshold | paper "
             "(V2-t, -v1) | iterations | best eval return (after episodes) | last eval return | env steps | wall time |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        t = r.task
        got = f"{r.reached_at:,}" if r.reached_at is not None else f"not reached ({r.reason})"
        lines.append(f"| {t.label} ({r.seed}) | {t.directions}, {t.top_directions}, {t.step_size:g}, {t.noise:g} | "
                     f"{t.num_envs} ({2 * t.directions} + {t.eval_envs} eval) | {t.threshold:g} | {got} | "
                     f"{t.paper_episodes:,} | {r.iterations} | {r.best_eval:.1f} ({r.best_at:,}) | {r.last_eval:.1f} | "
                     f"{r.env_steps:,} | {r.wall_s / 60:.1f} min |")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="parity runs and a short Swimmer-v5 run (< 2 min)")
    parser.add_argument("--task", choices=sorted(LEARNING), action="append",
                        help="learning runs of this task only (repeatable; no parity runs)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[237], help="seeds of the learning runs")
    parser.add_argument("--max-minutes", type=float, default=40.0, help="time cap of each learning run")
    parser.add_argument("--keep", type=Path, help="keep the runs' folders (server logs, ars.jsonl, client runs) here")
    args = parser.parse_args(argv)
    discover_envs()
    print(machine_line("mujoco", "gymnasium", "websockets"), flush=True)
    ok = True
    with tempfile.TemporaryDirectory(prefix="plugrl-learning-") as tmp:
        work = args.keep or Path(tmp)
        if not args.task:
            checks = [(POINT, 6, 4), (PENDULUM, 3, 1)]
            for task, iterations, seed in checks:
                good, line = parity(task, iterations, seed, work)
                ok &= good
                print(line, flush=True)
        tasks = [LEARNING[t] for t in args.task] if args.task else list(LEARNING.values())
        if args.quick:
            r = learn(SWIMMER, args.seeds[0], work, max_minutes=0.5, max_episodes=40)
            print(f"Swimmer-v5, {r.iterations} iterations ({r.env_steps:,} env steps, {r.wall_s:.0f} s): evaluation "
                  f"return {r.last_eval:.1f} (best {r.best_eval:.1f}); the full run goes on to {SWIMMER.threshold:g} or its time cap")
        else:
            results = [learn(task, seed, work, args.max_minutes) for task in tasks for seed in args.seeds]
            print(learning_table(results))
            print("Paper: Mania, Guy & Recht 2018, Table 1 (ARS V2-t, mean over three seeds, -v1 tasks on MuJoCo 1.31) "
                  "and Table 9 (hyperparameters). Here: MuJoCo v5 tasks (Gymnasium), which differ a little from v1, "
                  "and one seed per row; wall times on a machine shared with other work (load above).")
    print(f"load avg at the end: {load_avg()}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
