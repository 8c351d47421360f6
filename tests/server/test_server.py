"""The reference policy server over real loopback sockets: metadata, policies, strict validation, run end."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time

import numpy as np
import pytest
from extras import need
from waiting import wait_until
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
    return codec.packb(messages.InferRequest(obs(len(ids)), ids, np.zeros(len(ids), np.int64), reuse).message())


def feedback(ids, done=False, info=None):
    ids = np.asarray(ids, dtype=np.int64)
    m = len(ids)
    flags = np.full(m, done)
    if info is None and done:
        info = {"episode": {"r": np.ones(m, np.float32), "l": np.full(m, 5), "s": np.ones(m, bool), "mask": flags}}
    return codec.packb(messages.Feedback(ids, np.zeros(m, np.int64), obs(m), np.ones(m, np.float32), flags,
                                         np.zeros(m, bool), info or {}).message())


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
        [infer([0]), None, feedback([0]), infer([1]), None, feedback([0])],  # a second feedback for one chunk
        [b"\xc1not msgpack"],
        [codec.packb({"message_type": "bogus"})],
        [codec.packb({"message_type": "infer", "data": {"images": {}}, "env_indices": np.arange(1),
                      "step_ids": np.zeros(1, np.int64)})],
    ],
    ids=["double-infer", "feedback-first", "repeated-feedback", "garbage", "bad-type", "bad-obs"],
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
    wait_until(lambda: server.log.episodes >= 2, 5, "count of a's two episodes")
    b.send(feedback([0], done=True))  # the third episode: b is closed at once
    assert close_of(b) == (1001, messages.REASON_STOP)
    assert server.log.episodes == 3
    try:  # a learns of the end with its next message, or sooner: the close shows on this send or the next recv
        a.send(infer([0, 1]))
    except ConnectionClosed:
        pass
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
    stats = server.log.stats
    assert server.log.episodes == 2 and stats.return_sum == 4.0 and stats.length_sum == 10
    assert stats.success_count == 1 and stats.success_judged == 2
    ws.close()


def ended(ids, success, info=None):
    """A feedback on which every env of ``ids`` finishes an episode with the ``success`` flags (``None``: no
    ``s`` at all), plus ``info``'s other keys."""
    m = len(ids)
    episode = {"r": np.full(m, 2.0, np.float32), "l": np.full(m, 4), "mask": np.ones(m, bool)}
    if success is not None:
        episode["s"] = np.asarray(success, bool)
    return feedback(ids, done=True, info={**(info or {}), "episode": episode})


def exchange(ws, ids, sent_feedback):
    """One infer, its chunk, and ``sent_feedback``; the next infer's reply says the feedback was counted."""
    ws.send(infer(ids))
    ws.recv(timeout=5)
    ws.send(sent_feedback)
    ws.send(infer(ids))
    ws.recv(timeout=5)
    ws.send(feedback(ids))  # the chunk's feedback, so the next exchange may infer again


def test_false_success_flags_without_a_rule_are_not_a_zero_success_rate(server_factory):
    """A client sends ``s`` all False for an env with no success rule; nothing else on the wire says whether the
    env judges success, so the server does not claim a success rate of 0."""
    server = server_factory()
    ws, _ = open_client(server)
    for _ in range(3):
        exchange(ws, [0, 1], ended([0, 1], [False, False]))
    assert server.log.episodes == 6 and server.log.stats.success_judged == 0
    assert "success_rate=n/a" in server.log.line()
    ws.close()


def test_a_success_shows_the_rule_and_earlier_false_flags_become_failures(server_factory):
    """A rule judged by reward threshold shows on the wire only when an episode succeeds: from then on the
    connection's earlier and later False flags are failures."""
    server = server_factory()
    ws, _ = open_client(server)
    exchange(ws, [0, 1], ended([0, 1], [False, False]))
    exchange(ws, [0, 1], ended([0, 1], [False, False]))
    assert "success_rate=n/a" in server.log.line()
    exchange(ws, [0, 1], ended([0, 1], [False, True]))
    exchange(ws, [0, 1], ended([0, 1], [False, False]))
    stats = server.log.stats
    assert (server.log.episodes, stats.success_judged, stats.success_count) == (8, 8, 1)
    assert "success_rate=0.125" in server.log.line() and "over the" not in server.log.line()
    ws.close()


