"""The embedded default: a reference server in a thread, matched to the env's action space.

``--local-policy random`` needs no second terminal and no flags to match: the action shape, dtype and bounds come
from the env's ``single_action_space``, and the server binds a free port on 127.0.0.1.

Text action spaces (``gymnasium.spaces.Text``, language-agent envs) take ``--local-policy text``: the policy picks
one of a few strings per env and step. Given no choices it makes up :data:`DEFAULT_TEXT_CHOICES` strings from the
space's own character set (seeded, at most :data:`DEFAULT_TEXT_LENGTH` characters each), so any text env runs with
no flags; such gibberish exercises the text path (and an env's handling of malformed answers) but plays no game.
Pass ``choices`` to answer in the env's format (e.g. ``"<answer>3</answer>"``).

``--local-policy ars`` learns (Augmented Random Search, :mod:`~plugrl_env_client.server.ars`): its action shape and
bounds come from the env's Box action space, its seed from ``--runner.seed``, and it saves its policy and iteration
log into the run folder (:data:`LOCAL_ARS_POLICY`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import gymnasium as gym
import numpy as np

from plugrl_env_client.envs.base_env import describe_space
from plugrl_env_client.errors import ConfigError
from plugrl_env_client.server.policies import Policy, PolicyConfig, make_policy
from plugrl_env_client.server.server import PolicyServer

DEFAULT_TEXT_CHOICES = 8
"""How many strings ``--local-policy text`` makes up when it is given none."""
DEFAULT_TEXT_LENGTH = 16
"""Longest made-up string (a Text space's max_length can be huge; a smoke-test answer need not be)."""
LOCAL_ARS_POLICY = "policy/ars.npz"
"""Where ``--local-policy ars`` saves its policy, in the run folder (its iteration log: ``policy/ars.jsonl``)."""


def policy_for_space(name: str, space: gym.Space, horizon: int | None, seed: int | None = None,
                     choices: Sequence[str] = (), save: Path | None = None) -> Policy:
    """A reference policy whose actions fit ``space`` (Box, Discrete, MultiDiscrete, or Text with ``"text"``; a
    float Box for ``"ars"``). ``horizon`` None: the policy's own default.

    ``choices`` are the strings the text policy answers with (default: made up from the space's charset); ``save``
    is where ARS saves its policy.
    """
    if name == "ars":
        if not (isinstance(space, gym.spaces.Box) and np.dtype(space.dtype).kind == "f"):
            raise ConfigError(
                f"--local-policy ars learns a linear map from the env's state arrays to continuous actions, so it "
                f"needs a gymnasium Box action space of floats; the env's action space is {describe_space(space)}. "
                "Use --local-policy random or zero (or text for Text spaces)"
            )
        config = PolicyConfig(name="ars", action_horizon=horizon, dtype=np.dtype(space.dtype).name, seed=seed)
        return make_policy(config, action_shape=tuple(space.shape), low=space.low, high=space.high, save=save)
    if isinstance(space, gym.spaces.Text):
        if name != "text":
            raise ConfigError(
                f"--local-policy {name} cannot produce text actions for the env's action space {describe_space(space)}; "
                "use --local-policy text (it answers with one of a few strings per env and step)"
            )
        picked = tuple(choices) or default_text_choices(space, seed)
        return make_policy(PolicyConfig(name="text", action_horizon=horizon, seed=seed, choices=picked))
    if name == "text":
        raise ConfigError(
            f"--local-policy text answers with strings, but the env's action space is {space}; use "
            "--local-policy random or --local-policy zero"
        )
    if isinstance(space, gym.spaces.Box):
        shape, dtype, low, high = space.shape, space.dtype, space.low, space.high
    elif isinstance(space, gym.spaces.Discrete):
        shape, dtype, low, high = (), np.dtype(np.int64), space.start, space.start + space.n - 1
    elif isinstance(space, gym.spaces.MultiDiscrete):
        shape, dtype, low, high = space.shape, np.dtype(np.int64), space.start, space.start + space.nvec - 1
    else:
        raise ConfigError(
            f"--local-policy cannot produce actions for {space}; run a policy server that can "
            "(plugrl-run-policy-server) and connect with --server-host/--server-port"
        )
    config = PolicyConfig(name=name, action_horizon=horizon, dtype=np.dtype(dtype).name, seed=seed)  # type: ignore[arg-type]
    return make_policy(config, action_shape=tuple(shape), low=low, high=high)


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


def default_text_choices(space: gym.spaces.Text, seed: int | None = None) -> tuple[str, ...]:
    """:data:`DEFAULT_TEXT_CHOICES` strings drawn from ``space``'s charset, lengths within its bounds (capped at
    :data:`DEFAULT_TEXT_LENGTH` unless its min_length is longer).

    The charset is sorted first: a frozenset's iteration order changes with Python's hash seed, and the same seed
    must give the same strings in every run.
    """
    charset = sorted(space.character_set)
    low = int(space.min_length)
    high = max(low, min(int(space.max_length), DEFAULT_TEXT_LENGTH))
    rng = np.random.default_rng(seed)
    lengths = rng.integers(low, high + 1, size=DEFAULT_TEXT_CHOICES)
    return tuple("".join(charset[i] for i in rng.integers(len(charset), size=int(k))) for k in lengths)


def start_local_server(name: str, space: gym.Space, horizon: int | None, seed: int | None = None,
                       choices: Sequence[str] = (), transport: str = "websockets",
                       run_root: Path | None = None) -> PolicyServer:
    """Start the reference server on a free loopback port, serving in a daemon thread (over the client's
    ``transport``, so ``--transport picows`` speeds up both ends). ``run_root``: the run folder, where ARS saves
    its policy (:data:`LOCAL_ARS_POLICY`)."""
    save = run_root / LOCAL_ARS_POLICY if name == "ars" and run_root is not None else None
    return PolicyServer(policy_for_space(name, space, horizon, seed, choices, save), host="127.0.0.1", port=0,
                        seed=seed, transport=transport).start()
