"""The policy runs off the server's event loop: a slow call holds up no connection's pings and frames, and a
batching policy answers the infers of several connections in one call."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import numpy as np
import pytest
from waiting import wait_until
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from plugrl_env_client.errors import ProtocolError
from plugrl_env_client.protocol import codec, messages
from plugrl_env_client.server.policies import InferCall, Policy, PolicySetup
from plugrl_env_client.server.server import PolicyServer
from plugrl_env_client.server.worker import PolicyWorker

WAIT_S = 20.0
"""Bound of every wait (a loaded machine is slow; a broken server fails the test instead of hanging it)."""


def setup(horizon: int = 2) -> PolicySetup:
    return PolicySetup((2,), np.dtype(np.float32), horizon, -1.0, 1.0)


class Held(Policy):
    """Answers each env's index; an infer whose first state is 1 waits until ``release`` is set."""

    def __init__(self) -> None:
        super().__init__(setup())
        self.started = threading.Event()
        self.release = threading.Event()
        self.threads: set[str] = set()
        self.connections = 0

    def for_connection(self) -> Policy:
        self.connections += 1
        return self

    def act(self, obs: dict[str, Any], n: int) -> np.ndarray:
        raise NotImplementedError

    def infer(self, obs: dict[str, Any], env_indices: np.ndarray, step_ids: np.ndarray) -> np.ndarray:
        self.threads.add(threading.current_thread().name)
        if obs["states"]["x"][0, 0] == 1:
            self.started.set()
            assert self.release.wait(WAIT_S)
        return np.broadcast_to(env_indices[None, :, None], (self.horizon, len(env_indices), 2)).astype(np.float32)


class Batching(Held):
    """Held, answering through infer_batch; records how many infers each call took."""

    batches = True

    def __init__(self) -> None:
        super().__init__()
        self.sizes: list[int] = []

    def infer_batch(self, calls: list[InferCall]) -> list[np.ndarray]:
        self.sizes.append(len(calls))
        return [call.policy.infer(call.obs, call.env_indices, call.step_ids) for call in calls]


class Sleepy(Policy):
    """Sleeps 0.2 s in every infer, as a slow forward pass does."""

    def act(self, obs: dict[str, Any], n: int) -> np.ndarray:
        time.sleep(0.2)
        return np.zeros((self.horizon, n, 2), np.float32)


def infer_frame(ids: list[int], slow: bool = False) -> bytes:
    x = np.full((len(ids), 1), 1.0 if slow else 0.0)
    obs = {"images": {}, "states": {"x": x}, "text": None}
    return codec.packb(messages.InferRequest(obs, np.array(ids, np.int64), np.zeros(len(ids), np.int64)).message())


def client(server: PolicyServer) -> Any:
    ws = connect(server.url, compression=None, max_size=None, proxy=None, open_timeout=WAIT_S).__enter__()
    messages.parse_metadata(codec.unpackb(ws.recv(timeout=WAIT_S)))
    return ws


def actions_of(ws: Any, ids: list[int]) -> np.ndarray:
    return messages.parse_action(codec.unpackb(ws.recv(timeout=WAIT_S)), np.array(ids, np.int64)).actions


@pytest.fixture
def serve():
    made: list[PolicyServer] = []

    def start(policy: Policy, **kwargs: Any) -> PolicyServer:
        server = PolicyServer(policy, host="127.0.0.1", port=0, **kwargs).start()
        made.append(server)
        return server

    yield start
    for server in made:
        if isinstance(server.policy, Held):
            server.policy.release.set()
        server.shutdown()


def test_a_held_infer_stops_no_other_connection_from_connecting_and_being_pinged(serve):
    policy = Held()
    server = serve(policy)
    slow = client(server)
    slow.send(infer_frame([0], slow=True))
    assert policy.started.wait(WAIT_S)
    other = client(server)  # its metadata came while the policy is busy
    assert other.ping().wait(WAIT_S), "no pong while the policy runs"
    assert not policy.release.is_set()
    other.send(infer_frame([3, 4]))  # queued behind the held call
    policy.release.set()
    assert actions_of(slow, [0]).tolist() == [[[0, 0]]] * 2
    assert actions_of(other, [3, 4]).tolist() == [[[3, 3], [4, 4]]] * 2
    assert policy.threads == {"plugrl-policy-worker"}  # never the loop's thread
    slow.close()
    other.close()


