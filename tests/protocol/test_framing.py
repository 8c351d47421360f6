"""MaskedFramer: the bytes websockets would send, written into one buffer the connection keeps."""

from __future__ import annotations

import numpy as np
import pytest
import websockets.frames
from websockets.frames import Frame, Opcode
from websockets.streams import StreamReader

from plugrl_env_client.protocol.framing import MaskedFramer, frame_header

SIZES = [0, 1, 3, 4, 5, 7, 125, 126, 127, 65535, 65536, 65537, 1_000_003]


def _parse(frame: bytes) -> Frame:
    reader = StreamReader()
    reader.feed_data(frame)
    reader.feed_eof()
    parser = Frame.parse(reader.read_exact, mask=True)
    with pytest.raises(StopIteration) as stop:
        next(parser)
    return stop.value.value


@pytest.mark.parametrize("size", SIZES)
def test_frame_is_byte_identical_to_websockets_framing(size: int, monkeypatch) -> None:
    rng = np.random.default_rng(size)
    payload = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
    key = rng.integers(0, 256, 4, dtype=np.uint8).tobytes()
    monkeypatch.setattr(websockets.frames.secrets, "token_bytes", lambda n: key)
    theirs = Frame(Opcode.BINARY, payload).serialize(mask=True)
    assert bytes(MaskedFramer().frame(payload, key)) == theirs


@pytest.mark.parametrize("size", SIZES)
def test_frame_parses_back_to_the_payload(size: int) -> None:
    payload = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes()
    frame = _parse(bytes(MaskedFramer().frame(memoryview(payload))))  # a fresh random key
    assert frame.fin and frame.opcode is Opcode.BINARY and frame.data == payload


def test_header_uses_the_shortest_length_encoding() -> None:
    assert [len(frame_header(n)) for n in (0, 125, 126, 65535, 65536)] == [2, 2, 4, 4, 10]


def test_buffer_is_reused_and_a_held_frame_survives_growth() -> None:
    framer = MaskedFramer()
    big = framer.frame(bytes(100_000))
    again = framer.frame(bytes(90_000))
    assert np.shares_memory(np.frombuffer(big, np.uint8), np.frombuffer(again, np.uint8))  # no new memory
    held = bytes(again)
    view = framer.frame(b"x" * 10)  # the held view `again` still points into the same buffer...
    larger = framer.frame(bytes(1_000_000))  # ...so growing makes a new buffer instead of resizing under it
    assert not np.shares_memory(np.frombuffer(view, np.uint8), np.frombuffer(larger, np.uint8))
    assert _parse(bytes(larger)).data == bytes(1_000_000)
    assert len(held) == 90_000 + 10 + 4 and _parse(held).data == bytes(90_000)


def test_payload_of_any_bytes_like_shape() -> None:
    arr = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    frame = MaskedFramer().frame(memoryview(arr))  # a multi-dimensional buffer is framed as its raw bytes
    assert _parse(bytes(frame)).data == arr.tobytes()


def test_every_frame_gets_its_own_key_across_refills_of_the_key_pool() -> None:
    """Keys come from the OS's random source in batches of 1024; every frame still has a fresh one."""
    framer = MaskedFramer()
    keys = []
    for i in range(2500):  # more than two batches
        payload = i.to_bytes(4, "big") * 3
        frame = bytes(framer.frame(payload))
        assert _parse(frame).data == payload
        keys.append(frame[2:6])  # 12-byte payload: 2 header bytes, then the key
    assert len(set(keys)) > 2490  # 32-bit keys: a handful of repeats at most, by chance
