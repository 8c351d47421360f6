"""Conformance tests for the SPEC.md §8 clauses that no other test pins, each run against a scripted server.

Each test is named after its clause (``test_c<k>_...``). Clients run with ``max_reconnects`` set, so a client
that breaks a clause ends with an error instead of reconnecting forever.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from websockets.exceptions import ConnectionClosed

from plugrl_env_client.app import run_client
from plugrl_env_client.config import ClientConfig, ConnectionConfig, RunnerConfig
from plugrl_env_client.envs import discover_envs
from plugrl_env_client.envs.base_env import BaseEnvConfig
from plugrl_env_client.protocol import messages

discover_envs()
from conformance_envs import ACTION_DIM, TextOnlyConfig  # noqa: E402
from probe_protocol import D, check_probe_transcript, probe_script  # noqa: E402

from plugrl_env_client.envs.probe.probe_env import ProbeEnvConfig  # noqa: E402


def config(tmp_path: Path, port: int, env: BaseEnvConfig | None = None, **kwargs: Any) -> ClientConfig:
    kwargs.setdefault("num_envs", 3)
    kwargs.setdefault("connection", ConnectionConfig(max_reconnects=0))
    return ClientConfig(server_port=port, output_dir=tmp_path, exp_name="run", progress=False,
                        env=env if env is not None else ProbeEnvConfig(action_dim=D), **kwargs)


def summary(tmp_path: Path) -> dict[str, Any]:
    return json.loads((tmp_path / "run" / "summary.json").read_text())


def zeros_script(horizon: int, dim: int, **metadata: Any):
    """A server that answers every infer with a chunk of zeros and never ends the run itself."""

    def script(conn) -> None:
        conn.send_metadata(action_horizon=horizon, **metadata)
        while True:
            msg = conn.recv()
            if msg["message_type"] == "infer":
                n = len(msg["env_indices"])
                conn.send(messages.ActionReply(msg["env_indices"], np.zeros((horizon, n, dim), np.float32)).message())

    return script


def observations(received: list[dict[str, Any]]):
    """(message, env indices, observation map) of every infer and feedback."""
    for msg in received:
        obs = msg["data"] if msg["message_type"] == "infer" else msg["data"]["obs"]
        yield msg, msg["env_indices"].tolist(), obs


# --------------------------------------------------------------------------------------------------- transport


def test_c1_handshake_offers_no_compression_and_frames_have_no_size_limit(harness, tmp_path):
    seen = {}
    inner = probe_script(4, stop_after_feedbacks=None)

    def script(conn):
        seen["headers"] = conn.ws.request.headers
        send_metadata = conn.send_metadata
        # 2 MiB: over the websockets default max_size (1 MiB) a client would get without max_size=None
        conn.send_metadata = lambda **data: send_metadata(blob="x" * (2 * 2**20), **data)
        inner(conn)

    h = harness(script)
    assert run_client(config(tmp_path, h.port, num_episodes=3), "Probe-v1") == 0
    assert len(h.connections) == 1 and not h.errors
    headers = seen["headers"]
    assert "Sec-WebSocket-Extensions" not in headers, f"the client offered extensions: {headers}"
    assert "deflate" not in str(headers).lower()


@pytest.mark.slow
@pytest.mark.parametrize("slow", ["step", "reset"])
@pytest.mark.parametrize("pipeline", [1, 2], ids=["lockstep", "pipelined"])
def test_c2_answers_pings_while_its_envs_step(harness, tmp_path, slow, pipeline):
    """An env call blocks the client's main thread for 1.5 s (the first step, or every partial reset); the server
    pings every 0.1 s and drops the connection when a pong is 0.5 s late. One connection per env group for the whole
    run shows every ping was answered, also those of a group whose env was not the one in the call."""
    h = harness(zeros_script(4, ACTION_DIM), ping_interval=0.1, ping_timeout=0.5)
    env = TextOnlyConfig(slow_first_step_s=1.5) if slow == "step" else TextOnlyConfig(slow_reset_s=1.5)
    start = time.monotonic()
    cfg = config(tmp_path, h.port, env, num_envs=2 * pipeline, num_episodes=3 * pipeline,
                 runner=RunnerConfig(pipeline=pipeline))
    assert run_client(cfg, "TextOnly-v1") == 0
    assert time.monotonic() - start >= 1.5
    assert len(h.connections) == pipeline and not h.errors, "a missed pong would have dropped the connection"
    assert all(conn.ws.latency > 0 for conn in h.connections), "the server's pings were answered"


@pytest.mark.slow
def test_c2_answers_pings_during_a_run_of_short_steps_without_a_message(harness, tmp_path):
    """Steps of 20 ms through chunks of 100 steps: 2 s at a time in which the client has nothing to send or
    receive, and no single call is long. The sockets are read between the env calls, so pongs are at most about a
    quarter second late, against the server's 0.5 s."""
    h = harness(zeros_script(100, ACTION_DIM), ping_interval=0.1, ping_timeout=0.5)
    env = TextOnlyConfig(step_s=0.02, episode_length=100)
    assert run_client(config(tmp_path, h.port, env, num_envs=1, num_episodes=2), "TextOnly-v1") == 0
    assert len(h.connections) == 1 and not h.errors, "a missed pong would have dropped the connection"
    infers = [m for m in h.connections[0].received if m["message_type"] == "infer"]
    assert len(infers) == 2, "one infer per 100-step episode: long stretches without a message"


