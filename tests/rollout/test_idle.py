"""IdleEnvs: the one owner of which envs take part in a step."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from plugrl_env_client.errors import EnvContractError
from plugrl_env_client.rollout.idle import IdleEnvs


def test_while_every_env_takes_part_the_masks_are_not_applied() -> None:
    idle = IdleEnvs(3)
    needing = np.array([True, False, True])
    assert idle.everyone and idle.count == 3
    assert idle.only(needing) is needing
    assert idle.rows().tolist() == [0, 1, 2]
    rewards, terminated = np.array([1.0, 2.0, 3.0], np.float32), np.array([False, True, False])
    out = idle.leave_out(rewards, terminated, ~terminated)
    assert out[0] is rewards and out[1] is terminated and out[3].size == 0


def test_waiting_and_retired_envs_are_left_out_until_they_start_again() -> None:
    idle = IdleEnvs(4, "Toy-v1", offset=4)
    idle.wait(np.array([1]))
    idle.retire_without_episode({"no_episode": np.array([False, False, True, False])}, np.array([2, 3]))
    assert idle.active.tolist() == [True, False, False, True] and idle.count == 2 and not idle.everyone
    assert idle.only(np.ones(4, bool)).tolist() == [True, False, False, True]
    assert idle.rows().tolist() == [0, 3]
    rewards, terminated, truncated, quiet = idle.leave_out(
        np.array([1.0, 2.0, 3.0, 4.0], np.float32), np.array([False, True, True, False]), np.zeros(4, bool))
    assert rewards.tolist() == [1.0, 0.0, 0.0, 4.0] and rewards.dtype == np.float32
    assert not terminated.any() and not truncated.any()
    assert quiet.tolist() == [2]  # the retired row that ended is reset quietly; the waiting one is left as it is
    idle.start(np.array([1]))
    assert idle.active.tolist() == [True, True, False, True] and idle.count == 3 and not idle.all_retired


def test_a_reset_without_episodes_retires_those_envs_says_so_and_keeps_the_others(caplog) -> None:
    idle = IdleEnvs(3, "Toy-v1", offset=6)
    assert not idle.may_retire
    with caplog.at_level(logging.INFO):
        kept = idle.retire_without_episode({"no_episode": True}, np.array([0, 2]),
                                           none_left=np.array([False, True, False]))
    assert kept.size == 0 and idle.retired.tolist() == [True, False, True] and idle.may_retire
    assert "env Toy-v1: no episode left for envs [6, 8]; they are retired" in caplog.text
    kept = idle.retire_without_episode({}, np.array([1]), none_left=np.array([False, True, False]))
    assert kept.size == 0 and idle.all_retired and idle.count == 0


def test_a_reset_that_reports_nothing_retires_nobody() -> None:
    idle = IdleEnvs(2)
    assert idle.retire_without_episode({}, np.array([0, 1])).tolist() == [0, 1]
    assert idle.everyone and not idle.may_retire


def test_no_episode_of_a_wrong_shape_is_a_contract_error_naming_the_key() -> None:
    with pytest.raises(EnvContractError, match=r"info\['no_episode'\] must be a bool or one bool per env \(3\)"):
        IdleEnvs(3).retire_without_episode({"no_episode": np.zeros(2, bool)}, np.arange(3))
