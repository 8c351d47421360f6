"""Transport throughput: observation bytes per second through each WebSocket stack, next to a plain TCP socket.

Run from the repo root::

    python bench/transport.py            # full table, under two minutes on 2 cores
    python bench/transport.py --quick    # shorter cells, under a minute

Every cell is process to process over loopback: this process is the client, the peer is a subprocess started for
the cell. The frames are real PlugRL frames of Dummy-v1 observations (a feedback carrying ``n`` envs' images and
states: ~3 MB at n=16, ~48 MB at n=256), each answered by a small action frame (8 steps x 16 envs x 7 float32),
as a rollout with H=8 and reuse-feedback-obs sends one observation per env and chunk. Rows:

* ``tcp``: length-prefixed frames on a plain socket; the receiver reads each frame into a fresh bytearray.
* ``websockets, defaults``: websockets' threading client and server as the library ships them (64 KiB reads, no
  allocator setting), the bare baseline.
* ``sansio -> websockets``, ``sansio -> picows``: the client's one-thread WebSocket
  (:func:`plugrl_env_client.websocket.client.connect`) against :func:`plugrl_env_client.server.ws_server.serve`
  on either library (the server's handler a coroutine on its one event loop, as the reference server's are).
* ``stack``: a real :class:`~plugrl_env_client.protocol.session.Session` (encoder, connection, transport) against
  ``plugrl-run-policy-server``: each round is a feedback for all n envs, then an infer that reuses every row,
  answered by the random policy; the server decodes, validates and holds each row as in a run.
* ``client``: ``plugrl-run-env-client dummy-v1 --num-envs 16`` against ``plugrl-run-policy-server
  --policy.action-horizon 8`` (separate processes); the figure is ``timing.bytes_sent / timing.collect_time_s`` of
  its summary.json, so it includes stepping the env, the rollout's bookkeeping and the round trips.

Columns: ``GB/s`` (observation bytes sent per second; 1 GB = 1e9 bytes), ``x tcp`` (the ratio to the tcp row of
the same frame size, same run), ``cpu ms/MB`` of the client and the server process (all their threads; /proc on
Linux), the frame size and the rounds timed. The target, printed on the client rows: Dummy-v1 at n=16, H=8 moves
observations at >= 0.8 x what the bare link (``websockets, defaults``) moves in frames of the client's mean frame
size (measured right after each client row, in frames of that many envs' observations). Numbers depend on the machine and its load: compare
within one run only.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import re
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import websockets
from machine import load_avg

from plugrl_env_client.protocol import codec, messages

TARGET_RATIO = 0.8
CLIENT_FLAGS: tuple[tuple[str, ...], ...] = ((), ("--runner.pipeline", "2", "--runner.align-chunks", "7"))
"""The client rows: the defaults, and the settings that move the most bytes here (two pipelined groups whose
chunks end together, so each exchange carries the group's whole batch and overlaps the other group's stepping)."""
ACTION_HORIZON, ACTION_DIM = 8, 7
SIZES = (16, 256)  # envs per frame
HEADER = struct.Struct("!Q")


@dataclasses.dataclass(frozen=True)
class Durations:
    raw_s: float  # time of one raw cell
    stack_s: float  # time of one stack cell
    episodes: int  # episodes of one client run (Dummy-v1 episodes last ~100 steps)
    big_rounds: int  # cap on the rounds of a 48 MB cell


FULL = Durations(raw_s=2.0, stack_s=2.5, episodes=700, big_rounds=40)
QUICK = Durations(raw_s=0.6, stack_s=0.8, episodes=250, big_rounds=12)


# ------------------------------------------------------------------------------------------------ frames


def dummy_observation(n: int) -> Any:
    """Dummy-v1's first observation of ``n`` envs (images 224x224x3 and 112x112x3, two state vectors, text)."""
    from plugrl_env_client.envs import discover_envs
    from plugrl_env_client.envs.registry import make_env

    discover_envs()
    env = make_env("Dummy-v1", num_envs=n)
    try:
        obs, _ = env.reset(seed=0)
        return obs
    finally:
        env.close()


