"""The one-thread WebSocket client (``protocol/ws_client.py``) next to the other ways of being a client, on loopback.

Run from the repo root (Linux: it reads /proc)::

    python bench/ws_client.py            # 3-4 minutes on 2 cores
    python bench/ws_client.py --quick    # 1-1.5 minutes: one round, shorter cells

Every cell is a fresh client process talking to one server process (both started here; with two or more usable
CPUs the server is pinned to one and every client to another, ``os.sched_setaffinity``, so the client's figures are
its own). The server is ``server.ws_server.serve`` (picows when installed, else websockets) and answers every message
with one ~200 B action frame. Clients, each sending real PlugRL frames it encodes every round:

* ``websockets``: websockets' threading client (``websockets.sync.client.connect``: a reader thread), frames from
  ``codec.packb`` (msgpack), framed by websockets.
* ``picows 1-thread``: picows with its asyncio loop driven from the calling thread only
  (``loop.run_until_complete`` on each receive; no second thread): what picows would be without a bridge thread.
* ``sansio``: ``ws_client.WebSocketClient`` with ``FramePacker`` (arrays masked straight into the frame): the
  package's client.

Cells: (a) a ~1 KB infer and its ~200 B reply in lockstep, round trips per second; (b) 3 MB and 24 MB observation
frames (Dummy-v1-shaped images and states of 16 and 128 envs), MB/s and the peak resident memory above the
process's baseline (taken after the observation is built and the connection is open) in frames; (c) the client
process's CPU time (user + system, all its threads) per round trip. The kinds are run in turn (A B C ... A B C),
``--reps`` rounds, and each figure is the median over the rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import load_avg, machine_line, usable_cpus

from plugrl_env_client.protocol import codec, messages
from plugrl_env_client.protocol.frame_packer import FramePacker
from plugrl_env_client.server import ws_server
from plugrl_env_client.websocket import client as ws_client
from plugrl_env_client.websocket import common as ws_common

KINDS = ("websockets", "picows 1-thread", "sansio")
SIZES = {"small": 0, "3 MB": 16, "24 MB": 128}  # envs per observation frame (0: the small infer)
SECONDS = {"small": 1.5, "3 MB": 1.5, "24 MB": 2.0}
MAX_ROUNDS = {"small": 100_000, "3 MB": 5_000, "24 MB": 60}
_NO_PIN = "PLUGRL_BENCH_NO_PIN"  # set by --no-pin for the processes the bench starts


# ------------------------------------------------------------------------------------------------ frames


def small_infer() -> tuple[dict[str, Any], int]:
    """An infer of 4 envs with 24 float64 state values each (a proprioceptive policy): about 1 KB."""
    ids = np.arange(4, dtype=np.int64)
    obs = {"images": {}, "states": {"q": np.zeros((4, 24))}, "text": np.array(["", "", "", ""])}
    return messages.InferRequest(obs, ids, np.zeros(4, np.int64)).message(), 0


def observation_feedback(n: int) -> tuple[dict[str, Any], int]:
    """A feedback carrying Dummy-v1-shaped observations of ``n`` envs (as bench/transport.py's frames)."""
    rng = np.random.default_rng(0)
    images = {"base": rng.integers(0, 256, (n, 224, 224, 3), dtype=np.uint8),
              "wrist": rng.integers(0, 256, (n, 112, 112, 3), dtype=np.uint8)}
    states = {"robot_state": rng.standard_normal((n, 10)), "joint_angles": rng.standard_normal((n, 5))}
    obs = {"images": images, "states": states, "text": np.array(["pick up the red block"[:19]] * n)}
    ids = np.arange(n, dtype=np.int64)
    msg = messages.Feedback(ids, np.zeros(n, np.int64), obs, np.zeros(n, np.float32), np.zeros(n, bool),
                            np.zeros(n, bool), {}).message()
    return msg, sum(a.nbytes for a in images.values())


def reply_frame() -> bytes:
    """The server's answer to everything: an action chunk for 2 envs (horizon 4, 7 floats): about 200 B."""
    return codec.packb(messages.ActionReply(np.arange(2, dtype=np.int64), np.zeros((4, 2, 7), np.float32)).message())


# ------------------------------------------------------------------------------------------------ processes


def pin(index: int) -> None:
    """Pin this process to the index-th usable CPU when there are two or more (unless the bench runs --no-pin)."""
    if os.environ.get(_NO_PIN):
        return
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if len(cpus) >= 2:
        os.sched_setaffinity(0, {cpus[index % len(cpus)]})


def serve(kind: str) -> None:
    """The server process: answer every message with the reply frame until stdin closes (the bench ended or
    died)."""
    pin(1)
    reply = reply_frame()

    async def handler(conn: ws_server.Connection) -> None:
        try:
            while True:
                await conn.recv()
                await conn.send(reply)
        except ws_common.WebSocketClosed:
            pass

    server = ws_server.serve(handler, "127.0.0.1", 0, kind=kind)  # its loop runs in a thread of its own
    print(f"ready {server.address[1]}", flush=True)
    sys.stdin.read()
    server.shutdown()


class PicowsOneThread:
    """picows with its asyncio loop run only from this thread: a receive runs the loop until a message is there
    (``run_until_complete``); a send writes what the socket takes at once and leaves the rest in the loop's
    buffer, written on the next receive. Nothing answers pings between calls (the same need for a keepalive as
    the package's one-thread client has)."""

    def __init__(self, url: str) -> None:
        import picows

        self._binary = picows.WSMsgType.BINARY
        self.loop = asyncio.new_event_loop()
        self.messages: collections.deque[bytes] = collections.deque()
        self.waiter: asyncio.Future[None] | None = None
        owner = self

        class Listener(picows.WSListener):  # type: ignore[misc]
            def on_ws_frame(self, transport: Any, frame: Any) -> None:
                if frame.msg_type == picows.WSMsgType.BINARY:
                    owner.messages.append(frame.get_payload_as_bytes())
                    if owner.waiter is not None and not owner.waiter.done():
                        owner.waiter.set_result(None)
                elif frame.msg_type == picows.WSMsgType.CLOSE:
                    transport.disconnect()

            def on_ws_disconnected(self, transport: Any) -> None:
                if owner.waiter is not None and not owner.waiter.done():
                    owner.waiter.set_exception(ConnectionError("disconnected"))

        self.transport, _ = self.loop.run_until_complete(picows.ws_connect(
            Listener, url, enable_auto_pong=True, max_frame_size=1 << 62))

    def send(self, data: Any) -> None:
        self.transport.send(self._binary, data)

    def recv(self) -> bytes:
        while not self.messages:
            self.waiter = self.loop.create_future()
            self.loop.run_until_complete(self.waiter)
        return self.messages.popleft()

    def close(self) -> None:
        self.transport.send_close()
        self.transport.disconnect()
        self.loop.run_until_complete(asyncio.sleep(0))
        self.loop.close()


def picows_keepalive_probe() -> str:
    """Can a second thread answer pings for a one-thread picows connection while its owner is in a long call (by
    running the connection's loop, as a keepalive would)? picows binds each transport to the thread that opened it,
    so the answer is what happens when it tries."""
    import logging
    import threading

    from websockets.sync.server import serve as ws_serve

    answered: list[bool] = []

    def handler(ws: Any) -> None:
        ws.recv()
        answered.append(ws.ping().wait(3))

    server = ws_serve(handler, "127.0.0.1", 0, compression=None, max_size=None, ping_interval=None)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    failures: list[str] = []

    class Catch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.exc_info and record.exc_info[1] is not None:
                failures.append(str(record.exc_info[1]))
            else:
                failures.append(record.getMessage())

    catch = Catch(logging.WARNING)
    logging.getLogger("picows").addHandler(catch)
    logging.getLogger("picows").propagate = False
    try:
        driver = PicowsOneThread(f"ws://127.0.0.1:{server.socket.getsockname()[1]}")
        driver.loop.set_exception_handler(lambda loop, context: failures.append(str(context.get("exception"))))
        driver.send(b"go")
        keepalive = threading.Thread(target=driver.loop.run_until_complete, args=(asyncio.sleep(3.5),))
        keepalive.start()
        keepalive.join()
        driver.loop.close()
    finally:
        server.shutdown()
        logging.getLogger("picows").removeHandler(catch)
    if answered == [True]:
        return "a second thread running its loop answers the pings"
    why = next((f for f in failures if "wrong thread" in f), failures[0] if failures else "no pong")
    return f"a second thread running its loop cannot answer pings: {why.splitlines()[0]}"


def status(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def runqueue_wait_s() -> float:
    """Seconds this process's threads spent runnable but waiting for a CPU (/proc schedstat): on a shared core,
    the share of a round trip that is other processes' doing, not the client's."""
    total = 0
    for path in Path("/proc/self/task").glob("*/schedstat"):
        try:
            total += int(path.read_text().split()[1])
        except (OSError, IndexError, ValueError):  # a thread that just ended
            pass
    return total / 1e9


def client_cell(kind: str, size: str, port: int, seconds: float, max_rounds: int) -> dict[str, Any]:
    """One cell in this (fresh) process: connect, then round trips for ``seconds``; the figures as a dict."""
    pin(0)
    ws_common.retain_freed_memory()  # what every transport's connect does: the same allocator for every kind
    n = SIZES[size]
    msg, hint = small_infer() if n == 0 else observation_feedback(n)
    url = f"ws://127.0.0.1:{port}"
    packer = FramePacker()
    close: Any
    if kind == "sansio":
        client = ws_client.connect(url)

        def round_trip() -> None:
            client.send_frame(packer.pack(msg, hint))
            codec.unpackb(client.recv())  # type: ignore[arg-type]

        close = client.close
    elif kind == "picows 1-thread":
        driver = PicowsOneThread(url)

        def round_trip() -> None:
            driver.send(codec.packb(msg))
            codec.unpackb(driver.recv())

        close = driver.close
    else:
        from websockets.sync.client import connect as threading_connect

        conn = threading_connect(url, compression=None, max_size=None, ping_interval=None)

        def round_trip() -> None:
            conn.send(codec.packb(msg))
            codec.unpackb(conn.recv())

        close = conn.close
    Path("/proc/self/clear_refs").write_text("5")  # the peak starts again from here: frames only from now on
    baseline = status("VmRSS")
    for _ in range(2):
        round_trip()
    rounds, times = 0, []
    cpu0, wait0, start = time.process_time(), runqueue_wait_s(), time.perf_counter()
    at = start
    while True:
        round_trip()
        rounds += 1
        now = time.perf_counter()
        times.append(now - at)
        at = now
        elapsed = now - start
        if elapsed >= seconds or rounds >= max_rounds:
            break
    cpu, waited = time.process_time() - cpu0, runqueue_wait_s() - wait0
    peak = status("VmHWM") - baseline
    close()
    frame_bytes = len(codec.packb(msg))  # after the peak is read: this frame's memory is not the client's
    return {"kind": kind, "size": size, "frame_bytes": frame_bytes, "rounds": rounds, "rt_per_s": rounds / elapsed,
            "mb_per_s": rounds * frame_bytes / elapsed / 1e6, "cpu_us_per_rt": cpu / rounds * 1e6,
            "runq_us_per_rt": waited / rounds * 1e6, "p50_us": float(np.percentile(times, 50)) * 1e6, "p90_us": float(np.percentile(times, 90)) * 1e6,
            "peak_mb": peak / 1e6, "peak_frames": peak / frame_bytes}


# ------------------------------------------------------------------------------------------------ the table


def run_cell(kind: str, size: str, port: int, quick: bool) -> dict[str, Any]:
    seconds = SECONDS[size] / (3 if quick else 1)
    cmd = [sys.executable, __file__, "--client", kind, "--size", size, "--port", str(port), "--seconds", str(seconds)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise RuntimeError(f"the {kind} client failed on {size}: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def median(values: list[float]) -> float:
    return float(np.median(values))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="one round of shorter cells")
    parser.add_argument("--reps", type=int, default=None, help="rounds of every cell (default 3; --quick: 1)")
    parser.add_argument("--no-pin", action="store_true", help="leave client and server unpinned")
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--client", help=argparse.SUPPRESS)
    parser.add_argument("--size", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--seconds", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve)
        return
    if args.client:
        print(json.dumps(client_cell(args.client, args.size, args.port, args.seconds, MAX_ROUNDS[args.size])))
        return
    reps = args.reps if args.reps is not None else (1 if args.quick else 3)
    if args.no_pin:
        os.environ[_NO_PIN] = "1"
    try:
        import picows  # noqa: F401

        kinds, server_kind = KINDS, "picows"
    except ImportError:
        print("picows is not installed (pip install 'plugrl-env-client[fast]'): its rows are left out")
        kinds, server_kind = tuple(k for k in KINDS if "picows" not in k), "websockets"
    print("# " + machine_line("websockets", "picows", "msgpack"), flush=True)
    pinned = ("server pinned to one CPU, each client to another" if usable_cpus() >= 2 and not args.no_pin
              else "nothing pinned")
    print(f"# server: server.ws_server.serve(kind={server_kind!r}); {pinned}; {reps} round(s) of every cell in turn, "
          "medians", flush=True)
    started = time.perf_counter()
    server = subprocess.Popen([sys.executable, __file__, "--serve", server_kind], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline().split()[1])
        results: dict[tuple[str, str], list[dict[str, Any]]] = collections.defaultdict(list)
        for _ in range(reps):
            for size in SIZES:
                for kind in kinds:
                    results[(size, kind)].append(run_cell(kind, size, port, args.quick))
    finally:
        server.communicate("", timeout=30)
    header = (f"{'frame':>10}  {'client':<17} {'rt/s':>7} {'MB/s':>7} {'p50 us':>8} {'p90 us':>8} {'cpu us/rt':>9} "
              f"{'runq us/rt':>10} {'peak MB':>7} {'frames':>7}   {'rt/s x ws':>9} {'p50 x ws':>8} {'cpu x ws':>8}")
    print(header)
    for size in SIZES:
        reference = results[(size, "websockets")]
        ref_rt = median([r["rt_per_s"] for r in reference])
        ref_cpu = median([r["cpu_us_per_rt"] for r in reference])
        ref_p50 = median([r["p50_us"] for r in reference])
        for kind in kinds:
            cells = results[(size, kind)]
            rt, mb = median([c["rt_per_s"] for c in cells]), median([c["mb_per_s"] for c in cells])
            cpu = median([c["cpu_us_per_rt"] for c in cells])
            p50, p90 = median([c["p50_us"] for c in cells]), median([c["p90_us"] for c in cells])
            runq = median([c["runq_us_per_rt"] for c in cells])
            peak_mb, peak_frames = median([c["peak_mb"] for c in cells]), median([c["peak_frames"] for c in cells])
            size_b = cells[0]["frame_bytes"]
            frame = f"{size_b} B" if size == "small" else f"{size_b / 1e6:.2f} MB"
            print(f"{frame:>10}  {kind:<17} {rt:>7.0f} {mb:>7.1f} {p50:>8.0f} {p90:>8.0f} {cpu:>9.1f} {runq:>10.1f} "
                  f"{peak_mb:>7.1f} {peak_frames:>7.2f}   {rt / ref_rt:>9.2f} {p50 / ref_p50:>8.2f} {cpu / ref_cpu:>8.2f}",
                  flush=True)
    if server_kind == "picows":
        print(f"picows 1-thread, keepalive: {picows_keepalive_probe()}")
    print(f"# {time.perf_counter() - started:.0f} s; load avg {load_avg()}")


if __name__ == "__main__":
    main()
