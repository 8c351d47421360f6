"""GuessNumber-v1: answer parsing, rewards, the format penalty, the env-owned timeout, resets, seeds and info."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from plugrl_env_client.envs.guess_number.guess_number_env import (
    METRICS_AGG_MODE,
    GuessNumberConfig,
    GuessNumberEnv,
    parse_guess,
)
from plugrl_env_client.errors import ConfigError
from plugrl_env_client.utils.registration import get_spec, make_env

AGG_MODES = {"sum", "mean", "min", "max", "last", "first"}
NON_ASCII = "Ünïcödé 漢字 🙂 مرحبا "


def make(n: int = 3, **config) -> GuessNumberEnv:
    return GuessNumberEnv(GuessNumberConfig(**config), num_envs=n)


def answers(*guesses: int | str) -> np.ndarray:
    """One action per env: ints become '<answer>N</answer>', strings are sent as they are."""
    return np.array([f"<answer>{g}</answer>" if isinstance(g, int) else g for g in guesses])


# ---------------------------------------------------------------------------------------------------- parsing

@pytest.mark.parametrize("text, expected", [
    ("<answer>42</answer>", 42),
    ("I think <answer> 17 \n</answer>.", 17),
    ("<ANSWER>8</Answer>", 8),
    ("<answer>-3</answer>", -3),
    ("<answer>+0007</answer>", 7),
    ("<answer>1</answer> no, <answer>2</answer>", 2),
    ("<answer>5</answer><answer>x</answer>", 5),  # the last *parsable* answer
])
def test_parse_valid(text, expected):
    assert parse_guess(text) == expected


@pytest.mark.parametrize("text", ["", "42", "<answer></answer>", "<answer>four</answer>", "<answer>4", "answer>4</answer>",
                                  "<answer>4.5</answer>", "<answer>1 2</answer>"])
def test_parse_malformed(text):
    assert parse_guess(text) is None


def test_parse_whole_long_and_non_ascii_strings():
    filler = (NON_ASCII * 1000)[:10_000]
    assert len(filler) == 10_000
    assert parse_guess(filler) is None
    assert parse_guess(filler + "<answer>61</answer>") == 61
    assert parse_guess("<answer>61</answer>" + filler) == 61
    assert parse_guess(filler[:5000] + "<answer>3</answer>" + filler[5000:] + "<answer>9</answer>" + filler) == 9
    assert parse_guess("<answer>" + " " * 10_000 + "12</answer>") == 12
    assert parse_guess("<answer>" * 10_000) is None


def test_parse_numbers_beyond_int_conversion_limits():
    huge = "9" * 10_000
    assert parse_guess(f"<answer>{huge}</answer>") > 10**99
    assert parse_guess(f"<answer>-{huge}</answer>") < -(10**99)
    assert parse_guess(f"<answer>{'0' * 9_999}7</answer>") == 7


# ---------------------------------------------------------------------------------------------------- registration

def test_registered_with_its_own_timeout():
    spec = get_spec("GuessNumber-v1")
    assert spec.env_cls is GuessNumberEnv
    assert spec.best_reward_threshold_for_success == 1.0 and spec.max_episode_steps is None
    env = make_env("GuessNumber-v1", num_envs=2)
    assert isinstance(env.single_action_space, gym.spaces.Text) and env.single_action_space.max_length >= 1 << 20


@pytest.mark.parametrize("config, flag", [({"low": 5, "high": 4}, "--env.low"), ({"max_turns": 0}, "--env.max-turns"),
                                          ({"format_penalty": float("nan")}, "--env.format-penalty")])
def test_bad_config(config, flag):
    with pytest.raises(ConfigError, match=flag):
        make(**config)


# ---------------------------------------------------------------------------------------------------- game

def test_reset_info_and_observation():
    env = make(4, low=3, high=77, max_turns=6)
    obs, info = env.reset(seed=0)
    instruction = info["env_instruction"]
    assert isinstance(instruction, str)
    assert "3" in instruction and "77" in instruction and "<answer>" in instruction and "6 guesses" in instruction
    assert obs.text.shape == (4,) and all("6 guesses left" in t for t in obs.text.tolist())
    assert ((env.target >= 3) & (env.target <= 77)).all()


def test_feedback_rewards_and_penalty():
    env = make(4, format_penalty=-0.25)
    env.reset(seed=1)
    t = env.target.tolist()
    obs, reward, terminated, truncated, info = env.step(answers(t[0], t[1] - 1, t[2] + 1, "my guess is fifty"))
    text = obs.text.tolist()
    assert text[0].startswith("Correct.") and text[1].startswith("Too small.") and text[2].startswith("Too large.")
    assert "<answer>" in text[3] and "9 guesses left" in text[3]
    assert reward.dtype == np.float32 and reward.tolist() == [1.0, 0.0, 0.0, -0.25]
    assert terminated.tolist() == [True, False, False, False] and not truncated.any()
    assert info["action_is_valid"].tolist() == [True, True, True, False]
    m = info["metrics"]
    assert m["success"].tolist() == [True, False, False, False]
    assert m["format_errors"].tolist() == [0, 0, 0, 1]
    assert m["turns"].tolist() == [1, 1, 1, 1]


def test_out_of_range_guess_is_valid_and_gets_the_truthful_hint():
    env = make(2, low=10, high=20)
    env.reset(seed=0)
    obs, reward, _, _, info = env.step(answers(1000, -5))
    assert obs.text[0].startswith("Too large.") and obs.text[1].startswith("Too small.")
    assert info["action_is_valid"].all() and reward.tolist() == [0.0, 0.0]


def test_long_non_ascii_actions_are_parsed_whole():
    env = make(2)
    env.reset(seed=2)
    filler = (NON_ASCII * 1000)[:10_000]
    obs, reward, terminated, _, info = env.step(np.array([filler + f"<answer>{env.target[0]}</answer>", filler]))
    assert terminated.tolist() == [True, False] and reward.tolist() == [1.0, np.float32(-0.1)]
    assert info["action_is_valid"].tolist() == [True, False]


def test_timeout_sets_both_flags_unless_the_last_guess_is_correct():
    env = make(3, low=1, high=1000, max_turns=2)
    env.reset(seed=3)
    t = env.target.tolist()
    wrong = [x + 1 for x in t]
    _, _, terminated, truncated, _ = env.step(answers(*wrong))
    assert not terminated.any() and not truncated.any()
    obs, reward, terminated, truncated, info = env.step(answers(wrong[0], t[1], "no answer"))
    assert terminated.tolist() == [True, True, True]
    assert truncated.tolist() == [True, False, True]
    assert reward.tolist() == [0.0, 1.0, np.float32(-0.1)]
    assert f"the number was {t[0]}" in obs.text[0] and f"the number was {t[2]}" in obs.text[2]
    assert info["metrics"]["turns"].tolist() == [2, 2, 2]


def test_malformed_actions_do_not_end_the_episode_before_the_timeout():
    env = make(1, max_turns=3)
    env.reset(seed=0)
    flags = [env.step(answers("?"))[2:4] for _ in range(3)]
    assert [(bool(te[0]), bool(tr[0])) for te, tr in flags] == [(False, False), (False, False), (True, True)]


def test_partial_reset_leaves_other_rows_untouched():
    env = make(4, max_turns=5)
    env.reset(seed=4)
    obs, *_ = env.step(answers("bad", 0, 0, 0))
    before_text, before_target, before_turns = obs.text.copy(), env.target.copy(), env.turns.copy()
    mask = np.array([False, True, False, True])
    obs2, info = env.reset(options={"reset_mask": mask, "reset_indices": np.flatnonzero(mask)})
    assert obs2.text[~mask].tolist() == before_text[~mask].tolist()
    assert (env.target[~mask] == before_target[~mask]).all() and (env.turns[~mask] == before_turns[~mask]).all()
    assert (env.turns[mask] == 0).all() and all(t.startswith("Make your first guess") for t in obs2.text[mask].tolist())
    assert isinstance(info["env_instruction"], str)


def test_seeds_reproduce_targets_and_envs_differ():
    a, b, c = make(16, high=10**9), make(16, high=10**9), make(16, high=10**9)
    a.reset(seed=11)
    b.reset(seed=11)
    c.reset(seed=12)
    assert (a.target == b.target).all()
    assert not (a.target == c.target).any()
    assert len(set(a.target.tolist())) == 16
    a.reset(options={"reset_indices": [0]})  # no seed: continues the generator
    b.reset(options={"reset_indices": [0]})
    assert a.target[0] == b.target[0]


def test_targets_cover_the_range_uniformly_enough():
    env = make(2000, low=1, high=4)
    env.reset(seed=0)
    counts = np.bincount(env.target, minlength=5)[1:]
    assert counts.min() > 400  # 500 expected per value


def test_metrics_keys_and_agg_modes_are_stable():
    env = make(3, max_turns=4)
    env.reset(seed=5)
    t = env.target.tolist()
    keys = None
    for actions in (answers(t[0] + 1, "x", t[2]), answers(t[0], "y", 1), answers("z", "w", "v")):
        _, _, _, _, info = env.step(actions)
        assert set(info["metrics"]) == set(info["metrics_agg_mode"]) == set(METRICS_AGG_MODE)
        assert set(info["metrics_agg_mode"].values()) <= AGG_MODES
        assert all(v.shape == (3,) and v.dtype.kind in "biuf" for v in info["metrics"].values())
        assert info["action_is_valid"].dtype == np.bool_ and info["action_is_valid"].shape == (3,)
        keys = keys or list(info["metrics"])
        assert list(info["metrics"]) == keys


def test_make_vec_through_gymnasium():
    env = gym.make_vec("GuessNumber-v1", num_envs=2, config=GuessNumberConfig(high=5))
    obs, info = env.reset(seed=0)
    assert obs.text.shape == (2,) and "between 1 and 5" in info["env_instruction"]
