"""The reference policy server under connection storms and long load, each figure next to its target.

Run from the repo root (Linux: it reads /proc)::

    python bench/server_load.py                  # full scale: 3 storm waves, 32 clients over 40,000 episodes (30 min)
    python bench/server_load.py --quick          # one wave of 200, 8 clients over 14,000 episodes (5 min)
    python bench/server_load.py --only storm     # or: memory; --runs 1 for one run of 12,000 after the warm-up
    python bench/server_load.py --transport picows

The server is ``plugrl-run-policy-server`` (random policy, action dim 3) in a subprocess of its own; its threads,
open file descriptors and resident memory are read from /proc.

1. Storm. Waves of connections that open and drop, started ``--gap`` seconds apart so they overlap (full scale: 3
   waves of 200), each connection one of five kinds, in turn: a bare TCP connect; half an HTTP upgrade request; a
   whole handshake, then the socket dropped without a close frame; a handshake and half a frame; a handshake, the
   metadata read and a clean close. The first, second and fourth kinds hold their socket open for a random time up to
   ``--hold`` seconds (full scale: 90 s) before they let go. They run in a child process (asyncio, raw sockets). All
   the while a well-behaved client (this process, a thread) connects, reads the metadata, sends an infer, reads the
   action and closes, once every 0.25 s. Targets: every one of its round trips served, the slowest within 2 s;
   once the storm's sockets are gone, the server's threads and open descriptors back to what they were before it,
   within 60 s; no traceback in the server's log.
2. Memory and exact counts. ``--clients`` client processes of 16 ``Point-v1`` envs (full scale: 32, as one
   ``plugrl-run-env-client --num-procs 32`` run) against the server: a warm-up run, then runs of 12,000 episodes
   each (full scale: 3). The server's resident memory is read after each run (the server then idles: no message is
   in flight). Targets: after the warm-up it grows by less than 15 MB over each 12,000 episodes; every run records
   exactly the episodes it was asked for (``summary.json`` and the lines of every ``episodes.jsonl``), and the
   server counted at least as many.

CI runs both at a small scale: ``tests/server/test_ws_server.py`` the storm (one wave of 200),
``tests/server/test_episodes.py`` the memory (a few thousand episodes, the server's heap traced) and
``tests/server/test_server.py`` the exact counts of 32 client processes of 16 envs.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import dataclasses
import json
import os
import random
import re
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import load_avg, machine_line

from plugrl_env_client.protocol import codec, messages

KINDS = ("tcp", "half-upgrade", "handshake-drop", "half-frame", "clean-close")
"""The storm's connection kinds, in the order a wave cycles through them."""
HELD = frozenset({"tcp", "half-upgrade", "half-frame"})
"""Kinds that hold their socket open (up to ``--hold`` seconds) before dropping it."""
PROBE_PERIOD_S = 0.25
PROBE_TARGET_S = 2.0
RECOVERY_TARGET_S = 60.0
THREADS_SLACK = 4
"""Threads a server may add while it serves a storm: a thread per connection is what the storm must not get."""
MEMORY_TARGET_MB = 15.0
EPISODES_PER_RUN = 12_000
NUM_ENVS = 16
ACTION_DIMS = {"point-v1": 2, "probe-v1": 3}
"""The envs the memory runs can use, with the action dim the server's random policy must answer."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ------------------------------------------------------------------------------------------------ the server


class ServerProcess:
    """``plugrl-run-policy-server`` in a subprocess for the duration of a ``with`` block; its log is kept."""

    def __init__(self, transport: str = "websockets", action_dim: int = 3, extra: Sequence[str] = ()) -> None:
        self.port = free_port()
        cmd = [sys.executable, "-c", "from plugrl_env_client.server.cli import main; main()", "--port", str(self.port),
               "--policy.action-dim", str(action_dim), "--transport", transport, *extra]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        self.episodes = 0
        """The highest count the server logged (its final one once the ``with`` block is left)."""
        self._reader: threading.Thread | None = None

    def __enter__(self) -> ServerProcess:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if "listening" not in line:
            self.proc.kill()
            raise RuntimeError(f"the reference server did not start: {line}{self.proc.stdout.read()}")
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        return self

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            found = re.search(r"episodes=(\d+)", line)
            if found:
                self.episodes = max(self.episodes, int(found.group(1)))

    def __exit__(self, *exc: object) -> None:
        """Ctrl-C, as a user stops it: the server closes its clients and logs its final count."""
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self._reader is not None:
            self._reader.join(timeout=10)

    def status(self, field: str) -> int:
        """A field of /proc/<pid>/status (Threads; VmRSS in kB)."""
        return proc_status(self.proc.pid, field)

    def fds(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def rss_mb(self) -> float:
        return self.status("VmRSS") / 1024

    def tracebacks(self) -> list[str]:
        return [line for line in self.lines if line.startswith("Traceback")]


def proc_status(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/{pid}/status")


# ------------------------------------------------------------------------------------------------ the storm


def upgrade_request(port: int) -> bytes:
    key = base64.b64encode(os.urandom(16)).decode()
    return (f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode()


def masked_frame(opcode: int, payload: bytes) -> bytes:
    """One client frame (clients mask, RFC 6455 5.3), payload below 126 bytes."""
    mask = os.urandom(4)
    return bytes([0x80 | opcode, 0x80 | len(payload)]) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


async def storm_connection(kind: str, port: int, hold_s: float) -> str:
    """One connection of the storm; returns "ok" or what went wrong (the server may drop a held one first)."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 30)
    except (OSError, asyncio.TimeoutError) as exc:
        return f"connect failed: {type(exc).__name__}"
    try:
        if kind == "tcp":
            await asyncio.sleep(hold_s)
        elif kind == "half-upgrade":
            request = upgrade_request(port)
            writer.write(request[: len(request) // 2])
            await writer.drain()
            await asyncio.sleep(hold_s)
        else:
            writer.write(upgrade_request(port))
            await writer.drain()
            await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
            if kind == "half-frame":  # a binary frame that announces 1000 bytes and brings 10
                writer.write(bytes([0x82, 0x80 | 126]) + struct.pack("!H", 1000) + os.urandom(4) + bytes(10))
                await writer.drain()
                await asyncio.sleep(hold_s)
            elif kind == "clean-close":
                await asyncio.wait_for(reader.read(1 << 16), 30)  # the metadata
                writer.write(masked_frame(0x8, struct.pack("!H", 1000)))
                await writer.drain()
                await asyncio.wait_for(reader.read(1 << 16), 30)  # the server's close
        return "ok"
    except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError) as exc:
        return f"{kind}: {type(exc).__name__}"
    finally:
        if kind == "handshake-drop":
            writer.transport.abort()
        else:
            writer.close()


async def storm(port: int, waves: int, per_wave: int, gap_s: float, hold_s: float, seed: int = 0) -> dict[str, int]:
    """``waves`` waves of ``per_wave`` connections, started ``gap_s`` apart; returns the outcomes, counted."""
    rng = random.Random(seed)
    tasks = []
    for w in range(waves):
        if w:
            await asyncio.sleep(gap_s)
        print(f"wave {w}", flush=True)
        for i in range(per_wave):
            kind = KINDS[i % len(KINDS)]
            hold = rng.uniform(0.1, hold_s) if kind in HELD else 0.0
            tasks.append(asyncio.ensure_future(storm_connection(kind, port, hold)))
    outcomes: dict[str, int] = {}
    for outcome in await asyncio.gather(*tasks):
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    return outcomes


def start_storm(port: int, waves: int, per_wave: int, gap_s: float, hold_s: float) -> subprocess.Popen[str]:
    """The storm in a child process; it prints its outcomes as one JSON line when every connection is gone."""
    return subprocess.Popen([sys.executable, __file__, "--storm-worker", str(port), str(waves), str(per_wave),
                             str(gap_s), str(hold_s)], stdout=subprocess.PIPE, text=True)


@dataclasses.dataclass
class Probe:
    """A well-behaved client in a thread: connect, metadata, one infer and its action, close; every period."""

    url: str
    period_s: float = PROBE_PERIOD_S
    results: list[tuple[float, float, str]] = dataclasses.field(default_factory=list)
    """(start, seconds, "ok" or the error) of each round trip."""

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="storm-probe", daemon=True)

    def start(self) -> Probe:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.is_set():
            start = time.monotonic()
            self.results.append((start, *round_trip(self.url)))
            self._stop.wait(max(0.0, self.period_s - (time.monotonic() - start)))

    def worst(self) -> float:
        return max((s for _, s, _ in self.results), default=0.0)

    def failures(self) -> list[str]:
        return [r for _, _, r in self.results if r != "ok"]


