"""Checking an env against the batched env contract: :func:`check_env` and :func:`check_registered_env` run the
checklist of :mod:`plugrl_env_client.check.checklist` and return a :class:`CheckReport`."""

from plugrl_env_client.check.checklist import CheckReport, CheckResult, check_env, check_registered_env

__all__ = ["CheckReport", "CheckResult", "check_env", "check_registered_env"]
