"""The compiled framer (protocol/_frames.c): a small message's frame byte for byte what the Python path writes
(msgpack-python's bytes with the convention's hook, masked and framed as websockets frames them), for what it lays
out and for everything it hands back to Python."""

from __future__ import annotations

import gc
import os
import shlex
import shutil
import sysconfig
import time
from typing import Any

import msgpack
import numpy as np
import pytest
import websockets.frames
from hypothesis import given, settings
from hypothesis import strategies as st
from websockets.frames import Frame, Opcode

from plugrl_env_client.errors import ProtocolError
from plugrl_env_client.protocol import codec, frame_packer
from plugrl_env_client.protocol.codec import MessageWriter, Timed
from plugrl_env_client.protocol.frame_packer import FramePacker

KEY = bytes([0x9C, 0x01, 0xE7, 0x42])

compiled_only = pytest.mark.skipif(not frame_packer.COMPILED, reason="the compiled framer was not built")


@pytest.fixture(autouse=True)
def _websockets_masks_with_key(monkeypatch) -> None:
    monkeypatch.setattr(websockets.frames.secrets, "token_bytes", lambda n: KEY)


def expected(msg: Any) -> bytes:
    """msgpack-python's bytes of ``msg`` with the convention's hook, framed by websockets."""
    return Frame(Opcode.BINARY, msgpack.packb(msg, default=codec.encode_numpy, use_bin_type=True)).serialize(mask=True)


def both(msg: Any, compiled: FramePacker | None = None, python: FramePacker | None = None) -> tuple[bytes, bytes]:
    """``msg``'s frame from the compiled framer and from the Python path."""
    compiled = compiled or FramePacker()
    python = python or FramePacker(compiled=False)
    return bytes(compiled.pack(msg, key=KEY)), bytes(python.pack(msg, key=KEY))


def test_the_compiled_framer_is_built_where_a_c_compiler_and_python_s_headers_are():
    """An install on a machine with a C compiler and Python's headers builds it; without them the build is
    skipped and Python writes frames."""
    compiler = shlex.split(sysconfig.get_config_var("CC") or "cc")[0]
    if shutil.which(compiler) is None:
        pytest.skip(f"no C compiler ({compiler}) on this machine: the Python path writes every frame")
    headers = os.path.join(sysconfig.get_paths()["include"], "Python.h")
    if not os.path.exists(headers):
        pytest.skip(f"no {headers} (a distribution's python3-dev package): the Python path writes every frame")
    assert frame_packer.COMPILED, ("protocol/_frames.c was not built although a C compiler and Python's headers are "
                                   "here: reinstall with `pip install -e . -v` and read the compiler's error")


INT_EDGES = [0, 1, 127, 128, 255, 256, 65535, 65536, (1 << 32) - 1, 1 << 32, (1 << 63) - 1, 1 << 63, (1 << 64) - 1,
             -1, -32, -33, -128, -129, -32768, -32769, -(1 << 31), -(1 << 31) - 1, -(1 << 63)]


@compiled_only
@pytest.mark.parametrize("value", [
    *INT_EDGES, 0.0, -2.5, 1e308, float("inf"), None, True, False,
    *("x" * n for n in (0, 31, 32, 255, 256, 65535, 65536)), "\u00fc\U0001f600",
    *(b"y" * n for n in (0, 255, 256, 65535, 65536)),
], ids=repr)
def test_every_scalar_encoding_edge_gives_the_same_bytes(value):
    msg = {"v": value, value if isinstance(value, (str, bytes, int)) and not isinstance(value, bool) else "k": 1}
    compiled, python = both(msg)
    assert compiled == python == expected(msg)


@compiled_only
@pytest.mark.parametrize("n", [0, 15, 16, 65535, 65536])
def test_maps_of_every_header_size_give_the_same_bytes(n):
    msg = {"m": {f"k{i}": i for i in range(n)}}
    compiled, python = both(msg)
    assert compiled == python == expected(msg)


@compiled_only
@pytest.mark.parametrize("array", [
    np.arange(12, dtype=np.float32).reshape(3, 4), np.zeros(0), np.array([True, False]), np.array(["ab", "c"]),
    np.array([b"xy"]), np.arange(5, dtype=">i2"), np.zeros((2, 0, 3), np.uint8), np.arange(30_000, dtype=np.float64),
], ids=["f4", "empty", "bool", "unicode", "bytes", "big-endian", "zero-dim", "beyond-the-stack-buffer"])
def test_arrays_it_lays_out_give_the_same_bytes_also_with_new_data(array):
    compiled, python = FramePacker(), FramePacker(compiled=False)
    for scale in (1, 2):
        msg = {"message_type": "infer", "data": {"states": {"q": array * scale if array.dtype.kind in "fiu" else array}}}
        assert both(msg, compiled, python) == (expected(msg), expected(msg))


