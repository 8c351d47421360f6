"""ActionPlans: time-major chunks consumed per env, replan cuts, chunk ends, chunk rewards and step ids; a held
feedback merged into the next one (PendingFeedback)."""

from __future__ import annotations

import numpy as np
import pytest

from plugrl_env_client.envs.base_env import Observation
from plugrl_env_client.protocol.messages import Feedback
from plugrl_env_client.rollout.chunks import ActionPlans, PendingFeedback


def _chunk(h: int, env_ids: list[int], dim: int) -> np.ndarray:
    """Time-major chunk [h, m, dim] whose values encode (step, env, dim): 100*t + 10*env + d."""
    t = np.arange(h)[:, None, None]
    e = np.asarray(env_ids)[None, :, None]
    d = np.arange(dim)[None, None, :]
    return (100 * t + 10 * e + d).astype(np.float32)


def needing(plans: ActionPlans) -> np.ndarray:
    """The envs (ascending) that must ask for a chunk, as the rollout reads them off its plans."""
    return np.flatnonzero(plans.needing)


def _no_reward(n: int) -> np.ndarray:
    return np.zeros(n, np.float32)


def _not_done(n: int) -> np.ndarray:
    return np.zeros(n, bool)


def test_fresh_plans_need_every_env() -> None:
    plans = ActionPlans(3, (2,), np.float32, None)
    assert needing(plans).tolist() == [0, 1, 2]


def test_time_major_chunk_is_consumed_per_env_in_order() -> None:
    plans = ActionPlans(3, (2,), np.float32, None)
    chunk = _chunk(4, [0, 1, 2], 2)
    plans.load(np.array([0, 1, 2]), chunk)
    assert needing(plans).size == 0
    for t in range(4):
        batch = plans.next_actions()
        assert batch.shape == (3, 2)
        assert batch.dtype == np.float32
        # env j takes actions[t, j]
        np.testing.assert_array_equal(batch, chunk[t])
        np.testing.assert_array_equal(batch[1], [100 * t + 10, 100 * t + 11])
        ended = plans.advance(_no_reward(3), _not_done(3))
        assert ended.tolist() == ([] if t < 3 else [0, 1, 2])
    assert needing(plans).tolist() == [0, 1, 2]


def test_env_ids_map_columns_not_positions() -> None:
    """env_ids[j] gets actions[:, j], whatever order of env ids the column j belongs to."""
    plans = ActionPlans(3, (1,), np.float32, None)
    chunk = np.array([[[7.0], [9.0]], [[8.0], [10.0]]], np.float32)  # [H=2, m=2, 1]
    plans.load(np.array([2, 0]), chunk)  # column 0 -> env 2, column 1 -> env 0
    plans.load(np.array([1]), np.array([[[5.0]], [[6.0]]], np.float32))
    np.testing.assert_array_equal(plans.next_actions()[:, 0], [9.0, 5.0, 7.0])
    plans.advance(_no_reward(3), _not_done(3))
    np.testing.assert_array_equal(plans.next_actions()[:, 0], [10.0, 6.0, 8.0])


def test_replan_steps_cuts_the_chunk() -> None:
    plans = ActionPlans(2, (2,), np.float32, replan_steps=2)
    chunk = _chunk(5, [0, 1], 2)
    plans.load(np.array([0, 1]), chunk)
    assert plans.length.tolist() == [2, 2]
    np.testing.assert_array_equal(plans.next_actions(), chunk[0])
    assert plans.advance(_no_reward(2), _not_done(2)).size == 0
    np.testing.assert_array_equal(plans.next_actions(), chunk[1])
    assert plans.advance(_no_reward(2), _not_done(2)).tolist() == [0, 1]
    assert needing(plans).tolist() == [0, 1]


def test_replan_steps_larger_than_chunk_uses_the_whole_chunk() -> None:
    plans = ActionPlans(1, (1,), np.float32, replan_steps=10)
    plans.load(np.array([0]), _chunk(3, [0], 1))
    assert plans.length.tolist() == [3]


