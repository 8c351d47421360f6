"""The four PlugRL v1 messages: builders for what we send and validating parsers for what we receive.

Both ends live here (client and reference server) so the two can never disagree on a key name. Parsers raise
:class:`ProtocolError` with a message that names the offending key and what was expected.
"""

from __future__ import annotations

import dataclasses
import reprlib
from collections.abc import Mapping
from typing import Any, Generic, Protocol, TypeVar

import numpy as np

from plugrl_env_client.errors import ProtocolError
from plugrl_env_client.protocol import images as image_codecs

PROTOCOL_VERSION = 1
METADATA, INFER, ACTION, FEEDBACK = "metadata", "infer", "action", "feedback"
FEATURE_REUSE_FEEDBACK_OBS = "reuse-feedback-obs"

# Close reasons (code 1001 unless noted) and what a client does on each.
REASON_STOP = "plugrl-server-stop"
REASON_RESYNC = "plugrl-server-resync"
REASON_FEEDBACK_TIMEOUT = "Feedback timeout"
REASON_SHUTDOWN = "Server shutdown"
REASON_INTERNAL = "Internal server error."  # code 1011
CLOSE_GOING_AWAY, CLOSE_NORMAL, CLOSE_INTERNAL = 1001, 1000, 1011

# Handshake header naming a client's (process, env group) stream, "<process>.<group>"; optional, ignorable.
STREAM_HEADER = "X-PlugRL-Stream"

OBS_KEYS = ("images", "states", "text")
FEEDBACK_KEYS = ("obs", "rewards", "terminated", "truncated", "info")


Obs = TypeVar("Obs", covariant=True)
"""An observation batch: an :class:`ObservationLike` as the client builds a message, its wire map once parsed."""


@dataclasses.dataclass(frozen=True, slots=True)
class ServerMetadata:
    """What a server said about itself; ``None`` means the server did not say (never zero)."""

    raw: dict[str, Any]
    protocol_version: int | None = None
    server: str | None = None
    action_horizon: int | None = None
    action_dim: int | None = None
    features: tuple[str, ...] = ()

    def supports(self, feature: str) -> bool:
        return feature in self.features


@dataclasses.dataclass(frozen=True, slots=True)
class ActionReply:
    """A time-major chunk: ``actions[t, j]`` is the action for env ``env_ids[j]`` at chunk step ``t``."""

    env_ids: np.ndarray
    actions: np.ndarray
    server_infer_s: float | None = None
    """The inference time the server reported with the reply (openpi's ``server_timing``), None when it did not."""

    def message(self) -> dict[str, Any]:
        """The message as it travels (the reference server's reply to an infer)."""
        env_ids = np.asarray(self.env_ids, dtype=_I8)
        return {"message_type": ACTION, "data": {"env_ids": env_ids, "action": self.actions}}


@dataclasses.dataclass(frozen=True, slots=True)
class InferRequest(Generic[Obs]):
    """An infer: observation rows for ``env_indices`` (only those not marked in ``reuse``, when given)."""

    obs: Obs
    env_indices: np.ndarray
    step_ids: np.ndarray
    reuse: np.ndarray | None = None

    def message(self, obs: Any = None) -> dict[str, Any]:
        """The message as it travels, with ``obs`` (the wire map of :attr:`obs`) in place of :attr:`obs` when
        given."""
        msg = {"message_type": INFER, "data": self.obs if obs is None else obs,
               "env_indices": np.asarray(self.env_indices, dtype=_I8), "step_ids": np.asarray(self.step_ids, dtype=_I8)}
        if self.reuse is not None:
            msg["reuse"] = np.asarray(self.reuse, dtype=bool)
        return msg


@dataclasses.dataclass(frozen=True, slots=True)
class Feedback(Generic[Obs]):
    """A feedback: what the envs of ``env_indices`` saw at the end of their chunks (rewards summed over it).

    The rollout builds one and hands it to its session whole; the reference server gets one from
    :func:`parse_feedback`. A field added here is added to :meth:`message`, its parser and SPEC."""

    env_indices: np.ndarray
    step_ids: np.ndarray
    obs: Obs
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    info: dict[str, Any]

    def message(self, obs: Any = None, info: Any = None) -> dict[str, Any]:
        """The message as it travels, with ``obs`` and ``info`` in place of those fields when given (the wire map
        of :attr:`obs`; :class:`~plugrl_env_client.protocol.codec.Timed` parts)."""
        return {
            "message_type": FEEDBACK,
            "env_indices": np.asarray(self.env_indices, dtype=_I8),
            "step_ids": np.asarray(self.step_ids, dtype=_I8),
            "data": {
                "obs": self.obs if obs is None else obs,
                "rewards": np.asarray(self.rewards, dtype="<f4"),
                "terminated": np.asarray(self.terminated, dtype=bool),
                "truncated": np.asarray(self.truncated, dtype=bool),
                "info": self.info if info is None else info,
            },
        }


