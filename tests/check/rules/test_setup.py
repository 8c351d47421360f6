"""Rules 1 and 2: the env builds from its config, and its action space is one the client can fill."""

from __future__ import annotations

import broken_envs as b

from plugrl_env_client.check import check_env, check_registered_env


def test_rule1_default_config_that_cannot_build(registry) -> None:
    uid = b.register("NeedsSize-v1", b.NeedsSizeEnv, b.SizedConfig)
    report = check_registered_env(uid, config=b.SizedConfig(size=2), rollout=False)
    result = b.assert_caught(report, 1, "fail", "make_env('NeedsSize-v1', num_envs=2) with its default config raised "
                             "ValueError: size must be >= 1, got 0", "every field of the env's config needs a default")
    assert result.rule == "constructs from its default config and from the given config"
    assert "rollout=False" in report.result(14).seen


def test_rule1_config_of_another_env(registry) -> None:
    uid = b.register("Good-v1", b.GoodEnv)
    report = check_registered_env(uid, config=b.SizedConfig(), rollout=False)
    b.assert_caught(report, 1, "fail", "the given config is a SizedConfig, but Good-v1 is registered with GoodConfig",
                    skipped=b.ALL - {1})


def test_rule1_an_object_that_is_not_a_batched_env() -> None:
    report = check_env(object())
    b.assert_caught(report, 1, "fail", "the env is a object, not a BaseEnv", "env.num_envs is None",
                    skipped=b.ALL - {1})


def test_rule2_no_action_space() -> None:
    report = check_env(b.NoActionSpaceEnv())
    b.assert_caught(report, 2, "fail", "Env must expose action space via single_action_space/action_space",
                    "set `self.single_action_space = gymnasium.spaces.Box(...)` in the env's __init__",
                    skipped=b.NEEDS_STEPS | {14})


def test_rule2_an_action_of_several_arrays() -> None:
    report = check_env(b.DictActionSpaceEnv())
    b.assert_caught(report, 2, "fail", "the env's single_action_space is Dict(", "the client sends one array per env",
                    "use a Box (flatten the parts into one vector)", skipped=b.NEEDS_STEPS | {14})


def test_rule2_space_that_does_not_match_step() -> None:
    report = check_env(b.WrongActionSpaceEnv())
    result = b.assert_caught(report, 2, "fail", "step() with actions of shape (2, 3) and dtype float32 sampled from "
                             "Box(-1.0, 1.0, (3,), float32) raised ValueError", "make single_action_space describe",
                             skipped=b.NEEDS_STEPS | {14})
    assert "broken_envs.py" in result.seen and "Traceback" in result.details
