"""Throughput of the env client: raw env stepping vs. the full rollout loop over loopback WebSockets.

Run from the repo root::

    python bench/throughput.py                           # full table, about 40 s on 2 idle cores
    python bench/throughput.py --quick                   # short cells, about 10 s
    python bench/throughput.py --no-reuse-feedback-obs   # every observation sent in full

For each env (Dummy-v1, Point-v1), batch size (num_envs 1, 16, 256) and server action horizon (1, 8) it measures

* raw: ``env.step`` in a tight loop with pre-made valid actions, after one reset (independent of the horizon, so
  it is measured once per env and batch size and repeated on both horizon rows);
* client: the real :class:`~plugrl_env_client.rollout.loop.Rollout` (Session, EpisodeBudget, RunWriter in a
  temp dir) against the reference ``random`` server started with ``start_local_server`` in a thread of this
  process (as ``--local-policy random`` does), stopped through the budget's ``stop`` event by a watcher thread
  after a time limit or a step cap;
* the round trip of each infer (pack, send, server decode + policy, reply, parse: from ``send_infer`` to the
  ``receive_actions`` that returns its chunk), timed by instrumenting the session from this script only;
* bytes sent per env step (infer and feedback frames, from ``session.timing.bytes_sent``).

Numbers depend on the machine and its load; compare them within one run only.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np
from machine import load_avg, machine_line

from plugrl_env_client.envs import contract, discover_envs
from plugrl_env_client.envs.registry import get_spec, make_env
from plugrl_env_client.outputs.run_dir import RunDir
from plugrl_env_client.outputs.run_writer import RunWriter

try:
    from plugrl_env_client.protocol.dialing import SessionConfig
except ImportError:  # a tree whose session module held its config
    from plugrl_env_client.protocol.session import SessionConfig  # type: ignore[attr-defined,no-redef]
from plugrl_env_client.protocol.session import Session
from plugrl_env_client.rollout.budget import EpisodeBudget
from plugrl_env_client.rollout.group import EnvGroup
from plugrl_env_client.rollout.loop import Rollout
from plugrl_env_client.rollout.settings import LoopSettings
from plugrl_env_client.server.embedded import start_local_server

ENV_IDS = ("Dummy-v1", "Point-v1")
NUM_ENVS = (1, 16, 256)
HORIZONS = (1, 8)


@dataclasses.dataclass(frozen=True)
class Durations:
    raw_s: float  # seconds of raw stepping per (env, num_envs)
    client_s: float  # time limit of one client cell
    big_s: float  # time limit of the Dummy-v1 x 256 client cells (~190 KB of images per env per message)
    big_chunks: int  # ... and their step cap, in chunk lengths: big_chunks * H batch steps

    def limits(self, env_id: str, num_envs: int, horizon: int) -> tuple[float, int | None]:
        """(time limit in s, env-step cap or None) of one client cell."""
        if env_id == "Dummy-v1" and num_envs >= 256:
            return self.big_s, self.big_chunks * horizon * num_envs
        return self.client_s, None


FULL = Durations(raw_s=1.0, client_s=2.5, big_s=8.0, big_chunks=8)
QUICK = Durations(raw_s=0.25, client_s=0.5, big_s=1.5, big_chunks=2)


# ------------------------------------------------------------------------------------------------ raw stepping


RAW_SLICES = 5


def bench_raw(env_id: str, num_envs: int, seconds: float) -> float:
    """env-steps/s of ``env.step`` alone, on pre-made actions: the best of RAW_SLICES timed slices of the time.

    Taking the best slice keeps a burst of load from other processes out of the reference number.
    """
    env = make_env(env_id, num_envs=num_envs)
    try:
        space = env.action_space
        space.seed(0)
        actions = [np.asarray(space.sample()) for _ in range(64)]
        env.reset(seed=0)
        for a in actions[:5]:  # warm-up
            env.step(a)
        best, i = 0.0, 0
        for _ in range(RAW_SLICES):
            batches = 0
            start = time.perf_counter()
            deadline = start + seconds / RAW_SLICES
            now = start
            while now < deadline:
                for _ in range(16):
                    env.step(actions[i & 63])
                    i += 1
                batches += 16
                now = time.perf_counter()
            best = max(best, batches * num_envs / (now - start))
        return best
    finally:
        env.close()


# ------------------------------------------------------------------------------------------------ full client


class TimedSession(Session):
    """A Session that records the wall time of every completed infer exchange (``send_infer`` called → its action
    received by ``receive_actions``)."""

    def __init__(self, config: SessionConfig) -> None:
        super().__init__(config)
        self.infer_s: list[float] = []
        self._asked_at = 0.0

    def send_infer(self, *args: Any, **kwargs: Any) -> None:
        self._asked_at = time.perf_counter()
        super().send_infer(*args, **kwargs)

    def receive_actions(self, timeout: float | None = None) -> Any:
        out = super().receive_actions(timeout)  # a close raises: only completed exchanges are timed
        if out is not None:
            self.infer_s.append(time.perf_counter() - self._asked_at)
        return out


@dataclasses.dataclass
class ClientResult:
    env_steps: int
    seconds: float
    infers: int
    rtt_ms: np.ndarray
    bytes_sent: int
    status: str
    reused: bool  # the client used reuse-feedback-obs on this connection

    @property
    def rate(self) -> float:
        return self.env_steps / self.seconds if self.seconds > 0 else 0.0


def bench_client(env_id: str, num_envs: int, horizon: int, seconds: float, max_env_steps: int | None,
                 reuse_feedback_obs: bool = True) -> ClientResult:
    spec = get_spec(env_id)
    env = make_env(spec.uid, num_envs=num_envs)
    server = start_local_server("random", contract.action_space_of(env), horizon, seed=0)
    budget = EpisodeBudget(None)
    done = threading.Event()

    def watch() -> None:  # the budget's stop event, set from a timer thread
        deadline = time.perf_counter() + seconds
        while not done.wait(0.01):
            if time.perf_counter() >= deadline or (max_env_steps is not None and budget.env_steps >= max_env_steps):
                budget.stop.set()
                return

    with tempfile.TemporaryDirectory(prefix="plugrl-bench-") as tmp:
        writer = RunWriter(RunDir(Path(tmp) / "run").create(), "bench", 1)
        session = TimedSession(SessionConfig(url=server.url, connect_timeout=10))
        settings = LoopSettings(
            env_id=spec.uid,
            process_id=0,
            seed=0,
            max_episode_steps=spec.max_episode_steps,
            replan_steps=None,
            success_threshold=spec.best_reward_threshold_for_success,
            reuse_feedback_obs=reuse_feedback_obs,
        )
        group = EnvGroup(env, session, settings, budget, writer, session.timing)
        rollout = Rollout([group], settings, budget, writer)
        watcher = threading.Thread(target=watch, name="bench-watch", daemon=True)
        watcher.start()
        try:
            status = rollout.run()
        finally:
            done.set()
            watcher.join()
            writer.close()
            server.shutdown()
            env.close()
    t = session.timing
    return ClientResult(
        env_steps=t.env_steps,
        seconds=t.collect_time_s,
        infers=t.infer_calls,
        rtt_ms=np.asarray(session.infer_s) * 1e3,
        bytes_sent=t.bytes_sent,
        status=status.value,
        reused=group.held.enabled,
    )


# ------------------------------------------------------------------------------------------------ table


COLUMNS = ("env", "n", "H", "raw st/s", "client st/s", "cl/raw", "rtt med ms", "rtt p90 ms", "B sent/st", "infers", "steps")
WIDTHS = (9, 4, 2, 11, 12, 8, 10, 10, 10, 7, 7)


def _row(values: list[str]) -> str:
    return "  ".join(v.rjust(w) if i else v.ljust(w) for i, (v, w) in enumerate(zip(values, WIDTHS)))


def _num(x: float) -> str:
    if x >= 1e6:
        return f"{x / 1e6:.2f}M"
    if x >= 1e4:
        return f"{x / 1e3:.1f}k"
    if x >= 100:
        return f"{x:.0f}"
    return f"{x:.3g}"


def _ratio(x: float) -> str:
    return f"{x:.3f}" if x >= 0.01 else f"{x:.2e}"


def _bytes(x: float) -> str:
    if x >= 1e6:
        return f"{x / 1e6:.2f}MB"
    if x >= 1e3:
        return f"{x / 1e3:.1f}kB"
    return f"{x:.0f}B"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short cells (a smoke run, noisier numbers)")
    parser.add_argument("--no-reuse-feedback-obs", dest="reuse", action="store_false",
                        help="send every observation in full even though the server offers reuse-feedback-obs")
    args = parser.parse_args(argv)
    dur = QUICK if args.quick else FULL
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    discover_envs()

    print(machine_line("msgpack", "websockets"))
    print(f"mode: {'quick' if args.quick else 'full'}: raw {dur.raw_s:g} s per (env, n); client cells {dur.client_s:g} s, "
          f"Dummy-v1 n=256 {dur.big_s:g} s or {dur.big_chunks} x H batch steps, whichever comes first.")
    print("Numbers depend on this machine and its load: compare them within one run only.")
    print()
    print(_row(list(COLUMNS)))
    print(_row(["-" * w for w in WIDTHS]))
    sys.stdout.flush()
    started = time.perf_counter()
    failures = 0
    reused: list[bool] = []
    for env_id in ENV_IDS:
        for n in NUM_ENVS:
            raw = bench_raw(env_id, n, dur.raw_s)
            for h in HORIZONS:
                limit_s, cap = dur.limits(env_id, n, h)
                try:
                    res = bench_client(env_id, n, h, limit_s, cap, args.reuse)
                    reused.append(res.reused)
                except Exception as exc:  # report the cell and carry on with the others
                    failures += 1
                    traceback.print_exc()
                    print(_row([env_id, str(n), str(h), _num(raw), "ERROR", "", "", "", "", "", ""]) + f"  {type(exc).__name__}: {exc}")
                    continue
                rtt = res.rtt_ms
                med = f"{np.median(rtt):.3f}" if rtt.size else "-"
                p90 = f"{np.percentile(rtt, 90):.3f}" if rtt.size else "-"
                per_step = res.bytes_sent / res.env_steps if res.env_steps else float("nan")
                line = _row([env_id, str(n), str(h), _num(raw), _num(res.rate), _ratio(res.rate / raw), med, p90,
                             _bytes(per_step), str(res.infers), str(res.env_steps)])
                if res.status not in ("interrupted", "finished"):
                    line += f"  (status: {res.status})"
                print(line)
                sys.stdout.flush()
    print(f"\nreuse-feedback-obs {'requested' if args.reuse else 'disabled'}; used in {sum(reused)} of {len(reused)} client cells")
    print(f"total bench time {time.perf_counter() - started:.1f} s, load avg {load_avg()}")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
