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
                conn.send(messages.ActionReply(ids, chunk).message())
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


def _register_long_echo() -> None:
    """A text env (in the test's registry) that echoes each action whole, however long."""
    import dataclasses

    import gymnasium as gym

    from plugrl_env_client.envs.base_env import BaseEnv, BaseEnvConfig, Observation
    from plugrl_env_client.utils.registration import register_env, register_env_config

    @register_env_config("LongEcho-v1")
    @dataclasses.dataclass
    class LongEchoConfig(BaseEnvConfig):
        episode_length: int = 3

    @register_env("LongEcho-v1")
    class LongEchoEnv(BaseEnv[LongEchoConfig]):
        def __init__(self, config: LongEchoConfig, num_envs: int = 1, **kwargs) -> None:
            super().__init__(config, num_envs=num_envs, **kwargs)
            self.single_action_space = gym.spaces.Text(max_length=1 << 20)
            self.t = np.zeros(num_envs, np.int64)
            self.last = ["start"] * num_envs

        def reset(self, *, seed=None, options=None):
            mask = self.reset_mask(options)
            self.t[mask] = 0
            return Observation(text=list(self.last)), {"env_instruction": "é" * 3 + "instruction"}

        def step(self, actions):
            self.last = [str(a) for a in actions]
            self.t += 1
            n = self.num_envs
            return Observation(text=list(self.last)), np.zeros(n, np.float32), self.t >= 3, np.zeros(n, bool), {}


LONG = "ü" + "x" * 9_998 + "🙂"  # 10k characters, non-ASCII at both ends


def test_long_and_non_ascii_text_is_never_cut(harness, tmp_path, registry):
    """Actions of 10k characters sent as msgpack lists of str, and the env's 10k-character observations, arrive
    whole at both ends; the instruction goes in front of each episode's first observation."""
    _register_long_echo()

    def script(conn):
        conn.send_metadata(action_horizon=2)
        while True:
            msg = conn.recv()
            if msg["message_type"] == "infer":
                ids = msg["env_indices"].tolist()
                chunk = [[f"{LONG}{e}" for e in ids] for _ in range(2)]  # a list of lists, not a '<U' array
                conn.send({"message_type": "action", "data": {"env_ids": msg["env_indices"], "action": chunk}})

    h = harness(script)
    cfg = ClientConfig(num_envs=2, num_episodes=4, server_port=h.port, output_dir=tmp_path, exp_name="run",
                       progress=False)
    assert run_client(cfg, "LongEcho-v1") == 0 and not h.errors
    received = h.connections[0].received
    feedback = [m for m in received if m["message_type"] == "feedback"]
    for m in feedback:
        for row, env in enumerate(m["env_indices"].tolist()):
            assert str(m["data"]["obs"]["text"][row]) == f"{LONG}{env}"
    first_infer = received[0]
    assert [str(t) for t in first_infer["data"]["text"]] == ["éééinstruction\n\nstart"] * 2
    episodes = [json.loads(line) for line in (tmp_path / "run/rollout/proc_000/episodes.jsonl").read_text().splitlines()]
    assert {e["instruction"] for e in episodes} == {"éééinstruction"}