def round_trip(url: str, timeout: float = 30.0) -> tuple[float, str]:
    from websockets.sync.client import connect

    start = time.monotonic()
    obs = {"images": {}, "states": {"x": np.zeros((1, 2))}, "text": np.array(["probe"])}
    try:
        with connect(url, compression=None, max_size=None, proxy=None, open_timeout=timeout) as ws:
            messages.parse_metadata(codec.unpackb(ws.recv(timeout=timeout)))
            ws.send(codec.packb(messages.InferRequest(obs, np.arange(1), np.zeros(1, np.int64)).message()))
            messages.parse_action(codec.unpackb(ws.recv(timeout=timeout)), np.arange(1))
        outcome = "ok"
    except Exception as exc:  # what a client would see: recorded, the probe goes on
        outcome = f"{type(exc).__name__}: {exc}"
    return time.monotonic() - start, outcome


def wait_for(condition: object, timeout: float, step: float = 0.1) -> float | None:
    """Seconds until ``condition()`` held (polled), or None if it did not within ``timeout``."""
    start = time.monotonic()
    while True:
        if condition():  # type: ignore[operator]
            return time.monotonic() - start
        if time.monotonic() - start > timeout:
            return None
        time.sleep(step)


@dataclasses.dataclass
class StormResult:
    """What one storm did to the server and to the well-behaved client."""

    outcomes: dict[str, int]
    """The storm's connections, counted by outcome ("ok" or what went wrong on the storm's side)."""
    probe: Probe
    during: list[float]
    """Seconds of each of the probe's round trips that began before the storm's sockets were all gone."""
    threads0: int
    fds0: int
    peak_threads: int
    recovered: float | None
    """Seconds from the start of the last wave until threads and descriptors were back to ``threads0`` and
    ``fds0``; None if not within 120 s of the storm's end."""
    tracebacks: list[str]