def feedback_frame(n: int) -> bytes:
    """A feedback frame carrying ``n`` envs' observations, as the client sends it at the end of a chunk."""
    obs = dummy_observation(n)
    ids = np.arange(n, dtype=np.int64)
    return codec.packb(messages.Feedback(ids, np.zeros(n, np.int64), messages.wire_observation(obs),
                                         np.zeros(n, np.float32), np.zeros(n, bool), np.zeros(n, bool), {}).message())


def action_frame(n: int = 16) -> bytes:
    ids = np.arange(n, dtype=np.int64)
    return codec.packb(messages.ActionReply(ids, np.zeros((ACTION_HORIZON, n, ACTION_DIM), np.float32)).message())


# ------------------------------------------------------------------------------------------------ peers (servers)


def serve(role: str) -> None:
    """The peer of a raw cell: answer every frame with one action frame, until killed."""
    reply = action_frame()
    if role == "tcp":
        listener = socket.create_server(("127.0.0.1", 0))
        print(f"ready {listener.getsockname()[1]}", flush=True)
        while True:
            conn, _ = listener.accept()
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            try:
                while True:
                    _recv_frame(conn)
                    conn.sendall(HEADER.pack(len(reply)) + reply)
            except (ConnectionError, EOFError):
                conn.close()
    if role == "websockets-defaults":
        from websockets.sync.server import serve as ws_serve

        def bare(ws: Any) -> None:
            for _ in ws:
                ws.send(reply)

        server = ws_serve(bare, "127.0.0.1", 0, compression=None, max_size=None)
        print(f"ready {server.socket.getsockname()[1]}", flush=True)
        server.serve_forever()
    from plugrl_env_client.server import ws_server
    from plugrl_env_client.websocket.common import WebSocketClosed

    async def handler(conn: ws_server.Connection) -> None:
        try:
            while True:
                await conn.recv()
                await conn.send(reply)
        except WebSocketClosed:
            pass

    tserver = ws_server.serve(handler, "127.0.0.1", 0, kind=role)
    print(f"ready {tserver.address[1]}", flush=True)
    tserver.serve_forever()


def _recv_exact(sock: socket.socket, n: int) -> bytearray:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            raise EOFError
        got += k
    return buf


def _recv_frame(sock: socket.socket) -> bytearray:
    (n,) = HEADER.unpack(_recv_exact(sock, HEADER.size))
    return _recv_exact(sock, n)


class Peer:
    """A subprocess serving one cell; ``port`` is read from the first line it prints that names one."""

    def __init__(self, cmd: list[str], pattern: str) -> None:
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        assert self.proc.stdout is not None
        deadline = time.monotonic() + 60
        for line in self.proc.stdout:
            match = re.search(pattern, line)
            if match:
                self.port = int(match.group(1))
                return
            if time.monotonic() > deadline:
                break
        self.stop()
        raise RuntimeError(f"the peer {cmd} did not start")

    def cpu_s(self) -> float:
        return _cpu_of(self.proc.pid)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


def raw_peer(role: str) -> Peer:
    return Peer([sys.executable, __file__, "--serve", role], r"^ready (\d+)")


def policy_server(kind: str) -> Peer:
    cmd = [sys.executable, "-c", "from plugrl_env_client.server.cli import main; main()", "--port", "0",
           "--policy.action-dim", str(ACTION_DIM), "--policy.action-horizon", str(ACTION_HORIZON),
           "--policy.seed", "0", "--transport", kind]
    return Peer(cmd, r"listening on ws://[^:]+:(\d+)")


