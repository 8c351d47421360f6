"""The checklist's entry points: the built-in envs pass every rule, the rules run in their order, and an env
object or a registered id can be checked. Each rule's broken-env tests are in tests/check/rules/."""

from __future__ import annotations

import broken_envs as b
import numpy as np
import pytest

from plugrl_env_client.check import check_env, check_registered_env
from plugrl_env_client.check.rules import RULES
from plugrl_env_client.envs import discover_envs
from plugrl_env_client.errors import ConfigError


@pytest.fixture(scope="module", autouse=True)
def _builtins() -> None:
    discover_envs()


@pytest.mark.parametrize("env_id", ["Point-v1", "Probe-v1"])
def test_builtin_envs_pass_every_rule_rollout_included(env_id: str) -> None:
    report = check_registered_env(env_id)
    assert [r.number for r in report.results] == list(range(1, 15))
    assert b.statuses(report) == dict.fromkeys(b.ALL, "pass"), report.render(details=True)
    assert report.ok
    assert "2 episodes against the embedded random policy" in report.result(14).seen


def test_probe_fixed_start_passes_the_seed_rule_with_a_note() -> None:
    report = check_registered_env("Probe-v1", rollout=False)
    assert report.result(4).status == "pass"
    assert "reset() draws nothing from self.np_random" in report.result(4).seen
    assert "episode ends in 50 steps" in report.result(9).seen  # Probe's episodes end: rule 9 saw terminal rows


def test_check_env_on_a_good_env_passes_and_leaves_the_rollout_to_registered_envs() -> None:
    report = check_env(b.GoodEnv(num_envs=3))
    result = b.assert_caught(report, 14, "skip", "check_registered_env(env_id) runs the rollout", skipped=set())
    assert result.rule.startswith("a short rollout")
    assert report.ok and report.subject == "GoodEnv (num_envs=3, seed=0)"


def test_rule3_notes_an_observation_space_left_to_the_first_reset(registry) -> None:
    """Gymnasium wrappers that read the space when they are made need it declared up front: rule 3 says so (the
    client copes, so it stays a pass), for an env object and for a registered one; a declared space gets no note."""
    from plugrl_env_client.check.rules.returns import UNDECLARED_OBSERVATION_SPACE

    report = check_env(b.GoodEnv(num_envs=2))
    assert report.result(3).status == "pass" and report.result(3).seen == UNDECLARED_OBSERVATION_SPACE
    assert "NormalizeObservation" in UNDECLARED_OBSERVATION_SPACE and "declare it in __init__" in UNDECLARED_OBSERVATION_SPACE
    uid = b.register("Undeclared-v1", b.GoodEnv)
    assert check_registered_env(uid, rollout=False).result(3).seen == UNDECLARED_OBSERVATION_SPACE
    assert check_registered_env("Point-v1", rollout=False).result(3).seen == ""
    reset_first = b.GoodEnv(num_envs=2)
    reset_first.reset(seed=0)  # derived before the check: nothing left to note
    assert check_env(reset_first).result(3).seen == ""


def test_check_env_finds_the_registered_spec_of_an_env_made_by_make_env(registry) -> None:
    from plugrl_env_client.envs.registry import make_env

    uid = b.register("Limited-v1", b.OwnLimitEnv, max_episode_steps=10)
    report = check_env(make_env(uid, num_envs=2))
    assert report.subject.startswith("Limited-v1")
    assert report.result(10).status == "warn"  # the registered limit was used


def test_unknown_env_id_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="Unknown env id 'Nope-v9'"):
        check_registered_env("Nope-v9")


def test_rules_are_numbered_in_order_with_docstrings() -> None:
    assert [r.number for r in RULES] == list(range(1, 15))
    assert all(r.fn.__doc__ and r.fn.__doc__.startswith(f"{r.number}.") for r in RULES)
    assert np.all([len(r.title) < 100 for r in RULES])
