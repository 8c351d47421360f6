"""The launchers' table: ``--launcher`` offers its names, a run asks it for its launcher, Ray's modules load late."""

from __future__ import annotations

import subprocess
import sys
import typing

import pytest

from plugrl_env_client.app import run_client
from plugrl_env_client.config import ClientConfig
from plugrl_env_client.envs import discover_envs
from plugrl_env_client.errors import ConfigError
from plugrl_env_client.launch.launchers import LAUNCHERS, make_launcher
from plugrl_env_client.launch.local import LocalLauncher


def test_the_launcher_flag_offers_exactly_the_tables_names():
    choices = typing.get_args(typing.get_type_hints(ClientConfig)["launcher"])
    assert choices == tuple(LAUNCHERS) == ("local", "ray")
    assert ClientConfig().launcher in LAUNCHERS


def test_the_local_launcher_runs_a_lone_process_here():
    launcher = make_launcher("local", ClientConfig())
    assert isinstance(launcher, LocalLauncher) and launcher.in_process


def test_an_unknown_launcher_is_one_error_before_any_run_folder(tmp_path):
    with pytest.raises(ConfigError, match=r"^--launcher 'slurm' is not a launcher; use one of: local, ray$"):
        make_launcher("slurm", ClientConfig())
    discover_envs()
    config = ClientConfig(output_dir=tmp_path, exp_name="run", progress=False, launcher="slurm")
    with pytest.raises(ConfigError, match="--launcher 'slurm'"):
        run_client(config, "Point-v1")
    assert list(tmp_path.iterdir()) == []


def test_the_ray_launchers_modules_load_only_when_a_run_picks_it():
    code = (
        "import sys\n"
        "from plugrl_env_client.config import ClientConfig\n"
        "from plugrl_env_client.launch.launchers import make_launcher\n"
        "make_launcher('local', ClientConfig())\n"
        "print('plugrl_env_client.launch.ray.launcher' in sys.modules, 'ray' in sys.modules)\n"
        "launcher = make_launcher('ray', ClientConfig())\n"
        "print(type(launcher).__name__, launcher.in_process, 'ray' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["False False", "RayLauncher False False"]
