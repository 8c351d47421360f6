"""The env checklist: the built-in envs pass every rule, and each broken env is caught by its own rule (the other
rules passing, or skipped when they need what is broken)."""

from __future__ import annotations

import io
import re

import broken_envs as b
import numpy as np
import pytest

from plugrl_env_client.check import CheckReport, CheckResult, check_env, check_registered_env
from plugrl_env_client.check.checklist import GENEROUS_STEPS, RULES
from plugrl_env_client.envs import discover_envs
from plugrl_env_client.errors import ConfigError

ALL = set(range(1, 15))
NEEDS_STEPS = set(range(5, 13))  # rules that need a working step (rule 5 itself needs rules 2 and 3)


@pytest.fixture(scope="module", autouse=True)
def _builtins() -> None:
    discover_envs()


def assert_caught(report: CheckReport, rule: int, status: str, *words: str,
                  skipped: set[int] | frozenset[int] = frozenset({14})) -> CheckResult:
    """Rule ``rule`` has ``status`` and says each of ``words``; the others pass, except ``skipped``, which skip."""
    result = report.result(rule)
    assert result.status == status, report.render(details=True)
    for word in words:
        assert word in f"{result.seen} | {result.fix}", f"{word!r} not in rule {rule}:\n{report.render()}"
    others = {r.number: r.status for r in report.results if r.number != rule}
    expected = {n: "skip" if n in skipped else "pass" for n in others}
    assert others == expected, report.render(details=True)
    return result


def statuses(report: CheckReport) -> dict[int, str]:
    return {r.number: r.status for r in report.results}


# ------------------------------------------------------------------------------------------------ good envs


@pytest.mark.parametrize("env_id", ["Point-v1", "Probe-v1"])
def test_builtin_envs_pass_every_rule_rollout_included(env_id: str) -> None:
    report = check_registered_env(env_id)
    assert [r.number for r in report.results] == list(range(1, 15))
    assert statuses(report) == dict.fromkeys(ALL, "pass"), report.render(details=True)
    assert report.ok
    assert "2 episodes against the embedded random policy" in report.result(14).seen


def test_probe_fixed_start_passes_the_seed_rule_with_a_note() -> None:
    report = check_registered_env("Probe-v1", rollout=False)
    assert report.result(4).status == "pass"
    assert "reset() draws nothing from self.np_random" in report.result(4).seen
    assert "episode ends in 50 steps" in report.result(9).seen  # Probe's episodes end: rule 9 saw terminal rows


def test_check_env_on_a_good_env_passes_and_leaves_the_rollout_to_registered_envs() -> None:
    report = check_env(b.GoodEnv(num_envs=3))
    result = assert_caught(report, 14, "skip", "check_registered_env(env_id) runs the rollout", skipped=set())
    assert result.rule.startswith("a short rollout")
    assert report.ok and report.subject == "GoodEnv (num_envs=3, seed=0)"


def test_rule3_notes_an_observation_space_left_to_the_first_reset(registry) -> None:
    """Gymnasium wrappers that read the space when they are made need it declared up front: rule 3 says so (the
    client copes, so it stays a pass), for an env object and for a registered one; a declared space gets no note."""
    from plugrl_env_client.check.checklist import UNDECLARED_OBSERVATION_SPACE

    report = check_env(b.GoodEnv(num_envs=2))
    assert report.result(3).status == "pass" and report.result(3).seen == UNDECLARED_OBSERVATION_SPACE
    assert "NormalizeObservation" in UNDECLARED_OBSERVATION_SPACE and "declare it in __init__" in UNDECLARED_OBSERVATION_SPACE
    uid = b.register("Undeclared-v1", b.GoodEnv)
    assert check_registered_env(uid, rollout=False).result(3).seen == UNDECLARED_OBSERVATION_SPACE
    assert check_registered_env("Point-v1", rollout=False).result(3).seen == ""
    reset_first = b.GoodEnv(num_envs=2)
    reset_first.reset(seed=0)  # derived before the check: nothing left to note
    assert check_env(reset_first).result(3).seen == ""