class ObservationLike(Protocol):
    """What the wire needs of an observation batch (an env's ``Observation`` has it): the env batch leads."""

    @property
    def images(self) -> Mapping[str, np.ndarray]: ...

    @property
    def states(self) -> Mapping[str, np.ndarray]: ...

    @property
    def text(self) -> np.ndarray: ...


# ----------------------------------------------------------------------------------------------- builders


def wire_observation(obs: ObservationLike, image_codec: str = "none",
                     quality: int = image_codecs.DEFAULT_QUALITY) -> dict[str, Any]:
    """The three-key map an observation batch travels as.

    Servers read the batch size from an array, so a batch with neither images nor states (a text-only env)
    carries an empty ``states["_batch"]`` of shape ``(n, 0)``: the batch size, and no payload.

    With an ``image_codec`` other than ``none`` (only on a connection whose server offers
    :data:`~plugrl_env_client.protocol.images.FEATURE`), each camera the codec carries travels as its
    :func:`encoded_image` map; the others stay arrays.
    """
    states: Mapping[str, np.ndarray] = obs.states
    if not obs.images and not states:
        states = {"_batch": np.zeros((obs.text.shape[0], 0), np.float32)}
    cameras: Mapping[str, Any] = obs.images
    if image_codec != "none" and cameras:
        cameras = {name: encoded_image(arr, image_codec, quality, name) for name, arr in cameras.items()}
    return {"images": cameras, "states": states, "text": obs.text}


def encoded_image(arr: np.ndarray, codec: str, quality: int, name: str = "images") -> np.ndarray | dict[str, Any]:
    """One camera's batch as it travels with the images feature: ``{"codec", "shape", "rows"}`` (one encoded image
    per env row) when ``codec`` carries it, else the array itself (raw: :func:`~plugrl_env_client.protocol.images.refusal`
    says why)."""
    if not isinstance(arr, np.ndarray) or not image_codecs.encodable(arr.shape, codec, arr.dtype):
        return arr
    rows = image_codecs.encode(arr, codec, quality, field=f"images[{name!r}]")
    return {"codec": codec, "shape": list(arr.shape), "rows": rows}


def metadata_message(data: dict[str, Any]) -> dict[str, Any]:
    return {"message_type": METADATA, "data": data}


_I8 = np.dtype("<i8")
"""env indices and step ids travel as little-endian int64"""


# ----------------------------------------------------------------------------------------------- parsers


_SHORT = reprlib.Repr()
"""How a peer's values show in a log line or an error: a few levels deep and the start of each long value, so any
nesting and any size (a server may send anything under keys it adds, SPEC 4.1) gives a short line, never a
RecursionError."""
_SHORT.maxlevel, _SHORT.maxdict, _SHORT.maxlist, _SHORT.maxtuple = 4, 20, 10, 10
_SHORT.maxstring, _SHORT.maxother, _SHORT.maxlong = 80, 80, 40


def short_repr(value: Any, limit: int = 300) -> str:
    """``value`` shown by :data:`_SHORT`, then cut to ``limit`` characters (then ``...``): a message's content in a
    log line or an error stays readable when it holds large arrays or deep maps."""
    text = _SHORT.repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def message_type(msg: Any) -> str:
    if not isinstance(msg, dict) or not isinstance(msg.get("message_type"), str):
        got = type(msg).__name__ if not isinstance(msg, dict) else f"a map with keys {sorted(map(str, msg))}"
        raise ProtocolError(f"expected a map with a str 'message_type', got {got}")
    return msg["message_type"]


def _expect_type(msg: Any, expected: str) -> None:
    kind = message_type(msg)
    if kind != expected:
        raise ProtocolError(f"expected a {expected!r} message, got {kind!r}")


def _opt_int(data: dict[str, Any], key: str) -> int | None:
    value = data.get(key)
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return int(value)
    return None


