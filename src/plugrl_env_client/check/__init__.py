"""Checking an env against the batched env contract: :func:`check_env` and :func:`check_registered_env` run the
checklist (:mod:`plugrl_env_client.check.rules`, in the order of :mod:`plugrl_env_client.check.checklist`) and
return a :class:`CheckReport` (:mod:`plugrl_env_client.check.report`)."""

from plugrl_env_client.check.checklist import check_env, check_registered_env
from plugrl_env_client.check.report import CheckReport, CheckResult

__all__ = ["CheckReport", "CheckResult", "check_env", "check_registered_env"]