@compiled_only
@pytest.mark.parametrize("value", [
    [1, 2], (3,), np.float32(1.5), np.int64(-3), np.arange(6)[::2], np.arange(6).reshape(2, 3).T,
    np.ma.masked_array(np.zeros(3)), np.array(3.0), np.arange(3).astype("<M8[s]"), bytearray(b"ab"),
    type("Sub", (dict,), {})(a=1), {"deep": [np.zeros(2)]}, Timed([1, np.zeros(2)]),
], ids=["list", "tuple", "np-float", "np-int", "strided", "transposed", "masked", "0-d", "datetime", "bytearray",
        "dict-subclass", "list-inside", "timed-list"])
def test_what_it_hands_back_to_python_gives_the_same_bytes(value):
    msg = {"a": np.arange(3), "v": value}
    compiled, python = both(msg)
    plain = {"a": np.arange(3), "v": value.value if isinstance(value, Timed) else value}
    assert compiled == python == expected(plain)


@compiled_only
@pytest.mark.parametrize("key", [1.5, None, True, (1, 2)], ids=repr)
def test_keys_it_does_not_pack_itself_give_the_same_bytes(key):
    msg = {key: 1, "x": np.arange(2)}
    compiled, python = both(msg)
    assert compiled == python == expected(msg)


@compiled_only
def test_nesting_as_deep_as_the_writer_goes_gives_the_same_bytes():
    for depth in (codec.MAX_DEPTH - 1, codec.MAX_DEPTH, codec.MAX_DEPTH + 3):
        msg: dict[str, Any] = {"leaf": np.arange(2)}
        for _ in range(depth):
            msg = {"d": msg}
        compiled, python = both(msg)
        assert compiled == python == expected(msg)


@compiled_only
@pytest.mark.parametrize("bad, match", [
    (np.array([object()], dtype=object), "dtype object"),
    (np.zeros(2, np.complex64), "dtype complex64"),
    (1 << 64, "limited to 64 bits"),
    (-(1 << 63) - 1, "limited to 64 bits"),
    ("\ud800", "cannot encode the message"),
])
def test_what_the_codec_refuses_is_the_same_protocol_error(bad, match):
    for packer in (FramePacker(), FramePacker(compiled=False)):
        with pytest.raises(ProtocolError, match=match):
            packer.pack({"ok": np.arange(2), "bad": bad})


@compiled_only
def test_timed_parts_give_the_bytes_of_the_plain_message_and_their_seconds():
    obs = {"states": {"q": np.linspace(0, 1, 6).reshape(2, 3)}, "text": np.array(["a", "b"])}
    info = {"x": np.arange(2), "episode": {"r": np.ones(2, np.float32)}}
    parts = [Timed(obs), Timed(info)]
    timed = {"message_type": "feedback", "data": {"obs": parts[0], "info": parts[1]}}
    plain = {"message_type": "feedback", "data": {"obs": obs, "info": info}}
    assert bytes(FramePacker().pack(timed, key=KEY)) == expected(plain)
    assert all(part.seconds > 0 for part in parts)


@compiled_only
def test_a_new_layout_is_kept_by_the_writer_and_used_next_time():
    packer = FramePacker()
    packer.pack({"a": np.zeros((2, 5), np.float32)}, key=KEY)
    writer = packer._writer
    assert (np.dtype(np.float32), (2, 5)) in writer.layouts
    writer.layouts[(np.dtype(np.float32), (2, 5))] = (b"\x01", b"\x02")  # the kept layout is what it writes
    frame = bytes(packer.pack({"a": np.zeros((2, 5), np.float32)}, key=KEY))
    payload = bytes(b ^ KEY[i % 4] for i, b in enumerate(frame[6:]))
    assert payload == b"\x81\xa1a\x01" + bytes(40) + b"\x02"


