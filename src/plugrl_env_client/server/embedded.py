"""The embedded default: a reference server in a thread, matched to the env's action space.

``--local-policy random`` needs no second terminal and no flags to match: the action shape, dtype and bounds come
from the env's ``single_action_space``, and the server binds a free port on 127.0.0.1. Any registered policy
(:mod:`~plugrl_env_client.server.registry`) serves this way, with its config's defaults; a user's is registered by
a file the client imports (``--env-path my_policy.py``).

Each policy says which action spaces it can answer (:meth:`~plugrl_env_client.server.policies.Policy.refuses`):
the numeric ones (Box, Discrete, MultiDiscrete) by default, a Text space for ``--local-policy text`` (given no
choices it makes strings up from the space's own character set, see
:func:`~plugrl_env_client.server.policies.default_text_choices`; pass ``choices`` to answer in the env's format,
e.g. ``"<answer>3</answer>"``), a float Box for ``--local-policy ars``, which learns and saves its policy and
iteration log into the run folder (:data:`LOCAL_ARS_POLICY`), its seed from ``--runner.seed``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from plugrl_env_client.envs.base_env import describe_space
from plugrl_env_client.errors import ConfigError
from plugrl_env_client.protocol.openpi_keys import KeyMap
from plugrl_env_client.server.policies import (
    DEFAULT_TEXT_CHOICES,
    DEFAULT_TEXT_LENGTH,
    LOCAL_ARS_POLICY,
    Policy,
    default_text_choices,
)
from plugrl_env_client.server.registry import PolicyConfig, get_spec, make_policy, registered_names
from plugrl_env_client.server.server import PolicyServer

CHOICES_FIELD = "choices"
"""The config field ``--local-policy-choices`` sets, for the policies whose config has it (text)."""


def policy_for_space(name: str, space: gym.Space, horizon: int | None, seed: int | None = None,
                     choices: Sequence[str] = (), run_dir: Path | None = None) -> Policy:
    """The registered policy ``name``, answering actions that fit ``space``. ``horizon`` None: the policy's own
    default; ``choices``: the strings a policy whose config has ``choices`` answers with (others ignore them);
    ``run_dir``: the run folder, where a policy may write (ARS saves its policy there)."""
    spec = get_spec(name)
    why = spec.policy_cls.refuses(space)
    if why is not None:
        raise ConfigError(f"--local-policy {name} {why}, but the env's action space is {describe_space(space)}. "
                          f"{_alternatives(space, name)}")
    options: Any = None
    if spec.config is not None:
        given = {CHOICES_FIELD: tuple(choices)} if choices and CHOICES_FIELD in _field_names(spec.config) else {}
        options = spec.config(**given)
    shape, dtype, low, high = _numbers_of(space)
    config = PolicyConfig(name=name, action_horizon=horizon, dtype=dtype.name, seed=seed, options=options)
    try:
        return make_policy(config, action_shape=shape, low=low, high=high, space=space, run_dir=run_dir)
    except ValueError as exc:
        raise ConfigError(f"--local-policy {name}: {exc}") from exc


def _field_names(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def _alternatives(space: gym.Space, refused: str) -> str:
    """Which registered policies can answer ``space`` (or, when none can, where else to get actions)."""
    able = [n for n in registered_names() if n != refused and get_spec(n).policy_cls.refuses(space) is None]
    if not able:
        return ("Run a policy server that can (plugrl-run-policy-server) and connect with "
                "--server-host/--server-port")
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
    """The ``plugrl-run-policy-server`` command whose policy fits ``space`` (said when no server answers)."""
    base = f"plugrl-run-policy-server --port {port}"
    if isinstance(space, gym.spaces.Text):
        return f'{base} --policy.name text --policy.choices "<an answer>" "<another>"'
    if isinstance(space, gym.spaces.Discrete):
        return f"{base} --policy.action-dim 0 --policy.dtype int64 --policy.low {space.start} " \
               f"--policy.high {space.start + space.n - 1}"
    if isinstance(space, gym.spaces.Box) and len(space.shape) == 1:
        return f"{base} --policy.action-dim {space.shape[0]} --policy.dtype {np.dtype(space.dtype).name}"
    return base


def local_policy_flag(space: gym.Space) -> str:
    return "--local-policy text" if isinstance(space, gym.spaces.Text) else "--local-policy random"


def start_local_server(name: str, space: gym.Space, horizon: int | None, seed: int | None = None,
                       choices: Sequence[str] = (), transport: str = "websockets",
                       run_root: Path | None = None, openpi: KeyMap | None = None) -> PolicyServer:
    """Start the reference server on a free loopback port, serving in a daemon thread (over the client's
    ``transport``, so ``--transport picows`` speeds up both ends). ``run_root``: the run folder, where ARS saves
    its policy (:data:`LOCAL_ARS_POLICY`); ``openpi``: speak openpi's protocol, reading requests by this key map
    (None: PlugRL)."""
    policy = policy_for_space(name, space, horizon, seed, choices, run_root)
    if openpi is not None and policy.needs_feedback is not None:
        raise ConfigError(f"--local-policy {name} {policy.needs_feedback}, so it cannot serve --protocol openpi, "
                          "which has no feedback; use --local-policy random (or --protocol plugrl)")
    return PolicyServer(policy, host="127.0.0.1", port=0, seed=seed, transport=transport, openpi=openpi).start()


__all__ = ["DEFAULT_TEXT_CHOICES", "DEFAULT_TEXT_LENGTH", "LOCAL_ARS_POLICY", "default_text_choices",
           "local_policy_flag", "policy_for_space", "server_command", "start_local_server"]
