"""bench/link_proxy.py: the loopback link of limited bandwidth and delay that bench/link.py and these tests put
between the client and a server. Real sockets on 127.0.0.1; timing is asserted only as loose lower bounds (a loaded
machine is slower, never faster, than the link allows)."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest
from file_modules import bench_script
from waiting import wait_until

TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def link_proxy():
    with bench_script("link_proxy") as module:
        yield module


@contextlib.contextmanager
def upstream(handle) -> Iterator[int]:
    """A TCP server on a free port of 127.0.0.1 that runs ``handle(conn)`` for its one connection; yields the
    port and joins the handler (bounded) afterwards."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(TIMEOUT_S)
    errors: list[BaseException] = []

    def serve() -> None:
        try:
            conn, _ = listener.accept()
            with conn:
                conn.settimeout(TIMEOUT_S)
                handle(conn)
        except BaseException as exc:  # reported by the test, not lost in the thread
            errors.append(exc)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        thread.join(TIMEOUT_S)
        listener.close()
    assert not thread.is_alive(), "the upstream server did not end"
    assert not errors, errors


def receive_all(conn: socket.socket, into: bytearray) -> None:
    while chunk := conn.recv(1 << 16):
        into += chunk


def echo(conn: socket.socket) -> None:
    while chunk := conn.recv(1 << 16):
        conn.sendall(chunk)


def test_bytes_arrive_in_order_at_about_the_rate(link_proxy):
    """16 MB at 8 MB/s: every byte, in order, and no faster than the link (>= 1.8 s of the 2 s it takes)."""
    payload = np.random.default_rng(0).integers(0, 256, 16_000_000, dtype=np.uint8).tobytes()
    received = bytearray()
    with upstream(lambda conn: receive_all(conn, received)) as port, \
            link_proxy.LinkProxy(port, rate_mbytes=8, rtt_ms=0) as proxy:
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=TIMEOUT_S) as client:
            start = time.monotonic()
            client.sendall(payload)
            client.shutdown(socket.SHUT_WR)
            client.recv(1)  # the server's close, passed on once it has read everything
        elapsed = time.monotonic() - start
    assert bytes(received) == payload
    assert elapsed >= 1.8, f"16 MB crossed an 8 MB/s link in {elapsed:.2f} s"


def test_connections_at_once_share_the_rate(link_proxy):
    """Two connections sending 8 MB each at once through an 8 MB/s link: the link carries 16 MB, so together they
    take the 2 s one connection of 16 MB would (>= 1.8 s), not the 1 s of a link each."""
    payload = np.random.default_rng(1).integers(0, 256, 8_000_000, dtype=np.uint8).tobytes()
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(TIMEOUT_S)
    received = [bytearray(), bytearray()]

    def serve() -> None:
        conns = [listener.accept()[0] for _ in received]
        readers = [threading.Thread(target=receive_all, args=(conn, into)) for conn, into in zip(conns, received)]
        for conn, reader in zip(conns, readers):
            conn.settimeout(TIMEOUT_S)
            reader.start()
        for conn, reader in zip(conns, readers):
            reader.join(TIMEOUT_S)
            conn.close()

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    with link_proxy.LinkProxy(listener.getsockname()[1], rate_mbytes=8, rtt_ms=0) as proxy:
        clients = [socket.create_connection(("127.0.0.1", proxy.port), timeout=TIMEOUT_S) for _ in received]
        start = time.monotonic()
        senders = [threading.Thread(target=c.sendall, args=(payload,)) for c in clients]
        for sender in senders:
            sender.start()
        for client, sender in zip(clients, senders):
            sender.join(TIMEOUT_S)
            client.shutdown(socket.SHUT_WR)
        for client in clients:
            client.recv(1)  # the server's close, passed on once it has read everything
            client.close()
        elapsed = time.monotonic() - start
    server.join(TIMEOUT_S)
    listener.close()
    assert not server.is_alive()
    assert [bytes(r) == payload for r in received] == [True, True]
    assert elapsed >= 1.8, f"2 x 8 MB crossed an 8 MB/s link in {elapsed:.2f} s"


def test_a_round_trip_takes_at_least_the_rtt(link_proxy):
    """Each way adds half the round trip: an echoed message comes back no sooner than ``rtt_ms`` after it left,
    every time (the delay is per message, not once per connection)."""
    with upstream(echo) as port, link_proxy.LinkProxy(port, rate_mbytes=None, rtt_ms=200) as proxy:
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=TIMEOUT_S) as client:
            for i in range(3):
                start = time.monotonic()
                client.sendall(b"ping %d" % i)
                assert client.recv(100) == b"ping %d" % i
                assert time.monotonic() - start >= 0.19
            client.shutdown(socket.SHUT_WR)
            assert client.recv(1) == b""


def test_close_ends_every_thread_even_with_connections_open(link_proxy):
    with upstream(echo) as port:
        proxy = link_proxy.LinkProxy(port, rate_mbytes=1, rtt_ms=50)
        client = socket.create_connection(("127.0.0.1", proxy.port), timeout=TIMEOUT_S)
        wait_until(lambda: proxy.connections == 1, TIMEOUT_S, "the proxied connection")
        client.sendall(b"x" * 200_000)  # still in the link when the proxy closes
        proxy.close()
        assert proxy.threads_alive() == 0
        client.close()


def test_an_absent_upstream_closes_the_client_connection(link_proxy):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once closed
    with link_proxy.LinkProxy(port, rate_mbytes=10, rtt_ms=2) as proxy:
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=TIMEOUT_S) as client:
            assert client.recv(1) == b""


@pytest.mark.parametrize("rate,rtt", [(0, 2), (-1, 2), (10, -1), (float("nan"), 2)])
def test_bad_link_shapes_are_refused(link_proxy, rate, rtt):
    with pytest.raises(ValueError, match="must be"):
        link_proxy.LinkProxy(1, rate_mbytes=rate, rtt_ms=rtt)


@pytest.mark.slow
def test_a_client_run_through_the_link_against_the_reference_server(link_proxy, tmp_path):
    """The client, the link (25 MB/s, 2 ms) and the reference server, each as a user runs them: the run collects
    its episodes through the proxy and ends cleanly."""
    server = subprocess.Popen([sys.executable, "-c", "from plugrl_env_client.server.cli import main; main()",
                               "--port", "0", "--policy.action-dim", "7"],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = server.stdout.readline()
        assert "listening on ws://127.0.0.1:" in line, line
        port = int(line.rsplit(":", 1)[1].split()[0])
        with link_proxy.LinkProxy(port, rate_mbytes=25, rtt_ms=2) as proxy:
            done = subprocess.run([sys.executable, "-m", "plugrl_env_client", "Dummy-v1", "--num-envs", "4",
                                   "--num-episodes", "4", "--server-port", str(proxy.port), "--output-dir",
                                   str(tmp_path), "--exp-name", "linked", "--no-progress"],
                                  capture_output=True, text=True, timeout=TIMEOUT_S * 2)
            assert done.returncode == 0, done.stderr
            assert proxy.connections == 1
    finally:
        server.terminate()
        server.wait(timeout=TIMEOUT_S)
    summary = json.loads((tmp_path / "linked" / "summary.json").read_text())
    assert summary["completed_episodes"] == 4
