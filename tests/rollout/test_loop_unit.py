"""The rollout loop against an in-memory server: every rule of a rollout, in milliseconds.

A real :class:`EnvGroup` (one per pipeline group) and :class:`Rollout` run a scripted env (``scripted_env``: its
observations say which env, episode and step each row is) against a fake session (``fake_server``: it checks the
protocol's rules per connection as each message arrives and records everything). The tests assert behaviour
only: what the server got, what the env was asked, what was recorded. The socket tests (test_loop_e2e.py,
test_pipeline.py, test_group.py) stay the integration layer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest
from fake_server import (
    DROPPED,
    RESYNC,
    REUSE,
    STOP,
    FakeServer,
    Feedback,
    Infer,
    MemoryBudget,
    MemorySink,
    Policy,
    ProtocolViolation,
    close_after,
    decode_action,
    encoded_chunks,
    loop_settings,
    stop_after_feedbacks,
)
from scripted_env import Reset, ScriptedEnv, Step, by_env, col

from plugrl_env_client.envs.base_env import Observation
from plugrl_env_client.errors import ConfigError
from plugrl_env_client.protocol import messages
from plugrl_env_client.records import EpisodeRecord, ProcessStatus
from plugrl_env_client.rollout.group import EnvGroup
from plugrl_env_client.rollout.loop import Rollout
from plugrl_env_client.timing import Timing

LENGTHS = (3, 5, 4)


@dataclasses.dataclass
class Run:
    status: ProcessStatus
    server: FakeServer
    envs: list[ScriptedEnv]
    sink: MemorySink
    rollout: Rollout

    @property
    def episodes(self) -> list[EpisodeRecord]:
        return self.sink.episodes

    def of_env(self, env: int) -> list[EpisodeRecord]:
        return [e for e in self.episodes if e.env_index == env]


def run(envs: ScriptedEnv | Sequence[ScriptedEnv], server: FakeServer | None = None, episodes: int | None = None,
        **overrides: Any) -> Run:
    """Run a rollout to its end: one group per env object (several: pipelined), until ``episodes`` are recorded,
    every env is retired, or the server ends the run."""
    envs = [envs] if isinstance(envs, ScriptedEnv) else list(envs)
    server = server if server is not None else FakeServer()
    budget, sink, chosen = MemoryBudget(episodes), MemorySink(), loop_settings(**overrides)
    groups, offset = [], 0
    for env in envs:
        groups.append(EnvGroup(env, server.session(), chosen, budget, sink, Timing(), offset))
        offset += env.num_envs
    rollout = Rollout(groups, chosen, budget, sink)
    status = rollout.run()
    return Run(status, server, envs, sink, rollout)


def triangle(t: int) -> int:
    """The summed default rewards (1, 2, ..., t) of an episode's first t steps."""
    return t * (t + 1) // 2


def check_chunks(server: FakeServer, length: Callable[[int, int], int], steps: int, cut_with_left: int = 0,
                 max_episode_steps: int | None = None) -> int:
    """Every feedback row of every connection against the infer that asked for its chunk (default policy and
    rewards): it covers the steps the chunk ran (``steps`` of them; fewer only when the episode ended, or when the
    chunk was cut early with at most ``cut_with_left`` steps left), sums their rewards, carries the post-step
    observation of the chunk's own episode (the terminal one when it ended) with the chunk's last action, and has
    the flags of that step. Returns the number of rows whose chunk was cut early."""
    cut = 0
    for conn in server.connections:
        asked: dict[int, tuple[int, int, int]] = {}  # env -> (infer call, t, episode) when it asked
        for msg in conn.received:
            if isinstance(msg, Infer):
                for env, t, episode in zip(msg.env_indices.tolist(), col(msg.seen, "t"), col(msg.seen, "episode")):
                    asked[env] = (msg.call, int(t), int(episode))
                continue
            for j, env in enumerate(msg.env_indices.tolist()):
                call, t0, episode = asked.pop(env)
                t1, e = int(col(msg.obs, "t")[j]), int(col(msg.obs, "env")[j])
                assert int(col(msg.obs, "episode")[j]) == episode, "the feedback shows the chunk's own episode"
                k = t1 - t0
                assert 1 <= k <= steps, (env, t0, t1)
                assert msg.rewards[j] == triangle(t1) - triangle(t0), "the chunk's rewards, summed"
                assert decode_action(col(msg.obs, "a")[j]) == (call, k - 1), "the chunk's steps, in order"
                ended = t1 == length(e, episode)
                assert bool(msg.terminated[j]) == ended
                limited = max_episode_steps is not None and t1 >= max_episode_steps and not ended
                assert bool(msg.truncated[j]) == limited
                if not (ended or limited) and k < steps:
                    assert k >= steps - cut_with_left, f"env {env}'s chunk ended after {k} of {steps} steps"
                    cut += 1
    return cut


def resets_follow_episode_ends(env: ScriptedEnv) -> None:
    """Every reset after the first comes right after a step on which episodes ended, and resets exactly those
    envs (Gymnasium's ``reset_mask`` and PlugRL's ``reset_indices``), unseeded."""
    assert isinstance(env.calls[0], Reset) and env.calls[0].mask.all()
    for before, call in zip(env.calls, env.calls[1:]):
        if isinstance(call, Reset):
            assert isinstance(before, Step), "a reset that follows no episode's end"
            assert call.seed is None
            np.testing.assert_array_equal(call.mask, before.terminated)
            np.testing.assert_array_equal(call.options["reset_mask"], before.terminated)
            assert np.asarray(call.options["reset_indices"]).tolist() == np.flatnonzero(before.terminated).tolist()


