"""The ARS learner on its own (no sockets): the V2-t update, state statistics, evaluations, files and errors."""

from __future__ import annotations

import json
import logging
import math

import numpy as np
import pytest

from plugrl_env_client.server.ars import (
    ArsError,
    ArsLearner,
    ArsSettings,
    Episode,
    RunningStats,
    load_policy,
    state_layout,
    state_matrix,
)

LAYOUT = (("x", 2),)


def learner(**kwargs) -> ArsLearner:
    shape = kwargs.pop("action_shape", (1,))
    low, high = kwargs.pop("low", -10.0), kwargs.pop("high", 10.0)
    horizon = kwargs.pop("horizon", 1)
    made = ArsLearner(shape, low, high, ArsSettings(**kwargs), horizon)
    made.bind(LAYOUT)
    return made


def play(ars: ArsLearner, ret: float, states=((1.0, 2.0),), whole: bool = True) -> Episode:
    """One whole episode: its states observed, one reward ``ret`` for the whole of it."""
    episode = Episode(ars.start_episode(whole))
    for s in states:
        episode.observe(np.asarray(s, np.float64))
    episode.add(ret)
    return episode


def test_one_iteration_follows_the_v2t_update():
    """M += alpha / (b sigma_R) sum over the top b directions (by max(r+, r-)) of (r+ - r-) delta, sigma_R the std
    of those 2b returns; the directions come from --policy.seed."""
    ars = learner(directions=3, top_directions=2, step_size=0.05, noise=0.1, seed=11)
    deltas = np.random.default_rng(11).standard_normal((3, 1, 2))
    returns = {(0, 1): 1.0, (0, -1): 5.0, (1, 1): 2.0, (1, -1): 0.5, (2, 1): 4.0, (2, -1): 3.0}
    episodes = []
    for _ in range(6):
        episode = Episode(ars.start_episode())
        rollout = episode.rollout
        assert np.allclose(rollout.weights, rollout.sign * 0.1 * deltas[rollout.direction])
        episode.add(returns[(rollout.direction, rollout.sign)])
        episodes.append((episode, 10))
    ars.finish(episodes)
    top = [0, 2]  # max(r+, r-) = 5, 2, 4
    used = [1.0, 5.0, 4.0, 3.0]
    expected = 0.05 / (2 * np.std(used)) * ((1.0 - 5.0) * deltas[0] + (4.0 - 3.0) * deltas[2])
    assert ars.iteration == 1 and np.allclose(ars.weights, expected, rtol=1e-12, atol=0)
    record = ars.records[-1]
    assert record["returns_plus"] == [1.0, 2.0, 4.0] and record["returns_minus"] == [5.0, 0.5, 3.0]
    assert record["mean_return"] == pytest.approx(np.mean(list(returns.values()))) and record["max_return"] == 5.0
    assert record["episodes"] == 6 and record["env_steps"] == 60 and record["updated"] is True
    assert top  # (named for the reader)


def test_equal_returns_make_no_update():
    ars = learner(directions=2, top_directions=1, seed=0)
    ars.finish([(play(ars, 3.0), 1) for _ in range(4)])
    assert ars.iteration == 1 and not ars.weights.any() and ars.records[-1]["updated"] is False


def test_states_are_normalized_by_statistics_fixed_during_an_iteration():
    """Iteration 1 uses mean 0 and std 1; its rollouts' states (not its evaluation's) then set the statistics of
    iteration 2: their mean and (population) std, and a component that never varied gets weight 0."""
    ars = learner(directions=1, top_directions=1, seed=0)
    a = play(ars, 1.0, states=[(1.0, 5.0), (3.0, 5.0)])
    assert not a.rollout.mean.any() and (a.rollout.scale == 1).all()
    b = play(ars, 2.0, states=[(5.0, 5.0)])
    evaluation = play(ars, 0.0, states=[(100.0, -100.0)])  # both rollouts are handed out: an evaluation
    assert not evaluation.rollout.trains and evaluation.states == []
    ars.finish([(a, 2), (evaluation, 1), (b, 1)])
    seen = np.array([[1.0, 5.0], [3.0, 5.0], [5.0, 5.0]])
    nxt = ars.start_episode()
    assert np.allclose(nxt.mean, seen.mean(axis=0)) and ars.stats.count == 3
    assert np.allclose(nxt.scale, [1 / seen[:, 0].std(), 0.0])
    assert ars.records[-1]["eval_episodes"] == 1 and ars.records[-1]["eval_mean_return"] == 0.0