def test_a_slow_policy_keeps_pings_answered_and_every_infer_answered(serve):
    server = serve(Sleepy(setup()))
    first, second = client(server), client(server)
    start = time.monotonic()
    first.send(infer_frame([0]))
    second.send(infer_frame([0]))
    pong = second.ping()
    assert pong.wait(WAIT_S)
    ponged = time.monotonic() - start
    assert actions_of(first, [0]).shape == (2, 1, 2)
    first_answered = time.monotonic() - start
    assert actions_of(second, [0]).shape == (2, 1, 2)
    assert ponged < first_answered, "the pong waited for the policy's 0.2 s call"
    first.close()
    second.close()


def test_two_connections_infers_arrive_in_one_call(serve):
    policy = Batching()
    server = serve(policy)
    holder, a, b = client(server), client(server), client(server)
    wait_until(lambda: policy.connections == 3, WAIT_S, "the three connections set up")  # no setup call is pending
    holder.send(infer_frame([0], slow=True))
    assert policy.started.wait(WAIT_S)
    a.send(infer_frame([1]))
    b.send(infer_frame([2, 5]))
    wait_until(lambda: server._worker.pending >= 2, WAIT_S, "both infers waiting for the worker")
    policy.release.set()
    assert actions_of(holder, [0]).tolist() == [[[0, 0]]] * 2
    assert actions_of(a, [1]).tolist() == [[[1, 1]]] * 2
    assert actions_of(b, [2, 5]).tolist() == [[[2, 2], [5, 5]]] * 2
    assert policy.sizes == [1, 2]
    for ws in (holder, a, b):
        ws.close()


def test_the_worker_batches_what_waits_and_keeps_every_callers_order():
    policy = Batching()

    async def run() -> list[np.ndarray]:
        worker = PolicyWorker(policy)
        conns = [policy.for_connection() for _ in range(3)]
        obs = [{"images": {}, "states": {"x": np.full((1, 1), 1.0 if k == 0 else 0.0)}, "text": None}
               for k in range(3)]
        first = asyncio.ensure_future(worker.infer(conns[0], obs[0], np.array([0]), np.zeros(1, np.int64)))
        assert await asyncio.to_thread(policy.started.wait, WAIT_S)
        rest = [asyncio.ensure_future(worker.infer(conns[k], obs[k], np.array([10 * k]), np.zeros(1, np.int64)))
                for k in (1, 2)]
        await asyncio.sleep(0)  # both submitted
        policy.release.set()
        try:
            return list(await asyncio.wait_for(asyncio.gather(first, *rest), WAIT_S))
        finally:
            worker.close()

    replies = asyncio.run(run())
    assert [r[0, 0, 0] for r in replies] == [0, 10, 20]
    assert policy.sizes == [1, 2]


@pytest.mark.parametrize("gather_s", [0.0, 0.25])
def test_with_gather_a_burst_of_infers_is_one_call(gather_s: float):
    """Infers submitted one after another while no call runs: without gathering the first one runs at once, alone
    (the others take the next call); with it, those that come less than ``gather_s`` apart join the first. (The
    gap here is generous: a loaded machine may pause the submitting thread for milliseconds.)"""
    policy = Batching()

    async def run() -> list[np.ndarray]:
        worker = PolicyWorker(policy, gather_s=gather_s, gather_max_s=WAIT_S)
        conns = [policy.for_connection() for _ in range(3)]
        calls = []
        for k in range(3):
            obs = {"images": {}, "states": {"x": np.full((1, 1), 1.0 if k == 0 else 0.0)}, "text": None}
            calls.append(asyncio.ensure_future(worker.infer(conns[k], obs, np.array([10 * k]), np.zeros(1, np.int64))))
            await asyncio.sleep(0)  # submitted
            if k == 0 and not gather_s:
                assert await asyncio.to_thread(policy.started.wait, WAIT_S), "the first runs at once"
        policy.release.set()
        try:
            return list(await asyncio.wait_for(asyncio.gather(*calls), WAIT_S))
        finally:
            worker.close()

    replies = asyncio.run(run())
    assert [r[0, 0, 0] for r in replies] == [0, 10, 20]
    assert policy.sizes == ([3] if gather_s else [1, 2])