def truthful(env: ScriptedEnv, policy: Policy) -> Policy:
    """``policy``, checking first that every row the server holds for the infer (sent or reused) is the env's
    current observation (lockstep: the env does not step while an infer is out)."""

    def check(infer: Infer) -> np.ndarray:
        now = env.obs().select(infer.env_indices)
        for key, value in now.states.items():
            np.testing.assert_array_equal(infer.seen.states[key], value, err_msg=f"infer {infer.call}: {key}")
        return policy(infer)

    return check


def test_the_budget_holds_every_env_step_when_the_rollout_returns() -> None:
    """The rollout adds its env steps to the run's shared budget now and then, not per batch step; when it returns,
    the budget holds all of them (the progress line and the run's count read it), pipelined too."""
    one = run(ScriptedEnv(3, by_env(LENGTHS)), FakeServer(horizon=4), episodes=12)
    two = run([ScriptedEnv(2, by_env([3, 5])), ScriptedEnv(2, by_env([4, 6]))], FakeServer(horizon=4), episodes=12)
    for r in (one, two):
        assert r.status is ProcessStatus.FINISHED
        steps = r.rollout.timing().env_steps
        assert steps > 0 and r.rollout.budget.env_steps == steps  # type: ignore[attr-defined]


# ---------------------------------------------------------------------------------------------- chunks


def test_chunk_ends_and_summed_rewards() -> None:
    """Chunks of 4 over episodes of 3, 5 and 4 steps: feedback exactly where a chunk ran out or an episode
    ended, with the chunk's summed reward and its last step's observation and flags."""
    env = ScriptedEnv(3, by_env(LENGTHS))
    r = run(env, FakeServer(horizon=4, policy=truthful(env, encoded_chunks(4))), episodes=12)
    assert r.status is ProcessStatus.FINISHED
    assert check_chunks(r.server, by_env(LENGTHS), 4) == 0
    (conn,) = r.server.connections
    first, second = conn.received[:2]
    assert first.env_indices.tolist() == [0, 1, 2] and first.step_ids.tolist() == [0, 0, 0]
    assert second.env_indices.tolist() == [0], "env 0's episode ended on step 3, inside its chunk"
    assert second.terminated.tolist() == [True] and second.rewards.tolist() == [1 + 2 + 3]
    third, fourth = conn.received[2:4]
    assert third.env_indices.tolist() == [0] and third.step_ids.tolist() == [0], "a new episode counts from 0"
    assert fourth.env_indices.tolist() == [1, 2], "step 4: the chunks of envs 1 and 2 ran out"
    assert fourth.terminated.tolist() == [False, True] and fourth.step_ids.tolist() == [0, 0]
    later = [m for m in conn.infers if 1 in m.env_indices.tolist()]
    assert later[1].step_ids[later[1].env_indices.tolist().index(1)] == 1, "env 1 finished one chunk"


def test_step_ids_count_the_chunks_finished_in_the_episode() -> None:
    env = ScriptedEnv(2, by_env([7, 9]))
    r = run(env, FakeServer(horizon=2), episodes=6)
    chunks = {0: 0, 1: 0}
    for msg in r.server.connections[0].received:
        for j, e in enumerate(msg.env_indices.tolist()):
            assert msg.step_ids[j] == chunks[e]
            if isinstance(msg, Feedback):
                chunks[e] = 0 if msg.terminated[j] else chunks[e] + 1


def test_replan_steps_use_a_prefix_of_each_chunk() -> None:
    env = ScriptedEnv(3, by_env([5, 6, 7]))
    r = run(env, FakeServer(horizon=6), episodes=9, replan_steps=2)
    check_chunks(r.server, by_env([5, 6, 7]), 2)
    applied = {decode_action(a)[1] for step in env.steps for a in step.actions[step.live, 0]}
    assert applied == {0, 1}, "only the first 2 steps of a 6-step chunk are ever applied"


def test_align_chunks_end_nearly_used_chunks_with_the_others() -> None:
    """Episodes of 3, 6, 7 with chunks of 4: when env 0's episode ends on step 3, the chunks of envs 1 and 2 (one
    step left) end with it, so the three ask together; without align env 0 asks alone first."""
    length = by_env([3, 6, 7])
    plain = run(ScriptedEnv(3, length), FakeServer(horizon=4), episodes=9)
    aligned = run(ScriptedEnv(3, length), FakeServer(horizon=4), episodes=9, align_chunks=2)
    assert check_chunks(plain.server, length, 4) == 0
    assert check_chunks(aligned.server, length, 4, cut_with_left=2) > 0
    first_feedback = aligned.server.connections[0].received[1]
    assert first_feedback.env_indices.tolist() == [0, 1, 2] and first_feedback.rewards.tolist() == [6, 6, 6]
    assert aligned.server.connections[0].received[2].env_indices.tolist() == [0, 1, 2]
    assert len(aligned.server.infers) < len(plain.server.infers)
    lengths = lambda r: sorted((e.env_index, e.length) for e in r.episodes)  # noqa: E731
    assert lengths(aligned) == lengths(plain), "a cut chunk changes who asks when, never the episodes"


