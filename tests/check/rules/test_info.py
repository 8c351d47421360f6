"""Rules 11 and 12: info values that reach the server, documented keys, and metrics that keep their names."""

from __future__ import annotations

import broken_envs as b

from plugrl_env_client.check import check_env


def test_rule11_values_that_are_not_per_env() -> None:
    report = check_env(b.ScalarInfoEnv())
    b.assert_caught(report, 11, "warn", "info['mean_distance'] is a float: dropped from feedback",
                    "info['success'] is a bool: the client counts success only from a bool array of shape (2,)",
                    "documented keys: success, metrics")


def test_rule12_metric_that_comes_and_goes() -> None:
    report = check_env(b.UnstableMetricsEnv())
    b.assert_caught(report, 12, "fail", "info['metrics'] had ['distance'] at step 1 and ['distance', 'near'] at "
                    "step 2", "report every metric name on every step")


def test_rule12_reported_metrics_that_keep_their_keys_pass() -> None:
    report = check_env(b.MetricsEnv())
    b.assert_caught(report, 12, "pass", "2 metrics on every step")