def test_done_env_ends_its_chunk_early_and_drops_the_rest() -> None:
    plans = ActionPlans(3, (2,), np.float32, None)
    plans.load(np.array([0, 1, 2]), _chunk(4, [0, 1, 2], 2))
    ended = plans.advance(_no_reward(3), np.array([False, True, False]))
    assert ended.tolist() == [1]
    assert needing(plans).tolist() == [1]
    # a new chunk for env 1 starts from its first step; the others keep going
    fresh = np.full((3, 1, 2), -1.0, np.float32)
    fresh[1] = -2.0
    fresh[2] = -3.0
    plans.load(np.array([1]), fresh)
    batch = plans.next_actions()
    np.testing.assert_array_equal(batch[0], [100, 101])
    np.testing.assert_array_equal(batch[1], [-1.0, -1.0])
    np.testing.assert_array_equal(batch[2], [120, 121])
    ended = plans.advance(_no_reward(3), _not_done(3))
    assert ended.size == 0
    np.testing.assert_array_equal(plans.next_actions()[1], [-2.0, -2.0])


def test_done_on_the_last_step_of_a_chunk_ends_it_once() -> None:
    plans = ActionPlans(2, (1,), np.float32, None)
    plans.load(np.array([0, 1]), _chunk(2, [0, 1], 1))
    plans.advance(_no_reward(2), _not_done(2))
    ended = plans.advance(_no_reward(2), np.array([True, False]))
    assert ended.tolist() == [0, 1]
    assert needing(plans).tolist() == [0, 1]


def test_needing_actions_is_ascending_with_staggered_chunks() -> None:
    plans = ActionPlans(5, (1,), np.float32, None)
    plans.load(np.array([4, 1, 3]), _chunk(1, [4, 1, 3], 1))
    plans.load(np.array([2, 0]), _chunk(3, [2, 0], 1))
    assert needing(plans).size == 0
    ended = plans.advance(_no_reward(5), _not_done(5))
    assert ended.tolist() == [1, 3, 4]
    assert needing(plans).tolist() == [1, 3, 4]


def test_staggered_loads_for_different_env_subsets() -> None:
    plans = ActionPlans(3, (1,), np.float32, None)
    plans.load(np.array([0, 1, 2]), np.array([[[0.0], [10.0], [20.0]], [[1.0], [11.0], [21.0]]], np.float32))
    plans.advance(_no_reward(3), np.array([False, False, True]))  # env 2 done after its first step
    plans.load(np.array([2]), np.array([[[200.0]], [[201.0]], [[202.0]]], np.float32))
    np.testing.assert_array_equal(plans.next_actions()[:, 0], [1.0, 11.0, 200.0])
    assert plans.advance(_no_reward(3), _not_done(3)).tolist() == [0, 1]
    plans.load(np.array([0, 1]), np.array([[[30.0], [40.0]]], np.float32))
    np.testing.assert_array_equal(plans.next_actions()[:, 0], [30.0, 40.0, 201.0])
    assert plans.advance(_no_reward(3), _not_done(3)).tolist() == [0, 1]
    plans.load(np.array([0, 1]), np.array([[[31.0], [41.0]]], np.float32))
    np.testing.assert_array_equal(plans.next_actions()[:, 0], [31.0, 41.0, 202.0])
    assert plans.advance(_no_reward(3), _not_done(3)).tolist() == [0, 1, 2]


def test_chunk_reward_sums_per_chunk_and_restarts_on_load() -> None:
    plans = ActionPlans(2, (1,), np.float32, None)
    plans.load(np.array([0, 1]), _chunk(3, [0, 1], 1))
    plans.advance(np.array([1.0, 10.0], np.float32), _not_done(2))
    plans.advance(np.array([2.0, 20.0], np.float32), np.array([False, True]))
    assert plans.chunk_reward.tolist() == [3.0, 30.0]
    plans.load(np.array([1]), _chunk(2, [1], 1))
    assert plans.chunk_reward.tolist() == [3.0, 0.0]
    ended = plans.advance(np.array([4.0, 0.5], np.float32), _not_done(2))
    assert ended.tolist() == [0]
    assert plans.chunk_reward.tolist() == [7.0, 0.5]
    plans.load(np.array([0]), _chunk(2, [0], 1))
    assert plans.chunk_reward.tolist() == [0.0, 0.5]


def test_finish_chunks_returns_step_ids_and_restarts_after_done() -> None:
    plans = ActionPlans(2, (1,), np.float32, None)
    not_done = _not_done(2)
    assert plans.finish_chunks(np.array([0, 1]), not_done).tolist() == [0, 0]
    assert plans.finish_chunks(np.array([0]), not_done).tolist() == [1]
    assert plans.chunk_index.tolist() == [2, 1]
    # env 0's third chunk ends with its episode: its id is 2, and its next chunk is 0 again
    done = np.array([True, False])
    assert plans.finish_chunks(np.array([0, 1]), done).tolist() == [2, 1]
    assert plans.chunk_index.tolist() == [0, 2]
    assert plans.finish_chunks(np.array([0, 1]), not_done).tolist() == [0, 2]


