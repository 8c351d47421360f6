"""Observation (batch container) and BaseEnv (batched env base class) behaviour."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

from plugrl_env_client.envs.base_env import BaseEnv, BaseEnvConfig, Observation

# ------------------------------------------------------------------------------------------------ Observation


def _obs(n: int = 3, text: Any = None) -> Observation:
    return Observation(
        images={"cam": np.arange(n * 2 * 2 * 3, dtype=np.uint8).reshape(n, 2, 2, 3)},
        states={"pos": np.arange(n * 2, dtype=np.float64).reshape(n, 2)},
        text=text,
    )


def test_mismatched_leading_dims_raise_naming_the_arrays() -> None:
    with pytest.raises(ValueError) as err:
        Observation(images={"cam": np.zeros((3, 4, 4, 3), np.uint8)}, states={"pos": np.zeros((2, 5))})
    msg = str(err.value)
    assert "images['cam']: 3" in msg
    assert "states['pos']: 2" in msg


def test_mismatched_leading_dims_between_states() -> None:
    with pytest.raises(ValueError, match=r"states\['a'\].*states\['b'\]"):
        Observation(states={"a": np.zeros((4, 1)), "b": np.zeros((5, 1))})


@pytest.mark.parametrize("where", ["images", "states"])
def test_scalar_arrays_rejected(where: str) -> None:
    with pytest.raises(ValueError, match="scalar"):
        Observation(**{where: {"x": np.float64(1.0)}})


def test_text_none_is_broadcast_empty() -> None:
    obs = _obs(3, None)
    assert obs.text.shape == (3,)
    assert obs.text.dtype.kind == "U"
    assert list(obs.text) == ["", "", ""]


def test_text_str_is_broadcast() -> None:
    obs = _obs(4, "pick up the cube")
    assert obs.text.shape == (4,)
    assert obs.text.dtype.kind == "U"
    assert list(obs.text) == ["pick up the cube"] * 4


def test_text_list_of_n() -> None:
    obs = _obs(3, ["a", "bb", "ccc"])
    assert obs.text.shape == (3,)
    assert obs.text.dtype.kind == "U"
    assert list(obs.text) == ["a", "bb", "ccc"]


def test_text_unicode_array_of_n_and_of_one() -> None:
    obs = _obs(3, np.array(["x", "y", "z"]))
    assert obs.text.dtype.kind == "U" and list(obs.text) == ["x", "y", "z"]
    obs = _obs(3, np.array(["only"]))
    assert obs.text.shape == (3,)
    assert list(obs.text) == ["only"] * 3
    obs = _obs(2, ["single"])
    assert list(obs.text) == ["single", "single"]


def test_text_object_array_becomes_unicode() -> None:
    obs = _obs(2, np.array(["a", "b"], dtype=object))
    assert obs.text.dtype.kind == "U"
    assert list(obs.text) == ["a", "b"]


def test_text_only_observation_infers_batch_from_text() -> None:
    obs = Observation(text=["a", "b", "c", "d"])
    assert obs.batch_size == 4
    assert Observation().batch_size == 1


@pytest.mark.parametrize("text", [["a", "b"], np.array(["a", "b", "c", "d"])])
def test_wrong_text_length_raises(text: Any) -> None:
    with pytest.raises(ValueError, match="entries but the batch has 3 envs"):
        _obs(3, text)


def test_non_string_text_rejected() -> None:
    with pytest.raises(ValueError, match="text"):
        _obs(2, np.array([1, 2]))
    with pytest.raises(ValueError, match="one-dimensional"):
        _obs(2, np.array([["a", "b"]]))


def test_batch_size() -> None:
    assert _obs(5).batch_size == 5
    assert Observation(states={"s": np.zeros((7, 1))}).batch_size == 7


def test_select_copies_rows() -> None:
    obs = _obs(4, ["t0", "t1", "t2", "t3"])
    sub = obs.select([3, 1])
    assert sub.batch_size == 2
    np.testing.assert_array_equal(sub.images["cam"], obs.images["cam"][[3, 1]])
    np.testing.assert_array_equal(sub.states["pos"], obs.states["pos"][[3, 1]])
    assert list(sub.text) == ["t3", "t1"]
    sub.states["pos"][:] = -1.0
    sub.images["cam"][:] = 0
    assert (obs.states["pos"] >= 0).all(), "select must not alias the source arrays"
    assert obs.images["cam"].max() > 0


def test_copy_owns_every_array() -> None:
    obs = _obs(3, ["a", "b", "c"])
    copied = obs.copy()
    for kind in ("images", "states"):
        for key, arr in getattr(obs, kind).items():
            np.testing.assert_array_equal(getattr(copied, kind)[key], arr)
            assert not np.shares_memory(getattr(copied, kind)[key], arr), f"{kind}[{key!r}] is shared"
    obs.states["pos"][:] = -7.0
    obs.text[0] = "z"
    assert (copied.states["pos"] != -7.0).all() and list(copied.text) == ["a", "b", "c"]


def test_select_with_empty_and_bool_mask() -> None:
    obs = _obs(4, ["t0", "t1", "t2", "t3"])
    empty = obs.select(np.array([], dtype=np.int64))
    assert empty.states["pos"].shape == (0, 2)
    assert empty.text.shape == (0,)
    # a bool mask selects the True rows (not rows 0 and 1, which an int cast would give)
    masked = obs.select(np.array([False, False, True, True]))
    assert list(masked.text) == ["t2", "t3"]
    np.testing.assert_array_equal(masked.states["pos"], obs.states["pos"][2:])


# ------------------------------------------------------------------------------------------------ BaseEnv


class _BoxEnv(BaseEnv[BaseEnvConfig]):
    def __init__(self, config: BaseEnvConfig = BaseEnvConfig(), num_envs: int = 1, **kwargs: Any) -> None:
        super().__init__(config, num_envs=num_envs, **kwargs)
        self.single_action_space = gym.spaces.Box(-1.0, 1.0, (3, 2), np.float32)


@pytest.mark.parametrize("n", [0, -1])
def test_num_envs_below_one_rejected(n: int) -> None:
    with pytest.raises(ValueError, match="num_envs"):
        _BoxEnv(num_envs=n)


def test_constructor_stores_arguments() -> None:
    cfg = BaseEnvConfig()
    env = _BoxEnv(cfg, num_envs=2, process_id=1, total_processes=4)
    assert env.config is cfg
    assert env.num_envs == 2
    assert (env.process_id, env.total_processes) == (1, 4)


def test_metadata_autoreset_mode() -> None:
    assert BaseEnv.metadata["autoreset_mode"] is AutoresetMode.DISABLED
    assert _BoxEnv(num_envs=1).metadata["autoreset_mode"] is AutoresetMode.DISABLED


def test_action_space_is_batched_single_action_space() -> None:
    env = _BoxEnv(num_envs=5)
    assert env.single_action_space == gym.spaces.Box(-1.0, 1.0, (3, 2), np.float32)
    space = env.action_space
    assert isinstance(space, gym.spaces.Box)
    assert space.shape == (5, 3, 2)
    assert space.dtype == np.float32
    assert space.contains(np.zeros((5, 3, 2), np.float32))


def test_setting_single_action_space_redefines_action_space() -> None:
    env = _BoxEnv(num_envs=2)
    assert env.action_space.shape == (2, 3, 2)
    env.single_action_space = gym.spaces.Discrete(4)
    assert isinstance(env.action_space, gym.spaces.MultiDiscrete)
    np.testing.assert_array_equal(env.action_space.nvec, [4, 4])


def test_missing_single_action_space_is_attribute_error() -> None:
    class NoSpace(BaseEnv):
        pass

    env = NoSpace(BaseEnvConfig(), num_envs=1)
    with pytest.raises(AttributeError):
        _ = env.single_action_space


def test_seed_rngs_reproducible() -> None:
    env = _BoxEnv(num_envs=1)
    env.seed_rngs(123)
    first = env.np_random.random(5)
    env.seed_rngs(123)
    np.testing.assert_array_equal(env.np_random.random(5), first)
    env.seed_rngs(124)
    assert not np.array_equal(env.np_random.random(5), first)


def test_seed_rngs_none_keeps_generator() -> None:
    env = _BoxEnv(num_envs=1)
    env.seed_rngs(7)
    rng = env.np_random
    a = rng.random()
    env.seed_rngs(None)
    assert env.np_random is rng
    assert env.np_random.random() != a  # continued, not re-seeded
    fresh = _BoxEnv(num_envs=1)
    fresh.seed_rngs(None)
    assert isinstance(fresh.np_random, np.random.Generator)


def _envs(n: int) -> _BoxEnv:
    return _BoxEnv(num_envs=n)


def test_reset_mask_all_without_indices() -> None:
    np.testing.assert_array_equal(_envs(3).reset_mask(None), [True, True, True])
    np.testing.assert_array_equal(_envs(3).reset_mask({}), [True, True, True])
    np.testing.assert_array_equal(_envs(3).reset_mask({"reset_indices": None}), [True, True, True])


def test_reset_mask_with_indices() -> None:
    mask = _envs(5).reset_mask({"reset_indices": np.array([4, 1])})
    assert mask.dtype == np.bool_
    np.testing.assert_array_equal(mask, [False, True, False, False, True])
    np.testing.assert_array_equal(_envs(3).reset_mask({"reset_indices": [2]}), [False, False, True])
    np.testing.assert_array_equal(_envs(3).reset_mask({"reset_indices": []}), [False, False, False])


def test_reset_mask_with_bool_mask() -> None:
    mask = _envs(4).reset_mask({"reset_indices": np.array([False, False, True, True])})
    np.testing.assert_array_equal(mask, [False, False, True, True])


def test_reset_mask_gymnasium_name() -> None:
    """Gymnasium's ``reset_mask`` is accepted, and wins when both names are given (they agree from the runner)."""
    mask = _envs(3).reset_mask({"reset_mask": np.array([True, False, True])})
    np.testing.assert_array_equal(mask, [True, False, True])
    both = _envs(3).reset_mask({"reset_mask": np.array([False, True, False]), "reset_indices": np.array([1])})
    np.testing.assert_array_equal(both, [False, True, False])