def parse_metadata(msg: Any) -> ServerMetadata:
    """The server's first message. No key is required; unknown keys are kept in ``raw`` and otherwise ignored."""
    _expect_type(msg, METADATA)
    data = msg.get("data")
    if data is None:  # some servers leave it out entirely
        data = {}
    if not isinstance(data, dict):
        raise ProtocolError(f"metadata 'data' must be a map, got {type(data).__name__}")
    features = data.get("features") or ()
    features = tuple(f if isinstance(f, str) else short_repr(f, 80) for f in features) if isinstance(features, (list, tuple)) else ()
    server = data.get("server")
    return ServerMetadata(
        raw=data,
        protocol_version=_opt_int(data, "protocol_version"),
        server=(server if isinstance(server, str) else short_repr(server, 80)) if server is not None else None,
        action_horizon=_opt_int(data, "action_horizon"),
        action_dim=_opt_int(data, "action_dim"),
        features=features,
    )


def index_array(value: Any, name: str) -> np.ndarray:
    """A 1-d integer array (env indices, step ids), as int64; unsigned input is accepted if it fits."""
    if not isinstance(value, np.ndarray) or value.ndim != 1 or value.dtype.kind not in "iu":
        got = f"{value.dtype.str} {list(value.shape)}" if isinstance(value, np.ndarray) else type(value).__name__
        raise ProtocolError(f"{name!r} must be a 1-d int64 array, got {got}")
    if value.dtype.kind == "u" and value.size and int(value.max()) > np.iinfo(np.int64).max:
        raise ProtocolError(f"{name!r} holds values too large for int64 (max {int(value.max())})")
    return value.astype(np.int64, copy=False)


def parse_action(msg: Any, sent_indices: np.ndarray) -> ActionReply:
    """An ``action`` answering an infer for ``sent_indices``; ``env_ids`` must repeat them in order."""
    _expect_type(msg, ACTION)
    data = msg.get("data")
    if not isinstance(data, dict):
        raise ProtocolError(f"action 'data' must be a map with 'env_ids' and 'action', got {type(data).__name__}")
    env_ids = sent_indices if data.get("env_ids") is None else index_array(data["env_ids"], "env_ids")
    # Both are int64 vectors by now: equal bytes and length are equal ids (np.array_equal costs several times this).
    if env_ids is not sent_indices and (len(env_ids) != len(sent_indices)
                                        or env_ids.tobytes() != np.asarray(sent_indices, np.int64).tobytes()):
        raise ProtocolError(f"action env_ids {env_ids.tolist()} do not match the infer's env_indices {sent_indices.tolist()}")
    actions = data.get("action")
    if isinstance(actions, list):
        actions = _text_chunk(actions)
    if not isinstance(actions, np.ndarray):
        raise ProtocolError(f"action 'action' must be an array [horizon, n, *action_shape], got {type(actions).__name__}")
    if actions.ndim < 2 or actions.shape[1] != len(sent_indices):
        raise ProtocolError(
            f"action array has shape {list(actions.shape)}; expected time-major [horizon, {len(sent_indices)}, ...] "
            f"for the {len(sent_indices)} envs of the infer"
        )
    if actions.shape[0] == 0:
        raise ProtocolError("action array has horizon 0; a server must send at least one step per env")
    return ActionReply(env_ids=env_ids, actions=actions)


def _text_chunk(rows: list[Any]) -> np.ndarray:
    """A text chunk sent as msgpack lists of str (``[horizon][n]``) instead of a '<U' array: the same array, as wide
    as its longest string (never cut short)."""
    if not all(isinstance(row, list) and all(isinstance(t, str) for t in row) for row in rows):
        raise ProtocolError("action 'action' must be an array [horizon, n, *action_shape], or for text a list "
                            "(horizon) of lists (envs) of str; got list of other values")
    if len({len(row) for row in rows}) > 1:
        raise ProtocolError(f"action 'action' rows have different lengths: {[len(row) for row in rows]}")
    return np.array(rows, dtype=str) if rows and rows[0] else np.zeros((len(rows), 0), dtype="<U1")