def test_reported_metrics_that_keep_their_keys_pass() -> None:
    report = check_env(b.MetricsEnv())
    assert_caught(report, 12, "pass", "2 metrics on every step")


def test_check_env_finds_the_registered_spec_of_an_env_made_by_make_env(registry) -> None:
    from plugrl_env_client.envs.registry import make_env

    uid = b.register("Limited-v1", b.OwnLimitEnv, max_episode_steps=10)
    report = check_env(make_env(uid, num_envs=2))
    assert report.subject.startswith("Limited-v1")
    assert report.result(10).status == "warn"  # the registered limit was used


# ------------------------------------------------------------------------------------------------ 1. constructs


def test_rule1_default_config_that_cannot_build(registry) -> None:
    uid = b.register("NeedsSize-v1", b.NeedsSizeEnv, b.SizedConfig)
    report = check_registered_env(uid, config=b.SizedConfig(size=2), rollout=False)
    result = assert_caught(report, 1, "fail", "make_env('NeedsSize-v1', num_envs=2) with its default config raised "
                           "ValueError: size must be >= 1, got 0", "every field of the env's config needs a default")
    assert result.rule == "constructs from its default config and from the given config"
    assert "rollout=False" in report.result(14).seen


def test_rule1_without_an_env_every_other_rule_skips(registry) -> None:
    uid = b.register("NeedsSize-v1", b.NeedsSizeEnv, b.SizedConfig)
    report = check_registered_env(uid)
    assert_caught(report, 1, "fail", "raised ValueError", skipped=ALL - {1})
    assert report.result(7).seen == "there is no env to check: it could not be built (rule 1)"


def test_rule1_config_of_another_env(registry) -> None:
    uid = b.register("Good-v1", b.GoodEnv)
    report = check_registered_env(uid, config=b.SizedConfig(), rollout=False)
    assert_caught(report, 1, "fail", "the given config is a SizedConfig, but Good-v1 is registered with GoodConfig",
                  skipped=ALL - {1})


def test_rule1_an_object_that_is_not_a_batched_env() -> None:
    report = check_env(object())
    assert_caught(report, 1, "fail", "the env is a object, not a BaseEnv", "env.num_envs is None", skipped=ALL - {1})


def test_unknown_env_id_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="Unknown env id 'Nope-v9'"):
        check_registered_env("Nope-v9")


# ------------------------------------------------------------------------------------------------ 2. action space


def test_rule2_no_action_space() -> None:
    report = check_env(b.NoActionSpaceEnv())
    assert_caught(report, 2, "fail", "env.single_action_space is not set", "self.single_action_space = gymnasium",
                  skipped=NEEDS_STEPS | {14})
    assert report.result(5).seen == "needs rule 2, which failed"


def test_rule2_space_that_does_not_match_step() -> None:
    report = check_env(b.WrongActionSpaceEnv())
    result = assert_caught(report, 2, "fail", "step() with actions of shape (2, 3) and dtype float32 sampled from "
                           "Box(-1.0, 1.0, (3,), float32) raised ValueError", "make single_action_space describe",
                           skipped=NEEDS_STEPS | {14})
    assert "broken_envs.py" in result.seen and "Traceback" in result.details


# ------------------------------------------------------------------------------------------------ 3. reset returns


def test_rule3_bare_observation() -> None:
    report = check_env(b.BareResetEnv())
    assert_caught(report, 3, "fail", "reset(seed=0) returned a bare Observation", "return `observation, info`",
                  skipped=NEEDS_STEPS | {4, 14})


def test_rule3_reset_that_raises_fails_rule3_and_rule2_says_why_it_did_not_step() -> None:
    report = check_env(b.CrashingResetEnv())
    assert_caught(report, 3, "fail", "reset(seed=0) raised RuntimeError: simulator failed to load its scene (at "
                  "broken_envs.py:", skipped=NEEDS_STEPS | {2, 4, 14})
    assert "sampled actions could not be stepped: reset(seed=0) raised RuntimeError (rule 3)" in report.result(2).seen


# ------------------------------------------------------------------------------------------------ 4. seeding