def test_a_policy_that_raises_fails_its_caller_and_the_worker_goes_on():
    class Exiting(Held):
        def act(self, obs: dict[str, Any], n: int) -> np.ndarray:
            raise SystemExit(3)

    policy = Exiting()

    async def run() -> tuple[BaseException, np.ndarray]:
        worker = PolicyWorker(policy)
        try:
            with pytest.raises(RuntimeError, match="the policy raised SystemExit: 3") as info:
                await asyncio.wait_for(worker.call(policy.act, {}, 1), WAIT_S)
            obs = {"images": {}, "states": {"x": np.zeros((1, 1))}, "text": None}
            after = await asyncio.wait_for(worker.infer(policy, obs, np.array([7]), np.zeros(1, np.int64)), WAIT_S)
            return info.value, after
        finally:
            worker.close()

    error, after = asyncio.run(run())
    assert isinstance(error.__cause__, SystemExit) and after[0, 0, 0] == 7


def test_a_protocol_error_of_a_batch_resyncs_each_connection_in_it(serve):
    class Refusing(Batching):
        def infer_batch(self, calls: list[InferCall]) -> list[np.ndarray]:
            if len(calls) > 1:
                raise ProtocolError("these observations cannot be used together")
            return super().infer_batch(calls)

    policy = Refusing()
    server = serve(policy)
    holder, a, b = client(server), client(server), client(server)
    wait_until(lambda: policy.connections == 3, WAIT_S, "the three connections set up")  # no setup call is pending
    holder.send(infer_frame([0], slow=True))
    assert policy.started.wait(WAIT_S)
    a.send(infer_frame([1]))
    b.send(infer_frame([2]))
    wait_until(lambda: server._worker.pending >= 2, WAIT_S, "both infers waiting for the worker")
    policy.release.set()
    assert actions_of(holder, [0]).shape == (2, 1, 2)
    for ws in (a, b):
        with pytest.raises(ConnectionClosed) as info:
            ws.recv(timeout=WAIT_S)
        assert info.value.rcvd is not None and info.value.rcvd.reason == messages.REASON_RESYNC
    holder.send(codec.packb(messages.Feedback(
        np.array([0]), np.zeros(1, np.int64), {"images": {}, "states": {"x": np.zeros((1, 1))}, "text": None},
        np.zeros(1, np.float32), np.zeros(1, bool), np.zeros(1, bool), {}).message()))
    holder.send(infer_frame([0]))
    assert actions_of(holder, [0]).shape == (2, 1, 2)  # the others' resync ended nothing else
    holder.close()


def test_a_fast_policy_is_called_on_the_loop_and_a_slow_one_in_the_worker():
    """The built-in policies say they are fast (``off_loop`` False): their calls run on the event loop, with no
    thread hop; a policy that does not say so runs in the worker thread."""

    class Fast(Held):
        off_loop = False

    async def run(policy: Held) -> np.ndarray:
        worker = PolicyWorker(policy)
        obs = {"images": {}, "states": {"x": np.zeros((1, 1))}, "text": None}
        try:
            return await asyncio.wait_for(worker.infer(policy, obs, np.array([3]), np.zeros(1, np.int64)), WAIT_S)
        finally:
            worker.close()

    fast, slow = Fast(), Held()
    assert asyncio.run(run(fast))[0, 0, 0] == 3 and asyncio.run(run(slow))[0, 0, 0] == 3
    assert fast.threads == {threading.main_thread().name}
    assert slow.threads == {"plugrl-policy-worker"}
    from plugrl_env_client.server.policies import ArsPolicy, RandomPolicy, TextPolicy, ZeroPolicy

    assert not any(cls.off_loop for cls in (RandomPolicy, ZeroPolicy, TextPolicy, ArsPolicy))
