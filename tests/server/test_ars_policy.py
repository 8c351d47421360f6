"""ARS as a reference-server policy: its flags, the per-policy horizon, the embedded form and the command line."""

from __future__ import annotations

import re

import gymnasium as gym
import numpy as np
import pytest

from plugrl_env_client.errors import ConfigError
from plugrl_env_client.server.cli import main
from plugrl_env_client.server.embedded import policy_for_space, start_local_server
from plugrl_env_client.server.policies import LOCAL_ARS_POLICY, ArsPolicy, PolicyConfig, horizon_of, make_policy
from plugrl_env_client.server.registry import config_of


def test_ars_defaults_to_horizon_1_and_the_others_keep_4():
    assert horizon_of(PolicyConfig(name="ars")) == 1
    assert horizon_of(PolicyConfig(name="ars", action_horizon=3)) == 3
    for name in ("random", "zero", "text"):
        assert horizon_of(PolicyConfig(name=name)) == 4  # type: ignore[arg-type]
    assert make_policy(PolicyConfig(action_dim=2)).horizon == 4
    policy = make_policy(PolicyConfig(name="ars", action_dim=2))
    assert isinstance(policy, ArsPolicy) and policy.horizon == 1
    assert policy.metadata()["action_horizon"] == 1 and policy.metadata()["algorithm"] == "ARS V2-t"


def test_flags_reach_the_learner(tmp_path):
    policy = make_policy(config_of(name="ars", action_dim=3, directions=5, top_directions=2, step_size=0.1,
                                      noise=0.2, seed=9, save=tmp_path / "p.npz", low=-2.0, high=0.5))
    settings = policy.learner.settings
    assert (settings.directions, settings.top_directions, settings.step_size, settings.noise, settings.seed) == \
        (5, 2, 0.1, 0.2, 9)
    assert settings.save == tmp_path / "p.npz" and settings.log_path == tmp_path / "p.jsonl"
    assert policy.learner.low.tolist() == [-2.0] * 3 and policy.learner.high.tolist() == [0.5] * 3


def test_a_longer_chunk_repeats_the_action_for_its_first_observation():
    policy = make_policy(config_of(name="ars", action_dim=2, action_horizon=3, noise=1.0, seed=0))
    conn = policy.for_connection()
    obs = {"images": {}, "states": {"x": np.array([[1.0, -1.0], [0.5, 2.0]])}, "text": None}
    chunk = conn.infer(obs, np.arange(2), np.zeros(2, np.int64))
    assert chunk.shape == (3, 2, 2) and chunk.dtype == np.float32 and chunk.flags.c_contiguous
    assert (chunk == chunk[0]).all() and chunk[0].any()


@pytest.mark.parametrize("flags, words", [
    ({"directions": 4}, "--policy.directions is for --policy.name ars; --policy.name random ignores it (pass "
                        "--policy.name ars to use it)"),
    ({"eval": True, "noise": 0.1}, "--policy.noise, --policy.eval are for --policy.name ars"),
])
def test_ars_flags_are_refused_for_other_policies(flags, words):
    with pytest.raises(ConfigError, match=re.escape(words)):
        config_of(**flags)


@pytest.mark.parametrize("config, words", [
    (PolicyConfig(name="ars", action_dim=0), "--policy.action-dim must be >= 1"),
    (PolicyConfig(name="ars", dtype="int64"), "--policy.dtype must be a float dtype"),
])
def test_ars_needs_a_vector_of_float_actions(config, words):
    with pytest.raises(ValueError, match=words):
        make_policy(config)


@pytest.mark.parametrize("args, words", [
    (["--policy.name", "ars", "--policy.directions", "0"], "--policy.directions must be >= 1"),
    (["--policy.name", "ars", "--policy.top-directions", "9"], "--policy.top-directions must be between 1 and"),
    (["--policy.name", "ars", "--policy.step-size", "-1"], "--policy.step-size must be a finite number > 0"),
    (["--policy.name", "ars", "--policy.noise", "0"], "--policy.noise must be a finite number > 0"),
    (["--policy.name", "ars", "--policy.eval"], "--policy.eval evaluates a saved policy: pass --policy.load"),
    (["--policy.name", "ars", "--policy.load", "/nonexistent/ars.npz"], "--policy.load /nonexistent/ars.npz: no such file"),
    (["--policy.name", "ars", "--policy.action-dim", "0"], "--policy.action-dim must be >= 1"),
    (["--policy.seed", "1", "--policy.save", "x.npz"], "--policy.save is for --policy.name ars"),
])
def test_bad_ars_flags_exit_1_with_a_message(args, words, capsys):
    with pytest.raises(SystemExit) as info:
        main(args)
    assert info.value.code == 1
    assert words in capsys.readouterr().err


def test_embedded_ars_takes_shape_bounds_and_dtype_from_the_box(tmp_path):
    space = gym.spaces.Box(np.array([-1.0, -3.0]), np.array([1.0, 0.5]), dtype=np.float64)
    policy = policy_for_space("ars", space, None, seed=4, run_dir=tmp_path)
    assert isinstance(policy, ArsPolicy) and policy.horizon == 1 and policy.dtype == np.float64
    assert policy.learner.low.tolist() == [-1.0, -3.0] and policy.learner.high.tolist() == [1.0, 0.5]
    assert policy.learner.settings.seed == 4 and policy.learner.settings.save == tmp_path / LOCAL_ARS_POLICY
    assert policy_for_space("ars", space, 2).horizon == 2


@pytest.mark.parametrize("space", [gym.spaces.Discrete(3), gym.spaces.MultiDiscrete([2, 2]),
                                   gym.spaces.Box(0, 5, (2,), np.int64), gym.spaces.Text(10)],
                         ids=["discrete", "multidiscrete", "int-box", "text"])
def test_embedded_ars_refuses_what_is_not_a_box_of_floats(space):
    with pytest.raises(ConfigError, match="needs a gymnasium Box action space of floats, but the env's action space is"):
        policy_for_space("ars", space, None)


def test_the_local_server_saves_into_the_run_folder(tmp_path):
    server = start_local_server("ars", gym.spaces.Box(-1, 1, (2,), np.float32), None, seed=0, run_root=tmp_path)
    try:
        assert server.policy.learner.settings.save == tmp_path / LOCAL_ARS_POLICY
    finally:
        server.shutdown()
    random = start_local_server("random", gym.spaces.Box(-1, 1, (2,), np.float32), None, run_root=tmp_path)
    try:
        assert random.policy.horizon == 4
    finally:
        random.shutdown()