def test_running_stats_merge_like_one_batch():
    rng = np.random.default_rng(3)
    data = rng.normal(size=(50, 4))
    stats = RunningStats(4)
    for chunk in (data[:7], data[7:30], data[30:]):
        stats.merge(len(chunk), chunk.mean(axis=0), ((chunk - chunk.mean(axis=0)) ** 2).sum(axis=0))
    assert np.allclose(stats.mean, data.mean(axis=0)) and np.allclose(stats.std(), data.std(axis=0))


def test_the_order_episodes_finish_in_changes_nothing():
    """Two drivers finishing the same rollouts in other orders (and on other steps) get the same policy, bit for
    bit: the update ranks by direction and the statistics take the episodes in rollout order."""
    def run(order: list[int]) -> ArsLearner:
        ars = learner(directions=3, top_directions=2, seed=4)
        episodes = [play(ars, float(k * k - 3 * k), states=[(k, 2.0 * k), (0.5, k)]) for k in range(6)]
        for k in order:
            ars.finish([(episodes[k], 2)])
        return ars

    a, b = run([0, 1, 2, 3, 4, 5]), run([5, 2, 4, 0, 3, 1])
    assert a.iteration == b.iteration == 1
    assert np.array_equal(a.weights, b.weights) and np.array_equal(a.stats.mean, b.stats.mean)
    assert np.array_equal(a.stats.m2, b.stats.m2)


def test_an_evaluation_ending_with_the_last_rollout_counts_for_that_iteration():
    ars = learner(directions=1, top_directions=1, seed=0)
    plus, minus, evaluation = play(ars, 1.0), play(ars, 2.0), play(ars, 7.0)
    ars.finish([(plus, 1), (minus, 1), (evaluation, 1)])
    assert ars.records[-1]["eval_episodes"] == 1 and ars.records[-1]["eval_mean_return"] == 7.0


def test_an_episode_joined_midway_runs_the_current_policy_and_counts_nowhere():
    ars = learner(directions=1, top_directions=1, seed=0)
    joined = play(ars, 100.0, whole=False)
    assert not joined.rollout.trains and not joined.rollout.whole
    ars.finish([(joined, 50)])
    assert ars.env_steps == 0 and ars.episodes == 0
    ars.finish([(play(ars, 1.0), 1), (play(ars, 2.0), 1)])  # the rollouts were all still there
    assert ars.iteration == 1 and ars.records[-1]["eval_episodes"] == 0


def test_abandoned_rollouts_are_handed_out_again_first():
    ars = learner(directions=2, top_directions=1, seed=0)
    first, second = ars.start_episode(), ars.start_episode()
    ars.abandon([Episode(second), Episode(first)])
    again = [ars.start_episode() for _ in range(4)]
    assert [(r.direction, r.sign) for r in again] == [(0, 1), (0, -1), (1, 1), (1, -1)]
    assert again[0] is first and again[1] is second


def test_a_non_finite_return_is_not_used_and_its_rollout_runs_again(caplog):
    ars = learner(directions=1, top_directions=1, seed=0)
    bad = play(ars, math.nan)
    ars.finish([(bad, 3)])
    assert "NaN or infinite" in caplog.text
    retry = ars.start_episode()
    assert (retry.direction, retry.sign) == (bad.rollout.direction, bad.rollout.sign)


def test_actions_are_clipped_to_the_bounds():
    ars = learner(directions=1, top_directions=1, seed=0, noise=1000.0, low=-0.5, high=0.25)
    rollout = ars.start_episode()
    out = ars.actions([rollout, rollout], np.array([[1.0, -2.0], [-3.0, 4.0]]))
    raw = np.stack([rollout.act(np.array([1.0, -2.0])), rollout.act(np.array([-3.0, 4.0]))])
    assert out.shape == (2, 1) and np.array_equal(out, np.clip(raw, -0.5, 0.25))
    assert (np.abs(raw) > 1).any()


def test_state_layout_and_matrix_use_sorted_keys_and_skip_the_batch_placeholder():
    states = {"pos": np.arange(6.0).reshape(3, 2), "_batch": np.zeros((3, 0), np.float32),
              "goal": np.arange(12, dtype=np.int32).reshape(3, 2, 2)}
    layout = state_layout(states)
    assert layout == (("goal", 4), ("pos", 2))
    x = state_matrix(states, layout, 3)
    assert x.dtype == np.float64 and x.shape == (3, 6) and x[1].tolist() == [4, 5, 6, 7, 2, 3]


def test_an_env_without_states_is_a_clear_error():
    ars = ArsLearner((2,), -1, 1, ArsSettings())
    with pytest.raises(ArsError, match="sends none .only images and/or text"):
        ars.bind(state_layout({"_batch": np.zeros((2, 0), np.float32)}))


