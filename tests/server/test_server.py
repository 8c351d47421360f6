"""The reference policy server over real loopback sockets: metadata, policies, strict validation, run end."""

from __future__ import annotations

import time

import numpy as np
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from plugrl_env_client.protocol import codec, messages
from plugrl_env_client.server.policies import PolicyConfig, make_policy
from plugrl_env_client.server.server import PolicyServer


@pytest.fixture
def server_factory():
    made = []

    def start(**kwargs):
        policy = make_policy(PolicyConfig(**kwargs.pop("policy", {})))
        server = PolicyServer(policy, host="127.0.0.1", port=0, **kwargs).start()
        made.append(server)
        return server

    yield start
    for s in made:
        s.shutdown()


def obs(n: int) -> dict:
    return {"images": {}, "states": {"x": np.zeros((n, 2))}, "text": np.array(["hi"] * n)}


def infer(ids, reuse=None):
    ids = np.asarray(ids, dtype=np.int64)
    return codec.packb(messages.infer_message(obs(len(ids)), ids, np.zeros(len(ids), np.int64), reuse))


def feedback(ids, done=False, info=None):
    ids = np.asarray(ids, dtype=np.int64)
    m = len(ids)
    flags = np.full(m, done)
    if info is None and done:
        info = {"episode": {"r": np.ones(m, np.float32), "l": np.full(m, 5), "s": np.ones(m, bool), "mask": flags}}
    return codec.packb(messages.feedback_message(ids, np.zeros(m, np.int64), obs(m), np.ones(m, np.float32), flags,
                                                 np.zeros(m, bool), info or {}))


def open_client(server):
    ws = connect(server.url, compression=None, max_size=None, proxy=None).__enter__()
    meta = messages.parse_metadata(codec.unpackb(ws.recv(timeout=5)))
    return ws, meta


def close_of(ws) -> tuple[int, str]:
    with pytest.raises(ConnectionClosed) as info:
        ws.recv(timeout=5)
    return info.value.rcvd.code, info.value.rcvd.reason


def test_metadata_and_random_chunks(server_factory):
    server = server_factory(policy={"action_dim": 3, "action_horizon": 5, "low": -0.5, "high": 0.5})
    ws, meta = open_client(server)
    assert meta.protocol_version == 1 and meta.action_horizon == 5 and meta.action_dim == 3
    ws.send(infer([2, 0, 7]))
    reply = messages.parse_action(codec.unpackb(ws.recv(timeout=5)), np.array([2, 0, 7]))
    assert reply.actions.shape == (5, 3, 3) and reply.actions.dtype == np.float32
    assert (np.abs(reply.actions) <= 0.5).all() and reply.actions.std() > 0
    ws.close()


def test_zero_policy_integer_dtype_and_scalar_actions(server_factory):
    server = server_factory(policy={"name": "zero", "action_dim": 0, "dtype": "int64", "action_horizon": 2})
    ws, _ = open_client(server)
    ws.send(infer([0, 1]))
    reply = messages.parse_action(codec.unpackb(ws.recv(timeout=5)), np.array([0, 1]))
    assert reply.actions.shape == (2, 2) and reply.actions.dtype == np.int64 and not reply.actions.any()
    ws.close()


@pytest.mark.parametrize(
    "frames",
    [
        [infer([0]), None, infer([0])],  # two infers without a feedback between them
        [feedback([0])],  # feedback before any infer
        [infer([0]), None, feedback([1])],  # feedback for an env that holds no chunk
        [b"\xc1not msgpack"],
        [codec.packb({"message_type": "bogus"})],
        [codec.packb({"message_type": "infer", "data": {"images": {}}, "env_indices": np.arange(1),
                      "step_ids": np.zeros(1, np.int64)})],
    ],
    ids=["double-infer", "feedback-first", "unknown-env", "garbage", "bad-type", "bad-obs"],
)
def test_violations_close_with_resync(server_factory, frames, caplog):
    server = server_factory()
    ws, _ = open_client(server)
    for frame in frames:
        if frame is None:
            ws.recv(timeout=5)  # the action for the infer just sent
        else:
            ws.send(frame)
    assert close_of(ws) == (1001, messages.REASON_RESYNC)
    assert any("protocol violation" in r.getMessage() for r in caplog.records)


def test_text_frame_is_a_violation(server_factory):
    server = server_factory()
    ws, _ = open_client(server)
    ws.send("hello")
    assert close_of(ws) == (1001, messages.REASON_RESYNC)


def test_max_episodes_ends_the_run_for_every_client(server_factory):
    server = server_factory(max_episodes=3)
    a, _ = open_client(server)
    b, _ = open_client(server)
    a.send(infer([0, 1]))
    a.recv(timeout=5)
    b.send(infer([0]))
    b.recv(timeout=5)
    a.send(feedback([0, 1], done=True))
    deadline = time.monotonic() + 5
    while server.log.episodes < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    b.send(feedback([0], done=True))  # the third episode: b is closed at once
    assert close_of(b) == (1001, messages.REASON_STOP)
    assert server.log.episodes == 3
    a.send(infer([0, 1]))  # a learns of the end with its next message
    assert close_of(a) == (1001, messages.REASON_STOP)


def test_episode_log_counts_only_masked_rows(server_factory):
    server = server_factory()
    ws, _ = open_client(server)
    ws.send(infer([0, 1, 2]))
    ws.recv(timeout=5)
    mask = np.array([True, False, True])
    info = {"episode": {"r": np.array([1.0, 9.0, 3.0], np.float32), "l": np.array([4, 9, 6]), "s": np.array([True, True, False]), "mask": mask}}
    ws.send(feedback([0, 1, 2], info=info))
    ws.send(infer([0, 1, 2]))
    ws.recv(timeout=5)
    assert server.log.episodes == 2 and server.log.return_sum == 4.0 and server.log.length_sum == 10
    assert server.log.successes == 1
    ws.close()


@pytest.mark.parametrize("info", [{"x": np.float32(1.0)}, {"x": np.zeros(3)}, {"nested": {"y": [1, 2]}}],
                         ids=["scalar", "wrong-rows", "list-leaf"])
def test_info_that_cannot_be_split_per_env_is_a_violation(server_factory, info):
    server = server_factory()
    ws, _ = open_client(server)
    ws.send(infer([0, 1]))
    ws.recv(timeout=5)
    ws.send(feedback([0, 1], info=info))
    assert close_of(ws) == (1001, messages.REASON_RESYNC)


def test_shutdown_tells_clients_with_server_shutdown(server_factory):
    server = server_factory()
    ws, _ = open_client(server)
    server.shutdown()
    assert close_of(ws) == (1001, messages.REASON_SHUTDOWN)


def test_policy_crash_closes_with_internal_error(server_factory):
    server = server_factory()

    def boom(obs, n):
        raise RuntimeError("policy bug")

    server.policy.act = boom
    ws, _ = open_client(server)
    ws.send(infer([0]))
    assert close_of(ws) == (1011, messages.REASON_INTERNAL)
