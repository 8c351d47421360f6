"""Fault injection over real loopback sockets: servers that die, resync, time out, pause, or send huge frames.

The reference server validates every client message strictly, so a completed run against it with no protocol
violation in its log shows that no stale feedback (for an action from an earlier connection) was ever sent.
"""

from __future__ import annotations

import json
import random
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from waiting import wait_until
from websockets.exceptions import ConnectionClosed

from plugrl_env_client.app import run_client
from plugrl_env_client.config import ClientConfig, ConnectionConfig, RunnerConfig
from plugrl_env_client.envs import discover_envs
from plugrl_env_client.protocol import messages

discover_envs()
from probe_protocol import check_probe_transcript, probe_script  # noqa: E402

from plugrl_env_client.envs.probe.probe_env import ProbeEnvConfig  # noqa: E402

D = 3


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def config(tmp_path: Path, port: int, **kwargs) -> ClientConfig:
    kwargs.setdefault("num_envs", 4)
    return ClientConfig(server_port=port, output_dir=tmp_path, exp_name="run", progress=False,
                        env=ProbeEnvConfig(action_dim=D), **kwargs)


def episodes(tmp_path: Path) -> list[dict]:
    path = tmp_path / "run" / "rollout" / "proc_000" / "episodes.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def start_server(port: int, log: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-c", "from plugrl_env_client.server.cli import main; main()", "--port", str(port),
           "--policy.action-dim", str(D), "--policy.action-horizon", "3"]
    proc = subprocess.Popen(cmd, stdout=log.open("a"), stderr=subprocess.STDOUT)
    wait_until(lambda: "listening" in log.read_text(), 30, f"server listening on port {port}", proc=proc)
    return proc


@pytest.mark.slow
def test_server_killed_and_restarted_mid_run(tmp_path):
    port, log = free_port(), tmp_path / "server.log"
    servers = [start_server(port, log)]

    def kill_and_restart():
        wait_until(lambda: len(episodes(tmp_path)) >= 10, 60, "10 episodes before the server is killed")
        servers[0].kill()
        servers[0].wait(timeout=10)
        time.sleep(0.5)  # the outage the client rides out: the server stays down a while before it comes back
        servers.append(start_server(port, log))

    chaos = threading.Thread(target=kill_and_restart, daemon=True)
    chaos.start()
    try:
        assert run_client(config(tmp_path, port, num_episodes=200), "Probe-v1") == 0
    finally:
        chaos.join(timeout=60)
        for s in servers:
            s.kill()
            s.wait(timeout=10)
    assert len(servers) == 2, "the server was restarted during the run"
    recorded = episodes(tmp_path)
    assert len(recorded) == 200, "every episode counted exactly once"
    assert all(e["length"] == 3 + 2 * (e["env_index"] % 3) == e["return"] for e in recorded)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["completed_episodes"] == 200 and summary["timing"]["reconnects"] >= 1
    assert "protocol violation" not in log.read_text()


@pytest.mark.slow
@pytest.mark.parametrize(
    "close",
    [(1001, messages.REASON_RESYNC), (1001, messages.REASON_FEEDBACK_TIMEOUT), (1001, messages.REASON_SHUTDOWN),
     (1011, messages.REASON_INTERNAL), None],
    ids=["resync", "feedback-timeout", "shutdown", "internal-error", "dropped"],
)
def test_random_closes_reconnect_and_every_transcript_stays_valid(harness, tmp_path, close):
    """The server closes at random points (instead of an action, right after one, after a feedback)."""
    rng = random.Random(7)
    counter = [0]
    inner = probe_script(4, stop_after_feedbacks=None, counter=counter)

    def script(conn):
        if conn.index >= 6:  # enough chaos: let the run finish
            return inner(conn)
        original_send, original_recv = conn.send, conn.recv

        def end():
            if close is None:
                conn.ws.socket.shutdown(socket.SHUT_RDWR)  # no close frame at all
            else:
                conn.close(*close)
            raise ConnectionAbortedError

        def send(msg):
            original_send(msg)
            if rng.random() < 0.15:
                end()

        def recv():
            msg = original_recv()
            if rng.random() < 0.1:
                end()
            return msg

        conn.send, conn.recv = send, recv
        try:
            inner(conn)
        except (ConnectionAbortedError, OSError):
            pass

    h = harness(script)
    assert run_client(config(tmp_path, h.port, num_envs=5, num_episodes=60), "Probe-v1") == 0
    assert len(h.connections) >= 2 and not h.errors
    for conn in h.connections:
        answered = [m for m in conn.received if m["message_type"] == "feedback" or "_call" in m]
        if answered:
            check_probe_transcript(answered, 4, None, 5, retiring=True)  # shares of 12: the static split
        if conn.index > 0 and conn.received:
            assert conn.received[0]["message_type"] == "infer"
            assert conn.received[0]["env_indices"].tolist() == list(range(5))
    assert len(episodes(tmp_path)) == 60


