"""The four messages: builders send exactly the documented keys and dtypes; parsers accept what the protocol allows
(old dialects included) and refuse the rest with a ProtocolError that names the problem."""

from __future__ import annotations

import numpy as np
import pytest

from plugrl_env_client.envs.base_env import Observation
from plugrl_env_client.errors import ProtocolError
from plugrl_env_client.protocol import codec, messages
from plugrl_env_client.protocol.messages import (
    ActionReply,
    Feedback,
    InferRequest,
    ServerMetadata,
    metadata_message,
    parse_action,
    parse_feedback,
    parse_infer,
    parse_metadata,
)


def wire(msg):
    """What the peer sees: the message through the codec and back."""
    return codec.unpackb(codec.packb(msg))


def obs(n: int, *, text=True, states=True, images=False) -> dict:
    out = {"images": {}, "states": {}, "text": np.array(["probe"] * n, dtype="<U5") if text else None}
    if states:
        out["states"] = {"t": np.zeros((n, 1)), "a": np.zeros((n, 3))}
    if images:
        out["images"] = {"cam": np.zeros((n, 4, 4, 3), dtype=np.uint8)}
    return out


def infer(n: int = 2, **overrides) -> dict:
    msg = InferRequest(obs(n), np.arange(n), np.zeros(n, dtype=int)).message()
    msg.update(overrides)
    return wire(msg)


def feedback(m: int = 2, **data_overrides) -> dict:
    msg = Feedback(
        env_indices=np.arange(m),
        step_ids=np.ones(m, dtype=int),
        obs=obs(m),
        rewards=np.full(m, 2.0),
        terminated=np.zeros(m, dtype=bool),
        truncated=np.zeros(m, dtype=bool),
        info={},
    ).message()
    msg["data"].update(data_overrides)
    return wire(msg)


def refused(parse, msg, words: str, *args) -> None:
    with pytest.raises(ProtocolError) as info:
        parse(msg, *args)
    assert words in str(info.value), str(info.value)


# ----------------------------------------------------------------------------------------------- builders


def test_infer_message_keys_and_dtypes() -> None:
    msg = InferRequest(obs(3), [4, 0, 2], [1, 0, 7]).message()
    assert set(msg) == {"message_type", "data", "env_indices", "step_ids"}
    assert msg["message_type"] == "infer"
    assert set(msg["data"]) == {"images", "states", "text"}
    for key, values in (("env_indices", [4, 0, 2]), ("step_ids", [1, 0, 7])):
        assert msg[key].dtype.str == "<i8" and msg[key].tolist() == values


def test_infer_message_with_reuse() -> None:
    msg = InferRequest(obs(1), [0, 1], [3, 3], reuse=[True, False]).message()
    assert set(msg) == {"message_type", "data", "env_indices", "step_ids", "reuse"}
    assert msg["reuse"].dtype.str == "|b1" and msg["reuse"].tolist() == [True, False]


def test_action_message_keys_and_dtypes() -> None:
    actions = np.zeros((4, 2, 3), dtype=np.float32)
    msg = ActionReply([5, 1], actions).message()
    assert set(msg) == {"message_type", "data"} and msg["message_type"] == "action"
    assert set(msg["data"]) == {"env_ids", "action"}
    assert msg["data"]["env_ids"].dtype.str == "<i8" and msg["data"]["env_ids"].tolist() == [5, 1]
    assert msg["data"]["action"] is actions


def test_feedback_message_keys_and_dtypes() -> None:
    msg = Feedback(
        env_indices=[2],
        step_ids=[5],
        obs=obs(1),
        rewards=[1.5],
        terminated=[1],
        truncated=[0],
        info={"episode": {}},
    ).message()
    assert set(msg) == {"message_type", "env_indices", "step_ids", "data"} and msg["message_type"] == "feedback"
    assert tuple(msg["data"]) == messages.FEEDBACK_KEYS == ("obs", "rewards", "terminated", "truncated", "info")
    assert msg["env_indices"].dtype.str == "<i8" and msg["step_ids"].dtype.str == "<i8"
    assert msg["data"]["rewards"].dtype.str == "<f4" and msg["data"]["rewards"].tolist() == [1.5]
    assert msg["data"]["terminated"].dtype.str == "|b1" and msg["data"]["terminated"].tolist() == [True]
    assert msg["data"]["truncated"].dtype.str == "|b1" and msg["data"]["truncated"].tolist() == [False]


def test_metadata_message() -> None:
    assert metadata_message({"protocol_version": 1}) == {"message_type": "metadata", "data": {"protocol_version": 1}}