def _cpu_of(pid: int) -> float:
    """CPU seconds (user + system, all threads) of a process; NaN where /proc is not there."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# ------------------------------------------------------------------------------------------------ cells


@dataclasses.dataclass
class Cell:
    label: str
    n: int
    frame_bytes: float  # mean bytes per observation frame
    rate: float  # bytes per second (raw and stack cells: of the best slice)
    sent_bytes: int  # over the whole cell
    rounds: int
    client_cpu_s: float
    server_cpu_s: float


SLICES = 5


def timed_rounds(label: str, n: int, round_trip: Callable[[], int], seconds: float, max_rounds: int | None,
                 peer: Peer) -> Cell:
    """Run ``round_trip`` (returns the bytes it sent) for ``seconds`` (or ``max_rounds``) after two warm-up rounds,
    in :data:`SLICES` slices; the rate is the best slice's, so a burst of load from other processes does not
    lower it. CPU is counted over the whole cell."""
    for _ in range(2):
        round_trip()
    sent, rounds, best = 0, 0, 0.0
    per_slice = None if max_rounds is None else max(1, max_rounds // SLICES)
    cpu0, peer0 = time.process_time(), peer.cpu_s()
    for _ in range(SLICES):
        slice_sent, slice_rounds = 0, 0
        start = time.perf_counter()
        while True:
            slice_sent += round_trip()
            slice_rounds += 1
            elapsed = time.perf_counter() - start
            if elapsed >= seconds / SLICES or (per_slice is not None and slice_rounds >= per_slice):
                break
        best = max(best, slice_sent / elapsed)
        sent, rounds = sent + slice_sent, rounds + slice_rounds
    return Cell(label, n, sent / rounds, best, sent, rounds, time.process_time() - cpu0, peer.cpu_s() - peer0)


def raw_cell(label: str, client: str, server: str, n: int, frame: bytes, durations: Durations) -> Cell:
    peer = raw_peer(server)
    try:
        send, recv, close = _raw_client(client, peer.port)
        try:
            def round_trip() -> int:
                send(frame)
                recv()
                return len(frame)

            return timed_rounds(label, n, round_trip, durations.raw_s, durations.big_rounds if n >= 256 else None,
                                peer)
        finally:
            close()
    finally:
        peer.stop()


def _raw_client(kind: str, port: int) -> tuple[Callable[[bytes], None], Callable[[], Any], Callable[[], None]]:
    if kind == "tcp":
        sock = socket.create_connection(("127.0.0.1", port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def send(data: bytes) -> None:
            sock.sendall(HEADER.pack(len(data)))
            sock.sendall(data)

        return send, lambda: _recv_frame(sock), sock.close
    if kind == "websockets-defaults":
        from websockets.sync.client import connect as ws_connect

        ws = ws_connect(f"ws://127.0.0.1:{port}", compression=None, max_size=None, ping_interval=None,
                        proxy=None).__enter__()
        return ws.send, ws.recv, ws.close
    from websockets.frames import Frame, Opcode

    from plugrl_env_client.websocket import client as ws_client

    conn = ws_client.connect(f"ws://127.0.0.1:{port}")  # the client of every PlugRL connection: one thread

    def send(data: bytes) -> None:  # already msgpack: framed by websockets (a session frames with its FramePacker)
        conn.send_frame(Frame(Opcode.BINARY, data).serialize(mask=True))

    return send, conn.recv, conn.close


def stack_cell(kind: str, n: int, durations: Durations) -> Cell:
    from plugrl_env_client.protocol.dialing import SessionConfig
    from plugrl_env_client.protocol.session import Session

    obs = dummy_observation(n)
    none = obs.select(np.zeros(n, bool))
    ids, steps = np.arange(n, dtype=np.int64), np.zeros(n, np.int64)
    zeros, falses = np.zeros(n, np.float32), np.zeros(n, bool)
    reuse_all = np.ones(n, bool)
    peer = policy_server(kind)
    try:
        session = Session(SessionConfig(url=f"ws://127.0.0.1:{peer.port}", connect_timeout=30))
        session.open()
        session.infer(messages.InferRequest(obs, ids, steps))  # the server now expects this chunk's feedback
        try:
            def round_trip() -> int:
                before = session.timing.bytes_sent
                session.feedback(messages.Feedback(ids, steps, obs, zeros, falses, falses, {}))
                session.infer(messages.InferRequest(none, ids, steps, reuse_all))
                return session.timing.bytes_sent - before

            return timed_rounds(f"stack ({kind})", n, round_trip, durations.stack_s,
                                durations.big_rounds if n >= 256 else None, peer)
        finally:
            session.close()
    finally:
        peer.stop()


def client_cell(kind: str, durations: Durations, flags: tuple[str, ...] = ()) -> tuple[Cell, dict[str, Any]]:
    """The full client against the reference server, both as separate processes; (cell, the summary's timing).

    CPU is that of the collection only: both processes' CPU is sampled every 10 ms and read at the end of the
    client's run and ``collect_time_s`` before it (the client's start, imports included, is left out).
    """
    peer = policy_server(kind)
    try:
        with tempfile.TemporaryDirectory(prefix="plugrl-bench-") as tmp:
            cmd = [sys.executable, "-m", "plugrl_env_client", "dummy-v1", "--num-envs", "16", "--num-episodes",
                   str(durations.episodes), "--server-port", str(peer.port), "--output-dir", tmp, "--exp-name", "run",
                   "--no-progress", "--runner.seed", "0", "--transport", kind, *flags]
            client = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            samples: list[tuple[float, float, float]] = []  # (time, client cpu, server cpu)
            while client.poll() is None:
                samples.append((time.perf_counter(), _cpu_of(client.pid), peer.cpu_s()))
                time.sleep(0.01)
            stderr = client.stderr.read() if client.stderr is not None else ""
            if client.returncode != 0:
                raise RuntimeError(f"the client failed ({client.returncode}): {stderr[-2000:]}")
            timing = json.loads((Path(tmp) / "run" / "summary.json").read_text())["timing"]
    finally:
        peer.stop()
    sent, seconds = timing["bytes_sent"], timing["collect_time_s"]
    samples = [s for s in samples if np.isfinite(s[1])]  # the last sample may miss the exiting process
    times = np.array([s[0] for s in samples])
    ccpu = scpu = float("nan")
    if len(samples) > 2:
        end = times[-1]
        ccpu = float(np.interp(end, times, [s[1] for s in samples]) -
                     np.interp(end - seconds, times, [s[1] for s in samples]))
        scpu = float(np.interp(end, times, [s[2] for s in samples]) -
                     np.interp(end - seconds, times, [s[2] for s in samples]))
    frames = timing["infer_calls"] + timing["feedback_calls"]
    short = " ".join(f.removeprefix("--runner.").replace("-chunks", "") for f in flags)  # "pipeline 2 align 7"
    label = f"client ({kind}{', ' + short if short else ''})"
    cell = Cell(label, 16, sent / max(frames, 1), sent / seconds if seconds > 0 else 0.0, sent, frames,
                ccpu, scpu)
    return cell, timing


def _where(timing: dict[str, Any]) -> str:
    """Where a client run's collect time went, from its summary (shares of collect_time_s)."""
    total = timing["collect_time_s"] or 1.0
    parts = {"env step": timing["env_step_s"], "reset": timing["reset_s"], "infer pack": timing["infer_obs_pack_s"],
             "infer wait": timing["infer_wait_s"], "feedback": timing["feedback_s"]}
    parts["rest"] = max(0.0, total - sum(parts.values()))
    shares = ", ".join(f"{k} {v / total:.0%}" for k, v in parts.items())
    return f"collect {total:.2f} s: {shares}; {timing['infer_calls']} infers"


