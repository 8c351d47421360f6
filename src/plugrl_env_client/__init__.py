"""plugrl-env-client: batched, vectorized envs streamed to a remote PlugRL policy/training server."""

__version__ = "0.1.0"

from plugrl_env_client.envs.base_env import (  # noqa: E402
    Action,
    BaseEnv,
    BaseEnvConfig,
    BoolArray,
    Observation,
    RewardArray,
)
from plugrl_env_client.utils.registration import make_env, register_env, register_env_config  # noqa: E402

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
