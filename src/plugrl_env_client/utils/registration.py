"""Public import path of the env registry: ``register_env``, ``register_env_config``, ``make_env``.

Env files outside this package import from here (the guides spell this path); the registry itself lives in
:mod:`plugrl_env_client.envs.registry`, next to the env API it registers.
"""

from plugrl_env_client.envs.registry import (
    EnvSpec,
    get_spec,
    make_env,
    register_env,
    register_env_config,
    registered_ids,
)

__all__ = ["EnvSpec", "get_spec", "make_env", "register_env", "register_env_config", "registered_ids"]
