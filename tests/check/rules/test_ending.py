"""Rules 13 and 14: closing twice, and the short real rollout (skipped after a failure)."""

from __future__ import annotations

import dataclasses

import broken_envs as b
import pytest

from plugrl_env_client.check import check_env, check_registered_env
from plugrl_env_client.envs import discover_envs
from plugrl_env_client.server.registry import _POLICIES


@pytest.fixture(scope="module", autouse=True)
def _builtins() -> None:
    discover_envs()


def test_rule13_second_close_raises() -> None:
    report = check_env(b.CloseTwiceFailsEnv())
    b.assert_caught(report, 13, "fail", "close() (the second) raised RuntimeError: simulator handle already released")


def test_rule14_rollout_that_cannot_build_a_second_env(registry) -> None:
    b.LeakyEnv.slot_taken = False
    uid = b.register("Leaky-v1", b.LeakyEnv)
    try:
        report = check_registered_env(uid)
    finally:
        b.LeakyEnv.slot_taken = False
    b.assert_caught(report, 14, "fail", "the rollout stopped: process 0 failed:",
                    "RuntimeError: the simulator is already running in this process",
                    "plugrl-run-env-client Leaky-v1 --num-envs 2 --num-episodes 2 --local-policy random",
                    skipped=set())


def test_rule14_skipped_after_a_failure(registry) -> None:
    uid = b.register("NanReward-v1", b.NanRewardEnv)
    report = check_registered_env(uid)
    assert report.result(6).status == "fail"
    assert report.result(14).status == "skip"
    assert report.result(14).seen == ("rules [6] failed; the rollout runs once every rule passes (a real run stops "
                                      "at most such failures, a reset() inside step() included, and collects wrong "
                                      "data at the others)")


def test_rule14_is_skipped_when_no_registered_policy_is_offered_for_the_space(monkeypatch) -> None:
    """The rollout's policy is the registry's default for the env's action space, not a name kept here."""
    monkeypatch.setitem(_POLICIES, "random", dataclasses.replace(_POLICIES["random"], default=False))
    report = check_registered_env("Point-v1")
    assert report.result(14).status == "skip"
    assert report.result(14).seen.startswith("no registered policy is offered for the action space Box(")
    assert "@register_policy(NAME, default=True)" in report.result(14).seen


@pytest.mark.slow
def test_rule14_rolls_out_the_policy_the_registry_offers(monkeypatch) -> None:
    monkeypatch.setitem(_POLICIES, "random", dataclasses.replace(_POLICIES["random"], default=False))
    monkeypatch.setitem(_POLICIES, "zero", dataclasses.replace(_POLICIES["zero"], default=True))
    report = check_registered_env("Point-v1")
    assert report.result(14).status == "pass"
    assert report.result(14).seen.startswith("2 episodes against the embedded zero policy"), report.result(14).seen
