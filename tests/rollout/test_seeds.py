"""GroupSeeds: the first reset's seed, every later episode's seed derived with SeedSequence (per env, or shared by a
seed group)."""

from __future__ import annotations

import numpy as np
import pytest

from plugrl_env_client.errors import ConfigError
from plugrl_env_client.rollout.seeds import GroupSeeds, SeedGroups


def test_without_per_env_seeds_only_the_first_reset_is_seeded() -> None:
    seeds = GroupSeeds(10, process_id=1, offset=4, n=4, group_size=1)
    assert seeds.initial() == 14
    assert seeds.recorded(14, np.arange(4)) == [14, 15, 16, 17]
    assert seeds.upcoming(np.arange(4)) is None and seeds.recorded(None, np.arange(2)) == [None, None]
    assert GroupSeeds(None, 0, 0, 2, 1).initial() is None


def test_members_share_a_seed_and_each_group_episode_gets_a_new_one() -> None:
    seeds = GroupSeeds(3, process_id=0, offset=0, n=6, group_size=3)
    first = seeds.initial()
    assert isinstance(first, list) and first[0] == first[1] == first[2] and first[3] == first[4] == first[5]
    assert first[0] != first[3]
    upcoming = seeds.upcoming(np.array([0, 1]))
    assert upcoming[0] == upcoming[1] != first[0] and upcoming[2:] == [None] * 4
    seeds.advance(np.array([0, 1, 2]))
    assert seeds.upcoming(np.array([2]))[2] != upcoming[0], "after the group started, the next seed is new again"
    expected = int(np.random.SeedSequence(3, spawn_key=(0, 0, 1)).generate_state(1)[0])
    assert upcoming[0] == expected, "the documented derivation"


def test_seeds_are_identical_run_to_run_and_differ_by_process_and_group() -> None:
    a = GroupSeeds(3, 0, 0, 4, 2).initial()
    assert a == GroupSeeds(3, 0, 0, 4, 2).initial()
    assert a != GroupSeeds(3, 1, 0, 4, 2).initial()
    # a pipeline group holding envs 4..7 continues the process's group numbering (groups 2 and 3)
    later = GroupSeeds(3, 0, 4, 4, 2).initial()
    whole = GroupSeeds(3, 0, 0, 8, 2).initial()
    assert later == whole[4:]


def test_complete_groups_and_bad_splits() -> None:
    seeds = GroupSeeds(0, 0, 0, 4, 2)
    finished = np.array([True, False, True, True])
    assert seeds.complete(finished).tolist() == [False, False, True, True]
    with pytest.raises(ValueError):
        GroupSeeds(0, 0, 0, 5, 2)


def test_with_per_env_seeds_each_env_episode_gets_its_own_derived_seed() -> None:
    """Envs 4..7 of process 1: the first reset keeps seed + offset; env 5's episode k >= 1 gets
    SeedSequence(10, spawn_key=(1, 5, k)), whatever the other envs did."""
    seeds = GroupSeeds(10, process_id=1, offset=4, n=4, group_size=1, per_env=True)
    assert seeds.initial() == 14
    groups = SeedGroups(seeds)
    for k in (1, 2, 3):
        rows, argument, starting = groups.restart(np.array([1]))
        assert rows.tolist() == starting.tolist() == [1]
        want = int(np.random.SeedSequence(10, spawn_key=(1, 5, k)).generate_state(1)[0])
        assert argument == [None, want, None, None], k
        assert seeds.recorded(argument, rows) == [want]
    _, argument, _ = groups.restart(np.array([0, 2]))
    assert argument is not None and argument[1] is None and argument[3] is None
    assert argument[0] == int(np.random.SeedSequence(10, spawn_key=(1, 4, 1)).generate_state(1)[0])
    assert argument[2] == int(np.random.SeedSequence(10, spawn_key=(1, 6, 1)).generate_state(1)[0])


