"""Rules 8 to 10: partial resets, no reset inside step, and episode ends against the registered time limit."""

from __future__ import annotations

import broken_envs as b
import pytest

from plugrl_env_client.check import check_env, check_registered_env


@pytest.mark.parametrize("cls", [b.ResetAllEnv, b.ResetFirstRowsEnv])
def test_rule8_partial_reset_touching_other_rows(cls) -> None:
    report = check_env(cls())
    b.assert_caught(report, 8, "fail", "resetting envs [1] changed rows it was not asked to reset: states['pos'] in "
                    "envs [0]; states['t'] in envs [0]", "self.reset_mask(options)")


def test_rule8_partial_reset_that_returns_only_the_reset_rows() -> None:
    report = check_env(b.ResetRowsOnlyEnv())
    result = report.result(8)
    assert (result.status, result.seen, result.fix) == (
        "fail", "resetting envs [1]: reset() returned an Observation of 1 env; expected 2",
        "return every env's row, with the batch as the leading axis")
    # The shared run resets finished rows the same way, and stops there: as a run would.
    assert report.result(6).seen.startswith("reset(options={'reset_mask': ..., 'reset_indices': ...}): reset() "
                                            "returned an Observation of 1 env; expected 2")
    assert {r.number for r in report.results if r.status == "fail"} == {6, 8}


def test_rule8_skips_with_one_env() -> None:
    report = check_env(b.GoodEnv(num_envs=1))
    b.assert_caught(report, 8, "skip", "num_envs=1", skipped={8, 14})


def test_rule9_step_calling_reset() -> None:
    report = check_env(b.StepCallsResetEnv())
    b.assert_caught(report, 9, "fail", "step() called the env's reset() (at steps 3, ", "do not reset inside step()")


def test_rule9_step_restarting_rows_with_its_own_helper_shows_in_the_step_counter() -> None:
    report = check_env(b.StepRestartsRowsEnv())
    b.assert_caught(report, 9, "fail", "states['t'] column 0 changes by +1 every step but went back on the step that "
                    "ended env 0's episode (step 3)")


def test_rule9_countdown_that_went_back_up() -> None:
    report = check_env(b.CountdownRestartEnv())
    b.assert_caught(report, 9, "fail", "states['left'] column 0 changes by -1 every step but went back on the step "
                    "that ended env 0's episode (step 3)")


def test_rule9_finished_row_back_at_its_fixed_start() -> None:
    report = check_env(b.FixedStartRestartEnv())
    b.assert_caught(report, 9, "fail", "the observation of a finished env equals its observation right after a reset "
                    "(env 0 at step 3")


def test_rule9_autoreset_metadata() -> None:
    report = check_env(b.AutoresetMetadataEnv())
    b.assert_caught(report, 9, "fail", "metadata declares autoreset_mode=AutoresetMode.NEXT_STEP")


def test_rule10_own_limit_beyond_the_registered_one(registry) -> None:
    uid = b.register("OwnLimit-v1", b.OwnLimitEnv, max_episode_steps=10)
    report = check_registered_env(uid, rollout=False)
    b.assert_caught(report, 10, "warn", "the env truncates episodes itself after [25] steps, beyond the registered "
                    "max_episode_steps=10", "register max_episode_steps=25")


def test_rule10_own_limit_before_the_registered_one(registry) -> None:
    uid = b.register("ShortLimit-v1", b.ShortLimitEnv, max_episode_steps=10)
    report = check_registered_env(uid, rollout=False)
    b.assert_caught(report, 10, "warn", "after [5] steps, before the registered max_episode_steps=10")


def test_rule10_time_out_reported_as_termination(registry) -> None:
    uid = b.register("Timeout-v1", b.TimeoutAsTerminationEnv, max_episode_steps=10)
    report = check_registered_env(uid, rollout=False)
    b.assert_caught(report, 10, "warn", "every episode ended terminated at exactly max_episode_steps=10",
                    "return truncated=True")


def test_rule10_env_that_never_ends_without_a_time_limit() -> None:
    from plugrl_env_client.check.rules.episodes import GENEROUS_STEPS

    report = check_env(b.NeverEndsEnv())
    b.assert_caught(report, 10, "warn", f"no episode ended within {GENEROUS_STEPS} steps", "--runner.max-episode-steps")
    assert "only reset() calls were watched" in report.result(9).seen


def test_rule10_env_that_never_ends_passes_with_a_registered_limit(registry) -> None:
    uid = b.register("NeverEnds-v1", b.NeverEndsEnv, max_episode_steps=20)
    report = check_registered_env(uid, rollout=False)
    b.assert_caught(report, 10, "pass", "the env does not truncate by itself within 200 steps; the client truncates "
                    "at 20")