@pytest.mark.parametrize("key", ["success", "is_step_success"])
def test_a_success_flag_in_info_makes_an_all_false_run_a_real_zero(server_factory, key):
    """An env that reports ``info["success"]`` (forwarded per env), or PlugRL's client's ``is_step_success``,
    judges success: its all-False episodes are a success rate of 0, including those reported before the flag."""
    server = server_factory()
    ws, _ = open_client(server)
    exchange(ws, [0, 1, 2], ended([0, 1, 2], [False] * 3))
    exchange(ws, [0, 1, 2], ended([0, 1, 2], [False] * 3, info={key: np.zeros(3, bool)}))
    exchange(ws, [0, 1, 2], ended([0, 1, 2], [False] * 3))
    assert server.log.stats.success_judged == 9 and server.log.stats.success_count == 0
    assert "success_rate=0.000" in server.log.line()
    ws.close()


def test_rules_are_judged_per_connection(server_factory, caplog):
    """Two clients, one env with a rule and one without: only the first one's episodes are in the rate, and the
    log line says over how many; episodes that report no ``s`` are not judged either."""
    caplog.set_level(logging.INFO, logger="plugrl_env_client")
    server = server_factory(max_episodes=8)
    ruled, _ = open_client(server)
    plain, _ = open_client(server)
    exchange(ruled, [0, 1], ended([0, 1], [True, False]))
    exchange(plain, [0, 1], ended([0, 1], [False, False]))
    exchange(plain, [0, 1], ended([0, 1], [False, False]))
    assert "success_rate=0.500 (over the 2 episodes with a success rule)" in server.log.line()
    ruled.send(infer([0, 1]))
    ruled.recv(timeout=5)
    ruled.send(ended([0, 1], None))  # the 8th episode: no success flag at all
    assert close_of(ruled) == (1001, messages.REASON_STOP)
    assert server.log.stats.success_judged == 2
    ending = [r.getMessage() for r in caplog.records if "reached 8 episodes" in r.getMessage()]
    assert len(ending) == 1 and "success_rate=0.500 (over the 2 episodes" in ending[0]


def test_a_real_client_run_of_an_env_without_a_rule_logs_no_success_rate(server_factory, tmp_path, registry):
    """The client itself against the server: Probe-v1 has no success rule, the client writes ``success: null``
    and the server, seeing only ``s`` False, says n/a. An env that reports ``info["success"]`` and never
    succeeds gets a real 0, and so does one whose registered reward threshold is never reached."""
    from plugrl_env_client.app import run_client
    from plugrl_env_client.config import ClientConfig
    from plugrl_env_client.envs.probe.probe_env import ProbeEnv
    from plugrl_env_client.envs.registry import register_env

    @register_env("NeverSucceeds-v1")
    class NeverSucceeds(ProbeEnv):
        """Probe-v1 that reports ``info["success"]``, always False."""

        def step(self, actions):
            obs, reward, terminated, truncated, info = super().step(actions)
            return obs, reward, terminated, truncated, {**info, "success": np.zeros(self.num_envs, bool)}

    @register_env("UnreachedThreshold-v1", best_reward_threshold_for_success=1e9)
    class UnreachedThreshold(ProbeEnv):
        """Probe-v1 with a reward threshold for success that no episode reaches: the client says so with
        ``info["is_step_success"]``, as PlugRL's client does."""

    for uid, rate in (("Probe-v1", "n/a"), ("NeverSucceeds-v1", "0.000"), ("UnreachedThreshold-v1", "0.000")):
        server = server_factory(policy={"action_dim": 3})
        config = ClientConfig(output_dir=tmp_path, exp_name=uid, progress=False, num_envs=3, num_episodes=6,
                              server_port=server.port)
        assert run_client(config, uid) == 0
        lines = (tmp_path / uid / "rollout/proc_000/episodes.jsonl").read_text().splitlines()
        assert {json.loads(line)["success"] for line in lines} == ({None} if rate == "n/a" else {False})
        # Every feedback the client followed with an infer was counted before its reply; only the run's last
        # feedbacks may be in flight (or unsent) when it returns.
        assert server.log.episodes >= 3
        assert f"success_rate={rate}" in server.log.line()