def test_an_unseeded_run_still_derives_later_seeds() -> None:
    seeds = GroupSeeds(None, 0, 0, 2, 1, per_env=True)
    assert seeds.initial() is None
    upcoming = seeds.upcoming(np.arange(2))
    assert upcoming is not None and all(isinstance(s, int) for s in upcoming) and upcoming[0] != upcoming[1]


def test_a_negative_process_seed_is_refused_before_the_run() -> None:
    with pytest.raises(ConfigError, match=r"process 0 would start from seed -3 .*pass --runner.seed 0 or above"):
        GroupSeeds(-3, 0, 0, 2, 1)


def test_a_resumed_env_starts_at_its_next_episode_with_the_seed_it_would_have_had() -> None:
    """Env 0 of the group (process env 2) completed 2 episodes, env 1 none: env 0 starts episode 2 from its derived
    seed, env 1 its first episode from the first reset's seed (seed + its process env id), and both go on from there
    as they would have without the stop."""
    from plugrl_env_client.rollout.seeds import episode_seed

    seeds = GroupSeeds(10, process_id=1, offset=2, n=2, group_size=1, per_env=True, start=(2, 0))
    assert seeds.initial() == [episode_seed(10, 1, 2, 2), 13]
    assert seeds.upcoming(np.arange(2)) == [episode_seed(10, 1, 2, 3), episode_seed(10, 1, 3, 1)]
    uninterrupted = GroupSeeds(10, process_id=1, offset=2, n=2, group_size=1, per_env=True)
    uninterrupted.advance(np.array([0]))
    assert uninterrupted.upcoming(np.array([0]))[0] == seeds.initial()[0]


def test_a_resumed_seed_group_runs_its_unfinished_group_episode_while_the_members_done_with_it_wait() -> None:
    """Group 0's member 0 finished group episode 2 before the stop and member 1 did not: member 1 runs episode 2
    again from its seed while member 0 waits (reset to episode 3's seed); once member 1 is done, both start episode
    3 together, as without the stop."""
    from plugrl_env_client.rollout.seeds import episode_seed

    seeds = GroupSeeds(3, process_id=0, offset=0, n=4, group_size=2, start=(3, 2, 0, 1))
    assert seeds.initial() == [episode_seed(3, 0, 0, 3), episode_seed(3, 0, 0, 2),
                               episode_seed(3, 0, 1, 0), episode_seed(3, 0, 1, 1)]
    groups = SeedGroups(seeds)
    assert groups.idle.waiting.tolist() == [True, False, False, True]
    rows, seed, starting = groups.restart(np.array([1]))
    assert rows.tolist() == [0, 1] and starting.tolist() == [0, 1]
    assert seed is not None and seed[0] == seed[1] == episode_seed(3, 0, 0, 3)
    assert groups.idle.waiting.tolist() == [False, False, False, True]


def test_a_resumed_seed_group_member_past_its_share_does_not_hold_the_group_back() -> None:
    """Shares (2, 1): member 1 ran its one episode, member 0 its first of two; member 0 goes on alone with group
    episode 1, and member 1 is past its share."""
    seeds = GroupSeeds(3, process_id=0, offset=0, n=2, group_size=2, start=(1, 1), shares=(2, 1))
    assert seeds.exhausted().tolist() == [False, True]
    assert seeds.on_last().tolist() == [True, True]
    assert not SeedGroups(seeds).idle.waiting.any()


def test_a_resumed_env_without_per_env_seeds_starts_from_a_seed_apart_from_every_earlier_start() -> None:
    from plugrl_env_client.rollout.seeds import resumed_seed

    seeds = GroupSeeds(10, process_id=1, offset=0, n=3, group_size=1, start=(2, 1, 1))
    first = seeds.initial()
    assert first == resumed_seed(10, 1, 4) and first not in (10, 11, 12) and 0 <= first < 2**31
    assert first != GroupSeeds(10, 1, 0, 3, 1, start=(2, 2, 1)).initial(), "each resume point starts elsewhere"
    assert seeds.upcoming(np.arange(3)) is None
    assert GroupSeeds(None, 0, 0, 2, 1, start=(1, 0)).initial() is None
