"""Finding envs: built-ins, --env-path files and folders, $PLUGRL_ENV_PATH, the one-off file:Id form, installed
plugins (pip-installed into a folder of their own, never into the running venv), and env modules that fail to
import."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from importlib.metadata import PackageNotFoundError, distribution, entry_points
from pathlib import Path

import pytest

from plugrl_env_client import cli
from plugrl_env_client.envs import discovery
from plugrl_env_client.envs.discovery import (
    discover_envs,
    env_files,
    failed_sources_mentioning,
    unknown_id_help,
    user_module_name,
)
from plugrl_env_client.envs.registry import UnknownEnvError, get_spec, registered_ids
from plugrl_env_client.errors import ConfigError

ENV_TEMPLATE = '''
import dataclasses
import gymnasium as gym
import numpy as np
from plugrl_env_client.envs.base_env import BaseEnv, BaseEnvConfig, Observation
from plugrl_env_client.utils.registration import register_env, register_env_config


@register_env_config("{uid}")
@dataclasses.dataclass
class {name}Config(BaseEnvConfig):
    speed: float = 0.5


@register_env("{uid}", max_episode_steps=5)
class {name}Env(BaseEnv[{name}Config]):
    def __init__(self, config, num_envs=1, **kwargs):
        super().__init__(config, num_envs=num_envs, **kwargs)
        self.single_action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.x = np.zeros((num_envs, 1))

    def reset(self, *, seed=None, options=None):
        self.seed_rngs(seed)
        self.x[self.reset_mask(options)] = 0.0
        return Observation(states={{"x": self.x.copy()}}), {{}}

    def step(self, actions):
        self.x += self.config.speed * np.asarray(actions)
        n = self.num_envs
        return Observation(states={{"x": self.x.copy()}}), np.ones(n, np.float32), np.zeros(n, bool), np.zeros(n, bool), {{}}
'''


def write_env(folder: Path, filename: str, uid: str, name: str, extra: str = "") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / filename
    path.write_text(ENV_TEMPLATE.format(uid=uid, name=name) + extra)
    return path


def run_cli(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "plugrl_env_client", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=120, env={**os.environ, **(env or {})})


def test_builtins_are_found(registry: None) -> None:
    loaded = discover_envs()
    assert {"plugrl_env_client.envs.point.point_env", "plugrl_env_client.envs.probe.probe_env"} <= set(loaded)
    assert {"Point-v1", "Dummy-v1", "Probe-v1"} <= set(registered_ids())


def test_env_path_file_and_folder_searched_recursively(registry: None, tmp_path: Path) -> None:
    one = write_env(tmp_path / "a", "one_env.py", "OneDisc-v1", "One")
    write_env(tmp_path / "b" / "deep", "two_env.py", "TwoDisc-v1", "Two")
    (tmp_path / "b" / "helpers.py").write_text("raise RuntimeError('not an env module: never imported')\n")
    assert env_files(tmp_path / "b") == [(tmp_path / "b" / "deep" / "two_env.py").resolve()]
    loaded = discover_envs([str(one), str(tmp_path / "b")])
    assert user_module_name(one.resolve()) in loaded
    assert get_spec("OneDisc-v1").config_cls.__name__ == "OneConfig"
    assert get_spec("twodisc-v1").uid == "TwoDisc-v1"


def test_env_path_variable(registry: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a = write_env(tmp_path, "var_a_env.py", "VarA-v1", "VarA")
    b = write_env(tmp_path / "more", "var_b_env.py", "VarB-v1", "VarB")
    monkeypatch.setenv("PLUGRL_ENV_PATH", os.pathsep.join([str(a), str(b.parent)]))
    discover_envs()
    assert {"VarA-v1", "VarB-v1"} <= set(registered_ids())


def test_missing_env_path_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"--env-path .*nowhere: no such file or folder"):
        discover_envs([str(tmp_path / "nowhere")])
    (tmp_path / "notes.txt").write_text("")
    with pytest.raises(ConfigError, match="not a Python file"):
        discover_envs([str(tmp_path / "notes.txt")])


def test_a_broken_module_is_skipped_with_one_line_and_named_for_its_id(
        registry: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    broken = write_env(tmp_path, "broken_env.py", "Broken-v1", "Broken", extra="\n1 / 0\n")
    good = write_env(tmp_path, "fine_env.py", "Fine-v1", "Fine")
    discover_envs([str(tmp_path)])
    discover_envs([str(tmp_path)])  # a second discovery says nothing new
    err = capsys.readouterr().err
    assert err.count("Skip loading env module") == 1
    assert f"Skip loading env module {broken.resolve()}: ZeroDivisionError: division by zero" in err
    assert "Fine-v1" in registered_ids() and good.exists()
    assert [why for _, why in failed_sources_mentioning("Broken-v1")] == ["ZeroDivisionError: division by zero"]
    assert "Broken-v1" not in registered_ids(), "nothing half-registered by a module that failed"
    message = unknown_id_help("Broken-v1")
    assert "broken_env.py" in message and "ZeroDivisionError" in message and "--env-path" in message


def test_unknown_id_lists_the_ways_to_add_envs() -> None:
    with pytest.raises(UnknownEnvError) as info:
        get_spec("NoSuchEnvAnywhere-v9")
    assert info.value.uid == "NoSuchEnvAnywhere-v9"
    with pytest.raises(ConfigError) as info:
        cli.parse(["nosuchenvanywhere-v9"])
    message = str(info.value)
    for way in ("Unknown env id", "--env-path", "PLUGRL_ENV_PATH", "plugrl_env_client.envs", "my_env.py:"):
        assert way in message, message


@pytest.mark.slow
def test_cli_runs_a_user_file_with_env_path_and_in_one_off_form(tmp_path: Path) -> None:
    write_env(tmp_path / "envs", "walk_env.py", "Walk-v1", "Walk")
    common = ["--num-episodes", "2", "--local-policy", "random", "--no-progress", "--output-dir", str(tmp_path)]
    res = run_cli("walk-v1", "--env-path", "envs", "--exp-name", "a", "--env.speed", "0.1", *common, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    config = json.loads((tmp_path / "a" / "client_config.json").read_text())
    assert config["env"]["speed"] == 0.1 and config["env_path"] == [str(tmp_path / "envs")]
    res = run_cli("envs/walk_env.py:Walk-v1", "--exp-name", "b", "--num-procs", "2", *common, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert json.loads((tmp_path / "b" / "summary.json").read_text())["completed_episodes"] == 2


@pytest.mark.slow
def test_env_path_with_several_processes(tmp_path: Path) -> None:
    """Spawned processes import the same files before they unpickle their job (its config class lives there)."""
    write_env(tmp_path / "envs", "stroll_env.py", "Stroll-v1", "Stroll")
    res = run_cli("stroll-v1", "--env-path", str(tmp_path / "envs"), "--num-procs", "2", "--num-episodes", "4",
                  "--local-policy", "zero", "--no-progress", "--output-dir", str(tmp_path), "--exp-name", "x",
                  cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    summary = json.loads((tmp_path / "x" / "summary.json").read_text())
    assert summary["completed_episodes"] == 4 and summary["failed_processes"] == []


@pytest.mark.slow
def test_one_off_module_form(tmp_path: Path) -> None:
    write_env(tmp_path / "mypkg", "hop_env.py", "Hop-v1", "Hop")
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    res = run_cli("mypkg.hop_env:Hop-v1", "--num-episodes", "1", "--local-policy", "random", "--no-progress",
                  "--output-dir", str(tmp_path), "--exp-name", "m", cwd=tmp_path,
                  env={"PYTHONPATH": str(tmp_path)})
    assert res.returncode == 0, res.stderr


@pytest.mark.slow
def test_the_cli_survives_a_broken_env_module(tmp_path: Path) -> None:
    write_env(tmp_path, "bad_env.py", "Bad-v1", "Bad", extra="\n1 / 0\n")
    res = run_cli("point-v1", "--env-path", str(tmp_path), "--num-episodes", "1", "--local-policy", "random",
                  "--no-progress", "--output-dir", str(tmp_path), "--exp-name", "p", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "Skip loading env module" in res.stderr and "ZeroDivisionError: division by zero" in res.stderr
    assert "Traceback" not in res.stderr


@pytest.mark.slow
def test_unknown_id_names_the_file_that_failed(tmp_path: Path) -> None:
    write_env(tmp_path, "crashy_env.py", "Crashy-v1", "Crashy", extra="\nraise RuntimeError('no simulator')\n")
    res = run_cli("crashy-v1", "--env-path", str(tmp_path), "--local-policy", "random", cwd=tmp_path)
    assert res.returncode == 1
    assert "crashy_env.py" in res.stderr and "RuntimeError: no simulator" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr


@pytest.mark.slow
@pytest.mark.parametrize("ending, said", [
    ("import sys\nsys.exit(0)\n", "it called sys.exit(0) while imported"),
    ("raise SystemExit(2)\n", "it called sys.exit(2) while imported"),
    ("raise KeyboardInterrupt\n", "it raised KeyboardInterrupt while imported"),
])
def test_an_env_file_that_ends_the_process_while_imported_is_an_error_naming_it(tmp_path: Path, ending: str,
                                                                                said: str) -> None:
    """A module that calls sys.exit (or raises its own KeyboardInterrupt) at import used to end the CLI there, with
    that exit code and nothing on stderr: now it is a module that failed to import, and its env id says so."""
    write_env(tmp_path, "quits_env.py", "Quits-v1", "Quits", extra="\n" + ending)
    res = run_cli("quits-v1", "--env-path", str(tmp_path), "--local-policy", "random", "--no-progress",
                  "--output-dir", str(tmp_path), cwd=tmp_path)
    assert res.returncode == 1, (res.returncode, res.stderr)
    assert f"Skip loading env module {(tmp_path / 'quits_env.py').resolve()}: {said}" in res.stderr, res.stderr
    assert "error: Unknown env id" in res.stderr and f"quits_env.py mentions 'quits-v1' but failed to import ({said})" \
        in res.stderr, res.stderr
    assert "Traceback" not in res.stderr


@pytest.mark.slow
def test_a_ctrl_c_while_env_files_are_imported_stops_the_command(tmp_path: Path) -> None:
    """Only the module's own KeyboardInterrupt skips it: a real SIGINT while the CLI imports env files (here one
    that waits in its import) ends the command as interrupted."""
    import signal

    from children import sigint_default
    from waiting import wait_until

    marker = tmp_path / "importing"
    write_env(tmp_path, "slow_env.py", "Slow-v1", "Slow",
              extra=f"\nimport pathlib, time\npathlib.Path({str(marker)!r}).touch()\ntime.sleep(60)\n")
    proc = subprocess.Popen(sigint_default([sys.executable, "-m", "plugrl_env_client", "slow-v1", "--env-path",
                                            str(tmp_path), "--local-policy", "random", "--output-dir", str(tmp_path)]),
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(marker.exists, 60, "the env file's import", proc=proc)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Skip loading" not in err, err


def test_a_file_run_directly_names_itself_in_help(tmp_path: Path) -> None:
    path = write_env(tmp_path, "jog_env.py", "Jog-v1", "Jog",
                     extra='\nif __name__ == "__main__":\n    from plugrl_env_client.cli import main\n    main()\n')
    res = subprocess.run([sys.executable, str(path), "jog-v1", "--help"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert "python jog_env.py jog-v1" in " ".join(res.stdout.split())


# --------------------------------------------------------------------------------------------------- plugins

PLUGIN_PYPROJECT = """
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "plugrl-lineplug-test"
version = "0.1.0"