def test_builders_round_trip_through_parsers() -> None:
    sent = np.array([3, 1], dtype=np.int64)
    req = parse_infer(wire(InferRequest(obs(2, images=True), sent, [0, 4]).message()))
    assert isinstance(req, InferRequest) and req.env_indices.tolist() == [3, 1] and req.reuse is None
    assert req.obs["images"]["cam"].shape == (2, 4, 4, 3)
    reply = parse_action(wire(ActionReply(sent, np.ones((5, 2, 3), dtype=np.float32)).message()), sent)
    assert isinstance(reply, ActionReply) and reply.actions.shape == (5, 2, 3)
    fb = parse_feedback(feedback(2))
    assert isinstance(fb, Feedback) and fb.rewards.tolist() == [2.0, 2.0] and fb.step_ids.tolist() == [1, 1]
    meta = parse_metadata(wire(metadata_message({"protocol_version": 1, "features": ["reuse-feedback-obs"]})))
    assert meta.protocol_version == 1 and meta.supports(messages.FEATURE_REUSE_FEEDBACK_OBS)


# ----------------------------------------------------------------------------------------------- metadata


@pytest.mark.parametrize("msg", [{"message_type": "metadata", "data": {}}, {"message_type": "metadata"}])
def test_metadata_empty_means_unknown(msg) -> None:
    meta = parse_metadata(wire(msg))
    assert meta == ServerMetadata(raw={})
    assert meta.protocol_version is None and meta.action_horizon is None and meta.action_dim is None
    assert meta.server is None and meta.features == ()
    assert not meta.supports("reuse-feedback-obs")


def test_metadata_full_and_unknown_keys_ignored() -> None:
    data = {
        "protocol_version": 1,
        "server": "plugrl-server",
        "server_version": "0.3",
        "algorithm": "ppo",
        "policy": "dummy",
        "action_horizon": 4,
        "action_dim": 2,
        "features": ["reuse-feedback-obs", "something-new"],
        "a_key_from_the_future": {"nested": [1, 2]},
    }
    meta = parse_metadata(wire(metadata_message(data)))
    assert meta.protocol_version == 1 and meta.server == "plugrl-server"
    assert meta.action_horizon == 4 and meta.action_dim == 2
    assert meta.features == ("reuse-feedback-obs", "something-new")
    assert meta.raw["a_key_from_the_future"] == {"nested": [1, 2]}


def test_metadata_zero_is_kept_and_odd_values_are_unknown() -> None:
    meta = parse_metadata(metadata_message({"action_horizon": 0, "action_dim": "3", "protocol_version": True}))
    assert meta.action_horizon == 0  # said explicitly: kept, not confused with "absent"
    assert meta.action_dim is None and meta.protocol_version is None
    assert parse_metadata(metadata_message({"action_horizon": np.int64(8)})).action_horizon == 8
    assert parse_metadata(metadata_message({"features": "reuse-feedback-obs"})).features == ()
    assert parse_metadata(metadata_message({"features": None})).features == ()


@pytest.mark.parametrize("data", [[], "x", 0, [1]])
def test_metadata_data_must_be_a_map(data) -> None:
    refused(parse_metadata, {"message_type": "metadata", "data": data}, "metadata 'data' must be a map")


@pytest.mark.parametrize(
    "msg, words",
    [
        ({"message_type": "action", "data": {}}, "expected a 'metadata' message, got 'action'"),
        ({"data": {}}, "expected a map with a str 'message_type'"),
        ({"message_type": 1}, "expected a map with a str 'message_type'"),
        ([1, 2], "got list"),
        (None, "got NoneType"),
    ],
)
def test_metadata_wrong_envelope(msg, words) -> None:
    refused(parse_metadata, msg, words)


# ----------------------------------------------------------------------------------------------- action


SENT = np.array([4, 0, 2], dtype=np.int64)


def action(data) -> dict:
    return wire({"message_type": "action", "data": data})


def test_action_time_major_float() -> None:
    chunk = np.arange(2 * 3 * 2, dtype=np.float32).reshape(2, 3, 2)
    reply = parse_action(action({"env_ids": SENT, "action": chunk}), SENT)
    assert reply.env_ids.tolist() == [4, 0, 2] and reply.env_ids.dtype == np.int64
    np.testing.assert_array_equal(reply.actions, chunk)


def test_action_discrete_has_no_action_axis() -> None:
    reply = parse_action(action({"env_ids": SENT, "action": np.zeros((5, 3), dtype=np.int64)}), SENT)
    assert reply.actions.shape == (5, 3) and reply.actions.dtype == np.int64


