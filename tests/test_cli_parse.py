"""``plugrl-run-env-client`` command-line parsing, and running an env file directly."""

from __future__ import annotations

import dataclasses
import json
import pickle
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from plugrl_env_client import cli, env_commands
from plugrl_env_client.config import ClientConfig, RunnerConfig
from plugrl_env_client.envs.base_env import BaseEnv, BaseEnvConfig, Observation
from plugrl_env_client.envs.dummy.dummy_env import DummyEnvConfig
from plugrl_env_client.envs.point.point_env import PointEnvConfig
from plugrl_env_client.envs.probe.probe_env import ProbeEnvConfig
from plugrl_env_client.errors import ConfigError
from plugrl_env_client.utils import registration

# ---------------------------------------------------------------------------------------------- parse()


@pytest.mark.parametrize(
    "sub,uid,cfg_cls",
    [("point-v1", "Point-v1", PointEnvConfig), ("dummy-v1", "Dummy-v1", DummyEnvConfig),
     ("probe-v1", "Probe-v1", ProbeEnvConfig)],
)
def test_each_builtin_subcommand_parses_with_defaults(sub: str, uid: str, cfg_cls: type) -> None:
    env_id, config, _line = cli.parse([sub])
    assert env_id == uid
    assert type(config) is ClientConfig
    assert config.env == cfg_cls()
    assert type(config.env) is cfg_cls
    assert config.num_envs == 1 and config.num_procs == 1 and config.num_episodes is None
    assert config.runner == RunnerConfig()
    assert config.server_host == "127.0.0.1" and config.server_port == 8000
    assert config.output_dir == Path.cwd() / "runs", "relative to where the command started, made absolute"


def test_subcommands_are_lowercased_ids() -> None:
    subs = env_commands.build_subcommands(ClientConfig)
    assert {"point-v1", "dummy-v1", "probe-v1"} <= set(subs)
    assert all(name == name.lower() for name in subs)
    assert isinstance(subs["point-v1"]().env, PointEnvConfig)


def test_env_flags_map_to_config_fields() -> None:
    _, config, _line = cli.parse(["point-v1", "--env.step-size", "0.5", "--env.goal-radius", "0.02"])
    assert config.env == PointEnvConfig(step_size=0.5, goal_radius=0.02)
    _, config, _line = cli.parse(["probe-v1", "--env.action-dim", "5"])
    assert config.env == ProbeEnvConfig(action_dim=5)
    _, config, _line = cli.parse(["dummy-v1", "--env.base-image-size", "32", "--env.text", "open the door",
                           "--env.terminated-prob", "1.0"])
    assert config.env.base_image_size == 32
    assert config.env.text == "open the door"
    assert config.env.terminated_prob == 1.0
    assert config.env.wrist_image_size == DummyEnvConfig().wrist_image_size


def test_general_and_runner_flags() -> None:
    env_id, config, _line = cli.parse([
        "point-v1", "--num-envs", "8", "--num-procs", "2", "--num-episodes", "10", "--runner.seed", "42",
        "--runner.max-episode-steps", "50", "--runner.replan-steps", "3", "--runner.start-method", "fork",
        "--server-port", "9001", "--exp-name", "abc", "--local-policy", "random", "--no-progress",
    ])
    assert env_id == "Point-v1"
    assert (config.num_envs, config.num_procs, config.num_episodes) == (8, 2, 10)
    assert config.runner.seed == 42
    assert config.runner.max_episode_steps == 50 and config.runner.replan_steps == 3
    assert config.runner.start_method == "fork"
    assert config.server_port == 9001 and config.exp_name == "abc"
    assert config.local_policy == "random" and config.progress is False
    assert config.resolved_url() == "ws://127.0.0.1:9001"


def test_runner_seed_none() -> None:
    _, config, _line = cli.parse(["probe-v1", "--runner.seed", "None"])
    assert config.runner.seed is None


@pytest.mark.slow
@pytest.mark.parametrize("args", [["point-v1", "--env.no-such-flag", "1"], ["probe-v1", "--env.step-size", "1"],
                                  ["point-v1", "--num-envs", "many"], []])