def test_c4_sends_only_binary_frames_one_message_each(harness, tmp_path):
    kinds: list[type] = []
    inner = probe_script(4, stop_after_feedbacks=None)

    def script(conn):
        recv = conn.ws.recv

        def recording_recv(*args, **kwargs):
            frame = recv(*args, **kwargs)
            kinds.append(type(frame))
            return frame

        conn.ws.recv = recording_recv
        inner(conn)

    h = harness(script)
    assert run_client(config(tmp_path, h.port, num_episodes=6), "Probe-v1") == 0
    assert len(h.connections) == 1 and not h.errors
    assert kinds and set(kinds) == {bytes}, f"frame types received: {set(kinds)}"
    # The harness decodes each frame with codec.unpackb, which refuses trailing bytes: one message per frame.
    assert len(h.connections[0].received) == len(kinds)


# --------------------------------------------------------------------------------------------------- codec / text


def text_only_run(harness, tmp_path, horizon: int = 2) -> list[dict[str, Any]]:
    """A TextOnly-v1 run (3 envs, episodes of 2 and 3 steps) against a zero-action server; its transcript."""
    h = harness(zeros_script(horizon, ACTION_DIM))
    assert run_client(config(tmp_path, h.port, TextOnlyConfig(), num_episodes=8), "TextOnly-v1") == 0
    assert len(h.connections) == 1 and not h.errors
    received = h.connections[0].received
    assert {m["message_type"] for m in received} == {"infer", "feedback"}
    return received


def test_c8_text_is_a_unicode_array_of_one_string_per_env_in_order(harness, tmp_path):
    for msg, ids, obs in observations(text_only_run(harness, tmp_path)):
        text = obs["text"]
        assert isinstance(text, np.ndarray) and text.dtype.kind == "U", f"text sent as {type(text).__name__}"
        assert text.shape == (len(ids),)
        assert [int(s.split()[1]) for s in text.tolist()] == ids, f"{msg['message_type']} text rows out of order"


def test_c11_observation_without_images_or_states_still_carries_the_batch(harness, tmp_path):
    """Text-only observations: ``states`` still holds an array with the env batch leading (``_batch``, (n, 0))."""
    rows_seen = set()
    for msg, ids, obs in observations(text_only_run(harness, tmp_path)):
        assert set(obs) == {"images", "states", "text"}
        arrays = [*obs["images"].values(), *obs["states"].values()]
        assert arrays, f"{msg['message_type']} with neither images nor states"
        assert all(isinstance(a, np.ndarray) and a.shape[0] == len(ids) for a in arrays)
        batch = obs["states"]["_batch"]
        assert batch.shape == (len(ids), 0) and batch.dtype == np.float32
        rows_seen.add(len(ids))
        (messages.parse_infer if msg["message_type"] == "infer" else messages.parse_feedback)(msg)  # agrees
    assert len(rows_seen) > 1, "batches of different sizes were checked"