def test_action_without_env_ids_is_the_old_dialect() -> None:
    reply = parse_action(action({"action": np.zeros((1, 3, 2), dtype=np.float32)}), SENT)
    assert reply.env_ids.tolist() == SENT.tolist()


def test_action_env_ids_may_be_unsigned_or_big_endian() -> None:
    for dtype in ("<u4", ">i8", "<i4"):
        reply = parse_action(action({"env_ids": SENT.astype(dtype), "action": np.zeros((1, 3))}), SENT)
        assert reply.env_ids.tolist() == SENT.tolist()


@pytest.mark.parametrize(
    "env_ids, words",
    [
        (SENT[::-1].copy(), "do not match the infer's env_indices [4, 0, 2]"),
        (np.array([4, 0], dtype=np.int64), "do not match"),
        (np.array([4, 0, 2, 1], dtype=np.int64), "do not match"),
        (SENT.astype("<f8"), "'env_ids' must be a 1-d int64 array, got <f8 [3]"),
        (SENT.reshape(1, 3), "'env_ids' must be a 1-d int64 array, got <i8 [1, 3]"),
        ([4, 0, 2], "'env_ids' must be a 1-d int64 array, got list"),
        (np.array([2**63], dtype=np.uint64), "too large for int64"),
    ],
)
def test_action_env_ids_checked(env_ids, words) -> None:
    refused(parse_action, action({"env_ids": env_ids, "action": np.zeros((1, 3, 2))}), words, SENT)


@pytest.mark.parametrize(
    "chunk, words",
    [
        (np.zeros((0, 3, 2), dtype=np.float32), "horizon 0"),
        (np.zeros((2, 2, 2), dtype=np.float32), "expected time-major [horizon, 3, ...] for the 3 envs"),
        (np.zeros((3, 2), dtype=np.float32), "shape [3, 2]"),  # env-major [n, d] instead of [H, n, d]
        (np.zeros(3, dtype=np.float32), "shape [3]"),
        (np.float32(1.0), "must be an array [horizon, n, *action_shape], got float32"),
        ([[0.0, 0.0, 0.0]], "got list"),
        (None, "got NoneType"),
    ],
)
def test_action_array_checked(chunk, words) -> None:
    refused(parse_action, action({"env_ids": SENT, "action": chunk}), words, SENT)


@pytest.mark.parametrize("data", [None, [], np.zeros(3)])
def test_action_data_must_be_a_map(data) -> None:
    refused(parse_action, action(data), "action 'data' must be a map", SENT)


def test_action_wrong_type() -> None:
    refused(parse_action, wire(metadata_message({})), "expected a 'action' message, got 'metadata'", SENT)


# ----------------------------------------------------------------------------------------------- infer


def test_infer_accepts_text_as_list_and_no_images() -> None:
    o = obs(2, text=False)
    o["text"] = ["a", "b"]
    req = parse_infer(wire(InferRequest(o, [0, 1], [0, 0]).message()))
    assert req.obs["text"] == ["a", "b"]


def test_infer_with_reuse_carries_only_fresh_rows() -> None:
    req = parse_infer(wire(InferRequest(obs(1), [0, 1, 2], [2, 2, 2], reuse=[True, False, True]).message()))
    assert req.reuse.tolist() == [True, False, True] and req.obs["states"]["t"].shape == (1, 1)
    all_reused = parse_infer(wire(InferRequest(obs(0), [0, 1], [1, 1], reuse=[True, True]).message()))
    assert all_reused.obs["states"]["a"].shape == (0, 3)
    empty_text = obs(0)
    empty_text["text"] = np.array([])  # float64 [0], what numpy makes of an empty list
    assert parse_infer(wire(InferRequest(empty_text, [0], [1], reuse=[True]).message())).obs["text"].shape == (0,)


