"""``plugrl-run-policy-server``: the reference policy server as a standalone process.

The ``--policy.*`` section is built when the command runs, from the registered policies
(:mod:`~plugrl_env_client.server.registry`): ``--policy-path`` files are imported first, so a user's policy is a
choice of ``--policy.name`` and the fields of its config are ``--policy.<field>`` flags.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import threading
from collections.abc import Sequence
from typing import Annotated, Literal

import tyro

from plugrl_env_client.cli_support import cli, run_cli
from plugrl_env_client.connection_flags import OpenpiKeysConfig
from plugrl_env_client.errors import ConfigError
from plugrl_env_client.protocol.images import DEFAULT_MAX_PIXELS
from plugrl_env_client.protocol.openpi_keys import KeyMap
from plugrl_env_client.server.log_sink import ServerLog
from plugrl_env_client.server.policies import Policy
from plugrl_env_client.server.registry import (
    PolicyConfig,
    config_from_flags,
    flags_class,
    load_policy_files,
    make_policy,
    policy_paths,
)
from plugrl_env_client.server.server import PolicyServer
from plugrl_env_client.websocket.common import api_key_problem

logger = logging.getLogger(__name__)

@dataclasses.dataclass
class ServerArgs:
    """Serve a reference policy over the PlugRL v1 protocol (or openpi's)."""

    host: str = "127.0.0.1"
    """Address to bind: 127.0.0.1 serves this machine only; 0.0.0.0 accepts clients from other machines, and then
    anyone who reaches the port can feed the policy unless an --api-key is given too."""
    port: int = 8000
    """Port to listen on (0: any free port, printed when the server is up)."""
    max_episodes: Annotated[int | None, tyro.conf.arg(help_behavior_hint="(default: no limit)")] = None
    """End the run (close every client with plugrl-server-stop) after this many reported episodes."""
    reuse_feedback_obs: bool = True
    """Offer the reuse-feedback-obs feature (clients then skip re-sending observations held from feedback)."""
    image_codecs: bool = True
    """Offer the x-plugrl-env-client-images feature (clients with --image-codec then send camera images encoded
    per env row; the server decodes them before the policy sees them). Offered only with the images extra."""
    max_image_pixels: int = DEFAULT_MAX_PIXELS
    """The most pixels (env rows x height x width, all cameras together) the encoded images of one message may
    declare; a message declaring more is refused unread (its connection is closed with plugrl-server-resync and a
    log line), so a few bytes cannot make the server allocate gigabytes. Raise it for larger batches of images."""
    transport: Literal["websockets", "picows"] = "websockets"
    """The WebSocket implementation: websockets, or picows (extra fast; the same bytes, faster for large frames)."""
    api_key: Annotated[str | None, tyro.conf.arg(help_behavior_hint="(default: $PLUGRL_SERVER_API_KEY if set)")] = None
    """Serve only clients whose handshake carries 'Authorization: Api-Key <key>' (the client's --api-key or
    $PLUGRL_API_KEY); others get HTTP 401. The environment variable keeps the key out of the process list."""
    protocol: Literal["plugrl", "openpi"] = "plugrl"
    """The wire protocol: plugrl (PlugRL v1), or openpi (openpi's policy servers' protocol: one env's observation
    per request, its keys read back by --openpi.preset and --openpi.key; the requests of concurrent connections
    are answered together when the policy batches). A policy that learns from feedback (ars) cannot serve openpi."""
    openpi: OpenpiKeysConfig = dataclasses.field(default_factory=OpenpiKeysConfig)
    policy_path: Annotated[tuple[str, ...], tyro.conf.UseAppendAction] = ()
    """A Python file that registers a policy with @register_policy, imported before the command line is read: its
    name is then a choice of --policy.name and its config's fields are --policy.* flags."""
    policy: Annotated[PolicyConfig, tyro.conf.arg(constructor_factory=flags_class)] = dataclasses.field(
        default_factory=PolicyConfig)


API_KEY_ENV = "PLUGRL_SERVER_API_KEY"


def resolved_api_key(flag: str | None) -> str | None:
    """The key the server asks for: ``--api-key``, else ``$PLUGRL_SERVER_API_KEY`` (unset or empty: none).

    The key travels in an HTTP header, so it must be printable ASCII without spaces; a key that is not is refused
    (without echoing it: a key is never printed)."""
    key = flag if flag is not None else (os.environ.get(API_KEY_ENV) or None)
    if key is None:
        return None
    source = "--api-key" if flag is not None else f"${API_KEY_ENV}"
    if not key:
        raise ConfigError(f"{source} is empty; give a key, or leave it out to serve without one")
    problem = api_key_problem(key)
    if problem is not None:
        raise ConfigError(f"{source} cannot travel in an HTTP header: {problem}; use printable ASCII characters "
                          "only, e.g. a hex string")
    return key


def main(args: Sequence[str] | None = None) -> None:
    """Serve until Ctrl-C (exit 0); a bad ``--policy.*`` value or a port that is taken is a one-line error (exit 1),
    as for every plugrl command (:mod:`plugrl_env_client.cli_support`)."""
    run_cli(lambda: _serve(parse(args)), args)


def parse(args: Sequence[str] | None = None) -> ServerArgs:
    """The command line as :class:`ServerArgs`, its ``policy`` a plain :class:`PolicyConfig` holding the named
    policy's own config; the ``--policy-path`` files are imported before the parser is built."""
    args = list(sys.argv[1:] if args is None else args)
    load_policy_files(policy_paths(args))
    parsed = cli(ServerArgs, args, "plugrl-run-policy-server")
    return dataclasses.replace(parsed, policy=config_from_flags(parsed.policy))


def _serve(cfg: ServerArgs) -> int:
    # Log lines go through a bounded queue to a thread of their own: a stderr nobody reads never stops serving.
    with ServerLog():
        return _serve_logged(cfg)


def _serve_logged(cfg: ServerArgs) -> int:
    server: PolicyServer | None = None
    try:
        api_key = resolved_api_key(cfg.api_key)
        try:
            keys = KeyMap.of(cfg.openpi.preset, cfg.openpi.key) if cfg.protocol == "openpi" else None
        except ValueError as exc:
            raise ConfigError(f"--openpi.key / --openpi.preset: {exc}") from None
        try:
            policy = make_policy(cfg.policy)
            server = PolicyServer(policy, host=cfg.host, port=cfg.port, max_episodes=cfg.max_episodes,
                                  reuse_feedback_obs=cfg.reuse_feedback_obs, seed=cfg.policy.seed,
                                  transport=cfg.transport, latency_ms=cfg.policy.latency_ms, api_key=api_key,
                                  image_codecs=cfg.image_codecs, max_image_pixels=cfg.max_image_pixels,
                                  openpi=keys)
        except (TypeError, ValueError, OSError) as exc:  # a bad --policy.* value, the port is taken
            raise ConfigError(str(exc)) from exc
        shape = _shape_of(policy)
        latency = f", latency={cfg.policy.latency_ms:g} ms" if cfg.policy.latency_ms else ""
        if api_key is None and not server.loopback_only:
            logger.warning("listening on %s:%d without an API key: anyone who reaches this port can feed the policy; "
                           "give --api-key KEY (or $%s) and the clients the same --api-key", cfg.host, server.port,
                           API_KEY_ENV)
        keyed = ", API key required" if api_key is not None else ""
        wire = f", openpi protocol, preset {cfg.openpi.preset}" if keys is not None else ""
        print(f"Policy server ({cfg.policy.name}, {shape}, horizon={policy.horizon}{latency}, {cfg.transport}{keyed}"
              f"{wire}) listening on ws://{cfg.host}:{server.port}", flush=True)
        # A policy that cannot serve the clients' env ends the run; then this process ends too, with the reason.
        threading.Thread(target=_stop_on_failure, args=(server,), name="plugrl-failure-watch", daemon=True).start()
        server.serve_forever()
    except KeyboardInterrupt:  # Ctrl-C is how a server is stopped, also while it starts: not an error
        pass
    finally:
        if server is not None:
            server.shutdown()
    if server is not None and server.failure is not None:  # a user error like any other: one line, exit 1
        raise ConfigError(str(server.failure))
    return 0


def _shape_of(policy: Policy) -> str:
    """What the start line says of the actions: the number of choices of a text policy, else action_dim."""
    choices = getattr(policy, "choices", None)
    if policy.dtype.kind == "U" and choices is not None:
        return f"{len(choices)} choices"
    return f"action_dim={policy.metadata().get('action_dim', 'None')}"


def _stop_on_failure(server: PolicyServer) -> None:
    server.failed.wait()
    server.shutdown()


if __name__ == "__main__":  # python -m plugrl_env_client.server.cli, as plugrl-run-policy-server
    main()