[project.entry-points."plugrl_env_client.envs"]
line = "lineplug.line_env"

[tool.setuptools]
packages = ["lineplug"]
"""


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small plugin package pip-installed into a folder of its own (``pip install --target``), built once per
    module. Nothing lands in the running venv: a process sees the plugin only with this folder on ``PYTHONPATH``,
    where ``importlib.metadata`` finds its dist-info and entry point.

    The wheel is built in pip's usual isolated build environment: ``--no-build-isolation`` would need ``wheel``
    next to the venv's setuptools, and adding it would change the venv this fixture keeps untouched."""
    root = tmp_path_factory.mktemp("plugin")
    (root / "pyproject.toml").write_text(textwrap.dedent(PLUGIN_PYPROJECT))
    write_env(root / "lineplug", "line_env.py", "Line-v1", "Line")
    (root / "lineplug" / "__init__.py").write_text("")
    site = root.parent / f"{root.name}-site"
    res = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--disable-pip-version-check",
                          "--target", str(site), str(root)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert sorted(p.name for p in site.glob("*.dist-info")) == ["plugrl_lineplug_test-0.1.0.dist-info"]
    return site


def with_site(site: Path) -> dict[str, str]:
    """Environment variables that put ``site`` first on a child process's import path."""
    return {"PYTHONPATH": os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)}


