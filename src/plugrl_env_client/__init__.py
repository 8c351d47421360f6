"""plugrl-env-client: batched, vectorized envs streamed to a remote PlugRL policy/training server."""

from plugrl_env_client.envs.base_env import (
    Action,
    BaseEnv,
    BaseEnvConfig,
    BoolArray,
    Observation,
    RewardArray,
)
from plugrl_env_client.envs.registry import make_env, register_env, register_env_config
from plugrl_env_client.version import __version__

__all__ = [
    "Action",
    "BaseEnv",
    "BaseEnvConfig",
    "BoolArray",
    "Observation",
    "RewardArray",
    "__version__",
    "make_env",
    "register_env",
    "register_env_config",
]