# ---------------------------------------------------------------------------------------------- episodes


def test_feedback_carries_the_terminal_observation_and_the_reset_comes_after() -> None:
    timeline: list = []
    env = ScriptedEnv(3, by_env(LENGTHS), timeline=timeline)
    r = run(env, FakeServer(horizon=4, timeline=timeline), episodes=9)
    ends = 0
    for i, (what, _, msg) in enumerate(timeline):
        if what != "feedback" or not msg.terminated.any():
            continue
        for j in np.flatnonzero(msg.terminated):
            e = int(msg.env_indices[j])
            assert col(msg.obs, "t")[j] == LENGTHS[e], "the terminal observation, not the reset one"
            ends += 1
            later = timeline[i + 1:]
            reset = next((k for k, (w, _, x) in enumerate(later) if w == "reset" and x.mask[e]), None)
            infer = next((k for k, (w, _, x) in enumerate(later) if w == "infer" and e in x.env_indices.tolist()),
                         None)
            if reset is None:  # the run's last episodes: the env is not reset, nor asked for again
                assert infer is None and len(r.episodes) == 9
                continue
            assert infer is not None and reset < infer, "the env is reset after its feedback, before its next infer"
            row = later[infer][2].env_indices.tolist().index(e)
            nxt = later[infer][2]
            assert (col(nxt.seen, "t")[row], nxt.step_ids[row]) == (0, 0)
            assert col(nxt.seen, "episode")[row] == col(msg.obs, "episode")[j] + 1
    assert ends == len(r.episodes) == 9


def test_partial_resets_reset_exactly_the_finished_envs() -> None:
    env = ScriptedEnv(3, by_env(LENGTHS))
    r = run(env, episodes=10, seed=100)
    first = env.resets[0]
    assert first.seed == 100 and first.mask.all(), "the first reset: every env, seeded"
    resets_follow_episode_ends(env)
    ended = [s for s in env.steps if s.terminated.any()]
    assert len(env.resets) == 1 + len(ended) - 1, "after the first, a reset follows every step that ended episodes "\
                                                  "but the last (the budget was spent on it)"
    for e in range(3):
        records = r.of_env(e)
        assert records and all(x.length == LENGTHS[e] and x.episode_return == triangle(LENGTHS[e]) for x in records)
        assert all(x.terminated and not x.truncated for x in records)
        assert [x.seed for x in records] == [100 + e] + [None] * (len(records) - 1)
    assert len(r.episodes) == 10


def test_no_reset_once_the_budget_is_spent() -> None:
    env = ScriptedEnv(2, by_env([2, 2]))
    r = run(env, episodes=2)
    assert len(r.episodes) == 2 and len(env.resets) == 1, "both envs end on step 2: the run needs nothing more"


def test_time_limit_truncates_and_a_termination_on_the_limit_stays_terminated() -> None:
    """--runner.max-episode-steps 3: env 0 terminates first (2 steps), env 1 terminates on step 3 (terminated,
    not truncated), env 2 would run 10 steps and is truncated at 3."""
    length = by_env([2, 3, 10])
    env = ScriptedEnv(3, length)
    r = run(env, FakeServer(horizon=4), episodes=9, max_episode_steps=3)
    check_chunks(r.server, length, 4, max_episode_steps=3)
    flags = {e: {(x.length, x.terminated, x.truncated) for x in r.of_env(e)} for e in range(3)}
    assert flags == {0: {(2, True, False)}, 1: {(3, True, False)}, 2: {(3, False, True)}}
    truncated = [(int(m.env_indices[j]), int(col(m.obs, "t")[j])) for m in r.server.feedbacks
                 for j in np.flatnonzero(m.truncated)]
    assert truncated and set(truncated) == {(2, 3)}
    assert env.episode[2] >= 2, "a truncated env is reset like a terminated one"


def test_retired_envs_take_no_part_and_the_run_ends_when_all_are() -> None:
    """Two episodes per env, then each reset says no_episode: the env leaves every later infer and feedback."""
    env = ScriptedEnv(3, by_env([2, 3, 4]), episodes_per_env=2)
    r = run(env, FakeServer(horizon=4))
    assert r.status is ProcessStatus.FINISHED
    assert sorted((e.env_index, e.length) for e in r.episodes) == [(0, 2), (0, 2), (1, 3), (1, 3), (2, 4), (2, 4)]
    last_end = {}
    for k, msg in enumerate(r.server.connections[0].received):
        if isinstance(msg, Feedback):
            for j in np.flatnonzero(msg.terminated):
                last_end[int(msg.env_indices[j])] = k
    for e, k in last_end.items():
        later = r.server.connections[0].received[k + 1:]
        assert all(e not in m.env_indices.tolist() for m in later), f"env {e} is retired after its 2nd episode"
    timing = r.rollout.timing()
    assert timing.env_steps == 2 * (2 + 3 + 4)
    assert timing.idle_env_steps == 3 * timing.batch_steps - timing.env_steps > 0


def test_every_env_retired_at_the_first_reset_ends_the_run_at_once() -> None:
    env = ScriptedEnv(2, episodes_per_env=0)
    r = run(env)
    assert r.status is ProcessStatus.FINISHED and r.episodes == [] and env.steps == []
    assert r.server.infers == []


