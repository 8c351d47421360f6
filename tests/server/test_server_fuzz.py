"""Every field of valid infer and feedback messages, mutated into values of other types, shapes and contents, sent
to the reference server over real sockets.

Whatever the value, the server either answers with a resync whose log line names the field, or serves on: never
``1011 internal error``, never an error in its log, and a bystander client keeps being served throughout. Two
sweeps: every field with each of a fixed set of wrong values (so no field is left out), and hypothesis drawing
fields and values at random (arrays of any dtype and shape, nested maps, deleted keys, extra keys).
"""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from plugrl_env_client.errors import ProtocolError
from plugrl_env_client.protocol import codec, messages
from plugrl_env_client.server.policies import PolicyConfig, make_policy
from plugrl_env_client.server.server import PolicyServer

M = 2
DELETE = object()
"""A mutation that removes the key."""
FRESH = 10**6
"""Env indices no mutated message uses: what the checks after a mutated message send."""


def valid_obs(n: int = M) -> dict[str, Any]:
    return {"images": {"cam": np.full((n, 4, 4, 3), 7, np.uint8)},
            "states": {"x": np.arange(n * 3, dtype=np.float64).reshape(n, 3)},
            "text": np.array([f"env {i}" for i in range(n)])}


def valid_infer() -> dict[str, Any]:
    return {"message_type": "infer", "data": valid_obs(), "env_indices": np.arange(M, dtype=np.int64),
            "step_ids": np.zeros(M, np.int64), "reuse": np.zeros(M, bool)}


def valid_feedback() -> dict[str, Any]:
    done = np.array([True, False])
    info = {"is_step_success": np.zeros(M, bool),
            "episode": {"r": np.full(M, 3.0, np.float32), "l": np.full(M, 3, np.int64), "s": np.zeros(M, bool),
                        "mask": done.copy(), "mean_success_rate": 0.5},
            "metrics": {"dist": np.ones(M)}}
    return {"message_type": "feedback", "env_indices": np.arange(M, dtype=np.int64), "step_ids": np.ones(M, np.int64),
            "data": {"obs": valid_obs(), "rewards": np.ones(M, np.float32), "terminated": done,
                     "truncated": np.zeros(M, bool), "info": info}}


def paths(msg: dict[str, Any], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every key path of a message: maps and leaves."""
    out = []
    for key, value in msg.items():
        out.append((*prefix, key))
        if isinstance(value, dict):
            out.extend(paths(value, (*prefix, key)))
    return out


INFER_PATHS = paths(valid_infer())
FEEDBACK_PATHS = paths(valid_feedback())
STATE_PATHS = {p for p in INFER_PATHS if "states" in p}
"""The infer's state arrays: ARS binds its state layout to them (a change ends an ARS run by design)."""


def mutated(msg: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    node = msg
    for key in path[:-1]:
        node = node[key]
    if value is DELETE:
        node.pop(path[-1], None)
    else:
        node[path[-1]] = value
    return msg


def deep(levels: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    inner = out
    for _ in range(levels - 1):
        inner["k"] = {}
        inner = inner["k"]
    return out


FIXED_VALUES = [
    DELETE, None, True, 0, -1, 2**63 - 1, 1.5, math.nan, math.inf, "", "abc", b"\x00\xff", [], [1, "a", None],
    {}, {"k": np.zeros(M)}, {b"bytes": 1}, deep(40), np.float32(1.0), np.int64(-5), np.bool_(True),
    np.zeros((), np.float64), np.zeros(0), np.zeros(M + 1), np.full(M, -1, np.int64), np.full(M, np.nan),
    np.zeros((M, 0)), np.zeros((M, 3), np.float32), np.ones(M, bool), np.array(["a", "b"]), np.array([b"a", b"b"]),
    np.full(M, 2**64 - 1, np.uint64), np.zeros((1, M, 3), np.uint8), np.zeros(M, np.float16),
]


def arrays() -> st.SearchStrategy[np.ndarray]:
    dtypes = st.sampled_from(["|b1", "|i1", "<i8", "<u8", "<f2", "<f4", "<f8", "<U3", "|S3", "|u1", ">f8"])
    shapes = st.sampled_from([(), (0,), (1,), (M,), (M + 1,), (M, 0), (M, 3), (M, 4, 4, 3), (1, M, 3), (3, 1)])
    fill = st.sampled_from(["zeros", "ones", "neg", "nan", "big", "random"])

    def build(dtype: str, shape: tuple[int, ...], how: str) -> np.ndarray:
        dt = np.dtype(dtype)
        rng = np.random.default_rng(0)
        if dt.kind in "US":
            return np.full(shape, "x", dt)
        if how == "random":
            return rng.integers(0, 2, shape).astype(dt) if dt.kind in "biu" else rng.normal(size=shape).astype(dt)
        value = {"zeros": 0, "ones": 1, "neg": -1, "nan": math.nan, "big": 1e300}[how]
        if dt.kind in "biu" and how in ("nan", "big"):
            value = np.iinfo(dt).max if dt.kind in "iu" else 1
        if dt.kind in "ub" and how == "neg":
            value = np.iinfo(dt).max if dt.kind == "u" else 0
        with np.errstate(over="ignore", invalid="ignore"):
            return np.full(shape, value).astype(dt)

    return st.builds(build, dtypes, shapes, fill)


LEAVES = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8), st.binary(max_size=8), arrays(),
    st.sampled_from([np.float32(2.5), np.int8(-3), np.uint64(2**64 - 1), np.bool_(False), np.str_("s")]),
)
VALUES = st.one_of(
    st.just(DELETE),
    LEAVES,
    st.recursive(LEAVES, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner,
                                                                                     max_size=3), max_leaves=6),
    st.builds(deep, st.integers(1, 60)),
)


