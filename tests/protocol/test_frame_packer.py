"""FramePacker: msgpack-python's exact bytes (with the convention's hook), framed and masked as websockets frames
them, by the Python route and by the compiled framer where it is built (``compiled`` parameters: both routes)."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest
import websockets.frames
from websockets.frames import Frame, Opcode
from websockets.streams import StreamReader

from plugrl_env_client.errors import ProtocolError
from plugrl_env_client.protocol import codec
from plugrl_env_client.protocol.codec import Timed
from plugrl_env_client.protocol.frame_packer import FramePacker
from plugrl_env_client.websocket.client import control_frame, frame_header

KEY = bytes([0x37, 0xFA, 0x21, 0x3D])
ROUTES = pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "python"])
"""Both routes of a message to its frame (``compiled`` is the Python route where the framer is not built)."""


@pytest.fixture(autouse=True)
def _websockets_masks_with_key(monkeypatch) -> None:
    """websockets' own framing (the reference) draws its mask key here: make it :data:`KEY`."""
    monkeypatch.setattr(websockets.frames.secrets, "token_bytes", lambda n: KEY)


def reference(msg: object) -> bytes:
    """What msgpack-python writes with the convention's hook: the bytes every PlugRL peer writes."""
    return msgpack.packb(msg, default=codec.encode_numpy, use_bin_type=True)


def expected(msg: object) -> bytes:
    """``msg``'s frame as websockets frames msgpack-python's bytes."""
    return Frame(Opcode.BINARY, reference(msg)).serialize(mask=True)


def _parse(frame: bytes) -> Frame:
    reader = StreamReader()
    reader.feed_data(frame)
    reader.feed_eof()
    parser = Frame.parse(reader.read_exact, mask=True)
    with pytest.raises(StopIteration) as stop:
        next(parser)
    return stop.value.value


@ROUTES
@pytest.mark.parametrize("size", [0, 1, 125, 126, 65535, 65536, 1_000_003])
def test_frames_of_every_length_encoding_are_websockets_bytes(size: int, compiled: bool) -> None:
    """The 7-, 16- and 64-bit lengths, each the shortest that fits; a random key parses back to the message."""
    msg = {"b": np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8)}
    assert bytes(FramePacker(compiled).pack(msg, key=KEY)) == expected(msg)
    assert _parse(bytes(FramePacker(compiled).pack(msg))).data == reference(msg)


def test_header_uses_the_shortest_length_encoding() -> None:
    assert [len(frame_header(n)) for n in (0, 125, 126, 65535, 65536)] == [2, 2, 4, 4, 10]


def camera(n: int, h: int, w: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, h, w, 3), dtype=np.uint8)


def observation_message(lead: int) -> dict:
    """A feedback-like message whose big arrays start at every offset modulo 8 as ``lead`` varies."""
    return {
        "message_type": "feedback",
        "lead": "x" * lead,
        "data": {
            "obs": {"images": {"base": camera(4, 96, 96), "wrist": camera(4, 33, 35, seed=1)},
                    "states": {"q": np.linspace(0, 1, 4 * 7).reshape(4, 7)}, "text": np.array(["a", "bc", "", "d"])},
            "rewards": np.arange(4, dtype=np.float32),
            "info": {"episode": {"r": np.ones(4, np.float32), "mask": np.array([True, False, True, False])},
                     "many": [np.arange(2051, dtype=np.float64), 7, None, "ü"]},
        },
    }


@ROUTES
@pytest.mark.parametrize("lead", range(8))
def test_a_frame_is_the_codecs_bytes_masked(lead, compiled):
    msg = observation_message(lead)
    assert bytes(FramePacker(compiled).pack(msg, key=KEY)) == expected(msg)


@ROUTES
def test_a_small_message_gives_the_same_bytes(compiled):
    msg = {"message_type": "infer", "x": np.arange(10), "t": np.array(["hi"])}
    assert bytes(FramePacker(compiled).pack(msg, key=KEY)) == expected(msg)