def plugrl_client_feedback(ids, done):
    """A feedback shaped exactly as PlugRL's own env client sends it: ``info["is_step_success"]`` on every
    feedback; on a done step ``info["episode"]`` with ``l`` as int32 and a plain float ``mean_success_rate``."""
    ids = np.asarray(ids, dtype=np.int64)
    m = len(ids)
    done = np.asarray(done, bool)
    info = {"is_step_success": np.zeros(m, bool)}
    if done.any():
        info["episode"] = {"r": np.arange(1, m + 1, dtype=np.float32), "l": np.full(m, 7, np.int32),
                           "s": done.copy(), "mask": done.copy(), "mean_success_rate": 0.5}
    return codec.packb(messages.Feedback(ids, np.zeros(m, np.int64), obs(m), np.ones(m, np.float32), done,
                                         np.zeros(m, bool), info).message())


@pytest.mark.parametrize("m", [1, 3])
def test_plugrl_client_feedback_shape_is_accepted_and_counted(server_factory, m, caplog):
    """PlugRL's client against this server: no resync storm, every reported episode counted once."""
    server = server_factory()
    ws, _ = open_client(server)
    ids = list(range(m))
    rounds = 4
    for r in range(rounds):
        request = messages.InferRequest(obs(m), np.asarray(ids), np.zeros(m, np.int64))  # no "reuse"
        ws.send(codec.packb(request.message()))
        ws.recv(timeout=5)
        done = [r % 2 == 1] * m  # a non-done feedback with info, then a done one
        ws.send(plugrl_client_feedback(ids, done))
    ws.send(infer(ids))  # still the same connection
    assert ws.recv(timeout=5)
    assert server.log.episodes == 2 * m
    assert server.log.stats.length_sum == 2 * m * 7
    assert not any("protocol violation" in r.getMessage() for r in caplog.records)
    ws.close()


def test_feedback_for_envs_without_step_state_is_ignored_with_one_warning(server_factory, caplog):
    """PlugRL SPEC 7.6: feedback for an env that got no chunk on this connection has no transition to complete;
    the server says so once per connection, ignores those rows, and keeps serving."""
    server = server_factory()
    ws, _ = open_client(server)
    for _ in range(2):
        ws.send(infer([0]))
        ws.recv(timeout=5)
        ws.send(feedback([0, 5], done=True))
    ws.send(infer([0]))
    assert ws.recv(timeout=5)
    warnings = [r for r in caplog.records if "no step state" in r.getMessage()]
    assert len(warnings) == 1 and "[5]" in warnings[0].getMessage()
    assert server.log.episodes == 2, "only env 0's episodes count"
    ws.close()


def test_a_client_that_drops_the_socket_is_a_note_not_an_error(server_factory, caplog):
    caplog.set_level(logging.DEBUG, logger="plugrl_env_client")  # a per-connection line: DEBUG
    server = server_factory()
    ws, _ = open_client(server)
    ws.socket.close()  # no close frame
    wait_until(lambda: any("without a close frame" in r.getMessage() for r in caplog.records), 5,
               "note of the dropped socket")
    assert not any(r.levelname in ("WARNING", "ERROR") for r in caplog.records if "plugrl" in r.name)


@pytest.mark.parametrize("info", [{"x": np.float32(1.0)}, {"x": np.zeros(3)}, {"nested": {"y": [1, 2]}}],
                         ids=["scalar", "wrong-rows", "list-leaf"])
def test_info_that_cannot_be_split_per_env_is_a_violation(server_factory, info):
    """For m > 1, a non-empty info with no array of leading dim m has nothing to split it by."""
    server = server_factory()
    ws, _ = open_client(server)
    ws.send(infer([0, 1]))
    ws.recv(timeout=5)
    ws.send(feedback([0, 1], info=info))
    assert close_of(ws) == (1001, messages.REASON_RESYNC)


