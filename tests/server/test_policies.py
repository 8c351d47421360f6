"""The reference server's policies, the text policy above all: shapes, dtypes, seeding, and text on the wire."""

from __future__ import annotations

import numpy as np
import pytest
from websockets.sync.client import connect

from plugrl_env_client.errors import ConfigError
from plugrl_env_client.protocol import codec, messages
from plugrl_env_client.server.policies import PolicyConfig, TextPolicy, make_policy
from plugrl_env_client.server.registry import config_of
from plugrl_env_client.server.server import PolicyServer

LONG = "λ" * 6000 + "<answer>42</answer>" + "x" * 4000  # 10k characters, non-ASCII
CHOICES = ("<answer>3</answer>", "hello", "", "日本語のテキスト 🙂", "e\u0301 combining", LONG)


def text_policy(seed: int | None = 0, horizon: int = 3, choices: tuple[str, ...] = CHOICES) -> TextPolicy:
    policy = make_policy(config_of(name="text", action_horizon=horizon, seed=seed, choices=choices))
    assert isinstance(policy, TextPolicy)
    return policy


def test_text_policy_answers_horizon_by_envs_strings_from_the_choices():
    policy = text_policy(horizon=3)
    chunk = policy.act({}, 5)
    assert chunk.shape == (3, 5)
    assert chunk.dtype.kind == "U" and chunk.dtype.itemsize // 4 == len(LONG)  # as wide as the longest choice
    assert set(chunk.ravel().tolist()) <= set(CHOICES)


def test_text_policy_never_truncates_and_uses_every_choice():
    seen = set(text_policy(seed=1, horizon=50).act({}, 40).ravel().tolist())
    assert seen == set(CHOICES)  # 2000 draws over 6 choices: every one, each exactly as given


def test_text_policy_is_seeded():
    a = text_policy(seed=7).act({}, 16)
    b = text_policy(seed=7).act({}, 16)
    c = text_policy(seed=8).act({}, 16)
    assert (a == b).all()
    assert not (a == c).all()


def test_text_policy_draws_per_env_and_step():
    chunk = text_policy(seed=3, horizon=20, choices=("a", "b")).act({}, 20)
    assert len(set(chunk[:, 0].tolist())) == 2  # the steps of one env differ
    assert len(set(chunk[0, :].tolist())) == 2  # the envs of one step differ


def test_text_policy_with_no_envs_and_single_empty_choice():
    policy = text_policy(choices=("",))
    chunk = policy.act({}, 0)
    assert chunk.shape == (3, 0) and chunk.dtype == np.dtype("<U1")
    assert policy.act({}, 2).tolist() == [["", ""]] * 3


def test_empty_choices_is_an_error_with_the_fix():
    with pytest.raises(ValueError, match="--policy.choices"):
        make_policy(PolicyConfig(name="text"))


def test_non_string_choices_are_refused():
    with pytest.raises(ValueError, match="must be strings"):
        make_policy(config_of(name="text", choices=("ok", 3)))  # type: ignore[arg-type]


def test_choices_without_the_text_policy_is_an_error():
    with pytest.raises(ConfigError, match="--policy.choices is for --policy.name text; --policy.name random ignores it"):
        config_of(name="random", choices=("a",))


def test_text_metadata_has_a_dtype_and_no_action_dim():
    meta = text_policy(horizon=6, choices=("abc", "de")).metadata()
    assert meta == {"policy": "TextPolicy", "action_horizon": 6, "action_dtype": "<U3"}


def test_numeric_metadata_unchanged():
    meta = make_policy(PolicyConfig(action_dim=3, action_horizon=2)).metadata()
    assert meta == {"policy": "RandomPolicy", "action_horizon": 2, "action_dtype": "<f4", "action_dim": 3}


def test_text_chunks_survive_the_codec_unchanged():
    ids = np.array([4, 0, 9], dtype=np.int64)
    chunk = text_policy(seed=2, horizon=40).act({}, 3)
    reply = messages.parse_action(codec.unpackb(codec.packb(messages.ActionReply(ids, chunk).message())), ids)
    assert reply.actions.dtype == chunk.dtype and reply.actions.shape == chunk.shape
    assert reply.actions.tolist() == chunk.tolist()
    assert LONG in reply.actions.ravel().tolist() and "日本語のテキスト 🙂" in reply.actions.ravel().tolist()


def test_server_answers_text_over_a_real_socket():
    server = PolicyServer(text_policy(seed=0, horizon=2), host="127.0.0.1", port=0).start()
    try:
        with connect(server.url, compression=None, max_size=None, proxy=None) as ws:
            meta = messages.parse_metadata(codec.unpackb(ws.recv(timeout=5)))
            assert meta.action_horizon == 2 and meta.action_dim is None
            assert meta.raw["action_dtype"] == f"<U{len(LONG)}"
            twin = text_policy(seed=0, horizon=2)  # same seed: the server's answers, drawn locally
            for step in range(6):
                ids = np.array([1, 0, 2], dtype=np.int64)
                obs = {"images": {}, "states": {}, "text": np.array(["Too small.", "你好", LONG])}
                ws.send(codec.packb(messages.InferRequest(obs, ids, np.full(3, step, np.int64)).message()))
                reply = messages.parse_action(codec.unpackb(ws.recv(timeout=5)), ids)
                assert reply.actions.shape == (2, 3) and reply.actions.dtype.kind == "U"
                assert reply.actions.tolist() == twin.act({}, 3).tolist()
                ws.send(codec.packb(messages.Feedback(ids, np.full(3, step, np.int64), obs, np.zeros(3, np.float32),
                                                      np.zeros(3, bool), np.zeros(3, bool), {}).message()))
    finally:
        server.shutdown()