@compiled_only
def test_a_frame_written_while_another_is_half_written_leaves_both_whole():
    """A layout callback may let another thread frame a message meanwhile: each call writes into its own buffer."""
    inner = {"inner": np.arange(4), "s": "t" * 40}
    outer = {"outer": np.arange(30_000, dtype=np.float64), "then": np.arange(7, dtype=np.int16), "s": "u" * 40}
    writer = MessageWriter()
    framed: list[bytes] = []

    def miss(arr: Any) -> Any:
        framed.append(bytes(FramePacker().pack(inner, key=KEY)))
        return writer.layout_of(arr)

    assert _frame(outer, miss, writer) == expected(outer)
    assert framed and all(f == expected(inner) for f in framed)


def _frame(msg: Any, miss: Any, writer: MessageWriter) -> bytes | None:
    """The compiled framer's frame of ``msg`` (None: it hands the message to Python)."""
    assert frame_packer._frames is not None
    frame = frame_packer._frames.frame(msg, KEY, writer.layouts, miss, np.ndarray, Timed, time.perf_counter)
    return None if frame is None else bytes(frame)


@compiled_only
@pytest.mark.parametrize("part", ["map", "timed"])
def test_a_part_the_callback_lets_go_of_is_still_written_whole(part):
    """The layouts' callback runs Python code (another thread may too): what is being written is held meanwhile."""
    inner = {"a": np.arange(3), **{f"k{i}": "v" * 40 for i in range(50)}}
    msg: dict[str, Any] = {"data": inner if part == "map" else Timed(inner)}
    want = expected({"data": dict(inner)})
    writer = MessageWriter()

    def miss(arr: Any) -> Any:
        msg["data"] = None
        gc.collect()
        [dict(x=i) for i in range(1000)]  # reuse the memory a part let go of would have held
        return writer.layout_of(arr)

    del inner
    assert _frame(msg, miss, writer) == want


@compiled_only
def test_a_map_that_changes_size_while_it_is_written_goes_to_python():
    msg = {"a": np.arange(3), "b": 1}
    writer = MessageWriter()

    def miss(arr: Any) -> Any:
        msg["c"] = 2
        return writer.layout_of(arr)

    assert _frame(msg, miss, writer) is None


@compiled_only
def test_timed_parts_nested_beyond_the_writer_s_depth_are_written_or_refused_as_python_does():
    chain: Any = np.arange(2)
    for _ in range(codec.MAX_DEPTH + 5):
        chain = Timed(chain)
    compiled, python = both({"x": chain})
    assert compiled == python
    looped = Timed(None)
    looped.value = looped
    for packer in (FramePacker(), FramePacker(compiled=False)):
        with pytest.raises(RecursionError):
            packer.pack({"x": looped})


@compiled_only
def test_misuse_of_the_compiled_call_is_a_type_error():
    assert frame_packer._frames is not None
    writer = MessageWriter()
    with pytest.raises(TypeError, match="4 bytes"):
        frame_packer._frames.frame({}, b"abc", writer.layouts, writer.layout_of, np.ndarray, Timed, time.perf_counter)
    with pytest.raises(TypeError, match="7 arguments"):
        frame_packer._frames.frame({}, KEY)


leaves = st.one_of(
    st.builds(lambda shape, kind, seed: np.random.default_rng(seed).integers(0, 100, shape).astype(kind),
              st.lists(st.integers(0, 3), min_size=1, max_size=3).map(tuple),
              st.sampled_from(["<f4", "<f8", "<i8", "|u1", "|b1", "<U2", ">i4"]), st.integers(0, 50)),
    st.none(), st.booleans(), st.integers(-(1 << 64), 1 << 64), st.floats(allow_nan=False), st.text(max_size=40),
    st.binary(max_size=20), st.builds(np.float32, st.floats(-10, 10, width=32)),
)
keys = st.one_of(st.sampled_from(["obs", "info", "states", "text"]), st.text(max_size=10), st.binary(max_size=4),
                 st.integers(-(1 << 64), 1 << 64))
messages = st.dictionaries(keys, st.recursive(leaves, lambda inner: st.one_of(
    st.dictionaries(keys, inner, max_size=8), st.builds(Timed, inner), st.lists(inner, max_size=3)), max_leaves=20),
    max_size=8)


@compiled_only
@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(st.lists(messages, min_size=1, max_size=4))
def test_any_message_gets_the_bytes_or_the_error_of_the_python_path(msgs):
    compiled, python = FramePacker(), FramePacker(compiled=False)
    for msg in msgs:
        outcomes = []
        for packer in (compiled, python):
            try:
                outcomes.append(bytes(packer.pack(msg, key=KEY)))
            except ProtocolError as exc:
                outcomes.append(str(exc))
        assert outcomes[0] == outcomes[1]
