"""A minimal PlugRL v1 env client (SPEC.md): the Python floor that ``pipeline.py`` sets the package's lockstep against.

openpi-client's style, nothing from the package: one msgpack encoder with the openpi ndarray convention (SPEC 3.1),
one send call, websockets' Sans-I/O protocol on a socket of its own (less CPU per round trip than the sync client's
reader thread), Gymnasium's vector env with autoreset disabled (an env never resets inside ``step``). Lockstep: an
infer for the envs whose chunk ran out (per-env chunks of ``horizon`` steps), a batch step, a feedback for the envs
whose chunk ended on it (steps used up, or episode over: terminal observation and ``info["episode"]``), then a partial
reset of the finished envs. ``python bench/minimal_client.py ws://127.0.0.1:8765 --num-envs 16 --seconds 4``
"""

from __future__ import annotations

import argparse
import collections
import socket
import time
from contextlib import closing
from typing import Any

import gymnasium as gym
import msgpack
import numpy as np
from websockets.client import ClientProtocol
from websockets.frames import Frame, Opcode
from websockets.protocol import State
from websockets.uri import parse_uri


def pack_array(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return {b"__ndarray__": True, b"data": obj.tobytes(), b"dtype": obj.dtype.str, b"shape": list(obj.shape)}
    raise TypeError(f"cannot pack {type(obj).__name__}")


def unpack_array(obj: dict) -> Any:
    if b"__ndarray__" in obj:
        return np.frombuffer(obj[b"data"], dtype=np.dtype(obj[b"dtype"])).reshape(obj[b"shape"])
    return obj


packb = msgpack.Packer(default=pack_array).pack  # use_bin_type: bytes are bin, str are str


class Connection:
    """One WebSocket connection: websockets' Sans-I/O protocol over a blocking socket; every wait is bounded."""

    def __init__(self, url: str) -> None:
        uri = parse_uri(url)
        self.sock = socket.create_connection((uri.host, uri.port), timeout=30.0)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.ws = ClientProtocol(uri, max_size=None)  # no extensions: no compression
        self.frames: collections.deque[bytes] = collections.deque()
        self.ws.send_request(self.ws.connect())
        while self.ws.state is State.CONNECTING and self.ws.handshake_exc is None:
            self.read()  # the 101 response (a first frame read with it is kept)
        if self.ws.handshake_exc is not None:
            raise ConnectionError(f"the handshake with {url} failed: {self.ws.handshake_exc}")

    def read(self) -> None:
        for data in self.ws.data_to_send():  # what to send first: the request, pongs, a close's answer
            self.sock.sendall(data)
        data = self.sock.recv(1 << 16)
        if not data:
            raise ConnectionError("the server dropped the connection")
        self.ws.receive_data(data)
        for event in self.ws.events_received():  # the handshake's response, then frames (pings: the protocol's)
            if isinstance(event, Frame) and event.opcode is Opcode.BINARY:
                self.frames.append(event.data)
            elif isinstance(event, Frame) and event.opcode in (Opcode.CLOSE, Opcode.TEXT):
                raise ConnectionError(f"the server sent {event.opcode.name}: {self.ws.close_rcvd}")

    def send(self, message: dict) -> None:
        self.ws.send_binary(packb(message))
        for data in self.ws.data_to_send():
            self.sock.sendall(data)

    def recv(self) -> dict:
        while not self.frames:
            self.read()
        return msgpack.unpackb(self.frames.popleft(), object_hook=unpack_array)

    def close(self) -> None:
        try:
            if self.ws.state is State.OPEN:
                self.ws.send_close(1000)
                self.sock.sendall(b"".join(self.ws.data_to_send()))
            while self.sock.recv(1 << 16):  # until the server closes the TCP connection (the timeout bounds it)
                pass
        finally:
            self.sock.close()


def run(url: str, num_envs: int = 16, horizon: int = 8, seconds: float = 4.0, task: str = "Hopper-v5") -> dict:
    """Step ``num_envs`` copies of ``task`` for ``seconds`` from the first step on, the actions from the server at
    ``url``: env-steps/s and CPU per batch step outside the env (process CPU minus the env's step and reset CPU, as
    pipeline.EnvMeter counts it), from the first batch step to the last."""
    n, rows = num_envs, np.arange(num_envs)
    vector_kwargs = {"autoreset_mode": gym.vector.AutoresetMode.DISABLED, "copy": False}  # obs is cast (a copy)
    with closing(gym.make_vec(task, n, "sync", vector_kwargs)) as env, closing(Connection(url)) as conn:
        if (metadata := conn.recv()).get("message_type") != "metadata":
            raise ConnectionError(f"the server's first message must be 'metadata', got {metadata!r:.200}")
        obs, text = np.asarray(env.reset(seed=0)[0], np.float32), np.full(n, "", "<U1")
        chunks = np.zeros((n, horizon, *env.single_action_space.shape), np.float32)
        left, used, step_ids, lengths = (np.zeros(n, np.int64) for _ in range(4))  # chunk steps left, taken
        chunk_rewards, returns = np.zeros(n), np.zeros(n)
        need, steps, episodes, env_cpu, start = np.ones(n, bool), 0, 0, 0.0, None
        while start is None or time.perf_counter() - start[0] < seconds:
            if need.any():
                ids = np.flatnonzero(need)
                conn.send({"message_type": "infer", "env_indices": ids, "step_ids": step_ids[ids],
                           "data": {"images": {}, "states": {"obs": obs[ids]}, "text": text[ids]}})
                action = conn.recv()["data"]["action"]  # [H, len(ids), *action shape], time-major
                chunks[ids, :action.shape[0]] = np.swapaxes(action[:horizon], 0, 1)
                left[ids], used[ids] = min(horizon, action.shape[0]), 0
            if start is None:
                start = (time.perf_counter(), time.process_time())
            inside = time.thread_time()
            raw_obs, reward, terminated, truncated, _ = env.step(chunks[rows, used])
            env_cpu += time.thread_time() - inside
            obs, steps, used, left = np.asarray(raw_obs, np.float32), steps + 1, used + 1, left - 1
            chunk_rewards, returns, lengths = chunk_rewards + reward, returns + reward, lengths + 1
            done = terminated | truncated
            need = done | (left == 0)
            if need.any():  # these chunks ended on this step: their feedback, before any reset or infer
                ids = np.flatnonzero(need)
                info = {"episode": {"r": returns[ids].astype(np.float32), "l": lengths[ids], "mask": done[ids]}}
                conn.send({"message_type": "feedback", "env_indices": ids, "step_ids": step_ids[ids],
                           "data": {"obs": {"images": {}, "states": {"obs": obs[ids]}, "text": text[ids]},
                                    "rewards": chunk_rewards[ids].astype(np.float32), "terminated": terminated[ids],
                                    "truncated": truncated[ids], "info": info if done.any() else {}}})
                chunk_rewards[need], step_ids[need] = 0.0, step_ids[need] + 1
            if done.any():  # after the feedback: the terminal observations went out first
                episodes += int(done.sum())
                inside = time.thread_time()
                obs = np.asarray(env.reset(options={"reset_mask": done})[0], np.float32)
                env_cpu += time.thread_time() - inside
                step_ids[done], lengths[done], returns[done] = 0, 0, 0.0
        wall, cpu = time.perf_counter() - start[0], time.process_time() - start[1]
    return {"env_steps_per_s": steps * n / wall, "cpu_per_batch_step_s": max(0.0, cpu - env_cpu) / steps,
            "env_cpu_per_batch_step_s": env_cpu / steps, "batch_steps": steps, "episodes": episodes}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("url")
    for flag, kind, default in (("--num-envs", int, 16), ("--horizon", int, 8), ("--seconds", float, 4.0)):
        parser.add_argument(flag, type=kind, default=default)
    print(run(**vars(parser.parse_args())))