def test_bad_command_lines_exit_non_zero(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.parse(args)
    assert exc.value.code not in (0, None)


def test_returned_config_is_plain_and_picklable() -> None:
    env_id, config, _line = cli.parse(["point-v1", "--env.step-size", "0.3", "--runner.seed", "5"])
    assert type(config) is ClientConfig
    restored = pickle.loads(pickle.dumps(config))
    assert restored == config
    assert restored.env == PointEnvConfig(step_size=0.3)
    assert restored.runner.seed == 5
    json.dumps(dataclasses.asdict(config), default=str)  # what client_config.json holds


def test_env_registered_after_import_gets_a_subcommand(registry: None) -> None:
    """The parser is built at call time, so an env registered after importing the CLI is still offered."""

    @registration.register_env_config("Late-v1")
    @dataclasses.dataclass
    class LateConfig(BaseEnvConfig):
        level: int = 1

    @registration.register_env("Late-v1")
    class LateEnv(BaseEnv):
        """A late env."""

        def __init__(self, config: LateConfig, num_envs: int = 1, **kwargs: object) -> None:
            super().__init__(config, num_envs=num_envs, **kwargs)
            self.single_action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

        def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Observation, dict]:
            return Observation(states={"x": np.zeros((self.num_envs, 1))}), {}

    env_id, config, _line = cli.parse(["late-v1", "--env.level", "3"])
    assert env_id == "Late-v1"
    assert config.env == LateConfig(level=3)


# ---------------------------------------------------------------------------------------------- env file run directly

USER_FILE = textwrap.dedent('''
    """A user env file, run directly."""
    import dataclasses

    import gymnasium as gym
    import numpy as np

    from plugrl_env_client import BaseEnv, BaseEnvConfig, Observation, register_env, register_env_config


    @register_env_config("Tmpfile-v1")
    @dataclasses.dataclass
    class TmpfileConfig(BaseEnvConfig):
        flavour: str = "plain"


    @register_env_config("Point-v1")
    @dataclasses.dataclass
    class MyPointConfig(BaseEnvConfig):
        marker_file: str = ""
        """Each env built appends a line here."""


    class _Env(BaseEnv):
        REWARD = 0.0

        def __init__(self, config, num_envs=1, **kwargs):
            super().__init__(config, num_envs=num_envs, **kwargs)
            self.single_action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
            if getattr(config, "marker_file", ""):
                with open(config.marker_file, "a") as f:
                    f.write(f"{type(self).__name__} {type(config).__name__}\\n")

        def _obs(self):
            return Observation(states={"x": np.zeros((self.num_envs, 1))}, text="user env")

        def reset(self, *, seed=None, options=None):
            self.seed_rngs(seed)
            return self._obs(), {}

        def step(self, actions):
            n = self.num_envs
            return (self._obs(), np.full(n, self.REWARD, np.float32), np.ones(n, bool), np.zeros(n, bool), {})


    @register_env("Tmpfile-v1")
    class TmpfileEnv(_Env):
        """The temporary file env."""
        REWARD = 1.0


    @register_env("Point-v1", max_episode_steps=7)
    class MyPointEnv(_Env):
        """My own Point-v1."""
        REWARD = 42.0


    if __name__ == "__main__":
        from plugrl_env_client.cli import main
        main()
''')


@pytest.fixture
def user_file(tmp_path: Path) -> Path:
    path = tmp_path / "my_env.py"
    path.write_text(USER_FILE)
    return path


def _run(path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(path), *args], capture_output=True, text=True, timeout=60,
                          cwd=path.parent)


SHADOW = "my_env.py:0: UserWarning: env 'Point-v1' defined here shadows the built-in one in plugrl_env_client.envs.point.point_env"


@pytest.mark.slow
def test_env_file_help_for_shadowed_builtin_and_new_env(user_file: Path) -> None:
    res = _run(user_file, "point-v1", "--help")
    assert res.returncode == 0, res.stderr
    assert "My own Point-v1." in res.stdout
    assert "--env.marker-file" in res.stdout
    assert "--env.step-size" not in res.stdout  # the built-in's config is shadowed as well
    assert SHADOW in res.stderr and res.stderr.count("shadows") == 1, res.stderr

    res = _run(user_file, "tmpfile-v1", "--help")
    assert res.returncode == 0, res.stderr
    assert "The temporary file env." in res.stdout
    assert "--env.flavour" in res.stdout