def test_a_state_size_that_changes_is_a_clear_error():
    ars = learner()
    with pytest.raises(ArsError, match=r"changed mid-run.*'x': 2.*'x': 3"):
        ars.bind((("x", 3),))
    ars.bind(LAYOUT)  # the fixed one still serves


@pytest.mark.parametrize("kwargs, words", [
    ({"directions": 0}, "--policy.directions must be >= 1"),
    ({"directions": 2, "top_directions": 3}, "--policy.top-directions must be between 1 and --policy.directions"),
    ({"step_size": 0.0}, "--policy.step-size must be a finite number > 0"),
    ({"noise": math.inf}, "--policy.noise must be a finite number > 0"),
    ({"evaluate": True}, "--policy.eval evaluates a saved policy: pass --policy.load"),
])
def test_bad_settings_say_which_flag(kwargs, words):
    with pytest.raises(ValueError, match=words):
        ArsLearner((1,), -1, 1, ArsSettings(**kwargs))


def test_eval_with_save_and_a_jsonl_save_path_are_refused(tmp_path):
    with pytest.raises(ValueError, match="leave out --policy.save"):
        ArsSettings(evaluate=True, load=tmp_path / "a.npz", save=tmp_path / "b.npz").check()
    with pytest.raises(ValueError, match="another suffix"):
        ArsSettings(save=tmp_path / "a.jsonl").check()


# ------------------------------------------------------------------------------------------------ files


def train(ars: ArsLearner, iterations: int) -> None:
    for i in range(iterations):
        ars.finish([(play(ars, float((k * 7 + i) % 5), states=[(k, i), (1.0, 2.0 * k)]), 3)
                    for k in range(2 * ars.settings.directions)])