def test_finish_chunks_ignores_done_flags_of_other_envs() -> None:
    plans = ActionPlans(3, (1,), np.float32, None)
    plans.finish_chunks(np.array([0, 1, 2]), _not_done(3))
    plans.finish_chunks(np.array([1]), np.array([True, False, True]))  # env 2 is done but not finished here
    assert plans.chunk_index.tolist() == [1, 2, 1]


def test_drop_all_makes_every_env_ask_again() -> None:
    plans = ActionPlans(3, (1,), np.float32, None)
    plans.load(np.array([0, 1, 2]), _chunk(4, [0, 1, 2], 1))
    plans.advance(np.ones(3, np.float32), _not_done(3))
    plans.finish_chunks(np.array([0]), _not_done(3))
    plans.drop_all()
    assert needing(plans).tolist() == [0, 1, 2]
    assert plans.chunk_reward.tolist() == [0.0, 0.0, 0.0]
    assert plans.chunk_index.tolist() == [1, 0, 0]  # episodes go on: step ids keep counting
    chunk = _chunk(2, [0, 1, 2], 1) + 0.5
    plans.load(np.array([0, 1, 2]), chunk)
    np.testing.assert_array_equal(plans.next_actions(), chunk[0])


def test_queue_grows_when_the_horizon_increases() -> None:
    plans = ActionPlans(2, (2,), np.float32, None)
    first = _chunk(2, [0, 1], 2)
    plans.load(np.array([0, 1]), first)
    plans.advance(_no_reward(2), np.array([False, True]))
    longer = _chunk(6, [1], 2) + 1000
    plans.load(np.array([1]), longer)
    assert plans.length.tolist() == [2, 6]
    # env 0 keeps its old chunk across the growth
    np.testing.assert_array_equal(plans.next_actions()[0], first[1, 0])
    np.testing.assert_array_equal(plans.next_actions()[1], longer[0, 0])
    plans.advance(_no_reward(2), _not_done(2))
    plans.load(np.array([0]), _chunk(1, [0], 2))
    for t in range(1, 6):
        np.testing.assert_array_equal(plans.next_actions()[1], longer[t, 0])
        ended = plans.advance(_no_reward(2), _not_done(2))
        assert 1 in ended.tolist() if t == 5 else 1 not in ended.tolist()
        if 0 in ended.tolist():
            plans.load(np.array([0]), _chunk(1, [0], 2))


def test_discrete_int_actions_without_an_action_axis() -> None:
    plans = ActionPlans(3, (), np.int64, None)
    chunk = np.array([[1, 2, 3], [4, 5, 6]], np.int64)  # [H=2, m=3]
    plans.load(np.array([0, 1, 2]), chunk)
    first = plans.next_actions()
    assert first.shape == (3,)
    assert first.dtype == np.int64
    assert first.tolist() == [1, 2, 3]
    plans.advance(_no_reward(3), _not_done(3))
    assert plans.next_actions().tolist() == [4, 5, 6]
    assert plans.advance(_no_reward(3), _not_done(3)).tolist() == [0, 1, 2]


def test_loaded_actions_take_the_plan_dtype() -> None:
    plans = ActionPlans(1, (2,), np.float64, None)
    plans.load(np.array([0]), np.array([[[0.25, -0.5]]], np.float32))
    batch = plans.next_actions()
    assert batch.dtype == np.float64
    assert batch.tolist() == [[0.25, -0.5]]


@pytest.mark.parametrize("replan", [None, 1, 3])
def test_matches_a_reference_model_of_per_env_queues(replan: int | None) -> None:
    """Drive plans like the loop does; compare with plain per-env Python queues step by step."""
    n, h = 3, 4
    plans = ActionPlans(n, (1,), np.float64, replan)
    queues: list[list[float]] = [[] for _ in range(n)]
    sums = [0.0] * n
    rng = np.random.default_rng(0)
    counter = 0
    for _ in range(40):
        need = needing(plans)
        assert need.tolist() == [e for e in range(n) if not queues[e]]
        if need.size:
            chunk = np.arange(counter, counter + h * need.size, dtype=np.float64).reshape(h, need.size, 1)
            counter += h * need.size
            plans.load(need, chunk)
            for j, e in enumerate(need.tolist()):
                queues[e] = chunk[: h if replan is None else replan, j, 0].tolist()
                sums[e] = 0.0
        assert plans.next_actions()[:, 0].tolist() == [q[0] for q in queues]
        rewards = rng.integers(0, 5, n).astype(np.float32)
        done = rng.random(n) < 0.2
        ended = plans.advance(rewards, done)
        model_ended = []
        for e in range(n):
            queues[e].pop(0)
            sums[e] += float(rewards[e])
            if done[e]:
                queues[e] = []
            if not queues[e]:
                model_ended.append(e)
        assert ended.tolist() == model_ended
        assert plans.chunk_reward[ended].tolist() == [sums[e] for e in model_ended]