class Recorder(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


class Fuzzed:
    """One server for many examples, a log recorder on it, and a bystander client served between examples."""

    def __init__(self, policy: str) -> None:
        config = PolicyConfig(name=policy, action_dim=2) if policy == "ars" else PolicyConfig(action_dim=2)
        self.server = PolicyServer(make_policy(config), host="127.0.0.1", port=0).start()
        self.log = Recorder()
        self.logger = logging.getLogger("plugrl_env_client")
        self.logger.addHandler(self.log)
        self.level = self.logger.level
        self.logger.setLevel(logging.INFO)
        self.bystander, _ = self.open()
        self.bystander_envs = iter(range(10**6))

    def close(self) -> None:
        self.bystander.close()
        self.server.shutdown()
        self.logger.removeHandler(self.log)
        self.logger.setLevel(self.level)

    def open(self) -> Any:
        ws = connect(self.server.url, compression=None, max_size=None, proxy=None).__enter__()
        messages.parse_metadata(codec.unpackb(ws.recv(timeout=5)))
        return ws, ws.local_address[1]

    def served(self, ws: Any, env: int) -> bool:
        """An infer for a new env, then a feedback for it: True when the action came (the connection serves on)."""
        try:  # the server may have closed already: the close shows on this send or on the recv
            ws.send(codec.packb(messages.InferRequest(valid_obs(1), np.array([env]), np.zeros(1, np.int64)).message()))
            reply = codec.unpackb(ws.recv(timeout=10))
        except ConnectionClosed as closed:
            self.check_close(closed)
            return False
        messages.parse_action(reply, np.array([env]))
        ws.send(codec.packb(messages.Feedback(np.array([env]), np.ones(1, np.int64), valid_obs(1),
                                              np.ones(1, np.float32), np.zeros(1, bool), np.zeros(1, bool),
                                              {}).message()))
        return True

    def check_close(self, closed: ConnectionClosed) -> None:
        assert closed.rcvd is not None, "the server dropped the socket without a close frame"
        assert (closed.rcvd.code, closed.rcvd.reason) == (1001, messages.REASON_RESYNC), closed.rcvd

    def check_bystander(self) -> None:
        assert self.served(self.bystander, next(self.bystander_envs)), "the bystander was not served"

    def violation(self, port: int, since: int) -> str | None:
        """The violation logged for local ``port`` after record ``since`` (ports are reused across cases)."""
        found = [r.getMessage() for r in self.log.records[since:]
                 if "protocol violation" in r.getMessage() and f", {port})" in r.getMessage()]
        assert len(found) <= 1, found
        return found[0] if found else None

    def errors(self) -> list[str]:
        return [r.getMessage() for r in self.log.records if r.levelno >= logging.ERROR]

    def send_mutated(self, kind: str, path: tuple[str, ...], value: Any) -> None:
        """Send the valid message of ``kind`` with ``path`` set to ``value``; check what the server did."""
        msg = mutated(valid_infer() if kind == "infer" else valid_feedback(), path, value)
        try:
            frame = codec.packb(msg)
        except ProtocolError:
            return  # a value the codec cannot carry never reaches a server (the codec's own tests cover it)
        since = len(self.log.records)
        ws, port = self.open()
        try:
            if kind == "feedback":
                ws.send(codec.packb(valid_infer()))
                messages.parse_action(codec.unpackb(ws.recv(timeout=10)), np.arange(M))
            ws.send(frame)
            if kind == "infer":
                try:
                    reply = codec.unpackb(ws.recv(timeout=10))
                except ConnectionClosed as closed:
                    self.check_close(closed)
                    served = False
                else:
                    assert reply["message_type"] == "action", reply
                    served = self.served_after_infer(ws)
            else:
                served = self.served(ws, FRESH)
        finally:
            ws.close()
        said = self.violation(port, since)
        if not served:
            assert said is not None, f"resync without a logged violation for {path} = {value!r}"
            assert names(said, path, value), f"the violation does not name {path}: {said}"
        else:
            assert said is None, said
        assert not self.errors(), self.errors()
        self.check_bystander()

    def served_after_infer(self, ws: Any) -> bool:
        """After a served (mutated) infer: a feedback for an env that got no chunk (ignored by the server, SPEC
        7.6), then an infer for a new env."""
        ws.send(codec.packb(messages.Feedback(np.array([FRESH]), np.ones(1, np.int64), valid_obs(1),
                                              np.ones(1, np.float32), np.zeros(1, bool), np.zeros(1, bool),
                                              {}).message()))
        return self.served(ws, 101)


def names(said: str, path: tuple[str, ...], value: Any) -> bool:
    """Whether a violation's text names the mutated field (or, for a value holding a key the codec refuses, says
    so: such a frame is undecodable as a whole)."""
    leaf = path[-1]
    if leaf in said or repr(leaf) in said or (leaf == "message_type" and "message" in said):
        return True
    return _has_bad_key(value) and "key" in said


def _has_bad_key(value: Any) -> bool:
    if isinstance(value, dict):
        return any(not isinstance(k, str) or _has_bad_key(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_bad_key(v) for v in value)
    return False


@pytest.fixture(scope="module", params=["random", "ars"])
def fuzzed(request):
    made = Fuzzed(request.param)
    made.policy = request.param
    yield made
    made.close()


@pytest.mark.slow
def test_every_field_of_both_messages_with_each_fixed_value(fuzzed):
    """A resync naming the field, or serving on, for every field and each value of FIXED_VALUES (ARS: state
    arrays are left out, since an env whose state layout changes ends an ARS run by design)."""
    cases = [("infer", p) for p in INFER_PATHS] + [("feedback", p) for p in FEEDBACK_PATHS]
    for kind, path in cases:
        if fuzzed.policy == "ars" and path in STATE_PATHS:
            continue
        for value in FIXED_VALUES:
            fuzzed.send_mutated(kind, path, value)
    assert fuzzed.server.failure is None


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(data=st.data())
def test_random_fields_and_values(fuzzed, data):
    kind = data.draw(st.sampled_from(["infer", "feedback"]))
    choices = [p for p in (INFER_PATHS if kind == "infer" else FEEDBACK_PATHS)
               if not (fuzzed.policy == "ars" and p in STATE_PATHS)]
    path = data.draw(st.sampled_from(choices))
    if data.draw(st.booleans()) and isinstance(_at(kind, path), dict):
        path = (*path, data.draw(st.text(min_size=1, max_size=4)))  # an extra key in a map
    fuzzed.send_mutated(kind, path, data.draw(VALUES))
    assert fuzzed.server.failure is None


def _at(kind: str, path: tuple[str, ...]) -> Any:
    node: Any = valid_infer() if kind == "infer" else valid_feedback()
    for key in path:
        node = node[key]
    return node