@pytest.mark.slow
def test_env_file_run_uses_the_users_class(user_file: Path, tmp_path: Path) -> None:
    marker = tmp_path / "built.txt"
    out = tmp_path / "runs"
    res = _run(user_file, "point-v1", "--num-episodes", "1", "--local-policy", "zero", "--output-dir", str(out),
               "--exp-name", "x", "--no-progress", "--env.marker-file", str(marker))
    assert res.returncode == 0, res.stdout + res.stderr
    assert SHADOW in res.stderr and res.stderr.count("shadows") == 1, res.stderr
    built = marker.read_text().splitlines()
    assert built and all(line == "MyPointEnv MyPointConfig" for line in built)
    summary = json.loads((out / "x" / "summary.json").read_text())
    assert summary["completed_episodes"] == 1
    assert summary["mean_return"] == 42.0  # the user's reward, not the built-in's
    client_config = json.loads((out / "x" / "client_config.json").read_text())
    assert client_config["env_id"] == "Point-v1"
    assert client_config["env"] == {"marker_file": str(marker), "max_episode_steps": 7}  # + PlugRL's time limit


@pytest.mark.slow
def test_env_file_run_with_spawned_processes(user_file: Path, tmp_path: Path) -> None:
    """Spawned children re-import the file as ``__mp_main__``; its envs must still shadow the built-ins there."""
    marker = tmp_path / "built.txt"
    out = tmp_path / "runs"
    res = _run(user_file, "point-v1", "--num-procs", "2", "--num-episodes", "2", "--local-policy", "zero",
               "--output-dir", str(out), "--exp-name", "mp", "--no-progress", "--env.marker-file", str(marker))
    assert res.returncode == 0, res.stdout + res.stderr
    built = marker.read_text().splitlines()
    assert len(built) >= 3  # the local policy's probe env + one per process
    assert all(line == "MyPointEnv MyPointConfig" for line in built)
    summary = json.loads((out / "mp" / "summary.json").read_text())
    assert summary["completed_episodes"] == 2 and summary["mean_return"] == 42.0
    assert summary["failed_processes"] == []


