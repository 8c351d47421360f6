"""Rules 3 to 5: what reset and step return (the env contract, every broken rule listed), and seeded resets."""

from __future__ import annotations

import broken_envs as b

from plugrl_env_client.check import check_env


def test_rule3_bare_observation() -> None:
    report = check_env(b.BareResetEnv())
    b.assert_caught(report, 3, "fail", "reset() must return (observation, info); got a bare Observation",
                    "return `observation, info`", skipped=b.NEEDS_STEPS | {4, 14})


def test_rule3_reset_that_raises_fails_rule3_and_rule2_says_why_it_did_not_step() -> None:
    report = check_env(b.CrashingResetEnv())
    b.assert_caught(report, 3, "fail", "reset(seed=0) raised RuntimeError: simulator failed to load its scene (at "
                    "broken_envs.py:", skipped=b.NEEDS_STEPS | {2, 4, 14})
    assert "sampled actions could not be stepped: reset(seed=0) raised RuntimeError (rule 3)" in report.result(2).seen


def test_rule4_unseeded_starts() -> None:
    report = check_env(b.UnseededEnv())
    b.assert_caught(report, 4, "fail", "two reset(seed=0) calls returned different observations: states['pos'] in "
                    "envs [0, 1]", "self.seed_rngs(seed)")


def test_rule4_seed_ignored_is_a_warning() -> None:
    report = check_env(b.SeedIgnoredEnv())
    b.assert_caught(report, 4, "warn", "reset(seed=0) and reset(seed=[1, 2, 3]) returned identical observations",
                    "fine if the env has no randomness at reset")


def test_rule4_reset_that_does_not_restore_what_a_step_changed() -> None:
    report = check_env(b.ForgetfulResetEnv())
    b.assert_caught(report, 4, "fail", "two reset(seed=0) calls returned different observations: states['t'] in "
                    "envs [0, 1]", "reset all the state reset() reads")


def test_rule4_one_start_for_the_whole_batch_is_a_warning() -> None:
    report = check_env(b.SameStartEnv(num_envs=3))
    b.assert_caught(report, 4, "warn", "all 3 envs of the batch start from the same observation",
                    "draw each env's start separately")


def test_rule5_old_gym_four_values() -> None:
    report = check_env(b.OldGymEnv())
    result = b.assert_caught(report, 5, "fail", "that is the old gym API: split done into terminated and truncated",
                             skipped=b.NEEDS_STEPS - {5} | {14})
    assert result.seen == "step() must return 5 values (obs, reward, terminated, truncated, info); got 4"


def test_rule5_float64_rewards_warn() -> None:
    report = check_env(b.Float64RewardEnv())
    b.assert_caught(report, 5, "warn", "rewards have dtype float64 (the client casts them to float32)",
                    "return `reward.astype(np.float32)`")


def test_rule5_int_rewards_warn_as_the_client_casts_them_too() -> None:
    report = check_env(b.IntRewardEnv())
    b.assert_caught(report, 5, "warn", "rewards have dtype int64 (the client casts them to float32)")


def test_rule5_int_flags_fail() -> None:
    report = check_env(b.IntFlagsEnv())
    b.assert_caught(report, 5, "fail", "Expected terminated of dtype bool, got int64",
                    "return `np.asarray(terminated, dtype=bool)`", skipped=b.NEEDS_STEPS - {5} | {14})
