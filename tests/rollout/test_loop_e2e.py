"""End-to-end rollouts over real loopback WebSockets against scripted servers.

The Probe-v1 env reveals what the client did: ``states["a"]`` is the last action applied and ``states["t"]`` the
step count, so a server that encodes (chunk, step, env, dim) into action values can check every transition.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from plugrl_env_client.app import run_client
from plugrl_env_client.config import ClientConfig, RunnerConfig
from plugrl_env_client.envs import discover_envs
from plugrl_env_client.protocol import messages

discover_envs()
from plugrl_env_client.envs.probe.probe_env import ProbeEnvConfig  # noqa: E402

D = 3


def encode(call: int, t: np.ndarray, env: np.ndarray, dim: np.ndarray) -> np.ndarray:
    return call * 10000.0 + t * 100.0 + env * 10.0 + dim


def probe_script(horizon: int, stop_after_feedbacks: int | None, counter: list[int] | None = None):
    """A server that answers infers with encoded chunks and ends the run after some feedbacks."""
    counter = counter if counter is not None else [0]

    def script(conn: Any) -> None:
        conn.send_metadata(protocol_version=1, action_horizon=horizon, action_dim=D)
        feedbacks = 0
        while True:
            msg = conn.recv()
            if msg["message_type"] == "infer":
                ids = msg["env_indices"]
                t, e, d = np.arange(horizon)[:, None, None], ids[None, :, None], np.arange(D)[None, None, :]
                conn.send(messages.action_message(ids, encode(counter[0], t, e, d)))
                msg["_call"] = counter[0]
                counter[0] += 1
            else:
                feedbacks += 1
                if stop_after_feedbacks is not None and feedbacks >= stop_after_feedbacks:
                    conn.close(1001, messages.REASON_STOP)
                    return

    return script


def check_probe_transcript(received: list[dict[str, Any]], horizon: int, replan: int | None, num_envs: int) -> int:
    """Check one connection's messages against the probe's rules; returns the number of finished episodes."""
    kinds = [m["message_type"] for m in received]
    assert kinds[0] == "infer"
    assert all(a != b for a, b in zip(kinds, kinds[1:])), f"infer/feedback must alternate: {kinds}"
    lengths = 3 + 2 * (np.arange(num_envs) % 3)
    steps = horizon if replan is None else min(horizon, replan)
    chunk: dict[int, tuple[int, float, int]] = {}  # env -> (call, t at infer, step id)
    chunks_in_episode = {}
    done_episodes = 0
    for msg in received:
        if msg["message_type"] == "infer":
            ids = msg["env_indices"]
            assert ids.dtype == np.dtype("<i8") and list(ids) == sorted(ids)
            t_obs = msg["data"]["states"]["t"]
            assert t_obs.shape == (len(ids), 1)
            for row, env in enumerate(ids.tolist()):
                assert env not in chunk, f"env {env} asked for a chunk while holding one"
                chunk[env] = (msg["_call"], float(t_obs[row, 0]), int(msg["step_ids"][row]))
                if env in chunks_in_episode:
                    assert msg["step_ids"][row] == chunks_in_episode[env]
            continue
        ids = msg["env_indices"].tolist()
        data = msg["data"]
        assert set(data) == {"obs", "rewards", "terminated", "truncated", "info"}
        assert data["rewards"].dtype == np.float32
        assert not data["truncated"].any()
        for row, env in enumerate(ids):
            call, t0, step_id = chunk.pop(env)
            assert msg["step_ids"][row] == step_id
            k = int(data["rewards"][row])  # reward 1 per step: the chunk sum is the steps taken
            t1 = float(data["obs"]["states"]["t"][row, 0])
            assert t1 == t0 + k, "terminal/post-chunk observation must follow the chunk's steps"
            terminated = bool(data["terminated"][row])
            assert terminated == (t1 == lengths[env])
            assert k == (lengths[env] - t0 if terminated else steps)
            assert 1 <= k <= steps
            np.testing.assert_array_equal(data["obs"]["states"]["a"][row], encode(call, k - 1, env, np.arange(D)))
            chunks_in_episode[env] = 0 if terminated else chunks_in_episode.get(env, step_id) + 1
        if data["terminated"].any():
            episode = data["info"]["episode"]
            np.testing.assert_array_equal(episode["mask"], data["terminated"])
            done_rows = np.flatnonzero(data["terminated"])
            np.testing.assert_array_equal(episode["l"][done_rows], lengths[np.asarray(ids)[done_rows]])
            np.testing.assert_allclose(episode["r"][done_rows], lengths[np.asarray(ids)[done_rows]])
            assert episode["r"].dtype == np.float32 and episode["s"].dtype == bool
            done_episodes += len(done_rows)
        else:
            assert "episode" not in data["info"]
    return done_episodes


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


def test_num_episodes_stops_exactly_and_never_resets_after_last(harness, tmp_path):
    h = harness(probe_script(4, stop_after_feedbacks=None))
    code = run_client(client_config(tmp_path, h.port, 3, num_episodes=5), "Probe-v1")
    assert code == 0
    assert len(read_episodes(tmp_path)) == 5
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["completed_episodes"] == 5
    check_probe_transcript(h.connections[0].received, 4, None, 3)


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
                conn.send(messages.action_message(msg["env_indices"], np.zeros((4, len(msg["env_indices"]), D))))
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
    h = harness(lambda conn: (conn.send(messages.action_message(np.arange(1), np.zeros((1, 1, D)))), conn.ws.recv()))
    assert run_client(client_config(tmp_path, h.port, 1), "Probe-v1") == 1
    assert "first message must be 'metadata'" in capsys.readouterr().err
