"""The language-agent conventions the runner follows (ROLL/GEM): metrics aggregated per episode by mode,
instructions, envs retired when their reset has no episode, env-owned timeouts, and seed groups (GRPO)."""

from __future__ import annotations

import collections
import json
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from agent_envs import CountingConfig
from fake_server import FakeServer, MemoryBudget, MemorySink, loop_settings
from scripted_env import ScriptedEnv, by_env

from plugrl_env_client.app import run_client
from plugrl_env_client.config import ClientConfig, RunnerConfig
from plugrl_env_client.envs import discover_envs
from plugrl_env_client.rollout.group import EnvGroup
from plugrl_env_client.timing import Timing

discover_envs()
from plugrl_env_client.envs.guess_number.guess_number_env import GuessNumberConfig  # noqa: E402


def run(tmp_path: Path, env_id: str, env_config, name: str = "run", **kwargs) -> tuple[int, list[dict], dict]:
    runner = kwargs.pop("runner", RunnerConfig())
    cfg = ClientConfig(output_dir=tmp_path, exp_name=name, progress=False, env=env_config, runner=runner,
                       local_policy=kwargs.pop("local_policy", "text"), **kwargs)
    code = run_client(cfg, env_id)
    episodes = [json.loads(line) for path in sorted((tmp_path / name / "rollout").glob("proc_*/episodes.jsonl"))
                for line in path.read_text().splitlines()]
    summary = json.loads((tmp_path / name / "summary.json").read_text())
    return code, episodes, summary


def test_metrics_are_aggregated_per_episode_by_their_mode(tmp_path: Path) -> None:
    code, episodes, summary = run(tmp_path, "Counting-v1", CountingConfig(episode_length=3), num_envs=2,
                                  num_episodes=6)
    assert code == 0 and len(episodes) == 6
    for e in episodes:
        length = 3 + e["env_index"]
        assert e["length"] == length and e["terminated"] and e["truncated"], "an env timeout: both flags"
        assert e["metrics"] == {"step": sum(range(1, length + 1)), "step_max": length, "step_first": 10.0,
                                "value": 2.0}
    expected = sum(sum(range(1, 3 + e["env_index"] + 1)) for e in episodes) / 6
    assert summary["metrics"]["step"] == pytest.approx(expected)
    assert summary["metrics"]["value"] == 2.0


@pytest.mark.parametrize("config, message", [
    (CountingConfig(bad_mode="median"), "info['metrics_agg_mode']['step'] is 'median'; use one of sum, mean"),
    (CountingConfig(switch_mode_at=2), "info['metrics_agg_mode']['step'] changed from 'sum' to 'last'"),
])
def test_a_bad_or_changing_mode_is_an_error_the_first_time(tmp_path: Path, capsys, config, message) -> None:
    code, episodes, summary = run(tmp_path, "Counting-v1", config, num_envs=2, num_episodes=4)
    assert code == 1 and message in capsys.readouterr().err
    assert summary["status"] == "failed"


def test_instructions_go_in_front_of_each_first_observation_and_into_the_record(tmp_path: Path) -> None:
    code, episodes, _ = run(tmp_path, "Counting-v1", CountingConfig(), num_envs=2, num_episodes=4)
    assert code == 0
    assert {(e["env_index"], e["instruction"]) for e in episodes} == {(0, "count for env 0"), (1, "count for env 1")}


def test_envs_without_episodes_are_retired_and_the_run_ends(tmp_path: Path) -> None:
    """No --num-episodes: the run ends once every env is retired (2 episodes each), with status finished."""
    code, episodes, summary = run(tmp_path, "Counting-v1", CountingConfig(episodes_per_env=2), num_envs=3)
    assert code == 0
    assert collections.Counter(e["env_index"] for e in episodes) == {0: 2, 1: 2, 2: 2}
    assert summary["status"] == "finished"
    # env i runs 2 episodes of 4 + i steps; the batch steps until env 2 is done, the others' extra steps idle
    timing = summary["timing"]
    assert timing["env_steps"] == sum(2 * (4 + i) for i in range(3))
    assert timing["idle_env_steps"] == timing["batch_steps"] * 3 - timing["env_steps"] > 0