# --------------------------------------------------------------------------------------------------- session


def test_c9_sends_nothing_before_metadata_and_takes_odd_metadata_as_unknown(harness, tmp_path):
    early: list[Any] = []

    def script(conn):
        try:
            early.append(conn.ws.recv(timeout=0.5))
        except TimeoutError:
            pass
        # a horizon of the wrong type (not stated) and keys no client knows
        conn.send({"message_type": "metadata", "data": {"action_horizon": "3", "future": {"x": [1, 2]}}})
        conn.answer_infers_with_zeros(3, D)

    h = harness(script)
    assert run_client(config(tmp_path, h.port, num_episodes=3), "Probe-v1") == 0
    assert early == [], "the client sent a frame before the server's metadata"
    assert len(h.connections) == 1 and not h.errors
    assert h.connections[0].received[0]["message_type"] == "infer"


# --------------------------------------------------------------------------------------------------- infer / action


@pytest.mark.parametrize("horizon", [2, 3])
def test_c15_replan_steps_above_the_advertised_horizon_warn_at_connect_and_short_chunks_stop_the_run(
        harness, tmp_path, capsys, horizon):
    h = harness(zeros_script(horizon, D))
    cfg = config(tmp_path, h.port, num_episodes=3, runner=RunnerConfig(replan_steps=3))
    log = tmp_path / "run" / "logs" / "client.log"
    warning = f"--runner.replan-steps=3 exceeds the server's action_horizon={horizon}"
    if horizon < 3:
        assert run_client(cfg, "Probe-v1") == 1
        assert "server sent a chunk of 2 steps but --runner.replan-steps is 3" in capsys.readouterr().err
        assert warning in log.read_text(), "announced at connect, before the first chunk"
        assert log.read_text().index(warning) < log.read_text().index("chunk of 2 steps")
    else:
        assert run_client(cfg, "Probe-v1") == 0
        assert "exceeds the server's action_horizon" not in log.read_text()


# --------------------------------------------------------------------------------------------------- feedback


def test_c18_feedback_flags_are_those_of_the_chunks_last_step(harness, tmp_path):
    """Probe-v1 (episodes of 3, 5, 7 steps) with --runner.max-episode-steps 4 and H = 3: env 0 terminates at t=3,
    envs 1 and 2 are truncated at t=4, one step into their second chunk. (The shared split: under the static one
    the other envs' chunks end early once an env has run its share, so that an infer follows its last feedback.)"""
    h = harness(probe_script(3, stop_after_feedbacks=None))
    cfg = config(tmp_path, h.port, num_episodes=9, runner=RunnerConfig(max_episode_steps=4, episode_split="shared"))
    assert run_client(cfg, "Probe-v1") == 0
    lengths = np.array([3, 5, 7])
    t_at_infer: dict[int, float] = {}
    seen = set()
    for msg in h.connections[0].received:
        t = (msg["data"] if msg["message_type"] == "infer" else msg["data"]["obs"])["states"]["t"][:, 0]
        ids = msg["env_indices"].tolist()
        if msg["message_type"] == "infer":
            t_at_infer.update(zip(ids, t.tolist()))
            continue
        data = msg["data"]
        for row, env in enumerate(ids):
            t1 = float(t[row])
            steps = t1 - t_at_infer.pop(env)
            terminated, truncated = t1 == lengths[env], t1 == 4 and lengths[env] > 4
            assert data["rewards"][row] == steps, "the chunk's rewards, summed"
            assert bool(data["terminated"][row]) == terminated, (env, t1)
            assert bool(data["truncated"][row]) == truncated, (env, t1)
            assert terminated or truncated or steps == 3
            seen.add("terminated" if terminated else "truncated" if truncated else "running")
    assert seen == {"terminated", "truncated", "running"}


