"""The env registry: register_env / register_env_config, lookups, gymnasium integration, discovery."""

from __future__ import annotations

import dataclasses
import re
import warnings
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from plugrl_env_client.envs.base_env import BaseEnv, BaseEnvConfig, Observation
from plugrl_env_client.envs.point.point_env import PointEnv, PointEnvConfig
from plugrl_env_client.envs.registry import (
    get_spec,
    make_env,
    register_env,
    register_env_config,
    registered_ids,
)
from plugrl_env_client.errors import ConfigError


@pytest.fixture(autouse=True)
def _restore_registry(registry: None) -> None:
    """Every test here may register envs; the shared ``registry`` fixture undoes it."""


def _env_class(name: str = "Tmp", module: str | None = None, marker: str = "") -> type[BaseEnv]:
    """A tiny valid env class (one float state), optionally pretending to live in ``module``."""

    def __init__(self, config: Any = None, num_envs: int = 1, **kwargs: Any) -> None:
        ctor = {k: kwargs.pop(k) for k in list(kwargs) if k not in ("process_id", "total_processes")}
        BaseEnv.__init__(self, config, num_envs=num_envs, **kwargs)
        self.ctor_kwargs = ctor
        self.single_action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Observation, dict]:
        return Observation(states={"x": np.zeros((self.num_envs, 1))}), {}

    cls = type(name, (BaseEnv,), {"__init__": __init__, "reset": reset, "marker": marker})
    if module is not None:
        cls.__module__ = module
    return cls


def _config_class(name: str = "TmpConfig", module: str | None = None) -> type[BaseEnvConfig]:
    cls = dataclasses.make_dataclass(name, [("level", int, dataclasses.field(default=1))], bases=(BaseEnvConfig,))
    if module is not None:
        cls.__module__ = module
    return cls


# ---------------------------------------------------------------------------------------------- register_env


def test_register_non_base_env_class_errors() -> None:
    class NotAnEnv:
        pass

    with pytest.raises(ConfigError, match="not a subclass of BaseEnv"):
        register_env("NotAnEnv-v1")(NotAnEnv)
    with pytest.raises(ConfigError):
        register_env("NotAnEnv-v1")(gym.vector.SyncVectorEnv)
    assert "NotAnEnv-v1" not in registered_ids()


def test_register_non_json_kwargs_tells_to_pass_a_string_key() -> None:
    with pytest.raises(RuntimeError, match="JSON-serializable.*string key"):
        register_env("BadKwargs-v1", model=object())
    with pytest.raises(RuntimeError, match="string key"):
        register_env("BadKwargs-v1", table={1: np.zeros(2)})
    assert "BadKwargs-v1" not in registered_ids()


def test_kwargs_reach_the_constructor() -> None:
    cls = register_env("Kw-v1", scene="kitchen", sizes=[1, 2])(_env_class())
    env = make_env("Kw-v1", num_envs=2)
    assert isinstance(env, cls)
    assert env.ctor_kwargs == {"scene": "kitchen", "sizes": [1, 2]}
    assert get_spec("Kw-v1").kwargs == {"scene": "kitchen", "sizes": [1, 2]}
    # make_env kwargs override the registered ones
    assert make_env("Kw-v1", scene="garage").ctor_kwargs == {"scene": "garage", "sizes": [1, 2]}


def test_spec_fields_and_default_config() -> None:
    cls = register_env("Spec-v1", max_episode_steps=9, best_reward_threshold_for_success=0.5)(_env_class())
    spec = get_spec("Spec-v1")
    assert (spec.uid, spec.env_cls, spec.module) == ("Spec-v1", cls, cls.__module__)
    assert spec.max_episode_steps == 9 and spec.best_reward_threshold_for_success == 0.5
    assert spec.config_cls is BaseEnvConfig  # no config registered
    assert type(make_env("Spec-v1").config) is BaseEnvConfig
    cfg_cls = register_env_config("Spec-v1")(_config_class())
    assert get_spec("Spec-v1").config_cls is cfg_cls
    assert make_env("Spec-v1").config == cfg_cls()
    assert "Spec-v1" in registered_ids() and registered_ids() == sorted(registered_ids())


def test_process_ids_passed_only_when_given() -> None:
    register_env("Ids-v1")(_env_class())
    env = make_env("Ids-v1", num_envs=1)
    assert env.process_id is None and env.total_processes is None
    env = make_env("Ids-v1", num_envs=1, process_id=2, total_processes=3)
    assert (env.process_id, env.total_processes) == (2, 3)


# ---------------------------------------------------------------------------------------------- configs