def _observation(obs: Any, where: str, decode_images: bool = False,
                 max_image_pixels: int = image_codecs.DEFAULT_MAX_PIXELS) -> tuple[int, str]:
    """Check an observation map's structure; returns its batch size (-1 when it has no arrays) and which arrays it
    read that from (for messages). With ``decode_images`` (a server that offered the images feature), an encoded
    camera map is decoded in place into its array, the cameras together declaring at most ``max_image_pixels``."""
    if not isinstance(obs, dict) or set(obs) != set(OBS_KEYS):
        keys = sorted(map(str, obs)) if isinstance(obs, dict) else type(obs).__name__
        raise ProtocolError(f"{where} must be a map with exactly the keys images, states, text; got {keys}")
    rows: dict[str, int] = {}
    declared = 0  # pixels of the encoded cameras decoded so far
    for group in ("images", "states"):
        if not isinstance(obs[group], dict):
            raise ProtocolError(f"{where}[{group!r}] must be a map of arrays")
        for name, arr in obs[group].items():
            if type(name) is not str:
                raise ProtocolError(f"{where}[{group!r}] has a non-str key {short_repr(name, 80)}; name arrays with "
                                    "str keys")
            if group == "images" and isinstance(arr, dict):
                if not decode_images:
                    raise ProtocolError(f"{where}['images'][{name!r}] is an encoded image map, but this server did "
                                        f"not offer {image_codecs.FEATURE}: send the array")
                arr = obs["images"][name] = decoded_image(arr, f"{where}['images'][{name!r}]", max_image_pixels,
                                                          declared)
                declared += image_codecs.pixels(arr.shape)
            if not isinstance(arr, np.ndarray) or arr.ndim == 0:
                raise ProtocolError(f"{where}[{group!r}][{name!r}] must be an array with the env batch leading")
            if group == "images" and arr.dtype != np.uint8:
                raise ProtocolError(f"{where}['images'][{name!r}] must be uint8, got {arr.dtype.str}")
            if group == "states" and arr.dtype.kind not in "biuf":
                raise ProtocolError(f"{where}['states'][{name!r}] must be numeric, got {arr.dtype.str}")
            rows[f"{group}[{name!r}]"] = arr.shape[0]
    text = obs["text"]
    # np.array([]) is float64: an empty text batch may come with any dtype
    if isinstance(text, np.ndarray) and text.ndim == 1 and (text.dtype.kind == "U" or text.size == 0):
        rows["text"] = text.shape[0]
    elif isinstance(text, list) and all(isinstance(t, str) for t in text):
        rows["text"] = len(text)
    elif text is not None:
        got = f"{text.dtype.str} {list(text.shape)}" if isinstance(text, np.ndarray) else type(text).__name__
        raise ProtocolError(f"{where}['text'] must be a 1-d '<U' array or a list of str, got {got}")
    sizes = set(rows.values())
    if len(sizes) > 1:
        each = ", ".join(f"{name}: {n}" for name, n in rows.items())
        raise ProtocolError(f"{where} arrays disagree on the batch size: {sorted(sizes)} ({each})")
    return (sizes.pop() if sizes else -1), ", ".join(rows)


ENCODED_IMAGE_KEYS = ("codec", "shape", "rows")


def decoded_image(encoded: dict[Any, Any], field: str, max_pixels: int = image_codecs.DEFAULT_MAX_PIXELS,
                  before: int = 0) -> np.ndarray:
    """The array of one camera's :func:`encoded_image` map, its declared shape bounded by ``max_pixels`` (with the
    ``before`` pixels of the message's cameras decoded already) and each
    row's size checked against it before anything is decoded or allocated; a ProtocolError naming ``field`` when
    the map or a row is not right (:class:`~plugrl_env_client.protocol.images.ImagesTooLarge` past the bound)."""
    if set(encoded) != set(ENCODED_IMAGE_KEYS):
        raise ProtocolError(f"{field} must be an array or a map with exactly the keys codec, shape, rows; got keys "
                            f"{sorted(map(str, encoded))}")
    codec, shape, rows = encoded["codec"], encoded["shape"], encoded["rows"]
    if codec not in image_codecs.CHANNELS:
        raise ProtocolError(f"{field}['codec'] must be one of {', '.join(image_codecs.CHANNELS)}, got "
                            f"{short_repr(codec, 80)}")
    if (not isinstance(shape, (list, tuple)) or len(shape) != 4
            or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape)):
        raise ProtocolError(f"{field}['shape'] must be 4 ints >= 0 ([n, h, w, c]), got {short_repr(shape, 80)}")
    if not isinstance(rows, (list, tuple)):
        raise ProtocolError(f"{field}['rows'] must be a list of bytes (one encoded image per env row), got "
                            f"{type(rows).__name__}")
    return image_codecs.decode(rows, codec, shape, field=field, max_pixels=max_pixels, before=before)