# ------------------------------------------------------------------------------------------------ table

COLUMNS = ("frames", "path", "GB/s", "x tcp", "cpu ms/MB cl", "srv", "MB/frame", "frames")
WIDTHS = (8, 36, 7, 7, 12, 6, 9, 7)


def _line(values: list[str]) -> str:
    return "  ".join(v.rjust(w) if i not in (0, 1) else v.ljust(w) for i, (v, w) in enumerate(zip(values, WIDTHS)))


def _fmt(cell: Cell, tcp: Cell | None) -> str:
    mb = cell.sent_bytes / 1e6
    ratio = f"{cell.rate / tcp.rate:.2f}" if tcp is not None and tcp.rate > 0 else "n/a"
    return _line([f"n={cell.n}", cell.label, f"{cell.rate / 1e9:.3f}", ratio, _per_mb(cell.client_cpu_s, mb),
                  _per_mb(cell.server_cpu_s, mb), f"{cell.frame_bytes / 1e6:.2f}", str(cell.rounds)])


def _per_mb(cpu_s: float, mb: float) -> str:
    return "n/a" if not np.isfinite(cpu_s) or mb <= 0 else f"{cpu_s * 1e3 / mb:.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="shorter cells (under a minute)")
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve)
        return
    durations = QUICK if args.quick else FULL
    try:
        import picows

        picows_version = picows.__version__
    except ImportError:
        print("picows is not installed (pip install 'plugrl-env-client[fast]'): its rows are left out")
        picows_version = None
    print(f"# Python {platform.python_version()}, numpy {np.__version__}, msgpack {msgpack.version}, websockets "
          f"{websockets.__version__}, picows {picows_version or 'n/a'}; {os.cpu_count()} CPUs; load {load_avg()}",
          flush=True)
    started = time.perf_counter()
    print(_line(list(COLUMNS)))
    tcp: dict[int, Cell] = {}
    cells: list[Cell] = []
    kinds = ["websockets"] + (["picows"] if picows_version else [])
    for n in SIZES:
        frame = feedback_frame(n)
        # The library-default rows first: once this process opened a transport, its allocator setting applies here.
        paths = [("tcp", "tcp", "tcp"), ("websockets, defaults", "websockets-defaults", "websockets-defaults"),
                 ("sansio -> websockets", "sansio", "websockets")]
        if picows_version:
            paths += [("sansio -> picows", "sansio", "picows")]
        for label, client, server in paths:
            cell = raw_cell(label, client, server, n, frame, durations)
            tcp.setdefault(n, cell)
            cells.append(cell)
            print(_fmt(cell, tcp[n]), flush=True)
        for kind in kinds:
            cell = stack_cell(kind, n, durations)
            cells.append(cell)
            print(_fmt(cell, tcp[n]), flush=True)
    reference = tcp[16]
    per_env = len(feedback_frame(16)) / 16
    for kind, flags in [(kind, flags) for flags in CLIENT_FLAGS for kind in kinds]:
        cell, timing = client_cell(kind, durations, flags)
        cells.append(cell)
        # The bare link moving messages of the client's mean frame size (a whole number of envs' observations).
        envs = max(1, round(cell.frame_bytes / per_env))
        bare = raw_cell(f"websockets, defaults, n={envs}", "websockets-defaults", "websockets-defaults", envs,
                        feedback_frame(envs), durations)
        ratio = cell.rate / bare.rate if bare.rate > 0 else 0.0
        verdict = "met" if ratio >= TARGET_RATIO else "NOT met"
        print(f"{_fmt(cell, reference)}   {ratio:.2f} x bare websockets with frames of {envs} envs "
              f"({bare.rate / 1e9:.3f} GB/s); target >= {TARGET_RATIO}: {verdict}", flush=True)
        print(f"{'':8}  ({_where(timing)})", flush=True)
    print(f"# {time.perf_counter() - started:.0f} s; load {load_avg()}")


if __name__ == "__main__":
    main()