@pytest.mark.parametrize(
    "mutate, words",
    [
        (lambda m: m["data"].pop("text"), "must be a map with exactly the keys images, states, text"),
        (lambda m: m["data"].update(extra={}), "exactly the keys images, states, text; got ['extra', 'images'"),
        (lambda m: m.update(data=[1]), "infer data must be a map with exactly the keys"),
        (lambda m: m["data"].update(states=[np.zeros((2, 1))]), "infer data['states'] must be a map of arrays"),
        (lambda m: m["data"]["states"].update(t=np.zeros((3, 1))), "arrays disagree on the batch size: [2, 3]"),
        (lambda m: m["data"].update(text=np.array(["x"] * 3)), "disagree on the batch size: [2, 3]"),
        (lambda m: m["data"]["states"].update(t=np.float64(0.0)), "must be an array with the env batch leading"),
        (lambda m: m["data"]["states"].update(t=np.zeros(())), "must be an array with the env batch leading"),
        (lambda m: m["data"]["states"].update(t=np.array(["a", "b"])), "['states']['t'] must be numeric, got <U1"),
        (lambda m: m["data"]["images"].update(c=np.zeros((2, 2, 2, 3))), "['images']['c'] must be uint8, got <f8"),
        (lambda m: m["data"].update(text=np.zeros(2)), "['text'] must be a 1-d '<U' array or a list of str, got <f8"),
        (lambda m: m["data"].update(text=np.array("x")), "1-d '<U' array or a list of str, got <U1 []"),
        (lambda m: m["data"].update(text=["a", 1]), "1-d '<U' array or a list of str, got list"),
        (lambda m: m["data"].update(text="probe"), "got str"),
        (lambda m: m.update(env_indices=np.array([0, 0])), "infer env_indices must be unique, got [0, 0]"),
        (lambda m: m.update(env_indices=np.array([0.0, 1.0])), "'env_indices' must be a 1-d int64 array, got <f8"),
        (lambda m: m.pop("env_indices"), "'env_indices' must be a 1-d int64 array, got NoneType"),
        (lambda m: m.pop("step_ids"), "'step_ids' must be a 1-d int64 array, got NoneType"),
        (lambda m: m.update(step_ids=np.zeros(3, dtype=np.int64)), "infer has 3 step_ids for 2 env_indices"),
        (lambda m: m.update(env_indices=np.arange(3)), "infer has 2 step_ids for 3 env_indices"),
        (lambda m: m.update(message_type="feedback"), "expected a 'infer' message, got 'feedback'"),
        (lambda m: m.update(reuse=np.array([1, 0])), "'reuse' must be a bool array with one entry per env index"),
        (lambda m: m.update(reuse=np.array([True])), "'reuse' must be a bool array"),
        (lambda m: m.update(reuse=[True, False]), "'reuse' must be a bool array"),
    ],
)
def test_infer_refused(mutate, words) -> None:
    msg = infer(2)
    mutate(msg)
    refused(parse_infer, msg, words)


@pytest.mark.parametrize("n", [2, messages.SMALL_BATCH, messages.SMALL_BATCH + 1, 3 * messages.SMALL_BATCH])
def test_a_repeated_env_index_is_found_in_batches_of_any_size(n) -> None:
    """Small batches are checked as a set, large ones with numpy: both find the one repeat."""
    ids = np.arange(n)
    ids[-1] = ids[0]
    msg = infer(n)
    msg["env_indices"] = ids
    refused(parse_infer, msg, "infer env_indices must be unique")
    msg["env_indices"] = np.arange(n)
    parse_infer(msg)


def test_infer_row_count_must_match() -> None:
    refused(parse_infer, wire(InferRequest(obs(3), [0, 1], [0, 0]).message()),
            "infer data holds 3 rows but 2 rows are expected")
    # reuse: data holds the non-reused rows only
    refused(
        parse_infer,
        wire(InferRequest(obs(2), [0, 1], [0, 0], reuse=[True, False]).message()),
        "infer data holds 2 rows but 1 rows are expected",
    )


def test_infer_without_any_array_is_refused() -> None:
    empty = obs(2, text=False, states=False)
    refused(parse_infer, wire(InferRequest(empty, [0, 1], [0, 0]).message()), "infer data holds no arrays but 2 rows")
    refused(
        parse_infer,
        wire(InferRequest(empty, [0, 1], [0, 0], reuse=[False, True]).message()),
        "infer data holds no arrays but 1 rows are expected",
    )
    # ... but when every row is reused there is nothing to hold.
    assert parse_infer(wire(InferRequest(empty, [0, 1], [0, 0], reuse=[True, True]).message())).reuse.all()


# ----------------------------------------------------------------------------------------------- feedback


def test_feedback_with_episode_info() -> None:
    info = {"episode": {"r": np.array([3.0], "<f4"), "l": np.array([3]), "s": np.array([True]), "mask": np.array([True])}}
    msg = feedback(1, info=info, terminated=np.array([True]))
    fb = parse_feedback(msg)
    assert fb.terminated.tolist() == [True] and fb.info["episode"]["l"].tolist() == [3]


