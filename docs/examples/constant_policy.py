"""constant: a policy that answers the same action for every env and step. The example of docs/custom-policies.md.

Serve it:   plugrl-run-policy-server --policy-path docs/examples/constant_policy.py --policy.name constant \
                --policy.action-dim 2 --policy.value 0.25
or embed it: plugrl-run-env-client point-v1 --env-path docs/examples/constant_policy.py --local-policy constant \
                --policy.value 0.2
"""

from __future__ import annotations

import dataclasses
from typing import Any

import gymnasium as gym
import numpy as np

from plugrl_env_client.server import Policy, PolicySetup, register_policy


@dataclasses.dataclass
class ConstantConfig:
    """The constant policy's own flags (each field is a --policy.<field> flag)."""

    value: float = 0.5
    """Every component of every action, clipped to the action bounds (--policy.low/--policy.high, or the env's
    Box)."""


@register_policy("constant", config=ConstantConfig)
class ConstantPolicy(Policy):
    """Answers one action, every component --policy.value, for every env and step (for a Box action space)."""

    def __init__(self, setup: PolicySetup, config: ConstantConfig) -> None:
        super().__init__(setup)  # action_shape, dtype, horizon, low and high, from the flags or the env's space
        self.action = np.clip(np.full(self.action_shape, config.value), self.low, self.high).astype(self.dtype)

    @classmethod
    def refuses(cls, space: gym.Space) -> str | None:
        """Which env action spaces it cannot answer (asked by --local-policy, which knows the env's)."""
        return None if isinstance(space, gym.spaces.Box) else "answers a Box action space only"

    def act(self, obs: dict[str, Any], n: int) -> np.ndarray:
        """The chunk for n envs: [horizon, n, *action_shape], the same action everywhere."""
        return np.broadcast_to(self.action, (self.horizon, n, *self.action_shape)).copy()
