"""bench/learning.py's parity check, short enough for CI: ARS stepping Point-v1 itself vs. ARS through the real
client and server (separate processes, loopback) must agree on every episode."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from file_modules import bench_script

from plugrl_env_client.envs import discover_envs


@pytest.fixture(scope="module")
def learning():
    with bench_script("learning") as module:
        discover_envs()
        yield module


@pytest.mark.slow
def test_the_client_changes_nothing_the_learner_sees(learning, tmp_path):
    """Point-v1 with 4 envs and 6 rollouts per iteration: rollouts take turns, evaluations run in between, episodes
    end at different steps (at the goal, or at the registered limit of 100 steps); six iterations of it."""
    plain = learning.plain_run(learning.POINT, 6, 4)
    lengths = {e[2] for e in plain.episodes}
    assert len(lengths) > 3 and 100 in lengths, "the check needs episodes of different lengths"
    assert sum(r["eval_episodes"] for r in plain.iterations) > 0, "and evaluation episodes"
    client = learning.client_run(learning.POINT, 6, len(plain.episodes), 4, tmp_path)
    ok, line = learning.compare(plain, client, 6)
    assert ok, line
    assert line.startswith(f"parity: identical (6 iterations, {len(plain.episodes)} episodes")


@pytest.mark.slow
def test_early_terminations_of_a_mujoco_task_change_nothing_the_learner_sees(learning, tmp_path):
    """InvertedPendulum-v5 with 5 envs: episodes end early (the pole falls) at different steps for different envs;
    three iterations."""
    pytest.importorskip("mujoco", reason="MuJoCo-v1 needs the extra mujoco: pip install 'plugrl-env-client[mujoco]'")
    plain = learning.plain_run(learning.PENDULUM, 3, 1)
    lengths = {e[2] for e in plain.episodes}
    assert len(lengths) > 3 and max(lengths) < 1000, "the check needs early terminations of different lengths"
    client = learning.client_run(learning.PENDULUM, 3, len(plain.episodes), 1, tmp_path)
    ok, line = learning.compare(plain, client, 3)
    assert ok, line


def test_the_check_reports_the_first_episode_that_differs(learning):
    plain = learning.Run([(0, -3.5, 10), (1, -2.0, 7), (0, 1.25, 3)], [], np.zeros((1, 2)))
    off = dataclasses.replace(plain, episodes=[(0, -3.5, 10), (1, -2.001, 7), (0, 1.25, 3)])
    ok, line = learning.compare(plain, off, 1)
    assert not ok and "episode 1 differs" in line and "differs by 0.001" in line
    swapped = dataclasses.replace(plain, episodes=[(1, -2.0, 7), (0, -3.5, 10), (0, 1.25, 3)])
    assert "episode 0 differs" in learning.compare(plain, swapped, 1)[1]
    weights = dataclasses.replace(plain, weights=np.ones((1, 2)))
    assert "final weights differ" in learning.compare(plain, weights, 1)[1]
    assert learning.compare(plain, dataclasses.replace(plain), 1)[0]
