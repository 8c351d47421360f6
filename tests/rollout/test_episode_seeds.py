"""Every episode's start seed, derived from the run seed and the episode's place, end to end: Point-v1 over real
sockets (an episode's start does not depend on the episodes before it), and two client processes."""

from __future__ import annotations

import collections
import json
from pathlib import Path
from typing import Any

import numpy as np

from plugrl_env_client.app import run_client
from plugrl_env_client.config import ClientConfig, RunnerConfig
from plugrl_env_client.envs import discover_envs
from plugrl_env_client.protocol import messages

discover_envs()
from plugrl_env_client.envs.point.point_env import PointEnv, PointEnvConfig  # noqa: E402


def rule_seed(run_seed: int, num_envs: int, process: int, env: int, episode: int) -> int:
    """The documented start seed of episode ``episode`` (from 0) of env ``env`` of process ``process``, computed
    from the rule: the first from the process seed plus the env index, later ones from
    ``SeedSequence(process seed, spawn_key=(process, env, episode))``."""
    root = run_seed + process * num_envs
    if episode == 0:
        return root + env
    return int(np.random.SeedSequence(root, spawn_key=(process, env, episode)).generate_state(1)[0])


def episodes_by_env(run: Path) -> dict[tuple[int, int], list[dict[str, Any]]]:
    """(process, env index) -> the env's episode records, in order."""
    out: dict[tuple[int, int], list[dict[str, Any]]] = collections.defaultdict(list)
    for path in sorted(run.glob("rollout/proc_*/episodes.jsonl")):
        for line in path.read_text().splitlines():
            e = json.loads(line)
            out[(e["process_id"], e["env_index"])].append(e)
    return out


def point_server(chase: bool, starts: dict[int, list[np.ndarray]], episodes_of_env_1: int):
    """A server answering Point-v1's infers one step at a time: env 0 heads for its goal when ``chase`` (short
    episodes), else stands still; env 1 always stands still. Each env's episode starts (pos and goal as the infer
    after its reset shows them) go to ``starts``; the run ends once env 1 has begun ``episodes_of_env_1`` episodes."""
    def script(conn: Any) -> None:
        conn.send_metadata(protocol_version=1, action_horizon=1, action_dim=2)
        fresh = {0: True, 1: True}
        while True:
            msg = conn.recv()
            ids = msg["env_indices"].tolist()
            if msg["message_type"] == "feedback":
                for j, e in enumerate(ids):
                    fresh[e] = bool(msg["data"]["terminated"][j] or msg["data"]["truncated"][j])
                continue
            states = msg["data"]["states"]
            actions = np.zeros((1, len(ids), 2))
            for j, e in enumerate(ids):
                if fresh[e]:
                    starts[e].append(np.concatenate([states["pos"][j], states["goal"][j]]))
                    fresh[e] = False
                if chase and e == 0:
                    actions[0, j] = np.clip((states["goal"][j] - states["pos"][j]) / 0.1, -1.0, 1.0)
            if len(starts[1]) > episodes_of_env_1:
                conn.close(1001, messages.REASON_STOP)
                return
            conn.send(messages.ActionReply(np.asarray(ids), actions).message())

    return script


def test_an_episodes_start_does_not_depend_on_the_episodes_before_it(harness, tmp_path: Path) -> None:
    """Point-v1, 2 envs, seed 3, time limit 15: env 0 runs short episodes under one server (it heads for its
    goal) and full-length ones under the other; env 1 stands still in both. Env 1's k-th episode starts from the
    same position and goal either way, the one its recorded seed gives, and every line's seed is the rule's."""
    runs = {}
    for chase in (True, False):
        starts: dict[int, list[np.ndarray]] = collections.defaultdict(list)
        h = harness(point_server(chase, starts, episodes_of_env_1=3))
        name = f"chase-{chase}"
        cfg = ClientConfig(output_dir=tmp_path, exp_name=name, progress=False, num_envs=2, server_port=h.port,
                           runner=RunnerConfig(seed=3, max_episode_steps=15))
        assert run_client(cfg, "Point-v1") == 0
        assert not h.errors, h.errors
        runs[chase] = (starts, episodes_by_env(tmp_path / name))
    (chased, chased_records), (still, still_records) = runs[True], runs[False]
    lengths = {chase: [e["length"] for e in records[(0, 0)]] for chase, records in ((True, chased_records),
                                                                                     (False, still_records))}
    assert len(lengths[True]) > len(lengths[False]) and min(lengths[True]) < 15 == max(lengths[False]), lengths
    assert len(chased[1]) == len(still[1]) == 4
    for k in range(4):
        np.testing.assert_array_equal(chased[1][k], still[1][k], err_msg=f"env 1's episode {k}")
    point = PointEnv(PointEnvConfig(), num_envs=2)
    for records, starts in ((chased_records, chased), (still_records, still)):
        for (process, env), episodes in records.items():
            assert [e["seed"] for e in episodes] == [rule_seed(3, 2, process, env, k) for k in range(len(episodes))]
            for k, e in enumerate(episodes):  # the recorded seed gives the start the server saw
                obs, _ = point.reset(seed=[e["seed"] if i == env else None for i in range(2)],
                                     options={"reset_mask": np.arange(2) == env})
                start = np.concatenate([obs.states["pos"][env], obs.states["goal"][env]])
                np.testing.assert_array_equal(start, starts[env][k], err_msg=f"env {env} episode {k}")
    point.close()


def test_two_processes_derive_every_seed_from_their_place(tmp_path: Path) -> None:
    """--num-procs 2 (two client processes), 2 envs each: every line's seed is the rule's for its process, env
    and episode number, and no two episodes of the run share a seed."""
    cfg = ClientConfig(output_dir=tmp_path, exp_name="procs", progress=False, num_envs=2, num_procs=2,
                       num_episodes=16, local_policy="zero", runner=RunnerConfig(seed=5, max_episode_steps=3))
    assert run_client(cfg, "Point-v1") == 0
    records = episodes_by_env(tmp_path / "procs")
    assert set(records) == {(p, e) for p in (0, 1) for e in (0, 1)}
    seeds = []
    for (process, env), episodes in records.items():
        assert len(episodes) >= 2
        assert [e["seed"] for e in episodes] == [rule_seed(5, 2, process, env, k) for k in range(len(episodes))]
        seeds += [e["seed"] for e in episodes]
    assert len(set(seeds)) == len(seeds) == 16
