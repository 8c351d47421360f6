import dataclasses

import gymnasium as gym
import numpy as np

from plugrl_env_client.envs.base_env import Action, BaseEnv, BaseEnvConfig, BoolArray, Observation, RewardArray
from plugrl_env_client.utils.registration import register_env, register_env_config


@register_env_config("Reach-v1")
@dataclasses.dataclass
class ReachConfig(BaseEnvConfig):
    speed: float = 0.1  # every field needs a default


@register_env("Reach-v1", max_episode_steps=50, best_reward_threshold_for_success=1.0)
class ReachEnv(BaseEnv[ReachConfig]):
    def __init__(self, config: ReachConfig, num_envs: int = 1, **kwargs):
        super().__init__(config, num_envs=num_envs, **kwargs)
        self.single_action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.pos = np.zeros((num_envs, 2))

    def reset(self, *, seed=None, options=None):
        self.seed_rngs(seed)                                # all randomness from self.np_random
        mask = self.reset_mask(options)                     # the envs the runner resets (all at first)
        self.pos[mask] = self.np_random.uniform(-1, 1, (int(mask.sum()), 2))
        return Observation(states={"pos": self.pos.copy()}, text="reach the origin"), {}

    def step(self, actions: Action):
        self.pos += self.config.speed * actions
        dist = np.linalg.norm(self.pos, axis=1)
        terminated: BoolArray = dist < 0.1
        reward: RewardArray = np.where(terminated, 1.0, -dist).astype(np.float32)
        obs = Observation(states={"pos": self.pos.copy()}, text="reach the origin")
        return obs, reward, terminated, np.zeros(self.num_envs, bool), {}


if __name__ == "__main__":
    from plugrl_env_client.cli import main

    main()