@pytest.mark.slow
def test_huge_metadata_and_slow_metadata(harness, tmp_path):
    def script(conn):
        time.sleep(1.5)  # a slow server: the client waits for metadata
        conn.send_metadata(action_horizon=2, blob="x" * (3 * 1024 * 1024))
        conn.answer_infers_with_zeros(2, D)

    h = harness(script)
    assert run_client(config(tmp_path, h.port, num_episodes=4), "Probe-v1") == 0
    assert len(episodes(tmp_path)) == 4


@pytest.mark.slow
def test_long_server_pause_keeps_a_healthy_connection(harness, tmp_path):
    """The server pings every 0.2 s and waits 2 s before answering: the client must answer pings meanwhile."""

    def script(conn):
        conn.send_metadata(action_horizon=8)
        first = True
        while True:
            msg = conn.recv()
            if msg["message_type"] == "infer":
                if first:
                    time.sleep(2.0)
                    first = False
                conn.send_zero_action(msg, 8, D)

    h = harness(script, ping_interval=0.2, ping_timeout=0.5)
    assert run_client(config(tmp_path, h.port, num_episodes=3), "Probe-v1") == 0
    assert len(h.connections) == 1, "no reconnect: the pause did not drop the connection"


def test_max_reconnects_gives_up_with_a_message(harness, tmp_path, capsys):
    def script(conn):
        conn.send_metadata()
        conn.recv()
        conn.close(1001, messages.REASON_RESYNC)

    h = harness(script)
    assert run_client(config(tmp_path, h.port, connection=ConnectionConfig(max_reconnects=2)), "Probe-v1") == 1
    assert "more than --max-reconnects=2 times" in capsys.readouterr().err
    assert len(h.connections) == 3


def test_reconnect_on_server_stop_waits_for_the_next_run(harness, tmp_path):
    inner = probe_script(4, stop_after_feedbacks=5)

    def script(conn):
        if conn.index == 0:
            return inner(conn)  # ends the first run with plugrl-server-stop
        return probe_script(4, stop_after_feedbacks=None)(conn)

    h = harness(script)
    cfg = config(tmp_path, h.port, num_episodes=20, connection=ConnectionConfig(reconnect_on_server_stop=True))
    assert run_client(cfg, "Probe-v1") == 0
    assert len(h.connections) == 2 and len(episodes(tmp_path)) == 20


def test_close_after_the_last_needed_episode_ends_the_run_without_reconnecting(harness, tmp_path):
    """The server answers, then shuts down for good: the client has all it needs and must not wait for it."""

    def script(conn):
        conn.send_metadata(action_horizon=8)
        conn.send_zero_action(conn.recv(), 8, D)
        conn.close(1001, messages.REASON_SHUTDOWN)

    h = harness(script)
    start = time.monotonic()
    assert run_client(config(tmp_path, h.port, num_envs=1, num_episodes=1), "Probe-v1") == 0
    assert time.monotonic() - start < 20 and len(h.connections) == 1
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["completed_episodes"] == 1


@pytest.mark.slow
def test_reconnect_timeout_gives_up_with_a_message(harness, tmp_path, capsys):
    def script(conn):
        conn.send_metadata()
        conn.recv()
        conn.close(1001, messages.REASON_SHUTDOWN)
        threading.Thread(target=h.shutdown, daemon=True).start()  # and the server stays down

    h = harness(script)
    assert run_client(config(tmp_path, h.port, connection=ConnectionConfig(reconnect_timeout=1.0)), "Probe-v1") == 1
    assert "--reconnect-timeout" in capsys.readouterr().err


@pytest.mark.slow
def test_a_server_that_never_sends_metadata_fails_within_the_connect_timeout(harness, tmp_path, capsys):
    h = harness(lambda conn: conn.ws.recv())  # the handshake completes; then nothing
    start = time.monotonic()
    cfg = config(tmp_path, h.port, num_episodes=2, connection=ConnectionConfig(connect_timeout=1.5))
    assert run_client(cfg, "Probe-v1") == 1
    assert time.monotonic() - start < 1.5 + 10, "the whole run, env building included"
    assert "sent no metadata within 1.5 s (--connect-timeout)" in capsys.readouterr().err


