"""Text actions (language-agent envs): a ``gymnasium.spaces.Text`` action space takes '<U' chunks end to end."""

from __future__ import annotations

import json

import numpy as np
from conformance_envs import EchoTextConfig

from plugrl_env_client.app import run_client
from plugrl_env_client.config import ClientConfig
from plugrl_env_client.protocol import messages
from plugrl_env_client.rollout.chunks import ActionPlans


def test_plans_widen_for_longer_strings():
    plans = ActionPlans(2, (), np.dtype("<U"), None)
    plans.load(np.arange(2), np.array([["go", "stop"]]))  # [H=1, n=2]
    assert plans.next_actions().tolist() == ["go", "stop"]
    plans.advance(np.zeros(2), np.zeros(2, bool))
    plans.load(np.arange(2), np.array([["a much longer answer", "b"]]))
    assert plans.next_actions().tolist() == ["a much longer answer", "b"]


def test_text_actions_reach_the_env_in_order(harness, tmp_path):
    def script(conn):
        conn.send_metadata(action_horizon=2)
        call = 0
        while True:
            msg = conn.recv()
            if msg["message_type"] == "infer":
                ids = msg["env_indices"]
                chunk = np.array([[f"c{call} t{t} e{e}" for e in ids.tolist()] for t in range(2)])
                conn.send(messages.action_message(ids, chunk))
                call += 1

    h = harness(script)
    cfg = ClientConfig(num_envs=2, num_episodes=4, server_port=h.port, output_dir=tmp_path, exp_name="run",
                       progress=False, env=EchoTextConfig())
    assert run_client(cfg, "EchoText-v1") == 0
    feedback = [m for m in h.connections[0].received if m["message_type"] == "feedback"]
    # the env echoes the last text action it got as its observation text: the chunk's last step, per env
    for m in feedback:
        for row, env in enumerate(m["env_indices"].tolist()):
            assert m["data"]["obs"]["text"][row].endswith(f"t1 e{env}")
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["completed_episodes"] == 4
