"""The command line's ``--openpi.*`` sections: how the client and the reference server map observations onto
openpi's request keys, and how the client spreads its requests. The protocol itself is
:mod:`~plugrl_env_client.protocol.openpi`, which reads these choices without knowing they are flags."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Literal

import tyro

__all__ = ["OpenpiConfig", "OpenpiKeysConfig"]


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