def test_rule4_unseeded_starts() -> None:
    report = check_env(b.UnseededEnv())
    assert_caught(report, 4, "fail", "two reset(seed=0) calls returned different observations: states['pos'] in "
                  "envs [0, 1]", "self.seed_rngs(seed)")


def test_rule4_seed_ignored_is_a_warning() -> None:
    report = check_env(b.SeedIgnoredEnv())
    assert_caught(report, 4, "warn", "reset(seed=0) and reset(seed=[1, 2, 3]) returned identical observations",
                  "fine if the env has no randomness at reset")


def test_rule4_reset_that_does_not_restore_what_a_step_changed() -> None:
    report = check_env(b.ForgetfulResetEnv())
    assert_caught(report, 4, "fail", "two reset(seed=0) calls returned different observations: states['t'] in envs "
                  "[0, 1]", "reset all the state reset() reads")


def test_rule4_one_start_for_the_whole_batch_is_a_warning() -> None:
    report = check_env(b.SameStartEnv(num_envs=3))
    assert_caught(report, 4, "warn", "all 3 envs of the batch start from the same observation",
                  "draw each env's start separately")


# ------------------------------------------------------------------------------------------------ 5. step returns


def test_rule5_old_gym_four_values() -> None:
    report = check_env(b.OldGymEnv())
    assert_caught(report, 5, "fail", "step() returned 4 values", "that is the old gym API: split done into terminated "
                  "and truncated", skipped=NEEDS_STEPS - {5} | {14})


def test_rule5_float64_rewards_warn() -> None:
    report = check_env(b.Float64RewardEnv())
    assert_caught(report, 5, "warn", "rewards have dtype float64 (the client casts them to float32)",
                  "return `reward.astype(np.float32)`")


def test_rule5_int_flags_fail() -> None:
    report = check_env(b.IntFlagsEnv())
    assert_caught(report, 5, "fail", "terminated has dtype int64", "`np.asarray(terminated, dtype=bool)`",
                  skipped=NEEDS_STEPS - {5} | {14})


# ------------------------------------------------------------------------------------------------ 6. finite


def test_rule6_nan_rewards() -> None:
    report = check_env(b.NanRewardEnv())
    assert_caught(report, 6, "fail", "rewards were NaN or inf at steps 2, 6", "(envs [1] at step 2)",
                  "--runner.non-finite-rewards zero")


def test_rule6_inf_observations() -> None:
    report = check_env(b.NanStateEnv())
    assert_caught(report, 6, "fail", "states['pos'] held NaN or inf at step 2 (envs [0])",
                  "--runner.non-finite-observations allow")


# ------------------------------------------------------------------------------------------------ 7. layout


def test_rule7_float_images() -> None:
    report = check_env(b.FloatImageEnv())
    assert_caught(report, 7, "fail", "images['cam'] has dtype float32 (at reset(seed=0))", ".astype(np.uint8)")


def test_rule7_channels_first_images() -> None:
    report = check_env(b.ChannelsFirstEnv())
    assert_caught(report, 7, "fail", "images['cam'] has shape (2, 3, 8, 8), which looks channels-first",
                  "np.moveaxis(img, 1, -1)")


# ------------------------------------------------------------------------------------------------ 8. partial reset


@pytest.mark.parametrize("cls", [b.ResetAllEnv, b.ResetFirstRowsEnv])
def test_rule8_partial_reset_touching_other_rows(cls) -> None:
    report = check_env(cls())
    assert_caught(report, 8, "fail", "resetting envs [1] changed rows it was not asked to reset: states['pos'] in "
                  "envs [0]; states['t'] in envs [0]", "self.reset_mask(options)")


def test_rule8_skips_with_one_env() -> None:
    report = check_env(b.GoodEnv(num_envs=1))
    assert_caught(report, 8, "skip", "num_envs=1", skipped={8, 14})


# ------------------------------------------------------------------------------------------------ 9. no reset in step


def test_rule9_step_calling_reset() -> None:
    report = check_env(b.StepCallsResetEnv())
    assert_caught(report, 9, "fail", "step() called the env's reset() (at steps 3, ", "do not reset inside step()")


