"""SlowStep-v1: Point-v1 whose batch step takes 10 ms of wall time, like a simulator's (a sleep: no CPU taken from
the other processes of a test). For runs whose pipelining depends on the env's step time."""

from __future__ import annotations

import time
from typing import Any

from plugrl_env_client.envs.point.point_env import PointEnv, PointEnvConfig
from plugrl_env_client.envs.registry import register_env

STEP_S = 0.010


@register_env("SlowStep-v1", max_episode_steps=100, config=PointEnvConfig)
class SlowStepEnv(PointEnv):
    def step(self, actions: Any) -> Any:
        time.sleep(STEP_S)
        return super().step(actions)
