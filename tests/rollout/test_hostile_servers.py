"""Broken or hostile servers: each gets a clear error (what was sent, what was expected), outputs, exit 1, no hang."""

from __future__ import annotations

import json
import time

import msgpack
import numpy as np
import pytest

from plugrl_env_client.app import run_client
from plugrl_env_client.config import ClientConfig, RunnerConfig
from plugrl_env_client.envs import discover_envs
from plugrl_env_client.protocol import codec, messages

discover_envs()
from plugrl_env_client.envs.point.point_env import PointEnvConfig  # noqa: E402


def nd(data: bytes, dtype: str, shape: list[int]) -> dict:
    return {b"__ndarray__": True, b"data": data, b"dtype": dtype, b"shape": shape}


def raw_action(ids: np.ndarray, action: dict | np.ndarray) -> bytes:
    env_ids = nd(ids.astype("<i8").tobytes(), "<i8", [len(ids)])
    return msgpack.packb({"message_type": "action", "data": {"env_ids": env_ids, "action": action}},
                         default=lambda a: nd(a.tobytes(), a.dtype.str, list(a.shape)))


def good(n: int, h: int = 4, dtype: str = "<f4") -> np.ndarray:
    return np.zeros((h, n, 2), dtype=dtype)


CASES = {
    "wrong-message-type": (lambda ids: codec.packb(messages.metadata_message({})), "expected a 'action' message, got 'metadata'"),
    "env-ids-mismatch": (lambda ids: codec.packb(messages.ActionReply(ids + 1, good(len(ids))).message()), "do not match the infer's env_indices"),
    "ndim": (lambda ids: codec.packb(messages.ActionReply(ids, np.zeros(len(ids), np.float32)).message()), "time-major"),
    "horizon-0": (lambda ids: codec.packb(messages.ActionReply(ids, good(len(ids), h=0)).message()), "horizon 0"),
    "string-dtype": (lambda ids: codec.packb(messages.ActionReply(ids, np.full((4, len(ids), 2), "x")).message()), "needs numbers"),
    "shape": (lambda ids: codec.packb(messages.ActionReply(ids, np.zeros((4, len(ids), 7), np.float32)).message()),
              "Expected action shape tail (2,), got (7,)"),
    "nan": (lambda ids: codec.packb(messages.ActionReply(ids, np.full((4, len(ids), 2), np.nan, np.float32)).message()),
            "NaN or infinite"),
    "not-msgpack": (lambda ids: b"\xc1\xc1\xc1", "not a valid msgpack message"),
    "data-length": (lambda ids: raw_action(ids, nd(b"\x00" * 5, "<f4", [4, len(ids), 2])), "bytes but shape"),
    "object-dtype": (lambda ids: raw_action(ids, nd(b"\x00" * 8, "|O", [1])), "refused"),
    "complex-dtype": (lambda ids: raw_action(ids, nd(b"\x00" * 16, "<c16", [1])), "refused"),
    "int-map-key": (lambda ids: msgpack.packb({"message_type": "action", "data": {1: 2}}), "map keys must be str or bytes"),
}


def config(tmp_path, port, **kwargs) -> ClientConfig:
    return ClientConfig(num_envs=2, server_port=port, output_dir=tmp_path, exp_name="run", progress=False,
                        env=PointEnvConfig(), **kwargs)


def answer_first_infer_with(frame_for):
    def script(conn):
        conn.send_metadata(action_horizon=4, action_dim=2)
        msg = conn.recv()
        conn.ws.send(frame_for(msg["env_indices"]))
        conn.ws.recv()  # until the client closes

    return script


@pytest.mark.parametrize("case", sorted(CASES))
def test_malformed_action_is_a_clear_fatal_error(harness, tmp_path, capsys, case):
    frame_for, expected = CASES[case]
    h = harness(answer_first_infer_with(frame_for))
    start = time.monotonic()
    assert run_client(config(tmp_path, h.port), "Point-v1") == 1
    assert time.monotonic() - start < 30
    err = capsys.readouterr().err
    assert expected in err, err
    assert "Traceback" not in err
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "failed"


def test_chunk_shorter_than_replan_steps(harness, tmp_path, capsys):
    h = harness(answer_first_infer_with(lambda ids: codec.packb(messages.ActionReply(ids, good(len(ids), h=2)).message())))
    assert run_client(config(tmp_path, h.port, runner=RunnerConfig(replan_steps=3)), "Point-v1") == 1
    assert "--runner.replan-steps is 3" in capsys.readouterr().err


def test_non_finite_actions_can_be_clipped(harness, tmp_path):
    def script(conn):
        conn.send_metadata(action_horizon=4, action_dim=2)
        while True:
            msg = conn.recv()
            if msg["message_type"] == "infer":
                actions = np.full((4, len(msg["env_indices"]), 2), np.nan, np.float32)
                actions[:, :, 1] = np.inf
                conn.send(messages.ActionReply(msg["env_indices"], actions).message())

    h = harness(script)
    cfg = config(tmp_path, h.port, num_episodes=2, runner=RunnerConfig(non_finite_actions="clip", max_episode_steps=5))
    assert run_client(cfg, "Point-v1") == 0
    feedback = [m for m in h.connections[0].received if m["message_type"] == "feedback"]
    assert all(np.isfinite(m["data"]["obs"]["states"]["pos"]).all() for m in feedback)