def test_reset_mask_out_of_range() -> None:
    with pytest.raises(IndexError):
        _envs(2).reset_mask({"reset_indices": [2]})


# ------------------------------------------------------------------------------------------------ spaces


def test_observation_space_of_an_observation() -> None:
    from plugrl_env_client.envs.base_env import observation_space_of

    obs = Observation(images={"cam": np.zeros((3, 8, 6, 3), np.uint8)},
                      states={"pos": np.zeros((3, 2), np.float32), "count": np.zeros((3, 1), np.int64)}, text="hi")
    space = observation_space_of(obs)
    assert space["images"]["cam"].shape == (8, 6, 3) and space["images"]["cam"].dtype == np.uint8
    assert space["states"]["pos"].shape == (2,) and space["states"]["pos"].dtype == np.float32
    assert space["states"]["count"].dtype == np.int64
    row = {"images": {"cam": obs.images["cam"][0]}, "states": {"pos": obs.states["pos"][0],
                                                             "count": obs.states["count"][0]}, "text": "hi"}
    assert space.contains(row)


def test_missing_observation_space_says_how_to_declare_it() -> None:
    with pytest.raises(AttributeError, match="declare it in __init__"):
        _ = _BoxEnv(num_envs=1).single_observation_space


def test_declared_observation_space_is_batched() -> None:
    from plugrl_env_client.envs.base_env import observation_space

    env = _BoxEnv(num_envs=4)
    env.single_observation_space = observation_space(states={"x": (3,)})
    assert env.observation_space["states"]["x"].shape == (4, 3)


