import numpy as np

from plugrl_env_client.server import Policy, register_policy


@register_policy("steer")
class SteerPolicy(Policy):
    """A scripted controller for Point-v1: every step of the chunk heads straight for the goal."""

    def act(self, obs, n):
        direction = obs["states"]["goal"] - obs["states"]["pos"]  # [n, 2]
        action = np.clip(direction, self.low, self.high).astype(self.dtype)
        return np.broadcast_to(action, (self.horizon, n, *self.action_shape)).copy()
