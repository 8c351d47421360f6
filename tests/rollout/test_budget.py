"""EpisodeBudget: an exact total of claimed episodes across spawned processes, and the stop event.

Spawned children cannot import this test module (pytest runs with --import-mode=importlib), so each child runs
a small code string through the builtin ``exec`` with the shared objects passed in its globals.
"""

from __future__ import annotations

import multiprocessing as mp

import pytest
from waiting import wait_until

from plugrl_env_client.rollout.budget import EpisodeBudget

JOIN_TIMEOUT = 60.0

_RACE = """
ready.set()
go.wait(30)
mine = 0
while budget.claim():
    mine += 1
    budget.add_env_steps(3)
late = sum(1 for _ in range(50) if budget.claim())
counts[index] = mine
extra[index] = late
"""

_UNTIL_STOPPED = """
ready.set()
deadline = time.monotonic() + 30
while not budget.finished() and time.monotonic() < deadline:
    budget.claim()
    budget.add_env_steps(1)
seen_exhausted.value = int(budget.exhausted())
"""

_SET_STOP = """
budget.stop.set()
"""


def _start(ctx: mp.context.BaseContext, code: str, **shared: object) -> mp.process.BaseProcess:
    proc = ctx.Process(target=exec, args=(code, dict(shared)), daemon=True)
    proc.start()
    return proc


def _join(*procs: mp.process.BaseProcess) -> None:
    for proc in procs:
        proc.join(JOIN_TIMEOUT)
    alive = [p for p in procs if p.is_alive()]
    for proc in alive:  # only our own children, by handle
        proc.kill()
        proc.join(5)
    assert not alive, "a child process did not end by itself"
    assert [p.exitcode for p in procs] == [0] * len(procs)


@pytest.fixture(scope="module")
def ctx() -> mp.context.BaseContext:
    return mp.get_context("spawn")


@pytest.mark.slow
def test_claims_are_exact_across_two_racing_processes(ctx: mp.context.BaseContext) -> None:
    target = 3000
    budget = EpisodeBudget(target, ctx)
    go = ctx.Event()
    counts = ctx.Array("q", 2)
    extra = ctx.Array("q", 2)
    ready = [ctx.Event() for _ in range(2)]
    procs = [_start(ctx, _RACE, budget=budget, go=go, counts=counts, extra=extra, index=i, ready=ready[i])
             for i in range(2)]
    assert all(r.wait(JOIN_TIMEOUT) for r in ready), "a child did not start"
    go.set()  # both are waiting for it: they race from here
    _join(*procs)
    assert sum(counts[:]) == target
    assert list(extra[:]) == [0, 0]  # nothing claimed once the target was reached
    assert budget.claimed == target
    assert budget.env_steps == 3 * target  # the unlocked counter is guarded by the claim lock
    assert budget.exhausted() and budget.finished()
    assert not budget.claim()
    assert budget.claimed == target


def test_no_target_never_exhausts_and_the_stop_event_ends_a_child(ctx: mp.context.BaseContext) -> None:
    budget = EpisodeBudget(None, ctx)
    ready = ctx.Event()
    seen_exhausted = ctx.Value("q", -1)
    proc = _start(ctx, "import time\n" + _UNTIL_STOPPED, budget=budget, ready=ready, seen_exhausted=seen_exhausted)
    assert ready.wait(JOIN_TIMEOUT)
    wait_until(lambda: budget.claimed >= 500, 20, "500 episodes claimed by the child")
    assert not budget.exhausted()
    budget.stop.set()
    _join(proc)
    assert seen_exhausted.value == 0
    assert budget.finished() and not budget.exhausted()
    assert budget.env_steps >= 500


def test_a_stop_set_in_a_child_is_seen_by_the_parent(ctx: mp.context.BaseContext) -> None:
    budget = EpisodeBudget(10, ctx)
    assert not budget.finished()
    _join(_start(ctx, _SET_STOP, budget=budget))
    assert budget.stop.is_set()
    assert budget.finished()
    assert not budget.exhausted()
    assert budget.claim()  # stop does not block claims; the loop checks finished()


def test_target_none_in_process() -> None:
    budget = EpisodeBudget(None)
    assert all(budget.claim() for _ in range(1000))
    assert budget.claimed == 1000
    assert not budget.exhausted() and not budget.finished()
    budget.stop.set()
    assert budget.finished() and not budget.exhausted()


def test_target_in_process() -> None:
    budget = EpisodeBudget(3)
    assert [budget.claim() for _ in range(5)] == [True, True, True, False, False]
    assert budget.claimed == 3
    assert budget.exhausted() and budget.finished()
    budget.add_env_steps(4)
    budget.add_env_steps(5)
    assert budget.env_steps == 9


def test_static_shares_differ_by_at_most_one() -> None:
    from plugrl_env_client.rollout.budget import shares

    for target in (0, 1, 7, 10, 101):
        for procs in (1, 2, 3, 8):
            s = shares(target, procs)
            assert sum(s) == target and max(s) - min(s) <= 1 and len(s) == procs


def test_static_split_caps_each_process_at_its_share() -> None:
    budget = EpisodeBudget(5, num_procs=2, split="static")  # shares 3 and 2
    assert [budget.claim(1) for _ in range(4)] == [True, True, False, False]
    assert budget.exhausted(1) and not budget.exhausted(0) and not budget.finished(0)
    assert [budget.claim(0) for _ in range(4)] == [True, True, True, False]
    assert budget.claimed == 5
    assert budget.finished(0) and budget.finished(1)