def _feedback(rows: list[int], done: bool, info: dict | None = None) -> Feedback[Observation]:
    """A feedback for ``rows`` whose values say which env they are of: obs x = 10 * env, reward = env."""
    ids = np.asarray(rows, np.int64)
    m = ids.size
    obs = Observation(images={"cam": np.full((m, 2, 2, 3), ids[:, None, None, None], np.uint8)},
                      states={"x": 10.0 * ids[:, None]}, text=[f"env {i}" for i in rows])
    return Feedback(ids, ids + 100, obs, ids.astype(np.float32), np.full(m, done), np.zeros(m, bool),
                    info if info is not None else {})


def test_a_held_feedback_goes_out_merged_with_the_next_in_env_order() -> None:
    pending = PendingFeedback()
    assert not pending and pending.take() is None
    held = _feedback([1, 4], done=True, info={"episode": {"r": np.array([1.0, 4.0], np.float32),
                                                           "mask": np.array([True, True])}, "mine": np.array([7, 8])})
    pending.hold(held)
    assert pending
    nxt = _feedback([0, 2, 5], done=False, info={"theirs": np.array([0.5, 2.5, 5.5])})
    sent = pending.take(nxt)
    assert not pending, "taken once"
    assert sent is not None and sent.env_indices.tolist() == [0, 1, 2, 4, 5]
    assert sent.step_ids.tolist() == [100, 101, 102, 104, 105]
    assert sent.rewards.tolist() == [0.0, 1.0, 2.0, 4.0, 5.0]
    assert sent.terminated.tolist() == [False, True, False, True, False]
    assert sent.obs.states["x"][:, 0].tolist() == [0.0, 10.0, 20.0, 40.0, 50.0]
    assert sent.obs.images["cam"][:, 0, 0, 0].tolist() == [0, 1, 2, 4, 5]
    assert sent.obs.text.tolist() == ["env 0", "env 1", "env 2", "env 4", "env 5"]
    # a key only one side has: zeros for the other side's rows, as info["episode"] has for rows that did not end
    assert sent.info["episode"]["mask"].tolist() == [False, True, False, True, False]
    assert sent.info["episode"]["r"].tolist() == [0.0, 1.0, 0.0, 4.0, 0.0]
    assert sent.info["mine"].tolist() == [0, 7, 0, 8, 0] and sent.info["theirs"].tolist() == [0.5, 0, 2.5, 0, 5.5]


def test_held_feedbacks_add_up_and_go_out_alone_when_no_feedback_follows() -> None:
    pending = PendingFeedback()
    pending.hold(_feedback([3], done=True))
    pending.hold(_feedback([0], done=True))
    alone = pending.take()
    assert alone is not None and alone.env_indices.tolist() == [0, 3] and alone.rewards.tolist() == [0.0, 3.0]
    pending.hold(_feedback([2], done=True))
    pending.drop()
    assert not pending and pending.take(None) is None, "a reconnect drops what was held"


def test_what_is_held_does_not_change_when_the_env_reuses_its_buffers() -> None:
    pending = PendingFeedback()
    held = _feedback([1], done=True, info={"d": np.array([3.0])})
    pending.hold(held)
    held.obs.states["x"][:] = -1.0  # the env writes its next step into the same arrays
    held.obs.images["cam"][:] = 99
    held.info["d"][:] = -1.0
    sent = pending.take()
    assert sent is not None
    assert sent.obs.states["x"].tolist() == [[10.0]] and sent.obs.images["cam"].max() == 1
    assert sent.info["d"].tolist() == [3.0]


def test_a_held_feedback_and_the_next_never_share_a_row() -> None:
    pending = PendingFeedback()
    pending.hold(_feedback([1], done=True))
    with pytest.raises(RuntimeError, match=r"both carry env rows \[1\]"):
        pending.take(_feedback([1, 2], done=False))