def test_instructions_go_in_front_of_each_episode_s_first_observation() -> None:
    env = ScriptedEnv(2, by_env([2, 3]), text=True, instruction=lambda e, k: f"task {e}.{k}")
    r = run(env, FakeServer(horizon=2), episodes=6)
    starts = 0
    for infer in r.server.infers:
        for j, e in enumerate(infer.env_indices.tolist()):
            t, k = col(infer.seen, "t")[j], col(infer.seen, "episode")[j]
            body = f"env {e} episode {k} t {t}"
            assert str(infer.seen.text[j]) == (f"task {e}.{k}\n\n{body}" if t == 0 else body)
            starts += t == 0
    assert starts == env.episode.sum(), "every episode begun was asked for once from its first observation"
    assert all(not str(x).startswith("task") for m in r.server.feedbacks for x in m.obs.text)
    assert [(e.env_index, e.instruction) for e in r.episodes] == [  # env 0 ends on steps 2, 4, 6, 8; env 1 on 3, 6
        (0, "task 0.1"), (1, "task 1.1"), (0, "task 0.2"), (0, "task 0.3"), (1, "task 1.2"), (0, "task 0.4")]


def test_instruction_off_keeps_the_text_and_still_records_it() -> None:
    env = ScriptedEnv(2, by_env([2, 3]), text=True, instruction=lambda e, k: f"task {e}.{k}")
    r = run(env, FakeServer(horizon=2), episodes=4, instruction="off")
    assert all(str(x).startswith("env ") for m in r.server.infers for x in m.seen.text)
    for e in range(2):
        records = r.of_env(e)
        assert [x.instruction for x in records] == [f"task {e}.{k}" for k in range(1, len(records) + 1)]


# ---------------------------------------------------------------------------------------------- seed groups


def test_seed_groups_start_together_from_one_seed_and_members_wait() -> None:
    """Groups of 2 (envs 0-1, 2-3), episodes of 2 and 5 steps: env 0 finishes first and waits for env 1 (no infer,
    no feedback, its waiting steps not counted); both then start the group's next episode from one new seed."""
    env = ScriptedEnv(4, by_env([2, 5]), per_env_seeds=True)
    r = run(env, FakeServer(horizon=3), episodes=12, seed=3, group_size=2)
    first = env.resets[0]
    assert isinstance(first.seed, list) and first.seed[0] == first.seed[1] != first.seed[2] == first.seed[3]
    for reset in env.resets[1:]:
        assert all((s is None) != bool(reset.mask[i]) for i, s in enumerate(reset.seed)), "a seed per reset env"
    for group in ((0, 1), (2, 3)):
        a, b = (r.of_env(e) for e in group)
        assert all(x.length == 2 for x in a) and all(x.length == 5 for x in b)
        m = min(len(a), len(b))
        assert m >= 2 and [x.seed for x in a[:m]] == [x.seed for x in b[:m]], "members share each episode's seed"
        assert len({x.seed for x in a}) == len(a), "a new seed for every group episode"
    assert {x.seed for x in r.of_env(0)}.isdisjoint({x.seed for x in r.of_env(2)})
    for infer in r.server.infers:  # a group's members begin each episode in the same infer
        starting = {e for e, t in zip(infer.env_indices.tolist(), col(infer.seen, "t")) if t == 0}
        assert all((e ^ 1) in starting for e in starting), (infer.env_indices, col(infer.seen, "t"))
    for msg in r.server.connections[0].received:  # env 0 waits from step 2 to 5 of each group episode
        for j, e in enumerate(msg.env_indices.tolist()):
            if e in (0, 2):
                assert col(msg.seen if isinstance(msg, Infer) else msg.obs, "t")[j] <= 2
    timing = r.rollout.timing()
    assert timing.idle_env_steps > 0 and timing.env_steps + timing.idle_env_steps == 4 * timing.batch_steps


def rule_seed(run_seed: int, num_envs: int, process: int, env: int, episode: int) -> int:
    """The documented start seed of env ``env``'s episode ``episode`` (from 0) in process ``process``, computed
    here from the rule itself: the first episode from the process seed plus the env index, later ones from
    ``SeedSequence(process seed, spawn_key=(process, env, episode))``."""
    root = run_seed + process * num_envs
    if episode == 0:
        return root + env
    return int(np.random.SeedSequence(root, spawn_key=(process, env, episode)).generate_state(1)[0])


def test_every_episode_of_an_env_with_per_env_seeds_starts_from_its_derived_seed() -> None:
    """Episodes of 2, 5 and 3 steps: every partial reset passes one seed per env (None for the envs it does not
    reset), env i's k-th episode gets the rule's seed whatever the other envs did, and the record says so."""
    env = ScriptedEnv(3, by_env([2, 5, 3]), per_env_seeds=True)
    r = run(env, FakeServer(horizon=2), episodes=15, seed=4)
    assert env.resets[0].seed == 4, "the first reset keeps the int seed (env i starts from 4 + i)"
    for reset in env.resets[1:]:
        assert isinstance(reset.seed, list) and len(reset.seed) == 3
        assert all((s is None) != bool(reset.mask[i]) for i, s in enumerate(reset.seed)), reset.seed
    for i in range(3):
        assert len(env.seeds[i]) >= 2
        assert env.seeds[i] == [rule_seed(4, 3, 0, i, k) for k in range(len(env.seeds[i]))], i
        recorded = [e.seed for e in r.of_env(i)]
        assert recorded and recorded == env.seeds[i][:len(recorded)], "each record holds its episode's seed"
    assert len({s for seeds in env.seeds for s in seeds}) == sum(map(len, env.seeds)), "no two episodes share one"


