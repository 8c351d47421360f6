"""A slow log sink never stops the server: its lines go through a bounded queue that drops and counts what does not
fit, and a storm of connections against a server whose stderr nobody reads leaves it serving."""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator

import numpy as np
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from plugrl_env_client.protocol import codec, messages
from plugrl_env_client.server.log_sink import ServerLog

SERVER = [sys.executable, "-c", "from plugrl_env_client.server.cli import main; main()"]


@pytest.fixture(autouse=True)
def _only_the_sink_under_test() -> Iterator[None]:
    """The flood goes to the ServerLog under test alone: handlers earlier tests left on the root logger (with
    streams pytest has closed since) are taken off for the test and put back after it."""
    root = logging.getLogger()
    others = list(root.handlers)
    for handler in others:
        root.removeHandler(handler)
    try:
        yield
    finally:
        for handler in others:
            root.addHandler(handler)


def _log_many(count: int, timeout: float = 30.0) -> None:
    """``count`` warnings from a thread; fails unless every call returned within ``timeout`` seconds."""
    log = logging.getLogger("plugrl_env_client.tests.flood")

    def flood() -> None:
        for i in range(count):
            log.warning("line %d %s", i, "x" * 200)

    thread = threading.Thread(target=flood, daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), "logging blocked on a sink that is not read"


def _full_pipe() -> tuple[int, int]:
    """A pipe already full: the next write to it blocks until its reader reads."""
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    try:
        while True:
            os.write(write_fd, b"fill\n" * 1024)
    except BlockingIOError:
        pass
    os.set_blocking(write_fd, True)
    return read_fd, write_fd


def test_a_sink_nobody_reads_drops_and_counts_and_says_so_once_read_again():
    read_fd, write_fd = _full_pipe()
    sink = os.fdopen(write_fd, "w")
    server_log = ServerLog(stream=sink, capacity=50).start()
    try:
        _log_many(2000)  # the sink takes none of them until it is read
        assert server_log.handler.dropped > 0
        chunks: list[bytes] = []
        reader = threading.Thread(target=lambda: chunks.extend(iter(lambda: os.read(read_fd, 1 << 16), b"")),
                                  daemon=True)
        reader.start()
        assert server_log.stop(timeout=30)
    finally:
        server_log.stop(timeout=0.1)
        sink.close()
    reader.join(30)
    os.close(read_fd)
    text = b"".join(chunks).decode()
    lines = text.splitlines()
    dropped = [int(n) for n in re.findall(r"WARNING plugrl_env_client.server.log_sink: (\d+) log lines were dropped",
                                          text)]
    assert dropped and sum(dropped) == server_log.handler.dropped
    written = sum(" line " in line for line in lines)
    assert written + sum(dropped) == 2000  # every line is either written or counted
    assert "log lines were dropped" in lines[-1]  # the last drops are reported when the log stops


def test_stopping_is_bounded_when_the_sink_never_drains():
    read_fd, write_fd = _full_pipe()
    sink = os.fdopen(write_fd, "w")
    server_log = ServerLog(stream=sink, capacity=10).start()
    try:
        _log_many(1000)
        assert server_log.stop(timeout=0.5) is False
        assert logging.getLogger().handlers.count(server_log.handler) == 0
    finally:
        os.close(read_fd)  # the blocked write fails now, and the listener's thread ends
        try:
            sink.close()
        except OSError:  # its last buffered bytes had nowhere to go
            pass


def test_a_storm_of_connections_with_stderr_never_read_leaves_the_server_serving():
    """The server's stderr is a pipe this test never reads (until the end): 450 connections that each break the
    protocol (one warning line each, ~190 bytes, besides the connection lines the server used to write) would fill
    a 64 KiB pipe several times over; the server still answers a full exchange afterwards, and when stderr is read
    again it ends on SIGINT by itself, having said how many lines it dropped if any."""
    proc = subprocess.Popen([*SERVER, "--port", "0", "--policy.action-dim", "2"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        line = proc.stdout.readline().decode()
        port = int(re.search(r"listening on ws://127\.0\.0\.1:(\d+)", line).group(1))
        url = f"ws://127.0.0.1:{port}"
        for _ in range(450):
            with connect(url, compression=None, proxy=None, open_timeout=10) as ws:
                ws.recv(timeout=10)  # metadata
                ws.send("not msgpack")
                try:
                    ws.recv(timeout=10)
                except ConnectionClosed as exc:
                    assert exc.rcvd is not None and exc.rcvd.reason == messages.REASON_RESYNC
        with connect(url, compression=None, proxy=None, open_timeout=10) as ws:
            meta = messages.parse_metadata(codec.unpackb(ws.recv(timeout=10)))
            ids = np.arange(3, dtype=np.int64)
            obs = {"images": {}, "states": {"x": np.zeros((3, 1))}, "text": np.array(["a"] * 3)}
            ws.send(codec.packb(messages.InferRequest(obs, ids, np.zeros(3, np.int64)).message()))
            reply = messages.parse_action(codec.unpackb(ws.recv(timeout=10)), ids)
            assert reply.actions.shape == (meta.action_horizon, 3, 2)
            ws.send(codec.packb(messages.Feedback(
                ids, np.zeros(3, np.int64), obs, np.ones(3, np.float32), np.zeros(3, bool), np.ones(3, bool), {}
            ).message()))
            ws.send(codec.packb(messages.InferRequest(obs, ids, np.ones(3, np.int64)).message()))
            assert messages.parse_action(codec.unpackb(ws.recv(timeout=10)), ids).actions.shape == reply.actions.shape
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-2000:]
    text = err.decode()
    assert text.count("protocol violation by") + sum(
        int(n) for n in re.findall(r"(\d+) log lines were dropped", text)) == 450
    assert "client connected" not in text
    assert re.search(r"stopped: episodes=0 .* connections_open=0 connections_total=451", text)