def test_config_field_without_default_names_the_field() -> None:
    @dataclasses.dataclass
    class NeedsArgs(BaseEnvConfig):
        robot_name: str
        scene_id: int
        fine: int = 1
        scene_path: str = dataclasses.field(default_factory=str)

    with pytest.raises(ConfigError, match="NeedsArgs cannot be built without arguments") as err:
        register_env_config("NeedsArgs-v1")(NeedsArgs)
    assert str(err.value).endswith("give these fields a default: robot_name, scene_id")
    register_env("NeedsArgs-v1")(_env_class())
    assert get_spec("NeedsArgs-v1").config_cls is BaseEnvConfig, "the refused config was not registered"


def test_config_must_be_a_dataclass() -> None:
    class NotDc:
        x: int = 1

    with pytest.raises(ConfigError, match="dataclass"):
        register_env_config("NotDc-v1")(NotDc)


# ---------------------------------------------------------------------------------------------- clashes


def test_duplicate_uid_from_another_module_errors() -> None:
    first = register_env("Dup-v1")(_env_class("First", module="pkg_a.envs"))
    with pytest.raises(ConfigError, match=r"'Dup-v1' is already registered by pkg_a\.envs, and pkg_b\.envs registers "
                       r"it too; the first one stays.*override=True"):
        register_env("Dup-v1")(_env_class("Second", module="pkg_b.envs"))
    assert get_spec("Dup-v1").env_cls is first
    register_env_config("Dup-v1")(_config_class(module="pkg_a.envs"))
    with pytest.raises(ConfigError, match="already registered by pkg_a.envs"):
        register_env_config("Dup-v1")(_config_class(module="pkg_b.envs"))


def test_duplicate_uid_of_a_builtin_errors() -> None:
    with pytest.raises(ConfigError, match="plugrl_env_client.envs.point.point_env"):
        register_env("Point-v1")(_env_class(module="someone.else"))
    assert get_spec("Point-v1").env_cls is PointEnv


def test_same_module_reregistration_replaces() -> None:
    register_env("Same-v1")(_env_class("A", module="pkg.m"))
    second = register_env("Same-v1")(_env_class("B", module="pkg.m"))
    assert get_spec("Same-v1").env_cls is second


def test_override_true_replaces() -> None:
    register_env("Ovr-v1")(_env_class("First", module="pkg_a.envs"))
    second = register_env("Ovr-v1", override=True, max_episode_steps=3)(_env_class("Second", module="pkg_b.envs"))
    spec = get_spec("Ovr-v1")
    assert spec.env_cls is second and spec.module == "pkg_b.envs" and spec.max_episode_steps == 3
    assert isinstance(make_env("Ovr-v1"), second)
    assert isinstance(gym.make_vec("Ovr-v1", num_envs=1).unwrapped, second)
    cfg = register_env_config("Ovr-v1", override=True)(_config_class(module="pkg_b.envs"))
    assert get_spec("Ovr-v1").config_cls is cfg


def test_override_builtin() -> None:
    mine = register_env("Point-v1", override=True)(_env_class(module="my.project"))
    assert isinstance(make_env("Point-v1"), mine)


@pytest.mark.parametrize("main_module", ["__main__", "__mp_main__"])
def test_main_module_shadows_builtin_registered_first(main_module: str) -> None:
    """The built-in was imported first (discover_envs in the fixture); the run file's class still wins, with one
    warning in the run's own process (spawned children, ``__mp_main__``, stay quiet)."""
    cfg_cls = _config_class("MyPointConfig", module=main_module)
    mine = _env_class("MyPoint", module=main_module)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        register_env_config("Point-v1")(cfg_cls)
        register_env("Point-v1")(mine)
    messages = [str(w.message) for w in caught]
    if main_module == "__main__":
        assert len(messages) == 1
        assert re.fullmatch(r"env 'Point-v1' defined here shadows the built-in one in .*point_env", messages[0])
    else:
        assert messages == []
    assert get_spec("Point-v1").env_cls is mine
    assert get_spec("Point-v1").config_cls is cfg_cls
    env = make_env("Point-v1")
    assert isinstance(env, mine) and isinstance(env.config, cfg_cls)