def test_c20_info_leaves_are_batched_to_m_with_str_keys(harness, tmp_path):
    feedbacks = [m for m in text_only_run(harness, tmp_path) if m["message_type"] == "feedback"]
    assert any(len(m["env_indices"]) == 1 for m in feedbacks) and any(len(m["env_indices"]) > 1 for m in feedbacks)

    def keys(tree: dict[str, Any]):
        for key, value in tree.items():
            yield key
            if isinstance(value, dict):
                yield from keys(value)

    for msg in feedbacks:
        ids, info = msg["env_indices"], msg["data"]["info"]
        assert all(isinstance(k, str) for k in keys(info))
        assert set(info) - {"episode"} == {"env", "nested", "2"}, "the scalar is left out"
        assert info["env"].tolist() == ids.tolist(), "per-env arrays cut to the feedback's rows, in order"
        assert set(info["nested"]) == {"7"} and info["nested"]["7"].tolist() == (ids * 10).tolist()
        assert info["2"]["deep"].tolist() == (ids + 100).tolist()


# --------------------------------------------------------------------------------------------------- reuse


def reuse_checking_script(counter: list[int], stop_after: int, close_reason: str, offer: bool = True):
    """A probe server that offers reuse-feedback-obs, checks every reused row against what it holds (the row of the
    env's last feedback on this connection, if that feedback did not end the episode), and rebuilds each infer's
    full observation in the transcript so ``check_probe_transcript`` can verify it against the env's real state."""
    inner = probe_script(4, stop_after_feedbacks=stop_after, counter=counter)

    def script(conn):
        held: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        send_metadata, recv, close = conn.send_metadata, conn.recv, conn.close
        if offer:
            conn.send_metadata = lambda **data: send_metadata(features=[messages.FEATURE_REUSE_FEEDBACK_OBS], **data)
        conn.close = lambda code, reason="": close(code, close_reason)

        def recv_rebuilding():
            msg = recv()
            ids = msg["env_indices"].tolist()
            if msg["message_type"] == "feedback":
                data = msg["data"]
                done, states = data["terminated"] | data["truncated"], data["obs"]["states"]
                for row, env in enumerate(ids):
                    if done[row]:
                        held.pop(env, None)
                    else:
                        held[env] = (states["t"][row], states["a"][row])
                return msg
            reuse = msg.get("reuse")
            if reuse is None:
                return msg
            states = msg["data"]["states"]
            fresh = iter(range(int((~reuse).sum())))
            t_rows, a_rows = [], []
            for env, reused in zip(ids, reuse.tolist()):
                if reused:
                    assert env in held, f"env {env} reused a row this connection does not hold"
                    t_row, a_row = held[env]
                else:
                    j = next(fresh)
                    t_row, a_row = states["t"][j], states["a"][j]
                held.pop(env, None)  # the env gets a new chunk: its observation will change
                t_rows.append(t_row)
                a_rows.append(a_row)
            assert next(fresh, None) is None, "more rows sent than not reused"
            msg["data"] = {"images": {}, "states": {"t": np.stack(t_rows), "a": np.stack(a_rows)},
                           "text": np.array(["probe"] * len(ids))}
            return msg

        conn.recv = recv_rebuilding
        inner(conn)

    return script


def test_c22_reuses_only_unchanged_rows_and_forgets_them_on_reconnect(harness, tmp_path):
    counter = [0]
    resync = reuse_checking_script(counter, stop_after=8, close_reason=messages.REASON_RESYNC)
    stop = reuse_checking_script(counter, stop_after=12, close_reason=messages.REASON_STOP)
    h = harness(lambda conn: (resync if conn.index == 0 else stop)(conn))
    assert run_client(config(tmp_path, h.port, num_envs=4, connection=ConnectionConfig(max_reconnects=1)), "Probe-v1") == 0
    assert len(h.connections) == 2 and not h.errors, h.errors
    for conn in h.connections:
        infers = [m for m in conn.received if m["message_type"] == "infer"]
        assert all("reuse" in m for m in infers), "the reuse key is on every infer once the feature is on"
        assert sum(int(m["reuse"].sum()) for m in infers) > 0, "the client used the feature"
        check_probe_transcript(conn.received, 4, None, 4)  # reused rows were the envs' real observations
    first = h.connections[1].received[0]
    assert first["env_indices"].tolist() == [0, 1, 2, 3] and not first["reuse"].any(), "nothing held after a reconnect"