def run_storm(server: ServerProcess, waves: int, per_wave: int, gap_s: float, hold_s: float) -> StormResult:
    """The storm against ``server`` with the probe running throughout; the server's threads and descriptors
    watched until they are back to what they were before it."""
    url = f"ws://127.0.0.1:{server.port}"
    idle_fds = server.fds()
    round_trip(url)  # the server's state once it has served a client (and let it go)
    settled = wait_for(lambda: server.fds() <= idle_fds, 10)  # that client's socket closed on the server's side
    if settled is None:
        raise RuntimeError("the server still holds the first client's socket 10 s after it closed")
    threads0, fds0 = server.status("Threads"), server.fds()
    probe = Probe(url).start()
    worker = start_storm(server.port, waves, per_wave, gap_s, hold_s)
    assert worker.stdout is not None
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(worker.stdout), daemon=True)  # type: ignore[arg-type]
    reader.start()
    peak_threads, last_wave, recovered = threads0, None, None
    try:
        while recovered is None and (worker.poll() is None or reader.is_alive()):
            threads, fds = server.status("Threads"), server.fds()
            peak_threads = max(peak_threads, threads)
            if last_wave is None and sum(line.startswith("wave") for line in lines) == waves:
                last_wave = time.monotonic()
            if last_wave is not None and threads <= threads0 and fds <= fds0 and time.monotonic() - last_wave > 1:
                recovered = time.monotonic() - last_wave
            time.sleep(0.2)
        worker.wait(timeout=hold_s + 120)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    reader.join(timeout=10)
    gone = time.monotonic()
    if recovered is None and last_wave is not None:
        back = wait_for(lambda: server.status("Threads") <= threads0 and server.fds() <= fds0, 120, 0.25)
        recovered = None if back is None else gone + back - last_wave
    probe.stop()
    outcomes = json.loads(lines[-1]) if lines and lines[-1].startswith("{") else {}
    during = [s for start, s, _ in probe.results if start < gone]
    return StormResult(outcomes, probe, during, threads0, fds0, peak_threads, recovered, server.tracebacks())