def test_builtin_envs_declare_spaces_that_hold_their_observations(registry: None) -> None:
    from plugrl_env_client.utils.registration import make_env

    for uid in ("Point-v1", "Probe-v1", "Dummy-v1"):
        env = make_env(uid, num_envs=2)
        obs, _ = env.reset(seed=0)
        row = {"images": {k: v[1] for k, v in obs.images.items()}, "states": {k: v[1] for k, v in obs.states.items()},
               "text": str(obs.text[1])}
        assert env.single_observation_space.contains(row), uid
        env.close()


def test_gymnasium_record_episode_statistics_driven_like_the_runner(registry: None) -> None:
    """Gymnasium's RecordEpisodeStatistics over a built-in env, reset with a mask as the runner does (DISABLED
    autoreset): its episode lengths and returns match an independent count."""
    from plugrl_env_client.utils.registration import make_env

    env = gym.wrappers.vector.RecordEpisodeStatistics(make_env("Probe-v1", num_envs=3))
    env.reset(seed=0)
    lengths = np.zeros(3, int)
    seen: list[tuple[int, int, float]] = []
    for _ in range(40):
        _, rewards, terminated, truncated, info = env.step(np.zeros((3, 3)))
        lengths += 1
        done = terminated | truncated
        if done.any():
            ep = info["episode"]
            for i in np.flatnonzero(done):
                seen.append((int(i), int(ep["l"][i]), float(ep["r"][i])))
                assert ep["l"][i] == lengths[i] == 3 + 2 * (i % 3)
                assert ep["r"][i] == pytest.approx(lengths[i])  # reward 1 per step
            lengths[done] = 0
            env.reset(options={"reset_mask": done.copy(), "reset_indices": np.flatnonzero(done)})
    assert {i for i, _, _ in seen} == {0, 1, 2} and len(seen) >= 10