@pytest.mark.parametrize("info", [
    {"non_str": {3: np.zeros(2)}},
    {"episode": {"r": np.zeros(3, np.float32), "mask": np.ones(2, bool)}},
], ids=["non-str-key", "episode-field-of-wrong-length"])
def test_info_that_breaks_the_exchange_is_a_violation(server_factory, info):
    server = server_factory()
    ws, _ = open_client(server)
    ws.send(infer([0, 1]))
    ws.recv(timeout=5)
    ws.send(feedback([0, 1], info=info))
    assert close_of(ws) == (1001, messages.REASON_RESYNC)


def test_values_that_are_not_m_shaped_pass_through(server_factory):
    server = server_factory()
    ws, _ = open_client(server)
    ws.send(infer([0, 1]))
    ws.recv(timeout=5)
    ws.send(feedback([0, 1], info={"rows": np.zeros(2), "task": "pick", "scale": 0.5, "other": np.zeros(5)}))
    ws.send(infer([0, 1]))
    assert ws.recv(timeout=5)
    ws.close()


@pytest.mark.parametrize("factory", ["server_factory", "picows_server_factory"])
def test_shutdown_tells_clients_with_server_shutdown(factory, request):
    server = request.getfixturevalue(factory)()
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


# ------------------------------------------------------------------------------------------ reuse, latency, picows


def numbered_obs(ids, base: int) -> dict:
    """Observations whose every value names its env and a batch number (so reused rows can be recognised)."""
    ids = np.asarray(ids, dtype=np.int64)
    n = len(ids)
    image = (np.asarray(ids, np.uint8)[:, None, None, None] + base) * np.ones((n, 4, 4, 3), np.uint8)
    return {"images": {"cam": image}, "states": {"x": np.stack([ids, np.full(n, base)], axis=1).astype(np.float64)},
            "text": np.array([f"env {i} batch {base}" for i in ids.tolist()])}


@pytest.mark.parametrize("infer_ids, reuse", [
    ([1, 2, 3], [True, True, True]),  # one run of the feedback batch, in order: served as slices of it
    ([2, 3], [True, True]),  # a run that starts inside the batch
    ([3, 1], [True, True]),  # another order: rows stacked
    ([0, 1, 3], [False, True, True]),  # some rows sent, some reused
])
def test_reused_rows_are_the_held_feedback_rows(server_factory, infer_ids, reuse):
    server = server_factory()
    seen = []
    act = server.policy.act

    def recording(obs, n):
        seen.append(obs)
        return act(obs, n)

    server.policy.act = recording
    ws, _ = open_client(server)
    ids = np.array([0, 1, 2, 3])
    ws.send(codec.packb(messages.InferRequest(numbered_obs(ids, 10), ids, np.zeros(4, np.int64)).message()))
    ws.recv(timeout=5)
    m = 4
    ws.send(codec.packb(messages.Feedback(ids, np.zeros(m, np.int64), numbered_obs(ids, 20),
                                          np.ones(m, np.float32), np.zeros(m, bool), np.zeros(m, bool), {}).message()))
    sent_ids = [e for e, r in zip(infer_ids, reuse) if not r]
    fresh = numbered_obs(sent_ids, 30)
    ws.send(codec.packb(messages.InferRequest(fresh, np.array(infer_ids), np.zeros(len(infer_ids), np.int64),
                                              np.array(reuse)).message()))
    ws.recv(timeout=5)
    ws.close()
    obs = seen[-1]
    bases = [20 if r else 30 for r in reuse]
    expected = {"cam": np.stack([numbered_obs([e], b)["images"]["cam"][0] for e, b in zip(infer_ids, bases)]),
                "x": np.array([[e, b] for e, b in zip(infer_ids, bases)], np.float64)}
    assert np.array_equal(obs["images"]["cam"], expected["cam"])
    assert np.array_equal(obs["states"]["x"], expected["x"])
    assert obs["text"].tolist() == [f"env {e} batch {b}" for e, b in zip(infer_ids, bases)]


