"""MessageWriter, the one encoder: msgpack-python's exact bytes with the convention's hook (an oracle written apart
from the writer), with layouts kept from message to message (and bounded)."""

from __future__ import annotations

import types
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from plugrl_env_client.errors import ProtocolError
from plugrl_env_client.protocol import codec
from plugrl_env_client.protocol.codec import MessageWriter, Timed
from plugrl_env_client.protocol.frame_packer import FramePacker


def reference(msg: Any) -> bytes:
    """What msgpack-python writes with the convention's hook: the bytes every PlugRL peer writes."""
    return msgpack.packb(msg, default=codec.encode_numpy, use_bin_type=True)


DTYPES = ["<f4", "<f8", ">f4", "<i8", "<u2", "|i1", "|u1", "|b1", "<U3", "|S2", "<f2", "<M8[s]", "<m8[ms]"]


def arrays() -> st.SearchStrategy[np.ndarray]:
    """Plain arrays of many kinds and shapes (0-d and empty ones too), and views that are not C-contiguous."""

    def build(dtype: str, shape: tuple[int, ...], seed: int, view: str) -> np.ndarray:
        raw = np.random.default_rng(seed).integers(0, 120, size=shape)
        arr = raw.astype(dtype)
        if view == "strided" and arr.ndim and arr.shape[0] > 1:
            return arr[::2]
        if view == "transposed" and arr.ndim > 1:
            return arr.T
        if view == "masked":
            return np.ma.masked_array(arr)
        return arr

    shapes = st.lists(st.integers(0, 4), min_size=0, max_size=3).map(tuple)
    return st.builds(build, st.sampled_from(DTYPES), shapes, st.integers(0, 1000),
                     st.sampled_from(["plain", "plain", "strided", "transposed", "masked"]))


leaves = st.one_of(
    arrays(), st.none(), st.booleans(), st.integers(-(1 << 63), (1 << 64) - 1), st.floats(allow_nan=False),
    st.text(max_size=80), st.binary(max_size=20), st.sampled_from(["message_type", "infer", "feedback", "x"]),
    st.builds(np.float32, st.floats(-1e6, 1e6, width=32)), st.builds(np.int64, st.integers(-100, 100)),
)
keys = st.one_of(st.sampled_from(["images", "states", "text", "data", "obs"]), st.text(max_size=70),
                 st.binary(max_size=5), st.integers(-3, 3), st.booleans())
messages = st.recursive(leaves, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                        st.dictionaries(keys, inner, max_size=18)), max_leaves=30)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(st.lists(messages, min_size=1, max_size=4))
def test_every_message_gets_the_bytes_of_packb_also_after_the_ones_before(msgs):
    """One writer for a sequence of messages: what it kept from the earlier ones never changes a later one's bytes."""
    w = MessageWriter()
    for msg in msgs:
        assert w.write(msg) == reference(msg)


def test_the_same_layout_with_new_data_and_a_new_row_count():
    w = MessageWriter()
    for n in (3, 3, 5, 0, 3):
        msg = {"message_type": "feedback", "data": {"obs": {"states": {"q": np.random.rand(n, 7).astype("<f4")}},
                                                    "info": {"x": np.arange(n), "_x": np.ones(n, bool)}}}
        assert w.write(msg) == reference(msg)


def test_keys_that_compare_equal_across_types_stay_apart():
    """True == 1 and 'a' != b'a': only str keys are kept, so {True: ...}, {1: ...} and {b'a': ...} keep their own
    bytes."""
    w = MessageWriter()
    for msg in ({"a": 1}, {b"a": 1}, {1: "x"}, {True: "x"}, {1.0: "x"}, {"a": 1}):
        assert w.write(msg) == reference(msg)


def test_nesting_deeper_than_the_writer_goes_to_msgpack_with_its_own_limit():
    deep: object = np.arange(3)
    for _ in range(codec.MAX_DEPTH + 5):
        deep = {"d": deep}
    assert MessageWriter().write(deep) == reference(deep)
    too_deep: object = 1
    for _ in range(2000):  # beyond msgpack's own limit
        too_deep = {"d": too_deep}
    with pytest.raises(ProtocolError, match="ValueError"):  # msgpack's ValueError, as packb reports it
        codec.packb(too_deep)
    with pytest.raises(ValueError):
        MessageWriter().write(too_deep)
    with pytest.raises(ProtocolError, match="ValueError"):
        FramePacker().pack(too_deep)


def _deepest_list_packb_takes() -> int:
    low, high = 1, 5000
    while low < high:
        mid = (low + high + 1) // 2
        value: object = 1
        for _ in range(mid):
            value = [value]
        low, high = (mid, high) if _outcome(reference, value) != "refused" else (low, mid - 1)
    return low


def _outcome(pack: Any, msg: object) -> object:
    try:
        return pack(msg)
    except (ProtocolError, ValueError):  # packb's ProtocolError wraps msgpack's ValueError; the writer raises it bare
        return "refused"