def test_rule9_step_restarting_rows_with_its_own_helper_shows_in_the_step_counter() -> None:
    report = check_env(b.StepRestartsRowsEnv())
    assert_caught(report, 9, "fail", "states['t'] column 0 changes by +1 every step but went back on the step that ended "
                  "env 0's episode (step 3)")


def test_rule9_countdown_that_went_back_up() -> None:
    report = check_env(b.CountdownRestartEnv())
    assert_caught(report, 9, "fail", "states['left'] column 0 changes by -1 every step but went back on the step that "
                  "ended env 0's episode (step 3)")


def test_rule9_finished_row_back_at_its_fixed_start() -> None:
    report = check_env(b.FixedStartRestartEnv())
    assert_caught(report, 9, "fail", "the observation of a finished env equals its observation right after a reset "
                  "(env 0 at step 3")


def test_rule9_autoreset_metadata() -> None:
    report = check_env(b.AutoresetMetadataEnv())
    assert_caught(report, 9, "fail", "metadata declares autoreset_mode=AutoresetMode.NEXT_STEP")


# ------------------------------------------------------------------------------------------------ 10. time limit


def test_rule10_own_limit_beyond_the_registered_one(registry) -> None:
    uid = b.register("OwnLimit-v1", b.OwnLimitEnv, max_episode_steps=10)
    report = check_registered_env(uid, rollout=False)
    assert_caught(report, 10, "warn", "the env truncates episodes itself after [25] steps, beyond the registered "
                  "max_episode_steps=10", "register max_episode_steps=25")


def test_rule10_own_limit_before_the_registered_one(registry) -> None:
    uid = b.register("ShortLimit-v1", b.ShortLimitEnv, max_episode_steps=10)
    report = check_registered_env(uid, rollout=False)
    assert_caught(report, 10, "warn", "after [5] steps, before the registered max_episode_steps=10")


def test_rule10_time_out_reported_as_termination(registry) -> None:
    uid = b.register("Timeout-v1", b.TimeoutAsTerminationEnv, max_episode_steps=10)
    report = check_registered_env(uid, rollout=False)
    assert_caught(report, 10, "warn", "every episode ended terminated at exactly max_episode_steps=10",
                  "return truncated=True")


def test_rule10_env_that_never_ends_without_a_time_limit() -> None:
    report = check_env(b.NeverEndsEnv())
    assert_caught(report, 10, "warn", f"no episode ended within {GENEROUS_STEPS} steps", "--runner.max-episode-steps")
    assert "only reset() calls were watched" in report.result(9).seen


def test_rule10_env_that_never_ends_passes_with_a_registered_limit(registry) -> None:
    uid = b.register("NeverEnds-v1", b.NeverEndsEnv, max_episode_steps=20)
    report = check_registered_env(uid, rollout=False)
    assert_caught(report, 10, "pass", "the env does not truncate by itself within 200 steps; the client truncates "
                  "at 20")


# ------------------------------------------------------------------------------------------------ 11. info


def test_rule11_values_that_are_not_per_env() -> None:
    report = check_env(b.ScalarInfoEnv())
    assert_caught(report, 11, "warn", "info['mean_distance'] is a float: dropped from feedback",
                  "info['success'] is a bool: the client counts success only from a bool array of shape (2,)",
                  "documented keys: success, metrics")


# ------------------------------------------------------------------------------------------------ 12. metric keys


def test_rule12_metric_that_comes_and_goes() -> None:
    report = check_env(b.UnstableMetricsEnv())
    assert_caught(report, 12, "fail", "info['metrics'] had ['distance'] at step 1 and ['distance', 'near'] at step 2",
                  "report every metric name on every step")


# ------------------------------------------------------------------------------------------------ 13. close


def test_rule13_second_close_raises() -> None:
    report = check_env(b.CloseTwiceFailsEnv())
    assert_caught(report, 13, "fail", "close() (the second) raised RuntimeError: simulator handle already released")


# ------------------------------------------------------------------------------------------------ 14. rollout


