"""The session: what a feedback costs, split as PlugRL's client splits it, measured over a real loopback socket."""

from __future__ import annotations

import threading

import numpy as np

from plugrl_env_client.envs.base_env import Observation
from plugrl_env_client.protocol import messages
from plugrl_env_client.protocol.dialing import SessionConfig
from plugrl_env_client.protocol.session import Session


def test_feedback_times_its_observation_and_its_info_inside_its_own_time(harness):
    got: list[dict] = []
    done = threading.Event()

    def script(conn):
        conn.send_metadata(action_horizon=2)
        conn.send_zero_action(conn.recv(), 2, 1)
        got.append(conn.recv())
        conn.send_zero_action(conn.recv(), 2, 1)
        got.append(conn.recv())
        done.set()
        conn.recv()  # until the client closes

    h = harness(script)
    session = Session(SessionConfig(url=f"ws://127.0.0.1:{h.port}"))
    session.open()
    ids, steps, n = np.arange(2), np.zeros(2, np.int64), 2
    small = Observation(states={"x": np.zeros((n, 1))}, text="a")
    session.infer(messages.InferRequest(small, ids, steps))
    timing = session.timing
    assert timing.feedback_obs_pack_s == timing.feedback_info_pack_s == 0.0
    big = Observation(images={"cam": np.ones((n, 1024, 1024, 4), np.uint8)}, states={"x": np.zeros((n, 1))}, text="a")
    flags = np.zeros(n, bool)
    session.feedback(messages.Feedback(ids, steps, big, np.zeros(n, np.float32), flags, flags, {"episode": {"r": np.ones(n)}}))
    obs_part, info_part = timing.feedback_obs_pack_s, timing.feedback_info_pack_s
    assert obs_part > 0 and info_part > 0
    session.infer(messages.InferRequest(small, ids, steps + 1))  # one feedback per action (SPEC §2)
    session.feedback(messages.Feedback(ids, steps + 1, small, np.zeros(n, np.float32), flags, flags,
                     {"blob": np.ones((n, 4 << 20), np.uint8)}))
    assert done.wait(30)
    assert timing.feedback_calls == 2
    assert timing.feedback_obs_pack_s + timing.feedback_info_pack_s <= timing.feedback_s, "parts of feedback_s"
    assert timing.feedback_info_pack_s - info_part > 0 and timing.feedback_obs_pack_s - obs_part > 0
    assert got[0]["data"]["obs"]["images"]["cam"].shape == (n, 1024, 1024, 4)
    assert got[1]["data"]["info"]["blob"].shape == (n, 4 << 20) and got[1]["step_ids"].tolist() == [1, 1]
    session.close()
