"""Policies register in one table: the built-ins through it, a user's from a --policy-path file (with flags of its
own) or an --env-path file (for --local-policy), served to a real client."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from plugrl_env_client.envs.discovery import USER_MODULE_PREFIX
from plugrl_env_client.errors import ConfigError
from plugrl_env_client.server import Policy, PolicySetup, register_policy, registry
from plugrl_env_client.server.cli import main, parse
from plugrl_env_client.server.embedded import policy_for_space
from plugrl_env_client.server.policies import ArsConfig, ArsPolicy, RandomPolicy, TextConfig, TextPolicy, ZeroPolicy

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "docs" / "examples" / "constant_policy.py"
SERVER = [sys.executable, "-c", "from plugrl_env_client.server.cli import main; main()"]


@pytest.fixture
def table(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, registry.PolicySpec]]:
    """The registry as it is now; whatever a test registers (and the policy files it imports) is gone after it."""
    registry.registered_names()  # the built-ins, before the copy
    saved = dict(registry._POLICIES)
    monkeypatch.setattr(registry, "_POLICIES", saved)
    modules = set(sys.modules)
    yield saved
    for name in set(sys.modules) - modules:
        if name.startswith(USER_MODULE_PREFIX + "."):
            del sys.modules[name]


def test_the_built_ins_register_through_the_table():
    assert registry.registered_names()[:4] == ["random", "zero", "text", "ars"]
    specs = {name: registry.get_spec(name) for name in ("random", "zero", "text", "ars")}
    assert [s.policy_cls for s in specs.values()] == [RandomPolicy, ZeroPolicy, TextPolicy, ArsPolicy]
    assert (specs["text"].config, specs["ars"].config, specs["random"].config) == (TextConfig, ArsConfig, None)
    assert (specs["ars"].horizon, specs["random"].horizon) == (1, registry.DEFAULT_HORIZON)


def test_an_unknown_name_says_which_exist_and_how_to_add_one():
    with pytest.raises(ConfigError, match=r"unknown policy 'rndom'\. Did you mean 'random'\? Registered policies: "
                                          r"random, zero, text, ars.*--policy-path"):
        registry.get_spec("rndom")


@dataclasses.dataclass
class _Gain:
    gain: float = 2.0
    """How much."""


def test_registration_mistakes_are_clear_errors(table):
    with pytest.raises(ConfigError, match="not a subclass of Policy"):
        register_policy("plain")(dict)
    with pytest.raises(ConfigError, match="must be a @dataclasses.dataclass"):
        register_policy("x", config=int)

    @dataclasses.dataclass
    class NoDefault:
        gain: float

    with pytest.raises(ConfigError, match="give these fields a default: gain"):
        register_policy("x", config=NoDefault)

    @dataclasses.dataclass
    class Seeded:
        seed: int = 0

    with pytest.raises(ConfigError, match=r"fields named like flags every policy shares \(--policy.seed\)"):
        register_policy("x", config=Seeded)
    with pytest.raises(ConfigError, match="policy name 'random' is already registered by .*override=True"):
        register_policy("random")(type("Mine", (ZeroPolicy,), {}))
    with pytest.raises(ConfigError, match="a policy name is letters, digits"):
        register_policy("two words")
    assert registry.get_spec("random").policy_cls is RandomPolicy


def test_a_registered_policy_is_built_from_its_setup_and_config(table):
    @register_policy("gain", config=_Gain, horizon=2)
    class GainPolicy(Policy):
        """Answers low * gain."""

        def __init__(self, setup: PolicySetup, config: _Gain) -> None:
            super().__init__(setup)
            self.gain = config.gain

        def act(self, obs, n):
            return np.full((self.horizon, n, *self.action_shape), self.low * self.gain, self.dtype)

    policy = registry.make_policy(registry.config_of(name="gain", action_dim=3, low=-0.5, gain=3.0))
    assert isinstance(policy, GainPolicy) and policy.horizon == 2
    assert policy.act({}, 2).tolist() == [[[-1.5] * 3] * 2] * 2
    assert registry.make_policy(registry.config_of(name="gain", action_dim=1)).gain == 2.0  # the config's default
    with pytest.raises(ConfigError, match=r"--policy.gain is for --policy.name gain; --policy.name zero ignores it"):
        registry.config_of(name="zero", gain=3.0)


def test_policy_path_adds_a_name_and_its_own_flag(table):
    cfg = parse(["--policy-path", str(EXAMPLE), "--policy.name", "constant", "--policy.value", "0.25",
                 "--policy.action-dim", "2", "--policy.low", "0", "--policy.action-horizon", "3"])
    assert cfg.policy.name == "constant" and cfg.policy.options.value == 0.25
    assert cfg.policy_path == (str(EXAMPLE),)
    chunk = registry.make_policy(cfg.policy).act({}, 5)
    assert chunk.shape == (3, 5, 2) and chunk.dtype == np.float32 and (chunk == 0.25).all()
    clipped = registry.make_policy(parse(["--policy-path", str(EXAMPLE), "--policy.name", "constant",
                                          "--policy.value", "9", "--policy.action-dim", "1"]).policy)
    assert (clipped.act({}, 1) == 1.0).all()  # within --policy.high


def _ends_with_error(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as info:
        main(args)
    assert info.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err
    return err


def test_a_policy_flag_given_to_another_policy_is_refused(table, capsys):
    err = _ends_with_error(["--policy-path", str(EXAMPLE), "--policy.value", "0.3"], capsys)
    assert ("--policy.value is for --policy.name constant; --policy.name random ignores it (pass --policy.name "
            "constant to use it)") in err


def test_policy_path_mistakes_are_one_line_errors(table, tmp_path, capsys):
    err = _ends_with_error(["--policy-path", str(tmp_path / "nope.py")], capsys)
    assert f"--policy-path {tmp_path / 'nope.py'}: no such file" in err
    empty = tmp_path / "empty_policy.py"
    empty.write_text("X = 1\n")
    assert "registers no policy: decorate your Policy subclass with @register_policy('NAME')" in \
        _ends_with_error(["--policy-path", str(empty)], capsys)
    broken = tmp_path / "broken_policy.py"
    broken.write_text("import os\nimport no_such_module_here\n")
    assert (f"failed to import ({broken}:2: ModuleNotFoundError: No module named 'no_such_module_here'); "
            "fix it and run again") in _ends_with_error(["--policy-path", str(broken)], capsys)


def test_a_user_policy_answers_what_its_refuses_allows(table):
    registry.load_policy_files([str(EXAMPLE)])
    box = gym.spaces.Box(-1.0, 1.0, (3,), np.float64)
    chunk = policy_for_space("constant", box, horizon=2).act({}, 4)
    assert chunk.shape == (2, 4, 3) and chunk.dtype == np.float64 and (chunk == 0.5).all()
    with pytest.raises(ConfigError, match=r"--local-policy constant answers a Box action space only, but the env's "
                                          r"action space is .*Use --local-policy random or zero"):
        policy_for_space("constant", gym.spaces.Discrete(3), horizon=2)


def _recorded_actions(run: Path) -> np.ndarray:
    (episode,) = sorted(run.glob("rollout/proc_000/rollouts/*.npz"))
    with np.load(episode) as arrays:
        return arrays["actions"]


@pytest.mark.slow
def test_served_from_a_policy_path_file_to_a_real_client(tmp_path):
    server = subprocess.Popen([*SERVER, "--port", "0", "--policy-path", str(EXAMPLE), "--policy.name", "constant",
                               "--policy.action-dim", "2", "--policy.value", "0.25"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = server.stdout.readline()
        assert line.startswith("Policy server (constant, action_dim=2, horizon=4, websockets) listening on "), \
            (line, server.stderr.read() if server.poll() is not None else "")
        port = line.rsplit(":", 1)[1].strip()
        done = subprocess.run([sys.executable, "-m", "plugrl_env_client", "point-v1", "--server-port", port,
                               "--num-episodes", "1", "--output-dir", str(tmp_path), "--exp-name", "run",
                               "--no-progress", "--recorder.episode-freq", "1", "--recorder.record-full-rollout"],
                              capture_output=True, text=True, timeout=180)
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["completed_episodes"] == 1
    actions = _recorded_actions(tmp_path / "run")
    assert actions.shape[1:] == (2,) and (actions == np.float32(0.25)).all()


@pytest.mark.slow
def test_local_policy_takes_a_policy_registered_by_an_env_path_file(tmp_path):
    done = subprocess.run([sys.executable, "-m", "plugrl_env_client", "point-v1", "--env-path", str(EXAMPLE),
                           "--local-policy", "constant", "--num-episodes", "1", "--output-dir", str(tmp_path),
                           "--exp-name", "run", "--no-progress", "--recorder.episode-freq", "1",
                           "--recorder.record-full-rollout"], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    assert (_recorded_actions(tmp_path / "run") == np.float32(0.5)).all()  # the config's default value
    config = json.loads((tmp_path / "run" / "client_config.json").read_text())
    assert config["local_policy"] == "constant"


@pytest.mark.slow
def test_the_help_lists_a_user_policy_and_its_flag(tmp_path):
    source = textwrap.dedent('''
        import dataclasses
        from plugrl_env_client.server import Policy, register_policy

        @dataclasses.dataclass
        class ScaledConfig:
            scale: float = 1.0
            """How far the actions reach."""

        @register_policy("scaled", config=ScaledConfig)
        class Scaled(Policy):
            """Scaled zeros."""
            def __init__(self, setup, config):
                super().__init__(setup)

            def act(self, obs, n):
                raise NotImplementedError
    ''')
    path = tmp_path / "scaled_policy.py"
    path.write_text(source)
    done = subprocess.run([*SERVER, "--policy-path", str(path), "--help"], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 0, done.stderr
    assert "--policy.name {random,zero,text,ars,scaled}" in done.stdout
    assert "--policy.scale FLOAT" in done.stdout and "How far the actions reach." in done.stdout


def test_options_of_the_wrong_policy_and_unknown_options_are_refused(table):
    with pytest.raises(ValueError, match="the ars policy's options are a ArsConfig, got TextConfig"):
        registry.make_policy(registry.PolicyConfig(name="ars", action_dim=2, options=TextConfig()))
    with pytest.raises(ValueError, match="the zero policy has no options of its own"):
        registry.make_policy(registry.PolicyConfig(name="zero", options=ArsConfig()))
    with pytest.raises(ConfigError, match="no policy has the option bogus"):
        registry.config_of(name="zero", bogus=1)

    @dataclasses.dataclass
    class Directions:
        directions: str = "north"

    with pytest.raises(ConfigError, match=r"Directions.directions and the ars policy's ArsConfig.directions are both "
                                          r"--policy.directions but differ in type or default; rename one of them"):
        register_policy("compass", config=Directions)