@pytest.mark.parametrize("offer, enabled", [(False, True), (True, False)], ids=["not-offered", "disabled"])
def test_c22_no_reuse_unless_offered_and_enabled(harness, tmp_path, offer, enabled):
    h = harness(reuse_checking_script([0], stop_after=10, close_reason=messages.REASON_STOP, offer=offer))
    assert run_client(config(tmp_path, h.port, num_envs=4,
                             connection=ConnectionConfig(max_reconnects=0, reuse_feedback_obs=enabled)), "Probe-v1") == 0
    assert not h.errors
    infers = [m for m in h.connections[0].received if m["message_type"] == "infer"]
    assert infers and not any("reuse" in m for m in infers)


# --------------------------------------------------------------------------------------------------- closing


def test_c23_normal_close_with_empty_reason_ends_the_run(harness, tmp_path):
    inner = probe_script(4, stop_after_feedbacks=5)

    def script(conn):
        close = conn.close
        conn.close = lambda code, reason="": close(messages.CLOSE_NORMAL, "")
        inner(conn)

    h = harness(script)
    assert run_client(config(tmp_path, h.port), "Probe-v1") == 0
    assert len(h.connections) == 1 and not h.errors, "no reconnect after 1000 with an empty reason"
    assert summary(tmp_path)["status"] == "stopped by server"


@pytest.mark.parametrize("ending", ["budget-spent", "fatal-error", "interrupted"])
def test_c27_sends_close_1000_when_it_finishes(harness, tmp_path, ending):
    """The run ends because its episodes are collected, because the server sent a bad action, or on SIGINT (sent
    to this process, where run_client turns it into an orderly stop with exit code 130)."""
    closes: list[Any] = []
    closed = threading.Event()
    inner = probe_script(4, stop_after_feedbacks=None)

    def script(conn):
        try:
            if ending == "budget-spent":
                inner(conn)
            if ending == "interrupted":
                recv, feedbacks = conn.recv, []

                def recv_then_interrupt():
                    msg = recv()
                    feedbacks.append(msg["message_type"] == "feedback")
                    if sum(feedbacks) == 3:
                        os.kill(os.getpid(), signal.SIGINT)
                    return msg

                conn.recv = recv_then_interrupt
                inner(conn)
            conn.send_metadata(action_horizon=4)
            msg = conn.recv()
            wrong = msg["env_indices"] + 1  # an action for other envs: fatal for the client
            conn.send(messages.ActionReply(wrong, np.zeros((4, len(wrong), D))).message())
            conn.ws.recv()
        except ConnectionClosed as exc:
            closes.append(exc.rcvd)
            closed.set()
            raise

    h = harness(script)
    code = run_client(config(tmp_path, h.port, num_episodes=None if ending == "interrupted" else 4), "Probe-v1")
    assert code == {"budget-spent": 0, "fatal-error": 1, "interrupted": 128 + signal.SIGINT}[ending]
    assert closed.wait(5), "the server never saw the connection close"
    assert closes[0] is not None, "the client dropped the socket without a close frame"
    assert (closes[0].code, closes[0].reason) == (messages.CLOSE_NORMAL, "")
    assert h.connections[0].ws.close_code == messages.CLOSE_NORMAL


@pytest.mark.slow
def test_c28_every_process_numbers_its_envs_from_zero_on_its_own_connection(harness, tmp_path):
    # The server ends each connection's run itself, so each process sends its share whatever their start times.
    h = harness(probe_script(4, stop_after_feedbacks=8))
    assert run_client(config(tmp_path, h.port, num_envs=3, num_procs=2), "Probe-v1") == 0
    assert len(h.connections) == 2 and not h.errors
    for conn in h.connections:
        assert conn.received[0]["message_type"] == "infer"
        assert conn.received[0]["env_indices"].tolist() == [0, 1, 2]
        assert {i for m in conn.received for i in m["env_indices"].tolist()} <= {0, 1, 2}
        assert check_probe_transcript(conn.received, 4, None, 3) > 0
    assert summary(tmp_path)["total_processes"] == 2
