"""Reference policy server: speaks PlugRL v1, serves simple policies, and doubles as the embedded default.

A policy of one's own is a :class:`Policy` subclass registered with :func:`register_policy` (see
docs/custom-policies.md); the server builds it from a :class:`PolicySetup` and its own config.

The built-in policies register here, once, for every module of the package: importing any ``server`` module runs
this file first, and it imports :mod:`~plugrl_env_client.server.policies`, which registers ``random``, ``zero``,
``text`` and ``ars`` into the registry (which knows none of them).
"""

from plugrl_env_client.server import policies as _builtin_policies  # noqa: F401  (registers the built-ins)
from plugrl_env_client.server.policy import InferCall, Policy, PolicySetup
from plugrl_env_client.server.registry import register_policy

__all__ = ["InferCall", "Policy", "PolicySetup", "register_policy"]