def test_a_retired_env_is_no_longer_inferred(tmp_path: Path, harness) -> None:
    from plugrl_env_client.protocol import messages

    def script(conn):
        conn.send_metadata(action_horizon=1)
        while True:
            msg = conn.recv()
            if msg["message_type"] == "infer":
                ids = msg["env_indices"]
                conn.send(messages.ActionReply(ids, [["a"] * len(ids)]).message())

    h = harness(script)
    cfg = ClientConfig(output_dir=tmp_path, exp_name="run", progress=False, num_envs=2, server_port=h.port,
                       env=CountingConfig(episode_length=2, episodes_per_env=1))
    assert run_client(cfg, "Counting-v1") == 0
    infers = [m["env_indices"].tolist() for m in h.connections[0].received if m["message_type"] == "infer"]
    assert infers[:2] == [[0, 1], [0, 1]] and infers[2:] == [[1]], "env 0 is retired after its episode (2 steps)"


def test_seed_groups_start_every_member_from_one_seed(tmp_path: Path) -> None:
    """GuessNumber-v1, groups of 4: the members of a group start each episode from the same seed (the same secret
    number), a new one per group episode, the same run to run."""
    def go(name: str) -> list[dict]:
        code, episodes, _ = run(tmp_path, "GuessNumber-v1", GuessNumberConfig(low=1, high=50, max_turns=3), name=name,
                                num_envs=8, num_episodes=24, local_policy_choices=("<answer>7</answer>", "hmm"),
                                runner=RunnerConfig(seed=11, group_size=4))
        assert code == 0
        return episodes

    def timeless(episodes: list[dict]) -> list[dict]:
        return [{k: v for k, v in e.items() if k != "wall_time_s"} for e in episodes]

    a = go("a")
    assert timeless(go("b")) == timeless(a), "the same run twice gives the same episodes"
    by_group = collections.defaultdict(lambda: collections.defaultdict(list))
    for e in a:
        by_group[e["env_index"] // 4][e["env_index"]].append(e["seed"])
    for group, members in by_group.items():
        sequences = list(members.values())
        m = min(len(s) for s in sequences)
        assert m >= 1
        for k in range(m):
            assert len({s[k] for s in sequences}) == 1, f"group {group} episode {k}: members' seeds differ"
        assert len(set(sequences[0][:m])) == m, "a new seed for each group episode"
    assert len({members[4 * g][0] for g, members in by_group.items()}) == len(by_group), "groups differ"


def test_seed_groups_need_an_env_that_takes_per_env_seeds(tmp_path: Path, capsys) -> None:
    code, _, summary = run(tmp_path, "Counting-v1", CountingConfig(), num_envs=4, num_episodes=4,
                           runner=RunnerConfig(group_size=2))
    assert code == 1 and "does not take per-env seeds" in capsys.readouterr().err


def test_align_chunks_ends_nearly_used_chunks_with_the_others(harness, tmp_path: Path) -> None:
    """--runner.align-chunks 2 with chunks of 4: an env with at most 2 steps left joins the feedback of envs whose
    chunk ended, with exactly the steps it took (a prefix of its chunk), and the run needs fewer round trips."""
    from probe_protocol import D, encode, probe_script

    from plugrl_env_client.envs.probe.probe_env import ProbeEnvConfig

    def run_probe(name: str, align: int):
        h = harness(probe_script(4, stop_after_feedbacks=None))
        # shared: no env retires with its static share at the end, which ends the others' chunks too (a feedback
        # of envs that start nothing must be followed by an infer of the rest)
        cfg = ClientConfig(num_envs=6, num_episodes=30, server_port=h.port, output_dir=tmp_path, exp_name=name,
                           progress=False, env=ProbeEnvConfig(action_dim=D),
                           runner=RunnerConfig(align_chunks=align, episode_split="shared"))
        assert run_client(cfg, "Probe-v1") == 0 and not h.errors
        return h.connections[0].received

    plain, aligned = run_probe("plain", 0), run_probe("aligned", 2)
    infers = {name: sum(m["message_type"] == "infer" for m in msgs) for name, msgs in (("plain", plain),
                                                                                      ("aligned", aligned))}
    assert infers["aligned"] < infers["plain"]
    cut = 0
    chunk = {}
    for msg in aligned:
        if msg["message_type"] == "infer":
            for row, env in enumerate(msg["env_indices"].tolist()):
                chunk[env] = (msg["_call"], float(msg["data"]["states"]["t"][row, 0]))
            continue
        data = msg["data"]
        for row, env in enumerate(msg["env_indices"].tolist()):
            call, t0 = chunk.pop(env)
            k = int(data["rewards"][row])  # reward 1 per step
            assert float(data["obs"]["states"]["t"][row, 0]) == t0 + k
            np.testing.assert_array_equal(data["obs"]["states"]["a"][row], encode(call, k - 1, env, np.arange(D)))
            if k < 4 and not data["terminated"][row]:
                assert k >= 2, "only chunks with at most 2 steps left are ended early"
                cut += 1
    assert cut > 0


@pytest.mark.parametrize("env_id, env_config, runner", [
    ("GuessNumber-v1", GuessNumberConfig(high=4), RunnerConfig(group_size=4)),  # members wait for their group
    ("Counting-v1", CountingConfig(episode_length=2, episodes_per_env=2), RunnerConfig()),  # envs retire
    # envs retire, and the env says so up front rather than with no_episode in its first reset
    ("CountingFinite-v1", CountingConfig(episode_length=2, episodes_per_env=2, no_episode_when_out_only=True),
     RunnerConfig()),
])
def test_idle_envs_never_break_the_infer_feedback_alternation(tmp_path: Path, env_id, env_config, runner) -> None:
    """Chunks of 4 steps, envs going idle right after their feedback: the strict reference server never has to
    resync the connection (every feedback is followed by an infer)."""
    choices = ("<answer>1</answer>", "<answer>2</answer>", "<answer>3</answer>", "<answer>4</answer>", "no idea")
    code, episodes, summary = run(tmp_path, env_id, env_config, num_envs=8, local_policy_choices=choices,
                                  num_episodes=16 if env_id == "GuessNumber-v1" else None, runner=runner)
    assert code == 0 and episodes
    assert summary["timing"]["reconnects"] == 0
    assert "protocol violation" not in (tmp_path / "run" / "logs" / "client.log").read_text()


def test_the_step_observation_is_let_go_before_the_reset(tmp_path: Path, registry) -> None:
    """A partial reset returns a whole new batch: the finished step's observation (tens of MB for a camera batch)
    must not be kept alive while the env builds it."""
    import weakref

    from plugrl_env_client.envs.base_env import BaseEnv, BaseEnvConfig, Observation
    from plugrl_env_client.utils.registration import register_env, register_env_config

    @register_env_config("Freed-v1")
    class FreedConfig(BaseEnvConfig):
        pass

    @register_env("Freed-v1")
    class FreedEnv(BaseEnv[FreedConfig]):
        def __init__(self, config: FreedConfig, num_envs: int = 1, **kwargs) -> None:
            super().__init__(config, num_envs=num_envs, **kwargs)
            self.single_action_space = gym.spaces.Box(-1, 1, (1,), np.float32)
            self.t = np.zeros(num_envs, np.int64)
            self.last_step: weakref.ref | None = None
            self.alive_at_reset: list[bool] = []

        def _obs(self) -> Observation:
            return Observation(states={"t": self.t[:, None].astype(np.float32)})

        def reset(self, *, seed=None, options=None):
            if self.last_step is not None:
                self.alive_at_reset.append(self.last_step() is not None)
            self.t[self.reset_mask(options)] = 0
            return self._obs(), {}

        def step(self, actions):
            self.t += 1
            obs = self._obs()
            self.last_step = weakref.ref(obs.states["t"])
            done = self.t >= 1 + np.arange(self.num_envs)  # env i's episodes last i + 1 steps: partial resets
            return obs, np.zeros(self.num_envs, np.float32), done, np.zeros(self.num_envs, bool), {}

    built: list[FreedEnv] = []
    original = FreedEnv.__init__

    def tracking_init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        built.append(self)

    FreedEnv.__init__ = tracking_init  # type: ignore[method-assign]
    cfg = ClientConfig(output_dir=tmp_path, exp_name="run", progress=False, num_envs=3, num_episodes=12,
                       env=FreedConfig(), local_policy="random")
    assert run_client(cfg, "Freed-v1") == 0
    resets = [alive for env in built for alive in env.alive_at_reset]
    assert resets and not any(resets), resets


def test_a_step_sends_its_feedback_before_it_returns() -> None:
    """``EnvGroup.step`` is the pipe from the env to the socket: the feedback of the chunks that ended on a step is
    with the server when the step comes back, carrying that step's (terminal) observation, before anything resets."""
    server = FakeServer(horizon=1)
    env = ScriptedEnv(2, by_env([1, 3]))
    group = EnvGroup(env, server.session(), loop_settings(), MemoryBudget(4), MemorySink(), Timing())
    group.connect()
    group.request_actions(group.reset_all())
    conn = server.sessions[0].connections[0]
    step = group.step()
    assert [m.kind for m in conn.received] == ["infer", "feedback"]
    feedback = conn.feedbacks[0]
    assert feedback.env_indices.tolist() == [0, 1] == step.chunk_ended.tolist()
    assert feedback.terminated.tolist() == [True, False] == step.terminated.tolist()
    for key, sent in feedback.obs.states.items():
        assert np.array_equal(sent, step.obs.states[key])
    group.close()