def test_an_env_without_per_env_seeds_gets_none_after_its_first_reset() -> None:
    """No ``metadata["per_env_seeds"]``: later resets pass seed=None, and the records after the first hold null."""
    env = ScriptedEnv(2, by_env([2, 3]))
    r = run(env, FakeServer(horizon=2), episodes=8, seed=4)
    assert env.resets[0].seed == 4 and all(reset.seed is None for reset in env.resets[1:])
    for i in range(2):
        assert [e.seed for e in r.of_env(i)] == [4 + i] + [None] * (len(r.of_env(i)) - 1)
        assert len(r.of_env(i)) >= 2


def test_pipelined_groups_derive_each_envs_seeds_from_its_process_env_id() -> None:
    """Two groups of 2 (envs 0-1 and 2-3) record the seeds one batch of 4 does, the rule's, env by env."""
    length = lambda e, k: 1 + (3 * e + 2 * k) % 5  # noqa: E731  # different every episode
    lockstep = ScriptedEnv(4, length, per_env_seeds=True)
    piped = [ScriptedEnv(2, length, first_id=0, per_env_seeds=True), ScriptedEnv(2, length, first_id=2,
                                                                               per_env_seeds=True)]
    one, two = run(lockstep, FakeServer(horizon=2), episodes=20, seed=9), run(piped, FakeServer(horizon=2),
                                                                               episodes=20, seed=9)
    for e in range(4):
        a, b = [x.seed for x in one.of_env(e)], [x.seed for x in two.of_env(e)]
        m = min(len(a), len(b))
        assert m >= 2 and a[:m] == b[:m] == [rule_seed(9, 4, 0, e, k) for k in range(m)], e


def test_seed_groups_need_an_env_that_takes_per_env_seeds() -> None:
    with pytest.raises(ConfigError, match="does not take per-env seeds"):
        EnvGroup(ScriptedEnv(4), FakeServer().session(), loop_settings(group_size=2), MemoryBudget(), MemorySink(),
                 Timing())


# ---------------------------------------------------------------------------------------------- reuse-feedback-obs


def test_reuse_leaves_out_exactly_the_rows_the_server_holds() -> None:
    """The server offers reuse-feedback-obs: an env whose chunk ended without ending its episode is reused (the
    fake rebuilds it from that feedback, and the policy checks it is the env's current row); an env just reset is
    sent."""
    env = ScriptedEnv(3, by_env(LENGTHS))
    r = run(env, FakeServer(horizon=2, features=REUSE, policy=truthful(env, encoded_chunks(2))), episodes=9)
    (conn,) = r.server.connections
    last: dict[int, bool] = {}  # env -> whether its last feedback ended its episode
    reused = 0
    for msg in conn.received:
        if isinstance(msg, Feedback):
            last.update(zip(msg.env_indices.tolist(), (msg.terminated | msg.truncated).tolist()))
            continue
        assert msg.reuse is not None, "the key is on every infer of a connection with the feature"
        expected = [e in last and not last[e] for e in msg.env_indices.tolist()]
        assert msg.reuse.tolist() == expected
        assert msg.obs.batch_size == expected.count(False), "reused rows are left out of the infer"
        np.testing.assert_array_equal(col(msg.obs, "env"), msg.env_indices[~msg.reuse])
        reused += sum(expected)
    assert reused > 0
    check_chunks(r.server, by_env(LENGTHS), 2)


@pytest.mark.parametrize("features, enabled", [((), True), (REUSE, False)], ids=["not-offered", "disabled"])
def test_no_reuse_unless_offered_and_enabled(features: tuple[str, ...], enabled: bool) -> None:
    r = run(ScriptedEnv(3, by_env(LENGTHS)), FakeServer(horizon=2, features=features), episodes=6,
            reuse_feedback_obs=enabled)
    assert r.server.infers and all(m.reuse is None and m.obs.batch_size == len(m.env_indices)
                                   for m in r.server.infers)


def test_reuse_is_forgotten_on_reconnect() -> None:
    env = ScriptedEnv(3, by_env([6, 7, 8]))
    r = run(env, FakeServer(horizon=2, features=REUSE, closes=[close_after(4)]), episodes=6)
    old, new = r.server.connections
    assert old.infers[-1].reuse is not None and old.infers[-1].reuse.any(), "the old connection reused rows"
    assert new.infers[0].reuse.tolist() == [False, False, False], "a fresh connection holds nothing"
    assert any(m.reuse.any() for m in new.infers[1:])


# ---------------------------------------------------------------------------------------------- reconnects


@pytest.mark.parametrize("messages, after_reply", [(3, False), (3, True), (4, False)],
                         ids=["instead-of-an-action", "after-an-action", "after-a-feedback"])