@pytest.mark.parametrize("array", [
    camera(8, 64, 64)[:, ::2],  # not contiguous: the codec copies it (tobytes) and the copy is masked
    np.ma.masked_array(np.zeros((64, 64, 8))),  # a subclass goes through the codec's default hook unchanged
    np.full((70_000,), True),
    np.array(["\u00fcber" * 2000] * 3),  # a big text array (<U8000)
    np.frombuffer(bytes(range(256)) * 300, np.dtype("S300")),
    np.arange(30_000, dtype=">i4"),  # big-endian
], ids=["strided", "masked", "bool", "unicode", "bytes", "big-endian"])
@ROUTES
def test_every_kind_of_big_array_gives_the_codecs_bytes(array, compiled):
    msg = {"a": [1, {"deep": array}], "b": array}
    assert bytes(FramePacker(compiled).pack(msg, key=KEY)) == expected(msg)
    alone = {"b": array}  # without the list, the compiled framer lays out what it can
    assert bytes(FramePacker(compiled).pack(alone, key=KEY)) == expected(alone)


def test_every_frame_gets_its_own_key_across_refills_of_the_key_pool():
    """Keys come from the OS's random source in batches of 1024; every frame still has a fresh one."""
    packer = FramePacker()
    keys = []
    for i in range(2500):  # more than two batches
        frame = bytes(packer.pack({"i": i}))
        assert codec.unpackb(_parse(frame).data) == {"i": i}
        keys.append(frame[2:6])  # a payload below 126 bytes: 2 header bytes, then the key
    assert len(set(keys)) > 2490  # 32-bit keys: a handful of repeats at most, by chance


@ROUTES
def test_a_frame_still_held_is_not_changed_by_the_next_one(compiled):
    packer = FramePacker(compiled)
    held = packer.pack({"images": camera(2, 96, 96)}, key=KEY)
    before = bytes(held)
    packer.pack({"images": camera(8, 96, 96, seed=3)}, key=KEY)
    assert bytes(held) == before and bytes(held) == expected({"images": camera(2, 96, 96)})


@ROUTES
@pytest.mark.parametrize("bad, match", [
    (np.array([object()], dtype=object), "dtype object"),
    (1 << 70, "limited to 64 bits"),
    ("\ud800", "cannot encode the message"),
])
def test_what_the_codec_refuses_is_a_protocol_error_either_way(compiled, bad, match):
    with pytest.raises(ProtocolError, match=match):
        FramePacker(compiled).pack({"images": camera(4, 96, 96), "bad": bad})


# ------------------------------------------------------------------------------------------------ timed parts


def _timed_feedback(msg: dict) -> tuple[dict, list[Timed]]:
    """The feedback-like message with its obs and info as timed parts, and those two parts."""
    data = dict(msg["data"])
    parts = [Timed(data["obs"]), Timed(data["info"])]
    data["obs"], data["info"] = parts
    return {**msg, "data": data}, parts


@ROUTES
@pytest.mark.parametrize("lead", [0, 3])
def test_timed_parts_give_the_bytes_of_the_plain_message_and_their_times(compiled, lead):
    msg = observation_message(lead)
    timed, parts = _timed_feedback(msg)
    assert bytes(FramePacker(compiled).pack(timed, key=KEY)) == expected(msg)
    assert all(part.seconds > 0 for part in parts)


def test_what_the_codec_refuses_in_a_timed_part_is_a_protocol_error():
    with pytest.raises(ProtocolError, match="dtype object"):
        FramePacker().pack({"obs": Timed(np.array([object()], dtype=object))})


@pytest.mark.parametrize("opcode, payload", [(0x9, b""), (0xA, b"ping data"), (0x8, b"\x03\xe8bye"),
                                             (0x8, b"r" * 125)])
def test_a_control_frame_is_final_masked_and_unmasks_to_its_payload(opcode, payload):
    """Pongs and closes are framed here too (a real server reading them: tests/protocol/test_ws_client.py)."""
    frame = control_frame(opcode, payload)
    assert frame[0] == 0x80 | opcode and frame[1] == 0x80 | len(payload) and len(frame) == 6 + len(payload)
    key = frame[2:6]
    assert bytes(b ^ key[i % 4] for i, b in enumerate(frame[6:])) == payload
    assert control_frame(opcode, payload)[2:6] != key  # a fresh key each time