SMALL_BATCH = 256
"""Up to this many env indices are checked for repeats as a Python set (a few microseconds less than numpy's sort
for the handful of envs of most messages)."""


def _unique(env_indices: np.ndarray, kind: str) -> None:
    n = len(env_indices)
    if n <= 1:
        return
    distinct = len(set(env_indices.tolist())) if n <= SMALL_BATCH else len(np.unique(env_indices))
    if distinct != n:
        raise ProtocolError(f"{kind} env_indices must be unique, got {env_indices.tolist()}")


def parse_infer(msg: Any, decode_images: bool = False,
                max_image_pixels: int = image_codecs.DEFAULT_MAX_PIXELS) -> InferRequest[dict[str, Any]]:
    """An infer, checked; with ``decode_images`` (the images feature offered) its encoded cameras decoded, when
    they declare at most ``max_image_pixels`` together."""
    _expect_type(msg, INFER)
    env_indices = index_array(msg.get("env_indices"), "env_indices")
    step_ids = index_array(msg.get("step_ids"), "step_ids")
    _unique(env_indices, "infer")
    if len(step_ids) != len(env_indices):
        raise ProtocolError(f"infer has {len(step_ids)} step_ids for {len(env_indices)} env_indices")
    reuse = msg.get("reuse")
    if reuse is not None and (not isinstance(reuse, np.ndarray) or reuse.dtype != bool or reuse.shape != env_indices.shape):
        raise ProtocolError("infer 'reuse' must be a bool array with one entry per env index")
    n, names = _observation(msg.get("data"), "infer data", decode_images, max_image_pixels)
    expected = len(env_indices) if reuse is None else int((~reuse).sum())
    if n != expected and not (n == -1 and expected == 0):
        held = "no arrays" if n == -1 else f"{n} rows"
        per = "one per env index" if reuse is None else "one per env index not marked in 'reuse'"
        raise ProtocolError(f"infer data holds {held} but {expected} rows are expected ({per}; the rows of "
                            f"{names or 'no array'})")
    return InferRequest(obs=msg["data"], env_indices=env_indices, step_ids=step_ids, reuse=reuse)


def parse_feedback(msg: Any, decode_images: bool = False,
                   max_image_pixels: int = image_codecs.DEFAULT_MAX_PIXELS) -> Feedback[dict[str, Any]]:
    """A feedback, checked; with ``decode_images`` (the images feature offered) its encoded cameras decoded, when
    they declare at most ``max_image_pixels`` together."""
    _expect_type(msg, FEEDBACK)
    env_indices = index_array(msg.get("env_indices"), "env_indices")
    step_ids = index_array(msg.get("step_ids"), "step_ids")
    data = msg.get("data")
    if not isinstance(data, dict) or set(data) != set(FEEDBACK_KEYS):
        keys = sorted(map(str, data)) if isinstance(data, dict) else type(data).__name__
        raise ProtocolError(f"feedback data must have exactly the keys {', '.join(FEEDBACK_KEYS)}; got {keys}")
    _unique(env_indices, "feedback")
    m = len(env_indices)
    n, names = _observation(data["obs"], "feedback obs", decode_images, max_image_pixels)
    if (n != m and not (n == -1 and m == 0)) or len(step_ids) != m:
        held = "no arrays" if n == -1 else f"{n} rows"
        raise ProtocolError(f"feedback obs has {held} and {len(step_ids)} step ids for {m} env indices (the rows "
                            f"of {names or 'no array'}, 'step_ids', 'env_indices')")
    for key, kind in (("rewards", "f"), ("terminated", "b"), ("truncated", "b")):
        arr = data[key]
        if not isinstance(arr, np.ndarray) or arr.shape != (m,) or arr.dtype.kind != kind:
            raise ProtocolError(f"feedback {key!r} must be a [{m}] {'float (float32)' if kind == 'f' else 'bool'} array")
    if not isinstance(data["info"], dict):
        raise ProtocolError("feedback 'info' must be a map")
    return Feedback(
        env_indices, step_ids, data["obs"], data["rewards"], data["terminated"], data["truncated"], data["info"]
    )