@pytest.mark.parametrize("closed", [RESYNC, DROPPED], ids=["resync", "dropped"])
def test_reconnect_drops_chunks_in_flight_and_episodes_go_on(messages: int, after_reply: bool, closed: Any) -> None:
    """The server closes mid-episode (instead of its second action, right after it, or after the second
    feedback): the client reconnects, asks for every env on the fresh connection first, never feeds back an old
    chunk there, applies no old chunk's action any more, and its episodes keep their length and return (no
    reset)."""
    timeline: list = []
    length = by_env([6, 9, 7])
    env = ScriptedEnv(3, length, timeline=timeline)
    server = FakeServer(horizon=4, closes=[close_after(messages, closed, after_reply=after_reply)],
                        timeline=timeline, policy=truthful(env, encoded_chunks(4)))
    r = run(env, server, episodes=9)
    assert r.status is ProcessStatus.FINISHED
    (session,) = server.sessions
    old, new = session.connections
    assert session.reconnects == [closed]
    assert len(old.lost) == (1 if after_reply else 0), "a feedback sent after the close never arrives"
    first = new.received[0]
    assert isinstance(first, Infer) and first.env_indices.tolist() == [0, 1, 2], "a fresh connection starts with an "\
                                                                                "infer for every env"
    chunks = {e: 0 for e in range(3)}  # finished chunks in the current episode, as the client counts them
    for msg in [*old.received, *old.lost]:
        if isinstance(msg, Feedback):
            for j, e in enumerate(msg.env_indices.tolist()):
                chunks[e] = 0 if msg.terminated[j] else chunks[e] + 1
    assert first.step_ids.tolist() == [chunks[e] for e in range(3)], "a dropped chunk was not finished"
    assert not (col(first.seen, "t") == 0).all(), "the episodes went on: nothing was reset"
    opened = next(i for i, (what, who, _) in enumerate(timeline) if what == "open" and who == (0, 1))
    first_new_call = first.call
    for what, _, step in timeline[opened:]:
        if what == "step":
            assert all(decode_action(a)[0] >= first_new_call for a in step.actions[step.live, 0]), \
                "no action of a chunk from the closed connection is applied after the reconnect"
    resets_follow_episode_ends(env)  # none for the reconnect
    check_chunks(server, length, 4)
    for e in range(3):
        assert all(x.length == length(e, 1) and x.episode_return == triangle(length(e, 1)) for x in r.of_env(e))


def test_a_failed_connection_attempt_is_retried() -> None:
    server = FakeServer(horizon=4, failed_opens=2)
    r = run(ScriptedEnv(2), server, episodes=4)
    assert r.status is ProcessStatus.FINISHED and len(r.episodes) == 4
    (session,) = server.sessions
    assert len(session.connections) == 1 and session.reconnects == [DROPPED, DROPPED]


def test_the_server_ending_the_run_stops_it_without_a_reconnect() -> None:
    server = FakeServer(horizon=4, closes=[stop_after_feedbacks(5)])
    r = run(ScriptedEnv(3, by_env(LENGTHS)), server, episodes=100)
    assert r.status is ProcessStatus.STOPPED_BY_SERVER
    (session,) = server.sessions
    assert len(session.connections) == 1 and session.reconnects == [] and session.closed
    assert len(r.episodes) == sum(int(m.terminated.sum()) for m in server.feedbacks), \
        "every episode the server saw end is recorded, and no other"


def test_a_close_during_the_first_connection_ends_the_run_when_it_says_so() -> None:
    server = FakeServer(closes=[close_after(1, STOP)])
    r = run(ScriptedEnv(2), server, episodes=10)
    assert r.status is ProcessStatus.STOPPED_BY_SERVER and r.episodes == []
    assert [m.kind for m in server.connections[0].received] == ["infer"]


# ---------------------------------------------------------------------------------------------- pipelining


def _absolute_policy(infer: Infer) -> np.ndarray:
    """Actions that depend only on the env, its episode and its step in the episode (not on chunk boundaries):
    env * 16 + (t mod 8); the scripted env's reward is the action, so a return shows which actions an env got."""
    ids, t0 = col(infer.seen, "env"), col(infer.seen, "t")
    t = np.arange(3)[:, None]
    return (ids * 16 + (t0 + t) % 8)[:, :, None].astype(np.float64)


def _reward(env: int, t: int, action: float) -> float:
    return action


@pytest.mark.parametrize("k", [2, 3])
def test_pipelined_groups_give_the_episodes_of_lockstep(k: int) -> None:
    """Six envs, three episodes each: one group, or k groups whose replies come back after different numbers of
    polls (so the groups step while others wait). Every env gets the same episodes (seed, length, return)."""
    def go(groups: int) -> Run:
        timeline: list = []
        n = 6 // groups
        envs = [ScriptedEnv(n, lambda e, k: 2 + (7 * e + k) % 5, first_id=g * n, reward=_reward, episodes_per_env=3,
                            timeline=timeline, name=f"g{g}") for g in range(groups)]
        server = FakeServer(policy=_absolute_policy, timeline=timeline, delay=lambda infer: (2, 0, 1)[infer.session])
        return run(envs, server, seed=50)

    lockstep, pipelined = go(1), go(k)
    assert lockstep.status is pipelined.status is ProcessStatus.FINISHED

    def per_env(r: Run) -> dict[int, list[tuple[Any, ...]]]:
        return {e: [(x.seed, x.length, x.episode_return, x.terminated) for x in r.of_env(e)] for e in range(6)}

    assert per_env(pipelined) == per_env(lockstep)
    assert all(len(v) == 3 for v in per_env(lockstep).values())
    assert [x[0] for x in per_env(pipelined)[5]] == [55, None, None], "group g's envs are the process's g*n + i"
    assert len(pipelined.server.sessions) == k and all(len(s.connections) == 1 for s in pipelined.server.sessions)
    outstanding: set[int] = set()
    overlapped = False
    for what, who, _ in pipelined.server.timeline:
        if what == "infer":
            outstanding.add(who[0])
        elif what == "reply":
            outstanding.discard(who[0])
        elif what == "step":
            overlapped |= bool(outstanding - {int(who[1:])})
    assert overlapped, "a group stepped while another one's infer was out"