@pytest.mark.parametrize("maps", [1, 10, codec.MAX_DEPTH - 1, codec.MAX_DEPTH + 1])
def test_lists_under_maps_count_towards_msgpack_s_nesting_limit_as_in_packb(maps):
    """msgpack counts every level, maps and lists alike: a message just under its limit and one just over it are
    treated as packb treats them, however the levels are split between maps and lists."""
    limit = _deepest_list_packb_takes()
    wanted = []
    for lists in (limit - maps, limit - maps + 1):  # just under and just over, with the maps on top
        value: object = 1
        for _ in range(lists):
            value = [value]
        for _ in range(maps):
            value = {"k": value}
        want = _outcome(reference, value)
        assert _outcome(MessageWriter().write, value) == want, (maps, lists)
        wanted.append(want)
    assert wanted[0] != "refused" and wanted[1] == "refused"


def test_arrays_of_4_gib_are_refused_as_packb_refuses_them():
    big = np.zeros(1 << 32, np.uint8)
    with pytest.raises(ProtocolError, match="memoryview is too large"):
        codec.packb({"a": big})
    for compiled in (True, False):
        with pytest.raises(ProtocolError, match="memoryview is too large"):
            FramePacker(compiled).pack({"a": big})


@pytest.mark.parametrize("bad, match", [
    (np.array([object()], dtype=object), "dtype object"),
    (np.zeros(2, complex), "dtype complex128"),
    (object(), "type object"),
])
def test_what_the_codec_refuses_is_refused_the_same_way(bad, match):
    with pytest.raises(ProtocolError, match=match):
        MessageWriter().write({"data": {"x": bad}})


def test_what_it_keeps_is_bounded():
    w = MessageWriter()
    for i in range(codec.MAX_KEPT + 50):
        msg = {f"key{i}": np.zeros((1, i % 7 + 1, i), np.float32)}
        assert w.write(msg) == reference(msg)
    assert len(w._strs) <= codec.MAX_KEPT and len(w.layouts) <= codec.MAX_KEPT
    long_text = "t" * (codec.MAX_KEPT_STR + 1)
    w.write({"text": long_text})
    assert long_text not in w._strs


def test_arrays_are_not_copied_inside_timed_parts_either():
    arr, inner = np.arange(6, dtype=np.float32), np.arange(3)
    pieces = MessageWriter().pieces({"a": Timed({"x": inner}), "b": arr, "c": {"d": Timed(1.5)}})
    assert any(p is arr for p in pieces) and any(p is inner for p in pieces)


@pytest.mark.parametrize("msg", [
    {"a": {"x": np.arange(3)}, "b": 1, "c": {"d": "text", "e": None}},
    {"a": [1, 2], "b": {"x": np.arange(3)}},  # a list: msgpack packs it (the part, or the whole message)
    {"a": np.arange(4), "b": {"c": {"d": {"e": np.ones((2, 2))}}}},
])
def test_a_timed_part_writes_the_bytes_of_its_value(msg):
    timed = {key: Timed(value) for key, value in msg.items()}
    timed["b"] = {"inner": Timed(msg["b"])}
    plain = {**msg, "b": {"inner": msg["b"]}}
    assert MessageWriter().write(timed) == reference(plain)
    assert MessageWriter().write(Timed(plain)) == reference(plain)


@pytest.mark.parametrize("msg, plain", [
    ({"a": [1], "b": Timed(np.arange(3))}, {"a": [1], "b": np.arange(3)}),
    ({"a": [Timed(np.float32(1.5)), Timed(2)]}, {"a": [np.float32(1.5), 2]}),
    ({"a": (Timed(Timed({"x": np.ones(2)})),)}, {"a": ({"x": np.ones(2)},)}),
])
def test_timed_parts_in_a_message_msgpack_packs_whole_write_their_values(msg, plain):
    """The hook unwraps a part msgpack meets (whatever it holds), so the bytes are those of the plain message."""
    assert MessageWriter().write(msg) == codec.packb(msg) == reference(plain)


def test_a_timed_part_beyond_64_bit_integers_is_refused_as_a_plain_one_is():
    with pytest.raises(ProtocolError, match="limited to 64 bits"):
        codec.packb({"a": [Timed(2**70)]})


def test_a_parts_seconds_are_read_around_writing_that_part(monkeypatch):
    """Each part's seconds are the clock's reading after its value is written minus the one before, apart from
    the other parts' (a clock that ticks once per reading: each part spans its own two readings)."""
    ticks = iter(range(100))
    monkeypatch.setattr(codec, "time", types.SimpleNamespace(perf_counter=lambda: float(next(ticks))))
    parts = [Timed({"x": np.arange(3)}), Timed({"y": {"z": Timed(1.0)}})]
    MessageWriter().write({"a": parts[0], "b": np.arange(3), "c": parts[1]})
    inner = parts[1].value["y"]["z"]
    assert parts[0].seconds == 1.0  # readings 0 and 1
    assert inner.seconds == 1.0  # readings 3 and 4, inside the second part's 2 and 5
    assert parts[1].seconds == 3.0