def test_save_writes_the_policy_atomically_and_the_log_next_to_it(tmp_path):
    path = tmp_path / "out" / "ars.npz"
    ars = learner(directions=2, top_directions=1, seed=1, save=path)
    train(ars, 3)
    ars.close()
    assert sorted(p.name for p in path.parent.iterdir()) == ["ars.jsonl", "ars.npz"]  # no temp file left
    saved = load_policy(path, 1)
    assert np.array_equal(saved["weights"], ars.weights) and np.array_equal(saved["mean"], ars.stats.mean)
    assert saved["iteration"] == 3 and saved["state_keys"] == ["x"] and saved["state_sizes"] == [2]
    with np.load(path) as data:
        assert np.array_equal(data["std"], ars.stats.std())
    lines = [json.loads(line) for line in path.with_suffix(".jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in lines] == [1, 2, 3]
    assert set(lines[0]) >= {"iteration", "episodes", "env_steps", "mean_return", "max_return", "eval_episodes",
                             "eval_mean_return", "connections", "wall_time_s"}
    assert lines[0]["eval_mean_return"] is None  # no evaluation: null, never NaN
    assert "NaN" not in path.with_suffix(".jsonl").read_text()


def test_load_goes_on_training_and_appends_to_its_own_log(tmp_path):
    path = tmp_path / "ars.npz"
    first = learner(directions=2, top_directions=1, seed=1, save=path)
    train(first, 2)
    first.close()
    resumed = learner(directions=2, top_directions=1, seed=2, save=path, load=path)
    assert np.array_equal(resumed.weights, first.weights) and resumed.iteration == 2
    peek = resumed.start_episode()
    assert np.array_equal(peek.mean, first.stats.mean)
    resumed.abandon([Episode(peek)])
    train(resumed, 1)
    resumed.close()
    lines = [json.loads(line) for line in path.with_suffix(".jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in lines] == [1, 2, 3] and lines[-1]["episodes"] == 12


def test_eval_runs_the_loaded_policy_without_noise_or_updates(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="plugrl_env_client")
    path = tmp_path / "ars.npz"
    trained = learner(directions=2, top_directions=1, seed=1, save=path)
    train(trained, 2)
    ars = learner(directions=2, top_directions=1, load=path, evaluate=True)
    episodes = [play(ars, float(k)) for k in range(8)]
    assert all(not e.rollout.trains and np.array_equal(e.rollout.weights, trained.weights) for e in episodes)
    ars.finish([(e, 5) for e in episodes])
    assert ars.iteration == 2 and np.array_equal(ars.weights, trained.weights)
    assert [r["eval_mean_return"] for r in ars.records] == [1.5, 5.5]  # a line per 2N evaluation episodes
    assert "ARS evaluation of iteration 2" in caplog.text


@pytest.mark.parametrize("make, words", [
    (lambda p: None, "no such file"),
    (lambda p: np.savez(p, weights=np.zeros((1, 2))), "is not an ARS policy saved by --policy.save .it lacks"),
    (lambda p: p.write_text("not a zip"), "is not an ARS policy"),
])
def test_load_errors_say_what_is_wrong(tmp_path, make, words):
    path = tmp_path / "policy.npz"
    make(path)
    with pytest.raises(ArsError, match=words):
        ArsLearner((1,), -1, 1, ArsSettings(load=path))


def test_a_loaded_policy_of_another_shape_is_refused(tmp_path):
    path = tmp_path / "ars.npz"
    train(learner(directions=1, top_directions=1, save=path), 1)
    with pytest.raises(ArsError, match="holds a policy of 1 actions, but the server answers 3"):
        ArsLearner((3,), -1, 1, ArsSettings(load=path))
    other = ArsLearner((1,), -1, 1, ArsSettings(load=path))
    with pytest.raises(ArsError, match=r"holds a policy for the states \{'x': 2\}.*this env sends \{'y': 2\}"):
        other.bind((("y", 2),))


def test_a_longer_horizon_is_said_in_the_log(caplog):
    caplog.set_level(logging.INFO, logger="plugrl_env_client")
    learner(horizon=3)
    assert "each chunk repeats, 3 times, the action for the chunk's first observation" in caplog.text


def _policy_with(tmp_path, name: str, header_shape: str):
    """A policy file --policy.save wrote, its array ``name`` rewritten with a header that claims ``header_shape``
    (the zip itself stays valid: the members are written anew, with their checksums)."""
    import io
    import zipfile

    path = tmp_path / "ars.npz"
    train(learner(directions=1, top_directions=1, seed=1, save=path), 1)
    crafted = tmp_path / "crafted.npz"
    with zipfile.ZipFile(path) as source, zipfile.ZipFile(crafted, "w") as out:
        for info in source.infolist():
            data = source.read(info)
            if info.filename == f"{name}.npy":
                array = np.load(io.BytesIO(data))
                old = str(array.shape).encode()
                start = data.index(old)
                end = data.index(b"\n", start)  # the header is padded with spaces up to its newline
                patched = (b"'shape': " + header_shape.encode() + b", }").ljust(end - start + len(b"'shape': "))
                data = data[:start - len(b"'shape': ")] + patched + data[end:]
                assert len(np.lib.format.read_array_header_1_0(_at_header(data))[0]) >= 1
            out.writestr(info, data)
    return crafted


def _at_header(data: bytes):
    import io

    stream = io.BytesIO(data)
    np.lib.format.read_magic(stream)
    return stream


@pytest.mark.parametrize("name, shape, words", [
    ("weights", "(1, 1000000000000)", "array 'weights' claims shape (1, 1000000000000) (8000000000000 bytes) but the "
                                      "file holds 16 bytes of it"),
    ("mean", "(1000000000000,)", "array 'mean' claims shape (1000000000000,)"),
    ("weights", "(2, 1)", "holds a policy of 2 actions, but the server answers 1"),
    ("weights", "(1, 1)", "array 'weights' has shape (1, 1), expected (1, 2)"),
    ("std", "(1,)", "array 'std' has shape (1,), expected (2,)"),
    ("iteration", "(1,)", "array 'iteration' has shape (1,), expected ()"),
])
def test_a_policy_file_whose_headers_do_not_fit_is_refused_before_loading(tmp_path, name, shape, words):
    """A hostile or damaged npz: its shapes are checked from the headers, so a claim of 8 TB is one ArsError
    naming the file, the array, the shape found and the one expected, never an allocation of it."""
    path = _policy_with(tmp_path, name, shape)
    with pytest.raises(ArsError) as info:
        ArsLearner((1,), -1, 1, ArsSettings(load=path))
    message = str(info.value)
    assert message.startswith(f"--policy.load {path}") and words in message and "\n" not in message


def test_the_command_line_refuses_a_hostile_policy_file_in_one_line(tmp_path):
    import subprocess
    import sys

    path = _policy_with(tmp_path, "weights", "(1, 1000000000000)")
    done = subprocess.run([sys.executable, "-c", "from plugrl_env_client.server.cli import main; main()", "--port", "0",
                           "--policy.name", "ars", "--policy.action-dim", "1", "--policy.load", str(path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith(f"error: --policy.load {path}: array 'weights' claims shape (1, 1000000000000)")
    assert done.stderr.count("\n") == 1 and "MemoryError" not in done.stderr