def test_observation_wrappers_construct_from_the_declared_space(registry: None) -> None:
    """A NormalizeObservation-style vector wrapper reads the space when it is built, and runs."""
    from plugrl_env_client.utils.registration import make_env

    class ScaleStates(gym.vector.VectorObservationWrapper):
        def __init__(self, env: gym.vector.VectorEnv, scale: float) -> None:
            super().__init__(env)
            self.scale = scale
            self.keys = list(env.single_observation_space["states"].keys())

        def observations(self, observations: Observation) -> Observation:
            return Observation(images=observations.images, text=observations.text,
                               states={k: v * self.scale for k, v in observations.states.items()})

    env = ScaleStates(make_env("Point-v1", num_envs=2), 10.0)
    assert sorted(env.keys) == ["goal", "pos"]
    obs, _ = env.reset(seed=0)
    raw, _ = env.env.reset(seed=0)
    np.testing.assert_allclose(obs.states["pos"], 10.0 * raw.states["pos"])


class _Undeclared(BaseEnv[BaseEnvConfig]):
    """Declares no observation space (as the README's shortest env does)."""

    def __init__(self, config: BaseEnvConfig | None = None, num_envs: int = 1, **kwargs: Any) -> None:
        super().__init__(config or BaseEnvConfig(), num_envs=num_envs, **kwargs)
        self.single_action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.pos = np.zeros((num_envs, 2))

    def reset(self, *, seed: Any = None, options: dict[str, Any] | None = None) -> tuple[Observation, dict]:
        self.seed_rngs(seed)
        mask = self.reset_mask(options)
        self.pos[mask] = self.np_random.uniform(-1, 1, (int(mask.sum()), 2))
        return Observation(states={"pos": self.pos.copy()}, text="go"), {}

    def step(self, actions: np.ndarray) -> tuple:
        self.pos += 0.1 * actions
        n = self.num_envs
        return (Observation(states={"pos": self.pos.copy()}, text="go"), np.zeros(n, np.float32), np.zeros(n, bool),
                np.zeros(n, bool), {})


class _RunningMeanStates(gym.vector.VectorObservationWrapper):
    """Like Gymnasium's NormalizeObservation: its running statistics are shaped by the space when it is made."""

    def __init__(self, env: gym.vector.VectorEnv) -> None:
        super().__init__(env)
        self.stats = {k: gym.wrappers.utils.RunningMeanStd(shape=space.shape)
                      for k, space in env.single_observation_space["states"].items()}

    def observations(self, observations: Observation) -> Observation:
        states = {}
        for k, v in observations.states.items():
            self.stats[k].update(v)
            states[k] = (v - self.stats[k].mean) / np.sqrt(self.stats[k].var + 1e-8)
        return Observation(images=observations.images, states=states, text=observations.text)


