"""Observations as openpi's policies read them: which key of an openpi request holds which array of an env's
observation, and the same map read backwards.

openpi's policy server takes one example per request: a map whose keys the policy's input transforms name (its
LIBERO policy reads ``observation/image``, ``observation/wrist_image``, ``observation/state`` and ``prompt``; its
ALOHA policy a nested ``images: {cam_high: ...}`` in channel-first layout and ``state``). A :class:`KeyMap` says
where each of those keys comes from in an :class:`~plugrl_env_client.protocol.messages.ObservationLike`: a named
:data:`PRESETS` entry (as openpi's examples send them), with per-key overrides on top, or, without a preset, the
observation as it is (``images`` and ``states`` as maps of one env's arrays, the text as ``prompt``).

Images travel as openpi's client sends them: uint8, resized with padding to a square of ``image_size`` pixels by
the rule of ``openpi_client.image_tools.resize_with_pad`` (Pillow's bilinear resize to fit, pasted centred on
zeros), channel-first when the preset asks for it. Pillow is the extra ``openpi``, imported on first use.

An empty text is left out of a request (openpi's policies then use their default prompt, if they have one).
Nested keys are written with dots: ``images.cam_high``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from plugrl_env_client.errors import ConfigError, ProtocolError
from plugrl_env_client.protocol.messages import ObservationLike

__all__ = ["PRESETS", "KeyMap", "MissingKey", "Preset", "ObsPath", "resize_with_pad"]

GROUPS = ("images", "states", "text")
TEXT_KEY = ("prompt",)
"""Where the text goes without a preset (openpi's policies read their instruction there)."""


@dataclasses.dataclass(frozen=True)
class ObsPath:
    """Where a value of a request comes from: a camera, a state array, or the text."""

    group: str
    name: str = ""

    @classmethod
    def parse(cls, path: str) -> ObsPath:
        """``images.<name>``, ``states.<name>`` or ``text`` (a name may hold dots: ``images.pixels.top``)."""
        group, _, name = path.partition(".")
        if group not in GROUPS or (group == "text") != (name == ""):
            raise ValueError(f"{path!r} is not an observation path: use images.<camera>, states.<name> or text")
        return cls(group, name)

    def __str__(self) -> str:
        return "text" if self.group == "text" else f"{self.group}[{self.name!r}]"


@dataclasses.dataclass(frozen=True)
class Preset:
    """A named map from openpi keys (dotted for nesting) to observation paths, and the images' layout."""

    keys: Mapping[str, str]
    channels_first: bool = False


PRESETS: dict[str, Preset | None] = {
    "none": None,  # the observation as it is
    # openpi's examples/libero/main.py; LIBERO-v1's cameras and its 8-d state
    "libero": Preset({"observation/image": "images.agentview", "observation/wrist_image": "images.wrist",
                      "observation/state": "states.state", "prompt": "text"}),
    # openpi's examples/droid/main.py
    "droid": Preset({"observation/exterior_image_1_left": "images.exterior_image_1_left",
                     "observation/wrist_image_left": "images.wrist_image_left",
                     "observation/joint_position": "states.joint_position",
                     "observation/gripper_position": "states.gripper_position", "prompt": "text"}),
    # openpi's examples/aloha_sim: gym-aloha's top camera and joint positions (obs_type pixels_agent_pos)
    "aloha": Preset({"images.cam_high": "images.pixels.top", "state": "states.agent_pos", "prompt": "text"},
                    channels_first=True),
}


class MissingKey(ConfigError):
    """A key of the map comes from an array the env's observation does not have."""

    def __init__(self, key: str, source: ObsPath, obs: ObservationLike) -> None:
        self.key, self.source = key, source
        self.available = (f"images: {', '.join(sorted(obs.images)) or 'none'}; "
                          f"states: {', '.join(sorted(obs.states)) or 'none'}")
        super().__init__(f"openpi key {key!r} is taken from {source}, which the env's observation does not have "
                         f"(it has {self.available})")


@dataclasses.dataclass(frozen=True)
class KeyMap:
    """Which openpi key comes from which observation array (see the module docstring). ``keys`` are explicit
    (openpi key, source) pairs; ``as_is`` sends the observation's own maps besides them (no preset);
    ``image_size`` 0 sends images at their own size."""

    keys: tuple[tuple[str, ObsPath | None], ...]
    as_is: bool = False
    channels_first: bool = False
    image_size: int = 224

    @classmethod
    def of(cls, preset: str, overrides: Sequence[str] = (), image_size: int = 224) -> KeyMap:
        """The map of ``preset`` with ``overrides`` (``openpi_key=path``; an empty path leaves the key out). A
        ValueError says what is wrong with a value."""
        if preset not in PRESETS:
            raise ValueError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
        if image_size < 0:
            raise ValueError(f"an image size must be >= 0 pixels (0: as the env renders them), got {image_size}")
        chosen = PRESETS[preset]
        keys: dict[str, ObsPath | None] = {k: ObsPath.parse(v) for k, v in (chosen.keys if chosen else {}).items()}
        for item in overrides:
            key, sep, path = item.partition("=")
            key = key.strip()
            if not sep or not key or any(not part for part in key.split(".")):
                raise ValueError(f"{item!r} is not openpi_key=observation_path (e.g. observation/image=images.front)")
            keys[key] = ObsPath.parse(path.strip()) if path.strip() else None
        return cls(tuple(keys.items()), as_is=chosen is None,
                   channels_first=chosen is not None and chosen.channels_first, image_size=image_size)

    # ------------------------------------------------------------------------------------------ the client's side

    def check(self, obs: ObservationLike) -> None:
        """A :class:`MissingKey` for the first key whose source ``obs`` does not have."""
        for key, source in self.keys:
            if source is not None and source.group != "text" and source.name not in getattr(obs, source.group):
                raise MissingKey(key, source, obs)

    def request(self, obs: ObservationLike, row: int) -> dict[str, Any]:
        """The openpi request of env ``row`` of ``obs`` (checked with :meth:`check` first)."""
        out: dict[str, Any] = {}
        dropped = {key for key, source in self.keys if source is None}
        if self.as_is:
            for group in ("images", "states"):
                if group not in dropped:
                    arrays = getattr(obs, group)
                    out[group] = {name: self._value(ObsPath(group, name), arrays[name], row) for name in arrays}
            if "prompt" not in dropped:
                _put_text(out, TEXT_KEY, obs.text[row])
        for key, source in self.keys:
            if source is None:
                continue
            path = tuple(key.split("."))
            if source.group == "text":
                _put_text(out, path, obs.text[row])
            else:
                _put(out, path, self._value(source, getattr(obs, source.group)[source.name], row))
        return out

    def _value(self, source: ObsPath, batch: np.ndarray, row: int) -> np.ndarray:
        value = batch[row]
        if source.group != "images":
            return value
        image = _uint8(value, str(source))
        if self.image_size:
            image = resize_with_pad(image, self.image_size, self.image_size)
        if self.channels_first and image.ndim == 3:
            image = np.ascontiguousarray(image.transpose(2, 0, 1))
        return image

    # ------------------------------------------------------------------------------------------ the server's side

    def observation(self, request: Any) -> dict[str, Any]:
        """A request read back into the wire map of a batch of one (``images``, ``states``, ``text``), as the
        reference server's policies take it. A :class:`ProtocolError` names a key the request lacks."""
        if not isinstance(request, dict):
            raise ProtocolError(f"an openpi request must be a map, got {type(request).__name__}")
        images: dict[str, np.ndarray] = {}
        states: dict[str, np.ndarray] = {}
        text = ""
        dropped = {key for key, source in self.keys if source is None}
        if self.as_is:
            for group, into in (("images", images), ("states", states)):
                found = request.get(group, {}) if group not in dropped else {}
                if not isinstance(found, dict):
                    raise ProtocolError(f"the request's {group!r} must be a map of arrays, got "
                                        f"{type(found).__name__}")
                for name, value in found.items():
                    into[str(name)] = self._array(value, f"{group}.{name}", group == "images")
            text = _text(request.get("prompt", ""), "prompt")
        for key, source in self.keys:
            if source is None:
                continue
            value = _get(request, tuple(key.split(".")))
            if source.group == "text":
                text = "" if value is _ABSENT else _text(value, key)
                continue
            if value is _ABSENT:
                raise ProtocolError(f"the request has no {key!r} (the key map reads {source} from it); its keys: "
                                    f"{sorted(map(str, request))}")
            (images if source.group == "images" else states)[source.name] = self._array(
                value, key, source.group == "images")
        return {"images": {k: v[None] for k, v in images.items()}, "states": {k: v[None] for k, v in states.items()},
                "text": np.array([text])}

    def _array(self, value: Any, key: str, image: bool) -> np.ndarray:
        if not isinstance(value, np.ndarray):
            raise ProtocolError(f"the request's {key!r} must be an array, got {type(value).__name__}")
        if image:
            value = _uint8(value, repr(key))
            if self.channels_first and value.ndim == 3:
                value = value.transpose(1, 2, 0)
        return value


_ABSENT = object()


def _put(out: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    for part in path[:-1]:
        out = out.setdefault(part, {})
    out[path[-1]] = value


def _put_text(out: dict[str, Any], path: tuple[str, ...], text: Any) -> None:
    if str(text):
        _put(out, path, str(text))


def _get(request: dict[str, Any], path: tuple[str, ...]) -> Any:
    value: Any = request
    for part in path:
        if not isinstance(value, dict) or part not in value:
            return _ABSENT
        value = value[part]
    return value


def _text(value: Any, key: str) -> str:
    if isinstance(value, (str, np.str_)):
        return str(value)
    raise ProtocolError(f"the request's {key!r} must be a str, got {type(value).__name__}")


def _uint8(image: np.ndarray, what: str) -> np.ndarray:
    """An image as uint8: float images scaled from [0, 1] as openpi's client does (``convert_to_uint8``)."""
    if image.dtype == np.uint8:
        return image
    if image.dtype.kind == "f":
        return (255 * image).astype(np.uint8)
    raise ProtocolError(f"image {what} must be uint8 (or float in [0, 1]), got {image.dtype.str}")


def resize_with_pad(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """``image`` (``[h, w]`` or ``[h, w, c]`` uint8) fitted into ``height`` x ``width``: scaled by Pillow's
    bilinear filter to keep its aspect (each side truncated to whole pixels), then pasted centred on zeros; an
    image of that size already is returned as it is. The rule of openpi's client, so a policy sees what it was
    trained on."""
    if image.shape[:2] == (height, width):
        return image
    try:
        from PIL import Image
    except ImportError:
        raise ConfigError("resizing images for an openpi policy needs Pillow: pip install "
                          "'plugrl-env-client[openpi]'") from None
    one_channel = image.ndim == 3 and image.shape[2] == 1
    picture = Image.fromarray(image[:, :, 0] if one_channel else image)
    cur_width, cur_height = picture.size
    ratio = max(cur_width / width, cur_height / height)
    resized_height, resized_width = int(cur_height / ratio), int(cur_width / ratio)
    resized = picture.resize((resized_width, resized_height), resample=Image.Resampling.BILINEAR)
    canvas = Image.new(resized.mode, (width, height), 0)
    canvas.paste(resized, (max(0, int((width - resized_width) / 2)), max(0, int((height - resized_height) / 2))))
    out = np.asarray(canvas)
    return out[:, :, None] if one_channel else out