@pytest.mark.slow
def test_env_file_new_env_runs(user_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "runs"
    res = _run(user_file, "tmpfile-v1", "--num-episodes", "2", "--num-envs", "2", "--local-policy", "random",
               "--output-dir", str(out), "--exp-name", "t", "--no-progress", "--env.flavour", "spicy")
    assert res.returncode == 0, res.stdout + res.stderr
    summary = json.loads((out / "t" / "summary.json").read_text())
    assert summary["completed_episodes"] == 2 and summary["mean_return"] == 1.0
    assert json.loads((out / "t" / "client_config.json").read_text())["env"] == {"flavour": "spicy",
                                                                              "max_episode_steps": None}


def test_env_id_in_any_case_is_accepted():
    env_id, config, _line = cli.parse(["Point-v1", "--num-envs", "3"])
    assert env_id == "Point-v1" and config.num_envs == 3


def test_mistyped_env_id_on_the_command_line_suggests_close_ids(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["pont-v1", "--num-episodes", "1"])
    assert info.value.code == 1
    err = capsys.readouterr().err
    assert "Unknown env id 'pont-v1'" in err and "Did you mean 'Point-v1'" in err


def test_flags_before_the_env_id_say_where_the_id_goes(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["--num-envs", "2", "point-v1"])
    assert info.value.code == 1
    assert "the env id comes first" in capsys.readouterr().err


@pytest.mark.slow
def test_the_template_runs_directly_without_a_shadowing_warning(tmp_path: Path) -> None:
    """The env file users copy (docs/examples/template_env.py) is a command of its own; its id is its own, so it
    replaces no built-in. Built-in env files are not run directly: they have no ``__main__`` block."""
    template = Path(__file__).resolve().parents[1] / "docs" / "examples" / "template_env.py"
    res = subprocess.run([sys.executable, str(template), "template-v1", "--num-episodes", "1", "--local-policy",
                          "random", "--output-dir", str(tmp_path), "--exp-name", "p", "--no-progress"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "shadows" not in res.stderr
    assert json.loads((tmp_path / "p" / "summary.json").read_text())["completed_episodes"] == 1


@pytest.mark.slow
@pytest.mark.parametrize("value, expected", [("False", False), ("false", False), ("True", True), ("1", True)])
def test_bool_flags_take_a_value_as_well(value: str, expected: bool) -> None:
    _, config, _line = cli.parse(["point-v1", "--progress", value, "--reuse-feedback-obs", value])
    assert config.progress is expected and config.connection.reuse_feedback_obs is expected
    _, config, _line = cli.parse(["point-v1", "--no-progress"])
    assert config.progress is False


def test_bool_env_fields_take_a_value(registry: None) -> None:
    @registration.register_env_config("Flags-v1")
    @dataclasses.dataclass
    class FlagsConfig(BaseEnvConfig):
        shaped: bool = True

    @registration.register_env("Flags-v1")
    class FlagsEnv(BaseEnv[FlagsConfig]):
        pass

    for args, expected in ((["--env.shaped", "False"], False), (["--env.no-shaped"], False),
                           (["--env.shaped", "true"], True), ([], True)):
        _, config, _line = cli.parse(["flags-v1", *args])
        assert config.env.shaped is expected, args


def test_plugrl_dummy_flag_names_and_the_time_limit_alias() -> None:
    """The commands of PlugRL's README run unchanged: --env.img-width/--env.img-height/--env.state-dim, and
    --env.max-episode-steps for an env whose config has no such field."""
    from plugrl_env_client.utils.registration import make_env

    _, config, _line = cli.parse(["dummy-v1", "--env.img-width", "64", "--env.img-height", "48", "--env.state-dim",
                                  "6", "--env.max-episode-steps", "30"])
    assert config.runner.max_episode_steps == 30
    env = make_env("Dummy-v1", num_envs=2, config=config.env)
    obs, _ = env.reset(seed=0)
    assert obs.images["base"].shape == (2, 48, 64, 3) and obs.images["wrist"].shape == (2, 24, 32, 3)
    assert obs.states["robot_state"].shape == (2, 6) and obs.states["joint_angles"].shape == (2, 3)
    _, config, _line = cli.parse(["dummy-v1", "--env.max-episode-steps=12"])
    assert config.runner.max_episode_steps == 12


def test_time_limit_alias_hands_on_a_plain_runner_section() -> None:
    _, config, _line = cli.parse(["point-v1", "--env.max_episode_steps", "7"])
    assert type(config.runner) is RunnerConfig and config.runner == RunnerConfig(max_episode_steps=7)
    assert pickle.loads(pickle.dumps(config)) == config  # what crosses to spawned rollout processes


def test_an_env_config_with_max_episode_steps_keeps_its_own_flag(registry: None) -> None:
    @registration.register_env_config("Timed-v1")
    @dataclasses.dataclass
    class TimedConfig(BaseEnvConfig):
        max_episode_steps: int = 5

    @registration.register_env("Timed-v1")
    class TimedEnv(BaseEnv[TimedConfig]):
        pass

    _, config, _line = cli.parse(["timed-v1", "--env.max-episode-steps", "9", "--runner.max-episode-steps", "3"])
    assert config.env.max_episode_steps == 9 and config.runner.max_episode_steps == 3


# ---------------------------------------------------------------------------------------------- env ids and subcommands


def _register_sized(uid: str, default_size: int) -> None:
    """Register env ``uid`` whose config's default ``size`` tells which registration a parse picked."""

    @registration.register_env_config(uid)
    @dataclasses.dataclass
    class SizedConfig(BaseEnvConfig):
        size: int = default_size

    @registration.register_env(uid)
    class SizedEnv(BaseEnv[SizedConfig]):
        pass


@pytest.mark.slow
def test_every_subcommand_runs_its_own_env(registry: None) -> None:
    """Subcommands and env ids are paired by name: each subcommand gives back its id and that env's config."""
    for uid, size in (("Zeta-v1", 1), ("alpha-v1", 2), ("Mixed_Case-v2", 3), ("MIXED-v1", 4)):
        _register_sized(uid, size)
    ids = env_commands.subcommand_ids()
    assert ids["zeta-v1"] == "Zeta-v1" and ids["mixed_case-v2"] == "Mixed_Case-v2" and ids["mixed-v1"] == "MIXED-v1"
    for name, uid in ids.items():
        env_id, _config, _line = cli.parse([name])
        assert env_id == uid
    for typed, uid, size in (("zeta-v1", "Zeta-v1", 1), ("ALPHA-V1", "alpha-v1", 2), ("mixed-case-v2", "Mixed_Case-v2", 3),
                             ("Mixed_Case-v2", "Mixed_Case-v2", 3), ("mixed_v1", "MIXED-v1", 4)):
        env_id, config, _line = cli.parse([typed])
        assert (env_id, config.env.size) == (uid, size), typed


@pytest.mark.parametrize("first, second", [("Twin-v1", "twin-v1"), ("My_Env-v1", "my-env-v1"), ("a_b-v1", "A-B-v1")])
def test_ids_that_meet_in_one_subcommand_are_a_config_error(registry: None, first: str, second: str,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    _register_sized(first, 1)
    _register_sized(second, 2)
    with pytest.raises(ConfigError) as info:
        cli.parse(["point-v1"])
    message = str(info.value)
    assert repr(first) in message and repr(second) in message and "rename one" in message
    assert repr(second.lower()) in message, "the error names the subcommand they share"
    with pytest.raises(SystemExit) as exited:
        cli.main([second.lower(), "--num-episodes", "1"])
    assert exited.value.code == 1
    assert "rename one" in capsys.readouterr().err


# ------------------------------------------------------------------- the embedded policy's --policy.* flags

POLICY_FILE = '''
import dataclasses

import numpy as np

from plugrl_env_client.server import Policy, PolicySetup, register_policy


@dataclasses.dataclass
class LevelConfig:
    level: float = 0.5
    """Every component of every action."""


@register_policy("level", config=LevelConfig)
class LevelPolicy(Policy):
    def __init__(self, setup: PolicySetup, config: LevelConfig) -> None:
        super().__init__(setup)
        self.level = config.level
        if setup.run_dir is not None:  # what reached the embedded policy, for the test to read
            (setup.run_dir / "level.txt").write_text(repr(config.level))

    def act(self, obs, n):
        return np.full((self.horizon, n, *self.action_shape), self.level, self.dtype)
'''


@pytest.fixture
def level_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A policy file with an option of its own (``--policy.level``); what it registers is gone after the test."""
    from plugrl_env_client.envs.discovery import USER_MODULE_PREFIX
    from plugrl_env_client.server import registry

    monkeypatch.setattr(registry, "_POLICIES", dict(registry._POLICIES))
    path = tmp_path / "level_policy.py"
    path.write_text(POLICY_FILE)
    modules = set(sys.modules)
    yield path
    for name in set(sys.modules) - modules:
        if name.startswith(USER_MODULE_PREFIX + "."):
            del sys.modules[name]


def test_the_embedded_policy_takes_its_own_options_as_policy_flags(level_file: Path) -> None:
    _, config, _line = cli.parse(["point-v1", "--env-path", str(level_file), "--local-policy", "level",
                                  "--policy.level", "0.25"])
    assert type(config) is ClientConfig and config.local_policy_options == {"level": 0.25}
    pickle.loads(pickle.dumps(config))  # spawned processes get it: a plain config, no class built by the parser
    _, config, _line = cli.parse(["point-v1", "--env-path", str(level_file), "--local-policy", "level"])
    assert config.local_policy_options == {"level": 0.5}
    _, config, _line = cli.parse(["point-v1", "--local-policy", "text", "--policy.choices", "a", "b"])
    assert config.local_policy_options == {"choices": ("a", "b")}


@pytest.mark.parametrize("args, said", [
    (["--local-policy", "random", "--policy.level", "0.2"],
     "--policy.level is for --local-policy level; --local-policy random ignores it (pass --local-policy level to "
     "use it)"),
    (["--policy.level", "0.2"],
     "--policy.level is for --local-policy level; no --local-policy is given (pass --local-policy level to use it)"),
])
def test_an_option_of_another_policy_is_an_error_naming_the_policy_that_reads_it(level_file: Path, args: list[str],
                                                                                  said: str) -> None:
    with pytest.raises(ConfigError) as info:
        cli.parse(["point-v1", "--env-path", str(level_file), *args])
    assert str(info.value) == said


def test_the_client_help_lists_the_options_of_registered_policies(level_file: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.parse(["point-v1", "--env-path", str(level_file), "--help"])
    out = capsys.readouterr().out
    assert "--policy.level FLOAT" in out and "Every component of every action. (default: 0.5)" in out


@pytest.mark.slow
def test_a_run_hands_the_policy_flags_to_the_embedded_policy(level_file: Path, tmp_path: Path) -> None:
    res = subprocess.run([sys.executable, "-m", "plugrl_env_client", "point-v1", "--env-path", str(level_file),
                          "--local-policy", "level", "--policy.level", "0.2", "--num-episodes", "1", "--output-dir",
                          str(tmp_path / "runs"), "--exp-name", "level", "--no-progress"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    run = tmp_path / "runs" / "level"
    assert (run / "level.txt").read_text() == "0.2"
    assert json.loads((run / "client_config.json").read_text())["local_policy_options"] == {"level": 0.2}
    refused = subprocess.run([sys.executable, "-m", "plugrl_env_client", "point-v1", "--env-path", str(level_file),
                              "--local-policy", "level", "--policy.level", "high", "--num-episodes", "1",
                              "--output-dir", str(tmp_path / "runs"), "--no-progress"],
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "Error parsing --policy.level" in refused.stderr, refused.stderr