def storm_bench(transport: str, waves: int, per_wave: int, gap_s: float, hold_s: float) -> bool:
    with ServerProcess(transport) as server:
        result = run_storm(server, waves, per_wave, gap_s, hold_s)
    probe, threads0, recovered = result.probe, result.threads0, result.recovered
    ok_probe = not probe.failures() and probe.worst() <= PROBE_TARGET_S
    ok_threads = result.peak_threads <= threads0 + THREADS_SLACK
    ok_recovery = recovered is not None and recovered <= RECOVERY_TARGET_S
    during = result.during
    print(f"  storm: {waves} waves of {per_wave} connections {gap_s:g} s apart, held up to {hold_s:g} s "
          f"({sum(result.outcomes.values())} made: {result.outcomes})")
    print(f"    well-behaved client: {len(probe.results)} round trips, {len(probe.failures())} failed, slowest "
          f"{probe.worst():.2f} s, median during the storm {np.median(during) if during else 0:.3f} s "
          f"(target: all served, slowest <= {PROBE_TARGET_S:g} s: {'met' if ok_probe else 'NOT MET'})")
    for failure in sorted(set(probe.failures()))[:3]:
        print(f"      failed: {failure[:160]}")
    print(f"    server threads: {threads0} before, {result.peak_threads} at the peak (target <= "
          f"{threads0 + THREADS_SLACK}: {'met' if ok_threads else 'NOT MET'})")
    back = "not within 120 s of the storm's end" if recovered is None else f"{recovered:.1f} s"
    print(f"    threads and open descriptors back to {threads0} and {result.fds0}: {back} after the last wave began "
          f"(target <= {RECOVERY_TARGET_S:g} s, the storm's own sockets held up to {hold_s:g} s: "
          f"{'met' if ok_recovery else 'NOT MET'})")
    print(f"    tracebacks in the server log: {len(result.tracebacks)} (target 0: "
          f"{'met' if not result.tracebacks else 'NOT MET'})")
    return ok_probe and ok_threads and ok_recovery and not result.tracebacks


# ------------------------------------------------------------------------------------------------ memory


def client_run(port: int, procs: int, episodes: int, out: Path, transport: str = "websockets",
               env: str = "point-v1") -> dict[str, int]:
    """One ``plugrl-run-env-client`` run of ``procs`` processes of 16 envs; its counts."""
    exp = f"load-{time.monotonic_ns()}"
    cmd = [sys.executable, "-c", "from plugrl_env_client.cli import main; main()", env,
           "--num-envs", str(NUM_ENVS), "--num-procs", str(procs), "--num-episodes", str(episodes),
           "--server-port", str(port), "--no-progress", "--output-dir", str(out), "--exp-name", exp,
           "--transport", transport]
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"the client run failed (exit {done.returncode}): {done.stdout[-2000:]}")
    summary = json.loads((out / exp / "summary.json").read_text())
    lines = sum(len(p.read_text().splitlines()) for p in (out / exp / "rollout").glob("proc_*/episodes.jsonl"))
    return {"completed": int(summary["completed_episodes"]), "lines": lines}


def settle_rss(server: ServerProcess, seconds: float = 6.0) -> float:
    """The server's resident memory once it has been idle a little (its periodic log line has come, too)."""
    time.sleep(seconds)
    return server.rss_mb()