@pytest.mark.slow
def test_latency_holds_each_action_without_blocking_other_clients(server_factory):
    server = server_factory(latency_ms=3000)
    a, _ = open_client(server)
    start = time.monotonic()
    a.send(infer([0]))
    b, meta = open_client(server)  # served while a's action is held back
    assert meta.protocol_version == 1
    with pytest.raises(TimeoutError):
        a.recv(timeout=0.01)
    assert a.recv(timeout=30)
    assert time.monotonic() - start >= 3.0
    a.close()
    b.close()


@pytest.mark.parametrize("latency", [-1.0, float("nan"), float("inf")])
def test_latency_must_be_a_finite_non_negative_number(latency):
    with pytest.raises(ValueError, match="--policy.latency-ms must be a finite number >= 0"):
        PolicyServer(make_policy(PolicyConfig()), port=0, latency_ms=latency)


@pytest.fixture
def picows_server_factory():
    need("picows")
    made = []

    def start(**kwargs):
        policy = make_policy(PolicyConfig(**kwargs.pop("policy", {})))
        server = PolicyServer(policy, host="127.0.0.1", port=0, transport="picows", **kwargs).start()
        made.append(server)
        return server

    yield start
    for s in made:
        s.shutdown()


def test_picows_server_serves_like_the_websockets_one(picows_server_factory, caplog):
    """A websockets client against the picows server: metadata, chunks, strict validation, the run's end."""
    caplog.set_level(logging.DEBUG, logger="plugrl_env_client")  # the dropped-socket note is DEBUG
    server = picows_server_factory(max_episodes=2, policy={"action_dim": 3, "action_horizon": 5})
    ws, meta = open_client(server)
    assert meta.action_horizon == 5 and meta.action_dim == 3
    ws.send(infer([2, 0]))
    reply = messages.parse_action(codec.unpackb(ws.recv(timeout=5)), np.array([2, 0]))
    assert reply.actions.shape == (5, 2, 3) and reply.actions.std() > 0
    ws.send(feedback([2, 0], done=True))
    assert close_of(ws) == (1001, messages.REASON_STOP)
    assert server.log.episodes == 2

    bad, _ = open_client(picows_server_factory())
    bad.send(b"\xc1not msgpack")
    assert close_of(bad) == (1001, messages.REASON_RESYNC)
    assert any("protocol violation" in r.getMessage() for r in caplog.records)

    dropped, _ = open_client(server)
    dropped.socket.close()
    wait_until(lambda: any("without a close frame" in r.getMessage() for r in caplog.records), 5,
               "note of the dropped socket")


def test_picows_server_refuses_text_frames(picows_server_factory):
    ws, _ = open_client(picows_server_factory())
    ws.send("hello")
    assert close_of(ws) == (1001, messages.REASON_RESYNC)


# ------------------------------------------------------------------------------------------ values a server cannot use


def violation_of(caplog, port: int) -> str:
    """The protocol violation the server logged for the client connection from local ``port``."""
    found = [r.getMessage() for r in caplog.records
             if "protocol violation" in r.getMessage() and f", {port})" in r.getMessage()]
    assert len(found) == 1, f"expected one violation logged for port {port}, got {found}"
    return found[0]


def no_internal_errors(caplog) -> None:
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, f"the server logged errors: {errors}"


def still_serves(server) -> None:
    """Another client gets an action: the server goes on serving."""
    other, _ = open_client(server)
    other.send(infer([0]))
    assert messages.parse_action(codec.unpackb(other.recv(timeout=5)), np.array([0])).actions.shape[1] == 1
    other.close()


def deep_map(levels: int) -> dict:
    out: dict = {}
    inner = out
    for _ in range(levels - 1):
        inner["a"] = {}
        inner = inner["a"]
    return out


