"""The embedded default: a reference server in a thread, matched to the env's action space.

``--local-policy random`` needs no second terminal and no flags to match: the action shape, dtype and bounds come
from the env's ``single_action_space``, and the server binds a free port on 127.0.0.1. Any registered policy
(:mod:`~plugrl_env_client.server.registry`) serves this way, with its own options as the client's
``--policy.<field>`` flags gave them (the others at their defaults); a user's is registered by a file the client
imports (``--env-path my_policy.py``).

Each policy says which action spaces it can answer (:meth:`~plugrl_env_client.server.policy.Policy.refuses`), and
the registry which one is offered for a space (:func:`~plugrl_env_client.server.registry.default_policy`): this
module names none of them. The seed is ``--runner.seed``, and the run folder is where a policy may write.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from plugrl_env_client.envs.base_env import describe_space
from plugrl_env_client.errors import ConfigError
from plugrl_env_client.protocol.openpi_keys import KeyMap
from plugrl_env_client.server.policy import Policy
from plugrl_env_client.server.registry import (
    PolicyConfig,
    PolicyFlags,
    able_policies,
    default_policy,
    get_spec,
    make_policy,
    options_config,
)
from plugrl_env_client.server.server import PolicyServer

SERVER_COMMAND = "plugrl-run-policy-server"


def policy_for_space(name: str, space: gym.Space, horizon: int | None, seed: int | None = None,
                     options: Mapping[str, Any] | None = None, run_dir: Path | None = None) -> Policy:
    """The registered policy ``name``, answering actions that fit ``space``. ``horizon`` None: the policy's own
    default; ``options``: the policy's own options by field name (``--policy.<field>``; the others keep their
    defaults); ``run_dir``: the run folder, where a policy may write (ARS saves its policy there)."""
    spec = get_spec(name)
    why = spec.policy_cls.refuses(space)
    if why is not None:
        raise ConfigError(f"--local-policy {name} {why}, but the env's action space is {describe_space(space)}. "
                          f"{_alternatives(space, name)}")
    try:
        own = options_config(name, options)
    except ConfigError as exc:
        raise ConfigError(f"--local-policy {name}: {exc}") from None
    shape, dtype, low, high = _numbers_of(space)
    config = PolicyConfig(name=name, action_horizon=horizon, dtype=dtype.name, seed=seed, options=own)
    try:
        return make_policy(config, action_shape=shape, low=low, high=high, space=space, run_dir=run_dir)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"--local-policy {name}: {exc}") from exc


def _alternatives(space: gym.Space, refused: str) -> str:
    """Which registered policies can answer ``space`` (or, when none can, where else to get actions)."""
    able = [n for n in able_policies(space) if n != refused]
    if not able:
        return (f"Run a policy server that can ({SERVER_COMMAND}) and connect with --server-host/--server-port, "
                "or register a policy that can (docs/custom-policies.md)")
    return f"Use --local-policy {able[0]}" if len(able) == 1 else \
        f"Use --local-policy {', '.join(able[:-1])} or {able[-1]}"


def _numbers_of(space: gym.Space) -> tuple[tuple[int, ...], np.dtype, Any, Any]:
    """Shape, dtype and bounds of the actions of a numeric space (others: scalar float32 in [-1, 1], for a policy
    that reads ``setup.space`` itself)."""
    if isinstance(space, gym.spaces.Box):
        return tuple(space.shape), np.dtype(space.dtype), space.low, space.high
    if isinstance(space, gym.spaces.Discrete):
        return (), np.dtype(np.int64), space.start, space.start + space.n - 1
    if isinstance(space, gym.spaces.MultiDiscrete):
        return tuple(space.shape), np.dtype(np.int64), space.start, space.start + space.nvec - 1
    return (), np.dtype(np.float32), -1.0, 1.0


def server_command(space: gym.Space, port: int | str = "<port>") -> str:
    """The ``plugrl-run-policy-server`` command of the policy offered for ``space`` (said when no server answers):
    its name (unless it is --policy.name's default) and the flags it says fit the space."""
    base = f"{SERVER_COMMAND} --port {port}"
    name = default_policy(space)
    if name is None:
        return f"{base} --policy-path <your_policy.py> --policy.name <its name>"
    named = "" if name == PolicyFlags.name else f" --policy.name {name}"
    flags = get_spec(name).policy_cls.server_flags(space)
    return f"{base}{named}{' ' + flags if flags else ''}"


def local_policy_flag(space: gym.Space) -> str:
    """The flag that embeds the policy offered for ``space`` (a placeholder when no registered policy is)."""
    return f"--local-policy {default_policy(space) or '<a policy registered for this space>'}"


def start_local_server(name: str, space: gym.Space, horizon: int | None, seed: int | None = None,
                       options: Mapping[str, Any] | None = None, transport: str = "websockets",
                       run_root: Path | None = None, openpi: KeyMap | None = None) -> PolicyServer:
    """Start the reference server on a free loopback port, serving in a daemon thread (over the client's
    ``transport``, so ``--transport picows`` speeds up both ends). ``options``: the policy's own options by field
    name; ``run_root``: the run folder, where a policy may write (ARS saves its policy there); ``openpi``: speak
    openpi's protocol, reading requests by this key map (None: PlugRL)."""
    policy = policy_for_space(name, space, horizon, seed, options, run_root)
    if openpi is not None and policy.needs_feedback is not None:
        able = [n for n in able_policies(space) if get_spec(n).policy_cls.needs_feedback is None]
        instead = f"use --local-policy {able[0]}" if able else "use a policy that needs no feedback"
        raise ConfigError(f"--local-policy {name} {policy.needs_feedback}, so it cannot serve --protocol openpi, "
                          f"which has no feedback; {instead} (or --protocol plugrl)")
    return PolicyServer(policy, host="127.0.0.1", port=0, seed=seed, transport=transport, openpi=openpi).start()


__all__ = ["local_policy_flag", "policy_for_space", "server_command", "start_local_server"]