@pytest.mark.slow
def test_the_plugin_stays_out_of_this_venv(plugin_site: Path) -> None:
    assert "line" not in {ep.name for ep in entry_points(group=discovery.ENTRY_POINT_GROUP)}
    with pytest.raises(PackageNotFoundError):
        distribution("plugrl-lineplug-test")


def test_discovery_reads_the_plugin_entry_point(plugin_site: Path, tmp_path: Path) -> None:
    code = ("import json; from plugrl_env_client.envs.discovery import discover_envs; "
            "from plugrl_env_client.envs.registry import get_spec; "
            "loaded = discover_envs(); spec = get_spec('line-v1'); "
            "print(json.dumps([loaded, spec.uid, spec.config_cls.__name__, spec.config_cls.__module__]))")
    res = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env={**os.environ, **with_site(plugin_site)})
    assert res.returncode == 0, res.stderr
    loaded, uid, config_name, config_module = json.loads(res.stdout.splitlines()[-1])
    assert "lineplug.line_env" in loaded
    assert (uid, config_name, config_module) == ("Line-v1", "LineConfig", "lineplug.line_env")
    assert "Skip loading env module" not in res.stderr


@pytest.mark.slow
def test_an_installed_plugin_registers_its_envs(plugin_site: Path, tmp_path: Path) -> None:
    res = run_cli("line-v1", "--num-episodes", "2", "--local-policy", "random", "--no-progress",
                  "--output-dir", str(tmp_path), "--exp-name", "plug", cwd=tmp_path, env=with_site(plugin_site))
    assert res.returncode == 0, res.stderr
    config = json.loads((tmp_path / "plug" / "client_config.json").read_text())
    assert config["env_id"] == "Line-v1"
    listing = run_cli("--help", cwd=tmp_path, env=with_site(plugin_site))
    assert "line-v1" in listing.stdout
    without = run_cli("--help", cwd=tmp_path)
    assert without.returncode == 0, without.stderr
    assert "line-v1" not in without.stdout, "the plugin is visible only through its own folder"