ROWS = {"rows": np.zeros(2)}  # something m-shaped, so that info can be split per env
BAD_INFOS = [
    ({"episode": {"r": "abc", "mask": np.ones(2, bool)}}, "['r']"),
    ({"episode": {"r": np.array(["a", "b"]), "mask": np.ones(2, bool)}}, "['r']"),
    ({"episode": {"r": np.ones(2, np.float32), "mask": np.ones(3, bool)}}, "['mask']"),
    ({"episode": {"r": np.ones(2, np.float32), "mask": [True, True, True]}}, "['mask']"),
    ({"episode": {"r": np.ones(2, np.float32), "l": {"a": 1}}}, "['l']"),
    ({"episode": {"r": np.ones(2, np.float32), "l": np.array([3, -1])}}, "['l']"),
    ({"episode": {"r": np.ones(2, np.float32), "l": np.array([3.5, 2.0])}}, "['l']"),
    ({"episode": {"r": np.ones(2, np.float32), "l": np.array([2**63, 1], np.uint64)}}, "['l']"),
    ({"episode": {"r": np.ones(2, np.float32), "s": np.array([1, 0])}}, "['s']"),
    ({"episode": {"r": np.ones(2, np.float32), "mask": np.ones(2, np.float32)}}, "['mask']"),
    ({"episode": {"r": True}}, "['r']"),
    ({"episode": {"r": None, "mask": np.ones(2, bool)}}, "['r']"),
    ({**ROWS, "deep": deep_map(990)}, "deeper than"),
    ({**ROWS, "nested": {"x": {b"bytes-key": 1}}}, "non-str key"),
]


@pytest.mark.parametrize("info, field", BAD_INFOS, ids=[
    "r-str", "r-text-array", "mask-longer-than-r", "mask-list", "l-map", "l-negative", "l-fraction", "l-beyond-int64",
    "s-ints", "mask-floats", "r-bool", "r-nil", "nested-990-deep", "bytes-key"])
def test_an_unusable_info_value_is_a_resync_naming_the_field(server_factory, caplog, info, field):
    """Each of these made the server fail the connection with 1011 and a traceback (a client repeating them
    reconnected forever); now a resync whose log line names the field, and the server serves on."""
    server = server_factory()
    ws, _ = open_client(server)
    port = ws.local_address[1]
    ws.send(infer([0, 1]))
    ws.recv(timeout=5)
    ws.send(feedback([0, 1], done=True, info=info))
    assert close_of(ws) == (1001, messages.REASON_RESYNC)
    assert field in violation_of(caplog, port)
    still_serves(server)
    no_internal_errors(caplog)


@pytest.mark.parametrize("episode, counted", [
    ({"r": 2.5, "l": 4, "s": True, "mask": True}, (2, 5.0, 8, 2)),  # one value stands for every row
    ({"r": np.float32(1.0), "l": np.int32(3), "mask": np.array([True, False])}, (1, 1.0, 3, 0)),
    ({"r": np.array([1, 2], np.int64), "l": np.array([3.0, 4.0]), "s": np.array([False, True])}, (2, 3.0, 7, 1)),
    ({"r": np.ones(2, np.float16), "l": np.array([5, 6], np.uint16), "mean_success_rate": "any value"}, (2, 2.0, 11, 0)),
], ids=["scalars", "numpy-scalars", "int-returns-whole-float-lengths", "float16-uint16"])
def test_usable_episode_values_of_other_types_are_counted(server_factory, caplog, episode, counted):
    """What a value of another type still means is counted as it means (no resync): one value for every row,
    numbers of any numeric dtype for r, whole numbers of any dtype for l."""
    server = server_factory()
    ws, _ = open_client(server)
    ws.send(infer([0, 1]))
    ws.recv(timeout=5)
    ws.send(feedback([0, 1], done=True, info={"rows": np.zeros(2), "episode": episode}))
    ws.send(infer([0, 1]))
    assert ws.recv(timeout=5)
    stats = server.log.stats
    assert (stats.count, stats.return_sum, stats.length_sum, stats.success_count) == counted
    assert not [r for r in caplog.records if "protocol violation" in r.getMessage()]
    ws.close()