def test_make_vec_env_without_a_declared_space_has_one_after_its_first_reset(registry: None) -> None:
    from plugrl_env_client.envs.registry import register_env

    register_env("Undeclared-v1", max_episode_steps=20)(_Undeclared)
    env = gym.make_vec("Undeclared-v1", num_envs=4)
    with pytest.raises(AttributeError, match="declare it in __init__"):
        _ = env.single_observation_space  # nothing to derive it from yet
    env.reset(seed=0)
    assert env.single_observation_space["states"]["pos"] == gym.spaces.Box(-np.inf, np.inf, (2,), np.float64)
    assert env.observation_space["states"]["pos"].shape == (4, 2)
    wrapped = _RunningMeanStates(env)  # built after the reset: the space is there
    assert wrapped.stats["pos"].mean.shape == (2,)
    obs, _ = wrapped.reset(seed=1)
    for _ in range(3):
        obs, *_ = wrapped.step(np.ones((4, 2), np.float32))
    assert obs.states["pos"].shape == (4, 2) and np.isfinite(obs.states["pos"]).all()
    assert wrapped.stats["pos"].count > 4


def test_the_first_reset_derives_the_space_on_every_path_and_keeps_a_declared_one() -> None:
    from plugrl_env_client.envs.base_env import observation_space

    direct = _Undeclared(num_envs=2)
    direct.reset(seed=0)
    assert list(direct.single_observation_space["states"]) == ["pos"]
    declared = _Undeclared(num_envs=2)
    mine = observation_space(states={"pos": gym.spaces.Box(-1.0, 1.0, (2,), np.float64)})
    declared.single_observation_space = mine
    declared.reset(seed=0)
    assert declared.single_observation_space is mine

    class Extended(_Undeclared):  # a subclass whose reset adds to what its parent's returned
        def reset(self, *, seed: Any = None, options: dict[str, Any] | None = None) -> tuple[Observation, dict]:
            obs, info = super().reset(seed=seed, options=options)
            return Observation(states={**obs.states, "speed": np.zeros((self.num_envs, 1), np.float32)}), info

    extended = Extended(num_envs=2)
    extended.reset(seed=0)
    assert set(extended.single_observation_space["states"]) == {"pos", "speed"}, "the outermost reset's obs"
    assert extended.single_observation_space["states"]["speed"].dtype == np.float32

    class Broken(_Undeclared):
        def reset(self, *, seed: Any = None, options: dict[str, Any] | None = None) -> Any:
            return super().reset(seed=seed, options=options)[0]  # no info: the contract checks say so, not this

    broken = Broken(num_envs=2)
    assert isinstance(broken.reset(seed=0), Observation)
    assert "_single_observation_space" not in vars(broken)


def test_select_of_one_ascending_run_is_a_view() -> None:
    """Packing rows 1..3 of a camera batch must not copy tens of MB first: a run of rows is a view."""
    obs = _obs(5, ["t0", "t1", "t2", "t3", "t4"])
    for rows in ([1, 2, 3], np.array([False, True, True, True, False]), slice(1, 4)):
        sub = obs.select(rows)
        np.testing.assert_array_equal(sub.images["cam"], obs.images["cam"][1:4])
        assert np.shares_memory(sub.images["cam"], obs.images["cam"])
        assert list(sub.text) == ["t1", "t2", "t3"]
    for scattered in ([1, 3], [1, 2, 4], [3, 2, 1], [1, 1, 2]):  # a gap, a late gap, descending, a repeat
        sub = obs.select(scattered)
        np.testing.assert_array_equal(sub.images["cam"], obs.images["cam"][scattered])
        assert not np.shares_memory(sub.images["cam"], obs.images["cam"])
    with pytest.raises(IndexError):
        obs.select([4, 5])  # past the batch: an error, as with any other selection


def test_observation_space_takes_an_example_arrays_shape_and_dtype() -> None:
    import gymnasium as gym

    from plugrl_env_client.envs.base_env import observation_space

    space = observation_space(states={"pos": np.zeros(2, np.float32), "n": np.zeros((3, 1), np.int16), "s": (4,)})
    states = space["states"]
    assert states["pos"] == gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
    assert states["n"].dtype == np.int16 and states["n"].shape == (3, 1) and states["n"].high.max() == 32767
    assert states["s"].dtype == np.float64, "a bare shape still declares float64"
