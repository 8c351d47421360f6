"""How the checker drives an env: an env that crashes, or breaks the contract, inside a rule fails that rule and
skips the rules that needed what broke; an env that cannot be built leaves nothing to check."""

from __future__ import annotations

import broken_envs as b

from plugrl_env_client.check import check_env, check_registered_env


def test_an_env_crash_inside_a_rule_fails_that_rule_and_skips_those_that_needed_it() -> None:
    report = check_env(b.CrashingStepEnv())
    result = b.assert_caught(report, 6, "fail", "step() (step 3 of the run) raised FloatingPointError: solver "
                             "diverged (at broken_envs.py:", skipped={7, 9, 11, 12, 14})
    assert "FloatingPointError" in result.details and "Traceback" in result.details
    assert report.result(7).seen == ("the checker's run of the env crashed (step() (step 3 of the run) raised "
                                     "FloatingPointError)")


def test_a_later_step_that_breaks_the_contract_fails_the_rules_that_made_it() -> None:
    # Rules 2, 4 and 5 step once from a reset and see bool flags; the shared run's step 3 ends an episode and
    # returns int flags: the rollout would stop there, so the rule asking for the run fails, not skips.
    report = check_env(b.IntFlagsAtEpisodeEndEnv())
    assert b.statuses(report) == {**dict.fromkeys(b.ALL, "pass"), 6: "fail", 7: "skip", 9: "skip", 10: "fail",
                                  11: "skip", 12: "skip", 14: "skip"}, report.render()
    assert report.result(6).seen == "step() (step 3 of the run): Expected terminated of dtype bool, got int64"
    assert report.result(6).fix == "return `np.asarray(terminated, dtype=bool)`"
    assert report.result(10).seen.startswith("step() (step 3 of the time-limit run): Expected terminated of dtype")
    assert report.result(7).seen == ("the checker's run of the env stopped (step() (step 3 of the run) broke the env "
                                     "contract)")
    assert not report.ok


def test_without_an_env_every_other_rule_skips(registry) -> None:
    uid = b.register("NeedsSize-v1", b.NeedsSizeEnv, b.SizedConfig)
    report = check_registered_env(uid)
    b.assert_caught(report, 1, "fail", "raised ValueError", skipped=b.ALL - {1})
    assert report.result(7).seen == "there is no env to check: it could not be built (rule 1)"


def test_a_rule_whose_needs_failed_says_which() -> None:
    report = check_env(b.NoActionSpaceEnv())
    assert report.result(5).seen == "needs rule 2, which failed"
    assert report.result(6).seen == "needs rule 2, which failed"