@pytest.mark.parametrize("obs_map, said", [
    ({"images": {}, "states": {b"x": np.zeros((1, 2))}, "text": np.array(["hi"])}, "['states'] has a non-str key b'x'"),
    ({"images": {7: np.zeros((1, 2, 2, 3), np.uint8)}, "states": {"x": np.zeros((1, 2))}, "text": np.array(["hi"])},
     "map keys must be str or bytes, got 7"),
], ids=["bytes-state-key", "int-image-key"])
def test_observation_arrays_need_str_names(server_factory, caplog, obs_map, said):
    """A bytes state key made the ARS policy's sort of the state names fail (a 1011); now a resync for any policy."""
    server = server_factory()
    ws, _ = open_client(server)
    port = ws.local_address[1]
    ws.send(codec.packb({"message_type": "infer", "data": obs_map, "env_indices": np.arange(1),
                         "step_ids": np.zeros(1, np.int64)}))
    assert close_of(ws) == (1001, messages.REASON_RESYNC)
    assert said in violation_of(caplog, port)
    no_internal_errors(caplog)


@pytest.mark.parametrize("header", ["-1.0", "1.-1", "1", "a.b", "1.2.3", "1_0.2", "+1.2", "0x1.2", "1. 2",
                                    "99999999999999999999.1", ""])
def test_a_malformed_stream_header_is_ignored_with_one_warning(server_factory, caplog, header):
    """``-1.0`` and ``1.-1`` failed every connection with 1011 (a SeedSequence error) before any message. The
    header is optional: the server serves such a client with its shared generator and says so once."""
    server = server_factory()
    for _ in range(2):
        ws = connect(server.url, compression=None, max_size=None, proxy=None,
                     additional_headers={messages.STREAM_HEADER: header}).__enter__()
        assert messages.parse_metadata(codec.unpackb(ws.recv(timeout=5))).protocol_version == 1
        ws.send(infer([0]))
        assert messages.parse_action(codec.unpackb(ws.recv(timeout=5)), np.array([0]))
        ws.close()
    warnings = [r.getMessage() for r in caplog.records if messages.STREAM_HEADER in r.getMessage()]
    assert len(warnings) == 1 and "ignoring" in warnings[0] and repr(header) in warnings[0]
    no_internal_errors(caplog)


def test_a_valid_stream_header_gets_a_reproducible_generator(server_factory):
    """Two servers with one seed answer the same stream's first infer alike, and the stream's second connection
    differently (its generator is seeded with how often the stream connected)."""
    def first_chunk(server, stream):
        ws = connect(server.url, compression=None, max_size=None, proxy=None,
                     additional_headers={messages.STREAM_HEADER: stream}).__enter__()
        ws.recv(timeout=5)
        ws.send(infer([0]))
        actions = messages.parse_action(codec.unpackb(ws.recv(timeout=5)), np.array([0])).actions
        ws.close()
        return actions

    a, b = server_factory(seed=7), server_factory(seed=7)
    assert np.array_equal(first_chunk(a, "3.1"), first_chunk(b, "3.1"))
    assert not np.array_equal(first_chunk(a, "3.1"), first_chunk(b, "3.2"))
    assert not np.array_equal(first_chunk(a, "3.1"), first_chunk(b, "3.1"))  # a's 3rd connection of 3.1, b's 2nd


# ------------------------------------------------------------------------------------------------ many clients


@pytest.mark.slow
def test_32_client_processes_of_16_envs_against_one_server_give_exact_counts(server_factory, tmp_path):
    """One ``--num-procs 32`` run of 16 envs each (512 envs on one server's loop): every episode it was asked for
    recorded exactly once, in the summary and the episode lines, and counted by the server."""
    server = server_factory(policy={"action_dim": 2})
    episodes = 32 * 16 * 2
    cmd = [sys.executable, "-c", "from plugrl_env_client.cli import main; main()", "point-v1", "--num-envs", "16",
           "--num-procs", "32", "--num-episodes", str(episodes), "--runner.max-episode-steps", "8",
           "--server-port", str(server.port), "--no-progress", "--output-dir", str(tmp_path), "--exp-name", "many"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((tmp_path / "many" / "summary.json").read_text())
    assert summary["completed_episodes"] == episodes
    files = sorted((tmp_path / "many" / "rollout").glob("proc_*/episodes.jsonl"))
    assert len(files) == 32
    assert sum(len(f.read_text().splitlines()) for f in files) == episodes
    wait_until(lambda: server.log.episodes >= episodes, 10, "the server to count the last feedbacks")