@pytest.mark.slow
def test_infer_timeout_reconnects_then_gives_up_naming_the_timeout(harness, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PLUGRL_WAIT_WARNING_S", "0.2")

    def script(conn):
        conn.send_metadata(action_horizon=3)
        conn.recv()  # an infer that never gets its reply
        conn.ws.recv()

    h = harness(script)
    cfg = config(tmp_path, h.port, num_episodes=2, connection=ConnectionConfig(infer_timeout=0.5, max_reconnects=1))
    assert run_client(cfg, "Probe-v1") == 1
    err = capsys.readouterr().err
    assert "within --infer-timeout 0.5 s more than --max-reconnects=1 times; giving up" in err
    assert len(h.connections) == 2
    assert [(c.ws.close_code, c.ws.close_reason) for c in h.connections] == [(1001, "Infer timeout")] * 2


@pytest.mark.slow
def test_infer_timeout_in_one_pipelined_group_reconnects_that_group_alone(harness, tmp_path):
    """Group 0's first connection never answers; group 1 steps on meanwhile (the loop polls, then waits on both
    connections); group 0 reconnects at its --infer-timeout, and its second connection ends the run."""
    counter = [0]
    serve_on = probe_script(4, stop_after_feedbacks=None, counter=counter)
    then_stop = probe_script(4, stop_after_feedbacks=8, counter=counter)

    def script(conn):
        if conn.index == 0:
            conn.send_metadata(action_horizon=4, action_dim=D)
            conn.recv()  # group 0's first infer: never answered
            conn.ws.recv()
        return (serve_on if conn.index == 1 else then_stop)(conn)

    h = harness(script)
    cfg = config(tmp_path, h.port, connection=ConnectionConfig(infer_timeout=0.5, max_reconnects=1),
                 runner=RunnerConfig(pipeline=2))
    start = time.monotonic()
    assert run_client(cfg, "Probe-v1") == 0 and not h.errors
    assert time.monotonic() - start >= 0.5
    assert len(h.connections) == 3
    assert (h.connections[0].ws.close_code, h.connections[0].ws.close_reason) == (1001, "Infer timeout")
    for conn in h.connections[1:]:
        assert check_probe_transcript(conn.received, 4, None, 2) > 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["timing"]["reconnects"] == 1 and summary["status"] == "stopped by server"


@pytest.mark.slow
@pytest.mark.parametrize("extra", ["second-reply", "reply-after-feedback"])
def test_a_reply_that_answers_no_infer_resyncs_instead_of_being_the_next_chunk(harness, tmp_path, extra):
    """The first connection answers an infer twice, or sends an action after a feedback; the client's envs reset
    slowly after their episodes end, so the stray reply is in before the next infer goes out. The client closes
    with the resync close, and every transcript after it is exact."""
    from conformance_envs import ACTION_DIM, TextOnlyConfig

    closes: list[tuple[int | None, str | None]] = []

    def script(conn):
        conn.send_metadata(action_horizon=4)
        while True:
            msg = conn.recv()
            if msg["message_type"] == "infer":
                conn.send_zero_action(msg, 4, ACTION_DIM)
                if conn.index == 0 and extra == "second-reply":
                    conn.send_zero_action(msg, 4, ACTION_DIM)
            elif conn.index == 0 and extra == "reply-after-feedback":
                conn.send(messages.ActionReply(msg["env_indices"], np.zeros((4, len(msg["env_indices"]),
                                                                                 ACTION_DIM))).message())
            if conn.index == 0 and msg["message_type"] == "feedback":
                try:
                    conn.recv()
                except ConnectionClosed:
                    closes.append((conn.ws.close_code, conn.ws.close_reason))
                    raise

    h = harness(script)
    cfg = ClientConfig(server_port=h.port, output_dir=tmp_path, exp_name="run", progress=False, num_envs=2,
                       num_episodes=4, env=TextOnlyConfig(slow_reset_s=0.3),
                       connection=ConnectionConfig(max_reconnects=1))
    assert run_client(cfg, "TextOnly-v1") == 0 and not h.errors
    assert closes == [(1001, messages.REASON_RESYNC)]
    assert len(h.connections) == 2
    first = [m["message_type"] for m in h.connections[0].received]
    assert first == ["infer", "feedback"], "no infer went out on the connection with a stray reply"
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["timing"]["reconnects"] == 1 and summary["completed_episodes"] == 4
