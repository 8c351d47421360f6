"""The command line's choices of how a client connects: :class:`ConnectionConfig` (flags without a section prefix,
``--connect-timeout``, ``--image-codec``, ``--protocol``, ...) and the ``--openpi.*`` sections (how the client and
the reference server map observations onto openpi's request keys, and how the client spreads its requests).

They are the command line's dataclasses; ``protocol/`` never sees them: it takes the plain values of a
:class:`~plugrl_env_client.protocol.dialing.SessionConfig` (:meth:`ConnectionConfig.session`), which names each
choice by its flag in its messages."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any, Literal

import tyro

from plugrl_env_client.protocol.dialing import SessionConfig
from plugrl_env_client.protocol.images import DEFAULT_QUALITY

__all__ = ["ConnectionConfig", "OpenpiConfig", "OpenpiKeysConfig"]


@dataclasses.dataclass(frozen=True)
class OpenpiKeysConfig:
    """Which openpi key holds which observation array (--protocol openpi)."""

    preset: Literal["none", "libero", "droid", "aloha"] = "none"
    """The keys of openpi's examples: libero (observation/image <- images.agentview, observation/wrist_image <-
    images.wrist, observation/state <- states.state, prompt <- text), droid, aloha (images.cam_high
    channel-first <- images.pixels.top, state <- states.agent_pos); none sends the observation as it is (maps
    images and states of one env's arrays, the text as prompt)."""
    key: Annotated[tuple[str, ...], tyro.conf.arg(help_behavior_hint="(default: the preset's keys)")] = ()
    """Overrides, openpi_key=observation_path (images.<camera>, states.<name> or text; nested openpi keys with
    dots; an empty path leaves the key out), e.g. observation/image=images.front."""


@dataclasses.dataclass(frozen=True)
class OpenpiConfig(OpenpiKeysConfig):
    """How the client talks to openpi policy servers (--protocol openpi)."""

    image_size: int = 224
    """Images are resized with zero padding to this square size, as openpi's client does (0: as rendered)."""
    connections: Annotated[int | None, tyro.conf.arg(
        help_behavior_hint="(default: one per env, so every env's next request is in flight)")] = None
    """Connections per process, shared by its pipeline groups and spread over every --server-url."""


@dataclasses.dataclass(frozen=True)
class ConnectionConfig:
    """How the client connects to its server, and what it does when the server goes away."""

    # The user's choices: on the command line they are flags without a section prefix (--connect-timeout).

    api_key: Annotated[str | None, tyro.conf.arg(help_behavior_hint="(default: $PLUGRL_API_KEY if set)")] = None
    """Sent as 'Authorization: Api-Key <key>'."""
    reconnect_on_server_stop: bool = False
    """After the server ends a run, wait for its next run instead of exiting."""
    max_reconnects: Annotated[int | None, tyro.conf.arg(
        help_behavior_hint="(default: keep reconnecting while the server comes back)")] = None
    """Give up after this many reconnects."""
    connect_timeout: Annotated[float | None, tyro.conf.arg(help_behavior_hint="(default: wait until a server is up)")
                               ] = None
    """Seconds to wait for the first connection (the server's metadata included)."""
    reconnect_timeout: Annotated[float | None, tyro.conf.arg(help_behavior_hint="(default: wait until it does)")
                                 ] = None
    """Seconds to wait for the server to come back after a lost connection."""
    infer_timeout: Annotated[float | None, tyro.conf.arg(
        help_behavior_hint="(default: no limit, as a first GPU compile can take minutes)")] = None
    """Seconds to wait for the server's reply to an infer; then the connection is closed and opened again (each
    time counts as one of --max-reconnects). A warning comes after 30 s without a reply, then every minute."""
    reuse_feedback_obs: bool = True
    """When the server offers reuse-feedback-obs, do not upload an observation the server already holds."""
    image_codec: Literal["none", "jpeg", "qoi"] = "none"
    """Send camera images ([n, h, w, c] uint8) encoded per env row when the server offers it
    (x-plugrl-env-client-images; the reference server does), cutting the bytes of each step on a slow link: jpeg
    (lossy: 1- and 3-channel images; others travel raw) or qoi (lossless: 3- and 4-channel images). none: raw
    arrays, as every PlugRL server takes them. A server that does not offer it gets raw arrays, with one warning
    (extra images)."""
    image_quality: int = DEFAULT_QUALITY
    """JPEG quality (1..100) of --image-codec jpeg."""
    protocol: Literal["plugrl", "openpi"] = "plugrl"
    """The wire protocol: plugrl (PlugRL v1, batched infers and feedback), or openpi (openpi's policy servers: one
    env's observation per request over --openpi.connections connections, keys mapped by --openpi.preset; the
    embedded server speaks it too)."""

    def session(self, **added: Any) -> SessionConfig:
        """The protocol's plain :class:`~plugrl_env_client.protocol.dialing.SessionConfig` of these choices, with
        ``added`` (``url`` and the hints that fit the env, or a resolved ``api_key``), naming each choice by its flag."""
        taken = {f.name for f in dataclasses.fields(SessionConfig)}
        chosen = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name in taken}
        words = {f.name: self.word(f.name) for f in dataclasses.fields(self)}
        return SessionConfig(**{**chosen, "words": words, **added})

    @staticmethod
    def word(field: str) -> str:
        """How the user sets the choice ``field``: its flag (the key also from ``$PLUGRL_API_KEY``)."""
        flag = "--" + field.replace("_", "-")
        return f"{flag} / $PLUGRL_API_KEY" if field == "api_key" else flag

