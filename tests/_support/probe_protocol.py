"""Probe-v1 protocol helpers shared by tests: a server script that encodes (chunk, step, env, dim) into action
values, and a checker that verifies a connection's transcript against the probe's rules."""

from __future__ import annotations

from typing import Any

import numpy as np

from plugrl_env_client.protocol import messages

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
                msg["_call"] = counter[0]
                counter[0] += 1
                conn.send(messages.ActionReply(ids, encode(msg["_call"], t, e, d)).message())
            else:
                feedbacks += 1
                if stop_after_feedbacks is not None and feedbacks >= stop_after_feedbacks:
                    conn.close(1001, messages.REASON_STOP)
                    return

    return script


def check_probe_transcript(received: list[dict[str, Any]], horizon: int, replan: int | None, num_envs: int,
                           retiring: bool = False) -> int:
    """Check one connection's messages against the probe's rules; returns the number of finished episodes.
    ``retiring``: envs retire with their share of the run's episodes, and a feedback of envs that start nothing ends
    the other envs' chunks too (a prefix of each), so that an infer follows it."""
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
            if retiring and not terminated:
                assert k <= steps, "a chunk ended early is a prefix of it"
            else:
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