def test_a_pipelined_feedback_goes_out_with_the_infer_that_follows_it_and_a_lockstep_one_at_once() -> None:
    """Pipelined, a feedback may wait for its group's next infer to share its write: only when that infer comes
    before any env steps (the group's own reset may come between) and before anything else reaches the server."""
    def go(groups: int) -> list:
        timeline: list = []
        n = 6 // groups
        envs = [ScriptedEnv(n, lambda e, k: 2 + (7 * e + k) % 5, first_id=g * n, episodes_per_env=3,
                            timeline=timeline, name=f"g{g}") for g in range(groups)]
        run(envs, FakeServer(horizon=3, timeline=timeline, delay=lambda infer: (2, 0, 1)[infer.session]), seed=50)
        return timeline

    assert not [e for e in go(1) if e[0] == "infer follows"], "lockstep sends each feedback at once"
    timeline = go(3)
    joined = [i for i, e in enumerate(timeline) if e[0] == "infer follows"]
    assert len(joined) >= 10
    for i in joined:
        who = timeline[i][1]
        nxt = next((e for e in timeline[i + 1:] if e[0] != "reset"), None)  # None: the run ended (close writes it)
        assert nxt is None or (nxt[0], nxt[1]) == ("infer", who), f"after a feedback said to go with an infer: {nxt}"


def test_a_pipelined_group_asks_for_its_next_actions_before_the_next_group_steps() -> None:
    """With chunks of one step every step ends a chunk: group g's next infer must go out right after its step (and
    feedback), so its round trip overlaps the other groups' steps; sent only once every group had stepped, a
    server's latency would overlap nothing."""
    timeline: list = []
    envs = [ScriptedEnv(2, lambda e, k: 5, first_id=g * 2, timeline=timeline, name=f"g{g}") for g in range(2)]
    server = FakeServer(horizon=1, timeline=timeline, delay=1)
    assert run(envs, server, episodes=8).status is ProcessStatus.FINISHED
    events = [(what, who if what == "step" else f"g{who[0]}") for what, who, _ in timeline
              if what in ("step", "infer")]
    checked = 0
    for i, (what, group) in enumerate(events):
        if what != "step":
            continue
        later = events[i + 1:]
        next_other = next((j for j, (w, g) in enumerate(later) if w == "step" and g != group), None)
        if next_other is None or not any(e == ("infer", group) for e in later):
            continue  # the last steps of the run: no further infer of this group, or no other step after it
        assert ("infer", group) in later[:next_other], f"{group} stepped at event {i} but asked only after another group's step"
        checked += 1
    assert checked >= 10, checked


def test_a_close_in_one_pipeline_group_leaves_the_others_alone() -> None:
    length = by_env([6, 9, 7])
    envs = [ScriptedEnv(3, length, first_id=3 * g, name=f"g{g}") for g in range(2)]
    server = FakeServer(horizon=4, closes=[close_after(3, session=1)], delay=1)
    r = run(envs, server, episodes=18)
    assert [len(s.connections) for s in server.sessions] == [1, 2]
    assert server.sessions[1].connections[1].received[0].env_indices.tolist() == [0, 1, 2]
    check_chunks(server, length, 4)
    assert all(x.length == length(x.env_index % 3, 1) for x in r.episodes) and len(r.episodes) == 18


# ---------------------------------------------------------------------------------------------- protocol rules