def test_shared_split_lets_one_process_take_everything() -> None:
    budget = EpisodeBudget(3, num_procs=2, split="shared")
    assert [budget.claim(0) for _ in range(4)] == [True, True, True, False]
    assert budget.exhausted(1) and not budget.claim(1) and budget.claimed == 3


def test_a_resumed_budget_continues_the_total_and_each_static_share() -> None:
    """10 episodes over 2 processes (shares 5 and 5), of which process 0 had recorded 4 and process 1 had 2: process
    0 may claim 1 more, process 1 3 more, and the total ends at 10."""
    budget = EpisodeBudget(10, num_procs=2, split="static", done=[4, 2])
    assert budget.claimed == 6 and budget.per_process() == [4, 2]
    assert [budget.claim(0) for _ in range(2)] == [True, False]
    assert [budget.claim(1) for _ in range(4)] == [True, True, True, False]
    assert budget.claimed == 10 and budget.exhausted(0) and budget.exhausted(1)
    shared = EpisodeBudget(10, num_procs=2, split="shared", done=[4, 2])
    assert sum(shared.claim(0) for _ in range(6)) == 4 and shared.finished(1)


def test_the_static_split_gives_each_env_of_a_process_a_fixed_share() -> None:
    """23 episodes over 2 processes (shares 12 and 11) of 4 envs: process 0's envs run 3 each, process 1's 3, 3, 3
    and 2; whatever N, P and E, the envs' shares add up to N and differ by at most one within a process."""
    from plugrl_env_client.rollout.budget import env_shares

    assert env_shares(23, 2, 0, 4) == [3, 3, 3, 3]
    assert env_shares(23, 2, 1, 4) == [3, 3, 3, 2]
    assert env_shares(10, 3, 2, 4) == [1, 1, 1, 0], "process 2's share of 3 leaves its last env without any"
    for target in (0, 1, 7, 10, 101):
        for procs in (1, 2, 3):
            for envs in (1, 3, 4, 8):
                per_env = [env_shares(target, procs, p, envs) for p in range(procs)]
                assert sum(map(sum, per_env)) == target
                assert all(max(s) - min(s) <= 1 and len(s) == envs for s in per_env)


def test_each_env_s_share_is_its_run_of_listed_seeds_and_the_smaller_limit_wins() -> None:
    """Listed start seeds give env e of a process of E envs the share's episodes e, e + E, ...: exactly as many as
    its static share of them, so both rules agree. With --num-episodes below the list, the smaller limit is the
    one each env keeps."""
    from plugrl_env_client.config import ClientConfig, RunnerConfig
    from plugrl_env_client.launch.process import shares_of_envs
    from plugrl_env_client.rollout.seeds import listed_share

    seeds = tuple(range(100, 111))  # 11 seeds
    for procs, envs in ((1, 4), (2, 4), (3, 2), (2, 3)):
        for p in range(procs):
            share = len(listed_share(seeds, p, procs))
            per_env = shares_of_envs(ClientConfig(num_procs=procs, num_envs=envs,
                                                  runner=RunnerConfig(start_seeds=seeds)), p)
            assert [len(range(e, share, envs)) for e in range(envs)] == list(per_env)
    both = ClientConfig(num_procs=2, num_envs=4, num_episodes=7, runner=RunnerConfig(start_seeds=seeds))
    assert [shares_of_envs(both, p) for p in range(2)] == [(1, 1, 1, 1), (1, 1, 1, 0)]
    shared = ClientConfig(num_procs=2, num_envs=4, num_episodes=7, runner=RunnerConfig(episode_split="shared"))
    assert shares_of_envs(shared, 0) == () and shares_of_envs(ClientConfig(num_envs=4), 0) == ()


def test_a_process_resumed_with_an_env_past_its_share_is_ended_by_its_budget_alone(caplog) -> None:
    """Process 1 of 23 episodes over 2 processes of 4 envs (shares 3, 3, 3, 2): resumed with (1, 2, 0, 1) episodes
    per env, each env runs the rest of its own share; with (4, 2, 0, 1) (lines that do not follow the per-env split)
    no env has a share of its own, and a warning says so."""
    from plugrl_env_client.config import ClientConfig, RunnerConfig
    from plugrl_env_client.envs import discover_envs
    from plugrl_env_client.envs.registry import get_spec
    from plugrl_env_client.launch.process import ProcessJob, loop_settings

    discover_envs()
    cfg = ClientConfig(num_procs=2, num_envs=4, num_episodes=23, runner=RunnerConfig(episode_split="static"))
    fits = loop_settings(ProcessJob("Point-v1", cfg, 1, "", (1, 2, 0, 1)), get_spec("Point-v1"))
    assert fits.env_shares == (3, 3, 3, 2) and fits.first_episodes == (1, 2, 0, 1)
    assert not caplog.records
    off = loop_settings(ProcessJob("Point-v1", cfg, 1, "", (4, 2, 0, 1)), get_spec("Point-v1"))
    assert off.env_shares == () and off.first_episodes == (4, 2, 0, 1)
    assert "process 1: its episodes on disk ([4, 2, 0, 1] per env) do not follow" in caplog.text
    assert loop_settings(ProcessJob("Point-v1", cfg, 1, ""), get_spec("Point-v1"), with_shares=False).env_shares == ()
