"""The wire protocols a client can speak, by name: the one place a run's ``protocol`` choice becomes a session.

Each entry makes the rollout's server session for one env group: a PlugRL
:class:`~plugrl_env_client.protocol.session.Session` (one connection, batched infers and feedback), or an
:class:`~plugrl_env_client.protocol.openpi.OpenpiSession` (one request per env over several connections). Both
offer the same interface, so the rollout does not know which protocol it talks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from plugrl_env_client.protocol.dialing import SessionConfig
from plugrl_env_client.protocol.openpi import OpenpiSession
from plugrl_env_client.protocol.session import Session
from plugrl_env_client.timing import Timing

if TYPE_CHECKING:
    from plugrl_env_client.websocket.keepalive import Keepalive

__all__ = ["PROTOCOLS", "open_session"]

SessionFactory = Callable[[SessionConfig, int, Callable[[], bool], Timing, "Keepalive | None"], Any]


def _plugrl(config: SessionConfig, num_envs: int, should_stop: Callable[[], bool], timing: Timing,
            keepalive: Keepalive | None) -> Session:
    return Session(config, should_stop, timing, keepalive)


PROTOCOLS: dict[str, SessionFactory] = {"plugrl": _plugrl, "openpi": OpenpiSession}
"""Session makers by protocol name (the choices of ``SessionConfig.protocol``)."""


def open_session(config: SessionConfig, num_envs: int, should_stop: Callable[[], bool] = lambda: False,
                 timing: Timing | None = None, keepalive: Keepalive | None = None) -> Session | OpenpiSession:
    """The session of ``config.protocol`` for an env group of ``num_envs`` envs (not connected yet)."""
    return PROTOCOLS[config.protocol](config, num_envs, should_stop, timing if timing is not None else Timing(),
                                      keepalive)