CASES = {
    "plain": dict(n=3, horizon=4),
    "horizon-1": dict(n=2, horizon=1),
    "replan": dict(n=4, horizon=8, replan_steps=3),
    "align": dict(n=5, horizon=5, align_chunks=3),
    "reuse": dict(n=3, horizon=3, features=REUSE),
    "time-limit": dict(n=3, horizon=4, max_episode_steps=4),
    "retire": dict(n=4, horizon=4, episodes_per_env=2),
    "retire-align": dict(n=4, horizon=3, episodes_per_env=3, align_chunks=1, features=REUSE),
    "seed-groups": dict(n=6, horizon=4, group_size=3),
    "seed-groups-reuse": dict(n=4, horizon=2, group_size=2, features=REUSE, replan_steps=1),
    "seed-groups-retire": dict(n=4, horizon=3, group_size=2, episodes_per_env=2),
    "closes": dict(n=3, horizon=4, closes=[close_after(5), close_after(2, connection=1, closed=DROPPED),
                                           close_after(3, connection=2, after_reply=True)]),
    "closes-reuse": dict(n=3, horizon=2, features=REUSE, closes=[close_after(6)]),
    "retire-at-start": dict(n=4, horizon=3, episodes_per_env=[0, 2, 1, 3]),
    "retire-closes": dict(n=3, horizon=2, episodes_per_env=[2, 1, 3], features=REUSE,
                          closes=[close_after(3), close_after(4, connection=1)]),
    "replan-align-time-limit": dict(n=5, horizon=6, replan_steps=4, align_chunks=2, max_episode_steps=5),
    "pipelined": dict(n=4, horizon=3, pipeline=2, delay=1),
    "pipelined-retire": dict(n=6, horizon=2, pipeline=3, episodes_per_env=[1, 3, 0, 2, 2, 1],
                             delay=lambda infer: infer.call % 3),
    "pipelined-close-instead-of-action": dict(n=6, horizon=4, pipeline=2, delay=3, features=REUSE,
                                              closes=[close_after(3, session=1), close_after(1, session=0),
                                                      close_after(1, session=0, connection=1, after_reply=True)]),
    "pipelined-everything": dict(n=8, horizon=4, pipeline=2, group_size=2, align_chunks=2, features=REUSE,
                                 delay=2, closes=[close_after(4, session=0)]),
}


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_every_connection_keeps_the_protocol(case: dict[str, Any]) -> None:
    """The fake checks every rule as each message arrives (at most one infer outstanding; infer, action,
    feedback; a feedback always followed by an infer; a fresh connection starts with an infer; feedback only
    for this connection's chunks; reuse only for held rows). Here: whatever the features, the transcript of
    every connection alternates and the chunks add up."""
    case = dict(case)
    n, horizon, pipeline = case.pop("n"), case.pop("horizon"), case.pop("pipeline", 1)
    closes = case.pop("closes", ())
    server = FakeServer(horizon=horizon, features=case.pop("features", ()), closes=closes, delay=case.pop("delay", 0))
    episodes_per_env = case.pop("episodes_per_env", None)
    length = lambda e, k: 1 + (3 * e + 2 * k) % 6  # noqa: E731  # 1 to 6 steps, changing every episode
    size = n // pipeline
    envs = [ScriptedEnv(size, length, first_id=g * size, episodes_per_env=episodes_per_env,
                        per_env_seeds="group_size" in case) for g in range(pipeline)]
    r = run(envs, server, episodes=None if episodes_per_env else 4 * n, seed=1, **case)
    assert r.status is ProcessStatus.FINISHED
    assert len(server.connections) == pipeline + sum(len(x.reconnects) for x in server.sessions)
    assert (len(server.connections) > pipeline) == bool(closes), "the scripted closes happened"
    for conn in server.connections:
        kinds = conn.kinds
        assert kinds and kinds[0] == "infer"
        assert all(a != b for a, b in zip(kinds, kinds[1:])), kinds
    steps = horizon if case.get("replan_steps") is None else case["replan_steps"]
    # Chunks end early only with align (at most that many steps left): never because other envs retire or wait for
    # their seed group (a feedback no infer follows waits for the next one instead).
    check_chunks(server, length, steps, cut_with_left=case.get("align_chunks", 0),
                 max_episode_steps=case.get("max_episode_steps"))
    limit = case.get("max_episode_steps") or 10**9
    assert r.episodes
    if "group_size" not in case:  # (a member waiting for its group is reset twice: its episodes are not 1, 2, ...)
        for e in range(n):
            lengths = [x.length for x in r.of_env(e)]
            assert lengths == [min(length(e, k), limit) for k in range(1, len(lengths) + 1)], (e, lengths)


# ---------------------------------------------------------------------------------------------- the fake itself


def _obs(n: int) -> Observation:
    return Observation(states={"x": np.zeros((n, 1))})


@pytest.mark.parametrize("broken", ["two-infers", "feedback-first", "two-feedbacks", "foreign-env", "reuse-unoffered",
                                    "unsorted", "feedback-while-waiting"])
def test_the_fake_refuses_what_breaks_the_protocol(broken: str) -> None:
    """The checks the loop tests rely on can fail."""
    s = FakeServer(horizon=2).session()
    s.open()
    ids, zeros, flags = np.arange(2), np.zeros(2, np.int64), np.zeros(2, bool)
    rewards = np.zeros(2, np.float32)

    def exchange() -> None:
        s.infer(messages.InferRequest(_obs(2), ids, zeros))

    with pytest.raises(ProtocolViolation):
        if broken == "two-infers":
            exchange()
            exchange()
        elif broken == "feedback-first":
            s.feedback(messages.Feedback(ids, zeros, _obs(2), rewards, flags, flags, {}))
        elif broken == "two-feedbacks":
            exchange()
            s.feedback(messages.Feedback(ids[:1], zeros[:1], _obs(1), rewards[:1], flags[:1], flags[:1], {}))
            s.feedback(messages.Feedback(ids[1:], zeros[1:], _obs(1), rewards[1:], flags[1:], flags[1:], {}))
        elif broken == "foreign-env":
            s.infer(messages.InferRequest(_obs(1), ids[:1], zeros[:1]))
            s.feedback(messages.Feedback(ids, zeros, _obs(2), rewards, flags, flags, {}))
        elif broken == "reuse-unoffered":
            s.infer(messages.InferRequest(_obs(0), ids, zeros, reuse=np.ones(2, bool)))
        elif broken == "unsorted":
            s.infer(messages.InferRequest(_obs(2), ids[::-1], zeros))
        elif broken == "feedback-while-waiting":
            s.send_infer(messages.InferRequest(_obs(2), ids, zeros))
            s.feedback(messages.Feedback(ids, zeros, _obs(2), rewards, flags, flags, {}))