def memory_bench(transport: str, env: str, clients: int, warmup: int, runs: int) -> bool:
    ok = True
    with ServerProcess(transport, ACTION_DIMS[env]) as server, tempfile.TemporaryDirectory(prefix="plugrl-load-") as tmp:
        start_rss = server.rss_mb()
        counts = [client_run(server.port, clients, warmup, Path(tmp), transport, env)]
        after = [settle_rss(server)]
        for _ in range(runs):
            counts.append(client_run(server.port, clients, EPISODES_PER_RUN, Path(tmp), transport, env))
            after.append(settle_rss(server))
    counted = server.episodes  # the server's final line, logged as it stopped
    tracebacks = server.tracebacks()
    asked = [warmup] + [EPISODES_PER_RUN] * runs
    exact = all(c["completed"] == a and c["lines"] == a for c, a in zip(counts, asked))
    growth = [b - a for a, b in zip(after, after[1:])]
    grew_ok = all(g < MEMORY_TARGET_MB for g in growth)
    print(f"  memory: {clients} clients x {NUM_ENVS} envs ({env}), a warm-up run of {warmup} episodes, then "
          f"{runs} runs of {EPISODES_PER_RUN}")
    print(f"    server RSS {start_rss:.1f} MB at start, after each run: "
          + ", ".join(f"{r:.1f}" for r in after) + " MB")
    print(f"    growth per {EPISODES_PER_RUN} episodes after the warm-up: " + ", ".join(f"{g:+.1f}" for g in growth)
          + f" MB (target < {MEMORY_TARGET_MB:g} MB each: {'met' if grew_ok else 'NOT MET'})")
    print(f"    exact counts: every run recorded exactly what it asked for ({sum(asked)} episodes in all): "
          f"{'yes' if exact else 'NO: ' + str(counts)}; the server counted {counted} (>= {sum(asked)}: "
          f"{'met' if counted >= sum(asked) else 'NOT MET'})")
    if tracebacks:
        print(f"    tracebacks in the server log: {len(tracebacks)}")
    ok = grew_ok and exact and counted >= sum(asked) and not tracebacks
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="the scale CI runs")
    parser.add_argument("--only", choices=("storm", "memory"))
    parser.add_argument("--transport", choices=("websockets", "picows"), default="websockets")
    parser.add_argument("--waves", type=int, help="storm waves (default 3; --quick 1)")
    parser.add_argument("--per-wave", type=int, default=200)
    parser.add_argument("--gap", type=float, default=2.0, help="seconds between the starts of two waves")
    parser.add_argument("--hold", type=float, help="longest hold of a held storm socket, s (default 90; --quick 5)")
    parser.add_argument("--clients", type=int, help="client processes of 16 envs (default 32; --quick 8)")
    parser.add_argument("--env", choices=sorted(ACTION_DIMS), default="point-v1", help="the memory runs' env")
    parser.add_argument("--runs", type=int, help="runs of 12,000 episodes after the warm-up (default 3; --quick 1)")
    parser.add_argument("--storm-worker", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.storm_worker:
        port, waves, per_wave, gap, hold = args.storm_worker
        print(json.dumps(asyncio.run(storm(int(port), int(waves), int(per_wave), float(gap), float(hold)))))
        return
    started = time.monotonic()
    print(f"{machine_line('msgpack', 'websockets', 'picows')}; transport {args.transport}")
    ok = True
    if args.only in (None, "storm"):
        waves = args.waves or (1 if args.quick else 3)
        ok &= storm_bench(args.transport, waves, args.per_wave, args.gap, args.hold or (5.0 if args.quick else 90.0))
    if args.only in (None, "memory"):
        clients = args.clients or (8 if args.quick else 32)
        runs = args.runs or (1 if args.quick else 3)
        ok &= memory_bench(args.transport, args.env, clients, 2_000 if args.quick else 4_000, runs)
    print(f"{'all targets met' if ok else 'some targets NOT MET'}; {time.monotonic() - started:.0f} s; "
          f"load avg {load_avg()}")


if __name__ == "__main__":
    main()
