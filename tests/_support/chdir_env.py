"""Test-only env that changes the working folder: Point-v1 under another id, whose module moves to the folder named by
``$PLUGRL_TEST_CHDIR_AT_IMPORT`` as it is imported (when set), and whose constructor moves to ``--env.chdir-to``
(when given). A run's outputs must not follow it.

Loaded with ``--env-path`` (it may be copied anywhere: it imports only the package).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from plugrl_env_client.envs.point.point_env import PointEnv, PointEnvConfig
from plugrl_env_client.utils.registration import register_env, register_env_config

if os.environ.get("PLUGRL_TEST_CHDIR_AT_IMPORT"):
    os.chdir(os.environ["PLUGRL_TEST_CHDIR_AT_IMPORT"])


@register_env_config("ChdirPoint-v1")
@dataclasses.dataclass
class ChdirPointConfig(PointEnvConfig):
    chdir_to: str = ""
    """A folder the constructor makes the working folder ("": none)."""


@register_env("ChdirPoint-v1", max_episode_steps=5)
class ChdirPointEnv(PointEnv):
    def __init__(self, config: ChdirPointConfig, num_envs: int = 1, **kwargs: Any) -> None:
        super().__init__(config, num_envs=num_envs, **kwargs)
        if config.chdir_to:
            os.chdir(config.chdir_to)
