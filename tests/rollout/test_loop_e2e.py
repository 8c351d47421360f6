"""End-to-end rollouts over real loopback WebSockets against scripted servers.

The Probe-v1 env reveals what the client did: ``states["a"]`` is the last action applied and ``states["t"]`` the
step count, so a server that encodes (chunk, step, env, dim) into action values can check every transition.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from plugrl_env_client.app import run_client
from plugrl_env_client.config import ClientConfig, RunnerConfig
from plugrl_env_client.envs import discover_envs
from plugrl_env_client.protocol import messages

discover_envs()
from probe_protocol import D, check_probe_transcript, probe_script  # noqa: E402

from plugrl_env_client.envs.probe.probe_env import ProbeEnvConfig  # noqa: E402


def client_config(tmp_path: Path, port: int, num_envs: int, **kwargs: Any) -> ClientConfig:
    runner = kwargs.pop("runner", RunnerConfig())
    return ClientConfig(num_envs=num_envs, server_port=port, output_dir=tmp_path, exp_name="run", progress=False,
                        env=ProbeEnvConfig(action_dim=D), runner=runner, **kwargs)


def read_episodes(tmp_path: Path) -> list[dict[str, Any]]:
    lines = []
    for path in sorted((tmp_path / "run" / "rollout").glob("proc_*/episodes.jsonl")):
        lines += [json.loads(line) for line in path.read_text().splitlines()]
    return lines


@pytest.mark.parametrize("horizon,replan,num_envs", [(4, None, 6), (4, 2, 5), (1, None, 3), (8, 3, 4)])
def test_probe_transitions_are_exact(harness, tmp_path, horizon, replan, num_envs):
    h = harness(probe_script(horizon, stop_after_feedbacks=40))
    code = run_client(client_config(tmp_path, h.port, num_envs, runner=RunnerConfig(replan_steps=replan)), "Probe-v1")
    assert code == 0 and not h.errors
    (conn,) = h.connections
    finished = check_probe_transcript(conn.received, horizon, replan, num_envs)
    assert finished > 0
    episodes = read_episodes(tmp_path)
    assert len(episodes) == finished, "every episode the server saw finish is recorded once"
    for ep in episodes:
        expected = 3 + 2 * (ep["env_index"] % 3)
        assert ep["length"] == expected and ep["return"] == expected and ep["terminated"]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "stopped by server"
    assert summary["completed_episodes"] == finished
    assert summary["timing"]["feedback_calls"] == 40


def test_feedback_sets_differ_from_infer_sets(harness, tmp_path):
    h = harness(probe_script(4, stop_after_feedbacks=12))
    assert run_client(client_config(tmp_path, h.port, 6), "Probe-v1") == 0
    received = h.connections[0].received
    pairs = zip(received[::2], received[1::2])
    assert any(set(i["env_indices"].tolist()) != set(f["env_indices"].tolist()) for i, f in pairs)


@pytest.mark.parametrize("split", ["shared", "static"])
def test_num_episodes_stops_exactly_and_never_resets_after_last(harness, tmp_path, split):
    """5 episodes of 3 envs. Shared: whichever env finishes first takes the next episode. Static: each env runs its
    share (2, 2 and 1 episodes) and then retires, its last feedback ending the others' chunks (an infer must follow
    it)."""
    h = harness(probe_script(4, stop_after_feedbacks=None))
    code = run_client(client_config(tmp_path, h.port, 3, num_episodes=5, runner=RunnerConfig(episode_split=split)),
                      "Probe-v1")
    assert code == 0
    episodes = read_episodes(tmp_path)
    assert len(episodes) == 5
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["completed_episodes"] == 5
    assert check_probe_transcript(h.connections[0].received, 4, None, 3, retiring=split == "static") == 5
    if split == "static":
        assert sorted(ep["env_index"] for ep in episodes) == [0, 0, 1, 1, 2]


def test_resync_reconnects_without_stale_feedback(harness, tmp_path):
    counter = [0]
    good = probe_script(4, stop_after_feedbacks=15, counter=counter)

    def script(conn):
        if conn.index > 0:
            return good(conn)
        conn.send_metadata(action_horizon=4)
        for _ in range(3):  # three full exchanges, then a resync instead of an action
            msg = conn.recv()
            if msg["message_type"] == "infer":
                conn.send_zero_action(msg, 4, D)
            msg = conn.recv()
        conn.recv()
        conn.close(1001, messages.REASON_RESYNC)

    h = harness(script)
    assert run_client(client_config(tmp_path, h.port, 6), "Probe-v1") == 0
    assert len(h.connections) == 2 and not h.errors
    second = h.connections[1].received
    assert second[0]["message_type"] == "infer"
    assert second[0]["env_indices"].tolist() == list(range(6)), "after a reconnect every env asks for a fresh chunk"
    check_probe_transcript(second, 4, None, 6)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["timing"]["reconnects"] == 1


def test_text_frame_is_fatal_with_its_text(harness, tmp_path, capsys):
    def script(conn):
        conn.send_metadata()
        conn.recv()
        conn.ws.send("server exploded: CUDA out of memory")
        conn.ws.recv()

    h = harness(script)
    assert run_client(client_config(tmp_path, h.port, 2), "Probe-v1") == 1
    err = capsys.readouterr().err
    assert "text frame" in err and "CUDA out of memory" in err
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["failed_processes"] == [0]
    assert "Traceback" in (tmp_path / "run" / "logs" / "client.log").read_text()


def test_first_message_must_be_metadata(harness, tmp_path, capsys):
    h = harness(lambda conn: (conn.send(messages.ActionReply(np.arange(1), np.zeros((1, 1, D))).message()), conn.ws.recv()))
    assert run_client(client_config(tmp_path, h.port, 1), "Probe-v1") == 1
    assert "first message must be 'metadata'" in capsys.readouterr().err


@pytest.mark.parametrize("pipeline", [1, 2], ids=["lockstep", "pipelined"])
def test_no_thread_but_the_rollouts_reads_or_writes_the_sockets(harness, tmp_path, monkeypatch, pipeline):
    """During a run of short env steps every read and every write of the client's sockets happens on the thread
    that runs the rollout (here the main thread): no reader thread, and the keepalive's thread never takes over."""
    from plugrl_env_client.websocket import client as ws_client

    threads: dict[str, set[str]] = {"read": set(), "write": set()}
    read, write = ws_client.WebSocketClient._read, ws_client.WebSocketClient._write

    def reading(self: Any) -> Any:
        threads["read"].add(threading.current_thread().name)
        return read(self)

    def writing(self: Any, data: Any) -> None:
        threads["write"].add(threading.current_thread().name)
        write(self, data)

    monkeypatch.setattr(ws_client.WebSocketClient, "_read", reading)
    monkeypatch.setattr(ws_client.WebSocketClient, "_write", writing)
    h = harness(probe_script(4, stop_after_feedbacks=None))
    cfg = client_config(tmp_path, h.port, 4, num_episodes=40, runner=RunnerConfig(pipeline=pipeline))
    assert run_client(cfg, "Probe-v1") == 0 and not h.errors
    assert len(read_episodes(tmp_path)) == 40
    main = threading.main_thread().name
    assert threads == {"read": {main}, "write": {main}}
