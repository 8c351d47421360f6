"""Env families: the batched env API (:mod:`.base_env`), the registry (:mod:`.registry`), discovery of built-in,
user and plugin env modules (:mod:`.discovery`), and the built-in families, one ``<family>/<family>_env.py`` each."""

from plugrl_env_client.envs.discovery import discover_envs

__all__ = ["discover_envs"]