def test_plugin_entry_points_are_read_from_the_group(monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    class EntryPoint:
        def __init__(self, name: str, value: str) -> None:
            self.name, self.value = name, value

    monkeypatch.setattr(discovery, "_plugin_entry_points",
                        lambda: [EntryPoint("missing", "plugrl_no_such_plugin_module_xyz")])
    discover_envs()
    assert "Skip loading env module plugrl_no_such_plugin_module_xyz (plugin 'missing')" in capsys.readouterr().err


def test_two_files_of_a_folder_that_register_one_id_are_both_named_by_path(
        registry: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    first = write_env(tmp_path / "envs", "a_env.py", "Twice-v1", "First")
    second = write_env(tmp_path / "envs", "b_env.py", "Twice-v1", "Second")
    discover_envs([str(tmp_path / "envs")])
    err = capsys.readouterr().err
    assert err.count("Skip loading env module") == 1, err
    assert f"Skip loading env module {second.resolve()}: ConfigError: env config id 'Twice-v1'" in err
    assert (f"'Twice-v1' is already registered by {first.resolve()}, and {second.resolve()} registers it too; the "
            "first one stays") in err
    assert "plugrl_user_envs" not in err, "no made-up module name"
    assert get_spec("Twice-v1").env_cls.__name__ == "FirstEnv"


BROKEN_POLICY = '''"""A policy file with a mistake in it."""

from plugrl_env_client.server import Policy, register_policy

VALUE = undefined_name + 1


@register_policy("never")
class NeverPolicy(Policy):
    def act(self, obs, n):
        raise AssertionError
'''


def test_a_policy_file_that_fails_is_said_to_be_one_with_the_line_that_raised(
        registry: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    broken = tmp_path / "broken_policy.py"
    broken.write_text(BROKEN_POLICY)
    discover_envs([str(broken)])
    err = capsys.readouterr().err
    assert "Skip loading env module" not in err
    assert (f"Could not import policy file {broken.resolve()}:5: NameError: name 'undefined_name' is not defined (its "
            "policies are not registered; fix it and run again)") in err, err
    unparsable = tmp_path / "unparsable_policy.py"
    unparsable.write_text("from plugrl_env_client.server import register_policy\n\n\ndef f(:\n    pass\n")
    discover_envs([str(unparsable)])
    assert f"Could not import policy file {unparsable.resolve()}:4: SyntaxError: " in capsys.readouterr().err


def test_the_line_of_a_failure_is_the_file_s_own_line_that_called_what_raised(tmp_path: Path) -> None:
    helper = tmp_path / "helper_mod.py"
    helper.write_text("def boom():\n    raise ValueError('inside the helper')\n")
    user = tmp_path / "user_policy.py"
    user.write_text("import helper_mod\n\nhelper_mod.boom()\n")
    sys.path.insert(0, str(tmp_path))
    try:
        with pytest.raises(ValueError) as info:
            exec(compile(user.read_text(), str(user), "exec"), {})
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("helper_mod", None)
    assert discovery.failure_line(info.value, user) == 3
    assert discovery.failure_line(info.value, tmp_path / "elsewhere.py") is None


@pytest.mark.slow
def test_a_run_names_the_policy_file_that_failed_and_goes_on(tmp_path: Path) -> None:
    broken = tmp_path / "broken_policy.py"
    broken.write_text(BROKEN_POLICY)
    res = run_cli("point-v1", "--env-path", str(broken), "--num-episodes", "1", "--local-policy", "random",
                  "--no-progress", "--output-dir", str(tmp_path), "--exp-name", "p", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert f"Could not import policy file {broken.resolve()}:5: NameError: name 'undefined_name' is not defined" \
        in res.stderr, res.stderr
    assert "Skip loading env module" not in res.stderr and "Traceback" not in res.stderr