@pytest.mark.parametrize(
    "mutate, words",
    [
        (lambda m: m["data"].pop("info"), "feedback data must have exactly the keys obs, rewards, terminated, truncated, info; got ['obs', 'rewards'"),
        (lambda m: m["data"].update(episode={}), "got ['episode', 'info'"),
        (lambda m: m.update(data=None), "exactly the keys obs, rewards, terminated, truncated, info; got NoneType"),
        (lambda m: m["data"].update(obs={"states": {}}), "feedback obs must be a map with exactly the keys images, states, text"),
        (lambda m: m["data"]["obs"]["states"].update(t=np.zeros((3, 1))), "feedback obs arrays disagree on the batch size: [2, 3]"),
        (lambda m: m.update(env_indices=np.arange(3)), "feedback obs has 2 rows and 2 step ids for 3 env indices"),
        (lambda m: m.update(step_ids=np.arange(1)), "feedback obs has 2 rows and 1 step ids for 2 env indices"),
        (lambda m: m.update(env_indices=np.array([1, 1])), "feedback env_indices must be unique, got [1, 1]"),
        (lambda m: m.update(env_indices=[0, 1]), "'env_indices' must be a 1-d int64 array, got list"),
        (lambda m: m["data"].update(terminated=np.array([0, 1])), "feedback 'terminated' must be a [2] bool array"),
        (lambda m: m["data"].update(truncated=np.array([0.0, 1.0])), "feedback 'truncated' must be a [2] bool array"),
        (lambda m: m["data"].update(truncated=[False, False]), "feedback 'truncated' must be a [2] bool array"),
        (lambda m: m["data"].update(rewards=np.array([1, 2])), "feedback 'rewards' must be a [2] float (float32) array"),
        (lambda m: m["data"].update(rewards=np.float32(1.0)), "feedback 'rewards' must be a [2] float (float32) array"),
        (lambda m: m["data"].update(rewards=np.zeros(3, "<f4")), "feedback 'rewards' must be a [2] float (float32) array"),
        (lambda m: m["data"].update(info=[]), "feedback 'info' must be a map"),
        (lambda m: m.update(message_type="infer"), "expected a 'feedback' message, got 'infer'"),
    ],
)
def test_feedback_refused(mutate, words) -> None:
    msg = feedback(2)
    mutate(msg)
    refused(parse_feedback, msg, words)


def test_feedback_obs_without_arrays_is_refused() -> None:
    msg = feedback(2, obs=obs(2, text=False, states=False))
    refused(parse_feedback, msg, "feedback obs has no arrays and 2 step ids for 2 env indices")


def test_feedback_int_info_key_is_refused_by_the_codec() -> None:
    frame = codec.packb(Feedback([0], [1], obs(1), [0.0], [False], [False], {0: np.zeros(1)}).message())
    with pytest.raises(ProtocolError, match="map keys must be str or bytes, got 0"):
        codec.unpackb(frame)


# ------------------------------------------------------------------------------------------- wire observation


def test_wire_observation_keeps_the_three_groups() -> None:
    obs = Observation(images={"cam": np.zeros((2, 4, 4, 3), np.uint8)}, states={"pos": np.zeros((2, 2))}, text="hi")
    wire = messages.wire_observation(obs)
    assert set(wire) == {"images", "states", "text"}
    assert wire["images"]["cam"] is obs.images["cam"]  # no copy on the way to the codec
    assert set(wire["states"]) == {"pos"}
    assert wire["text"].shape == (2,)


def test_wire_observation_text_only_carries_the_batch_size() -> None:
    wire = messages.wire_observation(Observation(text=["a", "b", "c"]))
    assert wire["images"] == {}
    assert wire["states"]["_batch"].shape == (3, 0)


def test_text_chunk_as_lists_of_str_becomes_a_wide_enough_array() -> None:
    reply = parse_action(action({"env_ids": SENT, "action": [["a", "bb" * 600, "ü"], ["c", "d", "e"]]}), SENT)
    assert reply.actions.shape == (2, 3) and reply.actions.dtype.kind == "U"
    assert reply.actions[0, 1] == "bb" * 600 and reply.actions[0, 2] == "ü"
    refused(parse_action, action({"env_ids": SENT, "action": [["a", "b", "c"], ["d"]]}), "different lengths", SENT)


def test_short_repr_cuts_long_contents_and_keeps_short_ones() -> None:
    assert messages.short_repr({"a": 1}) == "{'a': 1}"
    long = messages.short_repr({"rows": np.arange(10_000)}, 50)
    assert len(long) == 53 and long.endswith("...") and long.startswith("{'rows': array([")