@pytest.mark.parametrize("main_module", ["__main__", "__mp_main__"])
def test_main_module_shadows_builtin_registered_later(main_module: str) -> None:
    """The run file registers first, a library module registers the same id afterwards: the run file still wins."""
    mine = register_env("Order-v1")(_env_class("Mine", module=main_module))
    mine_cfg = register_env_config("Order-v1")(_config_class("MineCfg", module=main_module))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        register_env("Order-v1", max_episode_steps=5)(_env_class("Builtin", module="lib.builtin"))
        register_env_config("Order-v1")(_config_class("BuiltinCfg", module="lib.builtin"))
    expected = ["env 'Order-v1' defined here shadows the built-in one in lib.builtin"] if main_module == "__main__" else []
    assert [str(w.message) for w in caught] == expected
    spec = get_spec("Order-v1")
    assert spec.env_cls is mine and spec.config_cls is mine_cfg and spec.max_episode_steps is None
    assert isinstance(gym.make_vec("Order-v1", num_envs=1).unwrapped, mine)


def test_main_module_reregistering_itself_does_not_warn() -> None:
    register_env("Self-v1")(_env_class(module="__main__"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = register_env("Self-v1")(_env_class(module="__main__"))
    assert get_spec("Self-v1").env_cls is again


# ---------------------------------------------------------------------------------------------- lookups


def test_unknown_id_suggests_close_matches() -> None:
    with pytest.raises(ConfigError, match=r"Unknown env id 'Piont-v1'\. Did you mean 'Point-v1'") as err:
        get_spec("Piont-v1")
    assert "Registered envs:" in str(err.value) and "Probe-v1" in str(err.value)
    with pytest.raises(ConfigError, match="Unknown env id") as err:
        make_env("zzzzzzzzzzzz")
    assert "Did you mean" not in str(err.value)


def test_lookup_is_case_insensitive() -> None:
    assert get_spec("point-v1") is get_spec("Point-v1")
    assert get_spec("PROBE-V1").uid == "Probe-v1"
    assert isinstance(make_env("dummy-v1", num_envs=1, config=None), get_spec("Dummy-v1").env_cls)


# ---------------------------------------------------------------------------------------------- gymnasium


def test_gymnasium_make_vec_builds_the_env_with_config() -> None:
    cfg = PointEnvConfig(step_size=0.25, goal_radius=0.05)
    env = gym.make_vec("Point-v1", num_envs=3, config=cfg)
    assert isinstance(env.unwrapped, PointEnv)
    assert env.num_envs == 3
    assert env.unwrapped.config is cfg
    assert env.action_space.shape == (3, 2)
    obs, _ = env.reset(seed=0)
    assert obs.states["pos"].shape == (3, 2)


def test_gymnasium_make_vec_default_config_and_registered_id() -> None:
    register_env("GymTmp-v1")(_env_class())
    cfg_cls = register_env_config("GymTmp-v1")(_config_class())
    assert "GymTmp-v1" in gym.registry
    env = gym.make_vec("GymTmp-v1", num_envs=2)
    assert env.num_envs == 2 and env.unwrapped.config == cfg_cls()


def test_gymnasium_make_vec_applies_the_registered_time_limit() -> None:
    """Point-v1 is registered with max_episode_steps=100: plain gymnasium code gets truncated at step 100."""
    env = gym.make_vec("Point-v1", num_envs=2, config=PointEnvConfig(step_size=0.0))  # never reaches the goal
    env.reset(seed=0)
    for step in range(1, 101):
        _, _, terminated, truncated, _ = env.step(np.zeros((2, 2), np.float32))
        assert not terminated.any()
        assert truncated.all() == (step == 100), step
    env.reset(options={"reset_mask": np.array([True, False])})
    _, _, _, truncated, _ = env.step(np.zeros((2, 2), np.float32))
    assert truncated.tolist() == [False, True], "the count restarts only for the env that was reset"
    unlimited = gym.make_vec("Point-v1", num_envs=1, max_episode_steps=-1)
    assert isinstance(unlimited, PointEnv)


def test_fixture_restores_registries() -> None:
    # the autouse fixture must undo what earlier tests registered
    for uid in ("Kw-v1", "Dup-v1", "Ovr-v1", "Order-v1", "GymTmp-v1"):
        assert uid not in registered_ids() and uid not in gym.registry
    assert get_spec("Point-v1").env_cls is PointEnv
    assert get_spec("Point-v1").config_cls is PointEnvConfig


# ---------------------------------------------------------------------------------------------- discovery


def test_make_vec_with_module_prefix_needs_no_discovery() -> None:
    """gymnasium's ``module:EnvId`` form imports the env's module first, so plain gymnasium code can build it."""
    env = gym.make_vec("plugrl_env_client.envs.probe.probe_env:Probe-v1", num_envs=3)
    obs, _ = env.reset(seed=1)
    assert env.num_envs == 3 and obs.states["t"].shape == (3, 1)