def test_rule14_rollout_that_cannot_build_a_second_env(registry) -> None:
    b.LeakyEnv.slot_taken = False
    uid = b.register("Leaky-v1", b.LeakyEnv)
    try:
        report = check_registered_env(uid)
    finally:
        b.LeakyEnv.slot_taken = False
    assert_caught(report, 14, "fail", "the rollout stopped: process 0 failed:",
                  "RuntimeError: the simulator is already running in this process",
                  "plugrl-run-env-client Leaky-v1 --num-envs 2 --num-episodes 2 --local-policy random", skipped=set())


def test_rule14_skipped_after_a_failure(registry) -> None:
    uid = b.register("NanReward-v1", b.NanRewardEnv)
    report = check_registered_env(uid)
    assert report.result(6).status == "fail"
    assert report.result(14).status == "skip"
    assert report.result(14).seen == "rules [6] failed; the rollout would stop at the first of them"


# ------------------------------------------------------------------------------------------------ crashes


def test_an_env_crash_inside_a_rule_fails_that_rule_and_skips_those_that_needed_it() -> None:
    report = check_env(b.CrashingStepEnv())
    result = assert_caught(report, 6, "fail", "step() (step 3 of the run) raised FloatingPointError: solver diverged "
                           "(at broken_envs.py:", skipped={7, 9, 11, 12, 14})
    assert "FloatingPointError" in result.details and "Traceback" in result.details
    assert report.result(7).seen == ("the checker's run of the env crashed (step() (step 3 of the run) raised "
                                     "FloatingPointError)")


# ------------------------------------------------------------------------------------------------ the report


def _sample_report() -> CheckReport:
    return CheckReport("Demo-v1 (num_envs=2, seed=0)", [
        CheckResult("first rule", "pass", number=1),
        CheckResult("second rule", "warn", "rewards have dtype float64", "return `reward.astype(np.float32)`", 2),
        CheckResult("third rule", "fail", "a long observation " * 12, "fix it", 3),
        CheckResult("fourth rule", "skip", "needs rule 3", number=4),
    ])


def test_report_renders_one_line_per_rule_with_seen_and_fix() -> None:
    text = _sample_report().render()
    lines = text.splitlines()
    assert lines[0] == "check Demo-v1 (num_envs=2, seed=0)"
    assert lines[1] == "[PASS]  1. first rule"
    assert lines[2] == "[WARN]  2. second rule"
    assert lines[3] == "           seen: rewards have dtype float64"
    assert lines[4] == "           fix:  return `reward.astype(np.float32)`"
    assert lines[5] == "[FAIL]  3. third rule"
    assert all(len(line) <= 120 for line in lines)
    assert lines[-1] == "Demo-v1 (num_envs=2, seed=0): 1 passed, 1 warning, 1 failed, 1 skipped: FAILED"
    assert "           why:  needs rule 3" in lines
    assert "\x1b[" not in text


def test_report_ok_and_counts() -> None:
    report = _sample_report()
    assert not report.ok and report.counts() == {"pass": 1, "warn": 1, "fail": 1, "skip": 1}
    report.results = [r for r in report.results if r.status != "fail"]
    assert report.ok and report.summary().endswith(": OK")
    with pytest.raises(KeyError):
        report.result(3)


def test_report_prints_plain_to_a_file_and_in_colour_on_request() -> None:
    plain = io.StringIO()
    _sample_report().print(plain)
    assert plain.getvalue() == _sample_report().render() + "\n"
    coloured = io.StringIO()
    _sample_report().print(coloured, color=True)
    out = coloured.getvalue()
    assert "\x1b[" in out
    assert re.sub(r"\x1b\[[0-9;]*m", "", out) == _sample_report().render() + "\n"


def test_rules_are_numbered_in_order_with_docstrings() -> None:
    assert [r.number for r in RULES] == list(range(1, 15))
    assert all(r.fn.__doc__ and r.fn.__doc__.startswith(f"{r.number}.") for r in RULES)
    assert np.all([len(r.title) < 100 for r in RULES])
