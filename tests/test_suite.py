"""plugrl-run-suite: suite files, the tasks' configs, and whole suites run, killed and resumed for real."""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from extras import need
from pip_sites import LIBERO, METAWORLD, installed, python_path_with
from waiting import wait_until

from plugrl_env_client.config import ClientConfig
from plugrl_env_client.envs import discover_envs
from plugrl_env_client.errors import ConfigError
from plugrl_env_client.suite.cli import parse
from plugrl_env_client.suite.runner import REFRESH_S, run_suite, split_env_flags, task_config
from plugrl_env_client.suite.spec import load_suite, parse_suite

discover_envs()

ROOT = Path(__file__).resolve().parents[1]
CONSTANT_POLICY = ROOT / "docs" / "examples" / "constant_policy.py"
TABLE_KEYS = ("name", "env", "episodes", "mean_return", "success_rate", "mean_length", "status")


def suite_of(tmp_path: Path, text: str, name: str = "s.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def run_module(args: list[str], cwd: Path, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run([sys.executable, "-m", "plugrl_env_client.suite", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600, **kwargs)


def table(root: Path) -> list[dict[str, Any]]:
    return [{k: t[k] for k in TABLE_KEYS} for t in json.loads((root / "suite.json").read_text())["tasks"]]


# ---------------------------------------------------------------------------------------------- suite files


def test_task_names_default_to_env_id_and_position_and_seeds_set_the_episodes(tmp_path: Path) -> None:
    suite = load_suite(suite_of(tmp_path, 'seeds = [4, 5, 6]\n[[task]]\nenv = "Point-v1"\n'
                                          '[[task]]\nname = "b"\nenv = "point-v1"\n', "mine.toml"))
    assert suite.name == "mine" and suite.seeds == (4, 5, 6)
    assert [(t.name, t.episodes) for t in suite.tasks] == [("point-v1-0", 3), ("b", 3)]
    assert load_suite(ROOT / "suites" / "demo.toml").tasks[2].local_policy == "text"


@pytest.mark.parametrize("text, message", [
    ('episodes = 2\n[[task]]\nenv = "point-v1"\nenvs = 3\n', r"task 'point-v1-0': unknown key\(s\) envs \(the keys"),
    ('episodes = 3\nseeds = [1, 2]\n[[task]]\nenv = "point-v1"\n', "episodes = 3 but seeds has 2"),
    ('seeds = [1, 2]\n[[task]]\nenv = "point-v1"\nepisodes = 4\n', "cannot be set per task when the suite has seeds"),
    ('episodes = 2\n[[task]]\nenv = "point-v1"\n[[task]]\nenv = "point-v1"\nname = "point-v1-0"\n',
     "point-v1-0 appear"),
    ('[[task]]\nenv = "point-v1"\n', "how many episodes"),
    ('episodes = 2\n', r"no \[\[task\]\] table"),
    ('episodes = 2\n[[task]]\nenv = "point-v1"\nlocal_policy = "smart"\n', "local_policy: unknown policy 'smart'"),
    ('episodes = 2\n[[task]]\nenv = "point-v1"\nname = "a/b"\n', "name must be a folder name"),
    ('episodes = 2\n[[task]]\nenv = "point-v1"\nserver_url = "http://x"\n', "server_url must be ws://"),
    ('episodes = [2\n', "not valid TOML"),
])
def test_a_bad_suite_file_is_one_clear_error(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_suite(suite_of(tmp_path, text))


def test_a_missing_suite_file_says_so(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"suite file .*nope.toml: cannot read it"):
        load_suite(tmp_path / "nope.toml")


@pytest.mark.parametrize("name, what", [
    ('"point\\n"', r"name must be a folder name, got 'point\\n'"),
    ('"point\\u00e9"', r"name must be a folder name, got 'point\u00e9'"),
    (f'"{"p" * 243}"', r"name is 243 bytes long, more than a folder name can hold \(a task run again goes to "
                       r"<name>-retry-<n>; a name is at most 255 bytes\) \(shorten it to 242 bytes or fewer\)"),
    ('"p-retry-3"', "name must not end in -retry-<n>"),
    ('"Suite.json"', "name 'Suite.json' is a file of the suite's folder"),
])
def test_a_task_name_is_a_whole_folder_name_with_room_for_its_retries(tmp_path: Path, name: str, what: str) -> None:
    """A name is matched whole (a newline at its end is no folder name), and fits a folder name with the
    -retry-<n> the runner may append: refused when the file is read, before the first task runs."""
    path = suite_of(tmp_path, f'episodes = 1\n[[task]]\nenv = "point-v1"\n[[task]]\nname = {name}\nenv = "point-v1"\n')
    with pytest.raises(ConfigError, match=rf"^suite file {path}: task .*: {what}"):
        load_suite(path)
    longest = load_suite(suite_of(tmp_path, f'episodes = 1\n[[task]]\nname = "{"p" * 242}"\nenv = "point-v1"\n'))
    assert len(longest.tasks[0].name) == 242


def test_a_suite_name_too_long_for_its_folder_and_names_one_case_apart_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"name is 231 bytes long, .*\(shorten it to 230 bytes or fewer\)"):
        load_suite(suite_of(tmp_path, f'name = "{"s" * 231}"\nepisodes = 1\n[[task]]\nenv = "point-v1"\n'))
    with pytest.raises(ConfigError, match=r"task names 'Reach' and 'reach' differ only in case.*\(rename one of them\)"):
        load_suite(suite_of(tmp_path, 'episodes = 1\n[[task]]\nname = "Reach"\nenv = "point-v1"\n'
                                      '[[task]]\nname = "reach"\nenv = "point-v1"\n'))
    with pytest.raises(ConfigError, match=r"--exp-name is 256 bytes long; a folder name is at most 255"):
        run_suite(load_suite(suite_of(tmp_path, 'episodes = 1\n[[task]]\nenv = "point-v1"\n')), tmp_path / "s.toml",
                  ClientConfig(output_dir=tmp_path / "runs", exp_name="e" * 256), [], resume=False)
    assert not (tmp_path / "runs").exists()


BAD_TASKS = [
    ('env = "pointt-v1"', r"Unknown env id 'pointt-v1'\. Did you mean 'Point-v1'.*Registered envs: [^(]*Point-v1[^(]*",
     r"name a registered env\. Envs outside this package are found through --env-path path/to/my_env\.py.*"),
    ('env = "point-v1"\nenv_config = { speed = 1 }', "env point-v1 has no config field 'speed'",
     "its fields are goal_radius, step_size"),
    ('env = "point-v1"\nenv_config = { step_size = "far" }', "env_config step_size = 'far' is not a float",
     r"give step_size a value of that type; plugrl-run-env-client point-v1 --help describes the field"),
    ('env = "guessnumber-v1"\nenv_config = { high = 2.5 }', "env_config high = 2.5 is not an int", ".*"),
    ('env = "point-v1"\nlocal_policy = "rndom"', r"local_policy: unknown policy 'rndom'\. Did you mean 'random'\? "
     r"Registered policies: random, zero, text, ars", r"name a registered policy; .*--env-path"),
    ('env = "point-v1"\nepisodes = 0', "episodes must be an integer >= 1, got 0", "e.g. episodes = 8"),
]


@pytest.mark.parametrize("body, what, fix", BAD_TASKS, ids=[b.split("\n")[-1] for b, _, _ in BAD_TASKS])
def test_every_mistake_in_a_task_names_the_file_the_task_and_the_fix(tmp_path: Path, body: str, what: str,
                                                                     fix: str) -> None:
    """Whether the file's reader or the task's config finds it, the one error reads
    ``<suite file>: task <name>: <what> (<fix>)``, and nothing is written."""
    path = suite_of(tmp_path, f'episodes = 1\n[[task]]\nname = "bad"\n{body}\n[[task]]\nenv = "point-v1"\n')
    base = ClientConfig(local_policy="zero", output_dir=tmp_path / "runs", progress=False)
    with pytest.raises(ConfigError) as info:
        run_suite(load_suite(path), path, base, [], resume=False)
    assert re.fullmatch(rf"suite file {re.escape(str(path))}: task 'bad': {what} \({fix}\)", str(info.value),
                        re.DOTALL), str(info.value)
    assert not (tmp_path / "runs").exists()


def test_a_check_of_the_client_run_is_made_for_every_task_before_the_first_runs(tmp_path: Path) -> None:
    path = suite_of(tmp_path, 'episodes = 1\n[[task]]\nenv = "point-v1"\n'
                              '[[task]]\nname = "nowhere"\nenv = "point-v1"\nserver_url = "ws://127.0.0.1:0"\n')
    base = ClientConfig(output_dir=tmp_path / "runs", progress=False, server_url="ws://127.0.0.1:9")
    with pytest.raises(ConfigError, match=rf"^suite file {re.escape(str(path))}: task 'nowhere': --server-url "
                                          r"ws://127\.0\.0\.1:0: the server's port must be from 1 to 65535"):
        run_suite(load_suite(path), path, base, [], resume=False)
    assert not (tmp_path / "runs").exists()


def test_thousands_of_tasks_are_checked_at_once_and_a_bad_last_one_is_named(tmp_path: Path) -> None:
    """2,000 tasks of three envs with --env.* flags, the last one's env_config wrong: the error names it, and
    nothing is written (each env's flags are parsed once, not once per task)."""
    envs = [("point-v1", "{ step_size = 0.2 }"), ("guessnumber-v1", "{ high = 9 }"), ("dummy-v1", "{}")]
    tasks = "".join(f'[[task]]\nname = "t{i}"\nenv = "{envs[i % 3][0]}"\nenv_config = {envs[i % 3][1]}\n'
                    for i in range(1999))
    path = suite_of(tmp_path, f'episodes = 2\n{tasks}[[task]]\nname = "last"\nenv = "point-v1"\n'
                              'env_config = { goal_radius = "near" }\n')
    suite = load_suite(path)
    _, flags = split_env_flags(["--env.max-episode-steps", "20", "--env.max-turns", "3"])
    base = ClientConfig(local_policy="random", output_dir=tmp_path / "runs", progress=False)
    with pytest.raises(ConfigError, match=rf"^suite file {re.escape(str(path))}: task 'last': env_config "
                                          r"goal_radius = 'near' is not a float \("):
        run_suite(suite, path, base, flags, resume=False)
    assert not (tmp_path / "runs").exists()


@pytest.fixture
def policies(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The policy registry as it is now; what a test's files register (and the files) are gone after it."""
    from plugrl_env_client.envs.discovery import USER_MODULE_PREFIX
    from plugrl_env_client.server import registry

    registry.registered_names()
    monkeypatch.setattr(registry, "_POLICIES", dict(registry._POLICIES))
    modules = set(sys.modules)
    yield
    for name in set(sys.modules) - modules:
        if name.startswith(USER_MODULE_PREFIX + "."):
            del sys.modules[name]


def test_a_task_names_any_registered_policy_and_an_unknown_one_lists_them(tmp_path: Path, policies: None) -> None:
    """The constant policy of docs/examples, registered by the --env-path file: a task may name it."""
    path = suite_of(tmp_path, 'episodes = 1\n[[task]]\nenv = "point-v1"\nlocal_policy = "constant"\n')
    _, base, flags = parse([str(path), "--env-path", str(CONSTANT_POLICY), "--local-policy", "random"])
    suite = load_suite(path)
    assert suite.tasks[0].local_policy == "constant"
    _, config = task_config(base, suite.tasks[0], flags, (), tmp_path, "t")
    assert config.local_policy == "constant"
    with pytest.raises(ConfigError, match=r"local_policy: unknown policy 'konstant'\. Did you mean 'constant'\? "
                                          r"Registered policies: random, zero, text, ars, constant \("):
        load_suite(suite_of(tmp_path, 'episodes = 1\n[[task]]\nenv = "point-v1"\nlocal_policy = "konstant"\n'))


@pytest.mark.slow
def test_a_suite_runs_a_task_with_the_policy_of_an_env_path_file(tmp_path: Path) -> None:
    path = suite_of(tmp_path, 'episodes = 1\n[[task]]\nname = "still"\nenv = "point-v1"\nlocal_policy = "constant"\n')
    done = run_module([str(path), "--env-path", str(CONSTANT_POLICY), "--local-policy", "random",
                       "--runner.max-episode-steps", "5", "--output-dir", str(tmp_path / "runs"), "--exp-name", "c",
                       "--no-progress"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "runs" / "c" / "still" / "client_config.json").read_text())["local_policy"] == \
        "constant"
    assert table(tmp_path / "runs" / "c")[0]["status"] == "finished"


# ---------------------------------------------------------------------------------------------- task configs


def test_env_flags_apply_where_the_task_env_has_the_field_and_the_file_wins(tmp_path: Path) -> None:
    suite = parse_suite({"episodes": 2, "task": [
        {"env": "point-v1"}, {"env": "point-v1", "name": "own", "env_config": {"step_size": 0.5}},
        {"env": "guessnumber-v1", "env_config": {"high": 9}}]}, tmp_path / "s.toml")
    rest, flags = split_env_flags(["--num-envs", "2", "--env.step-size", "0.3", "--env.max-turns=7"])
    assert rest == ["--num-envs", "2"] and [f.field for f in flags] == ["step_size", "max_turns"]
    base = ClientConfig(num_envs=2, local_policy="random")
    configs = [task_config(base, t, flags, (), tmp_path, t.name) for t in suite.tasks]
    assert [uid for uid, _ in configs] == ["Point-v1", "Point-v1", "GuessNumber-v1"]
    point, own, guess = (c for _, c in configs)
    assert point.env.step_size == 0.3 and own.env.step_size == 0.5  # type: ignore[attr-defined]
    assert guess.env.max_turns == 7 and guess.env.high == 9  # type: ignore[attr-defined]
    assert point.num_episodes == 2 and point.num_envs == 2 and point.output_dir == tmp_path
    assert point.exp_name == "point-v1-0" and own.local_policy == "random"


def test_seeds_reach_every_task_and_num_episodes_takes_the_first_ones(tmp_path: Path) -> None:
    suite = parse_suite({"seeds": [7, 8, 9], "task": [{"env": "point-v1", "local_policy": "zero"}]}, tmp_path / "s")
    _, config = task_config(ClientConfig(local_policy="random", num_episodes=2), suite.tasks[0], [], suite.seeds,
                            tmp_path, "t")
    assert config.runner.start_seeds == (7, 8) and config.num_episodes == 2
    assert config.runner.episode_split == "static" and config.local_policy == "zero"
    _, served = task_config(ClientConfig(server_url="ws://127.0.0.1:9"), suite.tasks[0], [], (), tmp_path, "t")
    assert served.local_policy is None, "a task's local_policy is used only with --local-policy"
    with pytest.raises(ConfigError, match="the suite has 3 seeds, one per episode; give at most 3"):
        task_config(ClientConfig(num_episodes=4), suite.tasks[0], [], suite.seeds, tmp_path, "t")


def test_a_task_field_the_env_lacks_and_a_flag_no_task_has_are_refused(tmp_path: Path) -> None:
    suite = parse_suite({"episodes": 1, "task": [{"env": "point-v1", "env_config": {"speed": 1}}]}, tmp_path / "s")
    with pytest.raises(ConfigError, match=r"env point-v1 has no config field 'speed' \(its fields are goal_radius"):
        task_config(ClientConfig(), suite.tasks[0], [], (), tmp_path, "t")
    good = parse_suite({"episodes": 1, "task": [{"env": "point-v1"}]}, tmp_path / "s")
    _, flags = split_env_flags(["--env.stepsize", "3"])
    with pytest.raises(ConfigError, match="--env.stepsize: no task's env has that config field"):
        run_suite(good, tmp_path / "s", ClientConfig(output_dir=tmp_path), flags, resume=False)
    assert not any(tmp_path.iterdir()), "nothing is written before every task's config is checked"


def test_a_table_for_a_text_field_is_its_json(tmp_path: Path) -> None:
    suite = parse_suite({"episodes": 1, "task": [{"env": "gym-v1", "env_config": {
        "id": "CartPole-v1", "kwargs": {"sutton_barto_reward": True}}}]}, tmp_path / "s")
    _, config = task_config(ClientConfig(), suite.tasks[0], [], (), tmp_path, "t")
    assert json.loads(config.env.kwargs) == {"sutton_barto_reward": True}  # type: ignore[attr-defined]


def test_env_config_values_are_checked_against_their_fields_and_taken_as_the_field_holds_them(tmp_path: Path) -> None:
    """An integer for a float field is a float, a choice must be one of the field's, an optional field takes its
    type, a bool is no integer."""
    suite = parse_suite({"episodes": 1, "task": [
        {"env": "point-v1", "env_config": {"step_size": 1}},
        {"env": "gym-v1", "name": "g", "env_config": {"id": "CartPole-v1", "vectorization": "async"}},
        {"env": "dummy-v1", "name": "d", "env_config": {"img_width": 32, "terminated_prob": 0.5}}]}, tmp_path / "s")
    point, gym_task, dummy = (task_config(ClientConfig(), t, [], (), tmp_path, t.name)[1].env for t in suite.tasks)
    assert point.step_size == 1.0 and isinstance(point.step_size, float)  # type: ignore[attr-defined]
    assert gym_task.vectorization == "async"  # type: ignore[attr-defined]
    assert (dummy.img_width, dummy.terminated_prob) == (32, 0.5)  # type: ignore[attr-defined]
    for env, config, what in [("gym-v1", {"vectorization": "threads"}, "is not one of 'sync', 'async'"),
                              ("dummy-v1", {"img_width": "32"}, "is not an int or None"),
                              ("dummy-v1", {"action_dim": True}, "is not an int"),
                              ("gym-v1", {"render": "yes"}, "is not a bool")]:
        bad = parse_suite({"episodes": 1, "task": [{"env": env, "name": "x", "env_config": config}]}, tmp_path / "s")
        with pytest.raises(ConfigError, match=rf"^suite file {re.escape(str(tmp_path / 's'))}: task 'x': "
                                              rf"env_config {next(iter(config))} = .* {what} \("):
            task_config(ClientConfig(), bad.tasks[0], [], (), tmp_path, "x")


def test_the_command_line_keeps_its_own_flags_from_the_tasks(tmp_path: Path) -> None:
    command, base, flags = parse(["s.toml", "--resume", "--exp-name", "x", "--num-envs", "4", "--env.step-size",
                                  "0.1", "--runner.seed", "3"])
    assert command.resume and command.suite_file == Path.cwd() / "s.toml"
    assert base.exp_name == "x" and base.num_envs == 4 and base.runner.seed == 3
    assert [f.tokens for f in flags] == [("--env.step-size", "0.1")]


# ---------------------------------------------------------------------------------------------- whole suites

THREE = """
name = "three"
episodes = 6

[[task]]
env = "point-v1"

[[task]]
name = "long"
env = "point-v1"
episodes = 150
env_config = { step_size = 0.01 }

[[task]]
name = "guess"
env = "guessnumber-v1"
env_config = { low = 1, high = 8, max_turns = 3 }
local_policy = "text"
local_policy_choices = ["<answer>2</answer>", "<answer>5</answer>", "nothing"]
"""


@pytest.mark.slow
def test_a_killed_suite_resumed_gives_the_table_of_an_uninterrupted_one(tmp_path: Path) -> None:
    """Three tasks (two policies: zero for Point-v1, text for GuessNumber-v1): killed with SIGKILL during the
    second, then resumed; the first is skipped, the second is resumed in its folder (its whole episodes count, the
    rest run from their own seeds), and the table is the table of the same suite run without a stop (a deterministic
    policy: a resumed connection of the random one would draw other actions)."""
    path = suite_of(tmp_path, THREE)
    flags = ["--local-policy", "zero", "--output-dir", str(tmp_path / "runs"), "--no-progress"]
    whole = run_module([str(path), *flags, "--exp-name", "whole"], tmp_path)
    assert whole.returncode == 0, whole.stderr
    assert "  mean " in whole.stdout and "suite three: 3 tasks" in whole.stdout

    root = tmp_path / "runs" / "cut"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    with subprocess.Popen([sys.executable, "-m", "plugrl_env_client.suite", str(path), *flags, "--exp-name", "cut"],
                          cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                          start_new_session=True) as proc:
        episodes = root / "long" / "rollout" / "proc_000" / "episodes.jsonl"
        try:
            wait_until(lambda: episodes.exists() and episodes.read_text().count("\n") >= 2, 300,
                       "episode of the second task", proc)
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    killed = json.loads((root / "suite.json").read_text())
    assert [t["status"] for t in killed["tasks"]] == ["finished", "running", "pending"]
    assert json.loads((root / "long" / "summary.json").read_text())["status"] in ("starting", "running")

    resumed = run_module([str(path), *flags, "--exp-name", "cut", "--resume"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert "task point-v1-0: done in point-v1-0, skipped" in resumed.stdout
    assert table(root) == table(tmp_path / "runs" / "whole")
    got = json.loads((root / "suite.json").read_text())
    assert [t["run"] for t in got["tasks"]] == ["point-v1-0", "long", "guess"]
    assert "task 2/3: long (Point-v1, 150 episodes) resumed in" in resumed.stdout
    want = json.loads((tmp_path / "runs" / "whole" / "suite.json").read_text())
    assert {k: got[k] for k in ("mean_return", "success_rate", "mean_length")} == {
        k: want[k] for k in ("mean_return", "success_rate", "mean_length")}
    assert got["tasks"][1]["episodes"] == 150 and got["tasks"][2]["success_rate"] is not None
    rows = list(csv.DictReader((root / "suite.csv").open()))
    assert [r["name"] for r in rows] == ["point-v1-0", "long", "guess", "mean"]
    assert float(rows[1]["mean_return"]) == pytest.approx(got["tasks"][1]["mean_return"])

    again = run_module([str(path), *flags, "--exp-name", "cut"], tmp_path)
    assert again.returncode == 1 and "already exists; continue the suite there with --resume" in again.stderr


@pytest.mark.slow
def test_the_table_counts_a_running_task_s_episodes_as_they_land(tmp_path: Path) -> None:
    """While a task runs, suite.json shows the episodes its run folder holds (refreshed every REFRESH_S seconds,
    never more than are on disk); interrupted, the task's row is its run's."""
    path = suite_of(tmp_path, 'episodes = 100000\n[[task]]\nname = "long"\nenv = "point-v1"\n')
    root = tmp_path / "runs" / "live"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    episodes = root / "long" / "rollout" / "proc_000" / "episodes.jsonl"

    def running_count() -> int:
        task = json.loads((root / "suite.json").read_text())["tasks"][0]
        return task["episodes"] if task["status"] == "running" else -1

    with subprocess.Popen([sys.executable, "-m", "plugrl_env_client.suite", str(path), "--local-policy", "zero",
                           "--output-dir", str(tmp_path / "runs"), "--exp-name", "live", "--no-progress"],
                          cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                          start_new_session=True) as proc:
        try:
            wait_until(lambda: episodes.exists() and episodes.read_bytes().count(b"\n") >= 3, 300,
                       "three episodes on disk", proc)
            wait_until(lambda: running_count() >= 3, 3 * REFRESH_S, "suite.json counting them", proc)
            shown = running_count()
            assert 3 <= shown <= episodes.read_bytes().count(b"\n")
        finally:
            os.killpg(proc.pid, signal.SIGINT)
            proc.wait(timeout=120)
    assert proc.returncode == 128 + signal.SIGINT
    task = json.loads((root / "suite.json").read_text())["tasks"][0]
    assert task["status"] == "interrupted" and task["episodes"] == episodes.read_bytes().count(b"\n") >= shown


@pytest.mark.slow
def test_every_task_talks_to_the_server_of_server_url(tmp_path: Path) -> None:
    """A real reference server for 2-d actions: both Point-v1 tasks run against it, with the suite's seeds (the
    zero policy: the same start states give the same returns in both tasks, whose envs are the same)."""
    from plugrl_env_client.server.embedded import start_local_server

    server = start_local_server("zero", gym.spaces.Box(-1, 1, (2,), np.float32), 4)
    url = server.url
    try:
        suite = load_suite(suite_of(tmp_path, 'seeds = [3, 1, 4]\n[[task]]\nenv = "point-v1"\n'
                                              '[[task]]\nname = "again"\nenv = "point-v1"\n'))
        base = ClientConfig(server_url=server.url, output_dir=tmp_path / "runs", exp_name="srv", progress=False,
                            num_envs=2)
        assert run_suite(suite, tmp_path / "s.toml", base, [], resume=False) == 0
    finally:
        server.shutdown()
    first, second = table(tmp_path / "runs" / "srv")
    assert first["episodes"] == second["episodes"] == 3 and first["mean_return"] == second["mean_return"]
    for name in ("point-v1-0", "again"):
        config = json.loads((tmp_path / "runs" / "srv" / name / "client_config.json").read_text())
        assert config["server_url"] == url and config["local_policy"] is None
        seeds = sorted(json.loads(line)["seed"] for line in
                       (tmp_path / "runs" / "srv" / name / "rollout" / "proc_000" / "episodes.jsonl").open())
        assert seeds == [1, 3, 4]


@pytest.mark.slow
def test_a_task_whose_action_dim_the_server_does_not_serve_fails_alone(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """Dummy-v1 (7-d actions) against a server of 2-d actions is refused as a client run refuses it; the other
    task still runs, and the suite exits 1 naming the task that is not done."""
    from plugrl_env_client.server.embedded import start_local_server

    server = start_local_server("zero", gym.spaces.Box(-1, 1, (2,), np.float32), 4)
    try:
        suite = load_suite(suite_of(tmp_path, 'episodes = 2\n[[task]]\nname = "dims"\nenv = "dummy-v1"\n'
                                              '[[task]]\nenv = "point-v1"\n'))
        base = ClientConfig(server_url=server.url, output_dir=tmp_path / "runs", exp_name="bad", progress=False)
        assert run_suite(suite, tmp_path / "s.toml", base, [], resume=False) == 1
    finally:
        server.shutdown()
    dummy, point = table(tmp_path / "runs" / "bad")
    assert (dummy["status"], point["status"]) == ("failed", "finished") and dummy["mean_return"] is None
    err = capsys.readouterr().err
    assert "got (2,) (the server's metadata says action_dim=2)" in err
    assert "error: task(s) not done: dims; rerun them with --resume --exp-name bad" in err


# ---------------------------------------------------------------------------------------------- Meta-World's MT10


@pytest.fixture(scope="module")
def metaworld_site() -> Path:
    return installed(METAWORLD)


@pytest.mark.slow
def test_the_shipped_mt10_suite_runs_its_ten_tasks(metaworld_site: Path, tmp_path: Path) -> None:
    """suites/mt10.toml as shipped, with Meta-World installed as tests/_support/pip_sites.py installs it: two
    short episodes per task (40 steps instead of Meta-World's 500), from the suite's first two seeds."""
    env = {**os.environ, "PYTHONPATH": python_path_with(metaworld_site)}
    done = subprocess.run([sys.executable, "-m", "plugrl_env_client.suite", str(ROOT / "suites" / "mt10.toml"),
                           "--local-policy", "random", "--num-episodes", "2", "--num-envs", "2",
                           "--runner.max-episode-steps", "40", "--output-dir", str(tmp_path), "--exp-name", "mt10",
                           "--no-progress"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    suite = json.loads((tmp_path / "mt10" / "suite.json").read_text())
    names = ["reach", "push", "pick-place", "door-open", "drawer-open", "drawer-close", "button-press-topdown",
             "peg-insert-side", "window-open", "window-close"]
    assert [t["name"] for t in suite["tasks"]] == names
    for task in suite["tasks"]:
        assert (task["env"], task["status"], task["episodes"], task["mean_length"]) == ("Gym-v1", "finished", 2, 40)
        assert isinstance(task["success_rate"], float) and isinstance(task["mean_return"], float)
        run = tmp_path / "mt10" / task["run"]
        config = json.loads((run / "client_config.json").read_text())
        assert json.loads(config["env"]["kwargs"]) == {"env_name": f"{task['name']}-v3"}
        seeds = sorted(json.loads(line)["seed"] for line in (run / "rollout" / "proc_000" / "episodes.jsonl").open())
        assert seeds == [0, 1]
    assert len({t["mean_return"] for t in suite["tasks"]}) == 10, "ten different tasks"
    assert "suite mt10: 10 tasks" in done.stdout


# ---------------------------------------------------------------------------------------------- LIBERO's suites

LIBERO_SUITES = ("libero_spatial", "libero_object", "libero_goal", "libero_10")


@pytest.mark.parametrize("name", LIBERO_SUITES)
def test_a_libero_suite_file_runs_every_task_of_its_suite_from_each_of_its_50_initial_states(name: str) -> None:
    suite = load_suite(ROOT / "suites" / f"{name}.toml")
    assert suite.name == name and suite.seeds == tuple(range(50))
    assert [t.env for t in suite.tasks] == ["libero-v1"] * 10
    assert [t.env_config for t in suite.tasks] == [{"suite": name, "task_id": i} for i in range(10)]
    assert len({t.name for t in suite.tasks}) == 10 and all(t.episodes == 50 for t in suite.tasks)


@pytest.fixture(scope="module")
def libero_site() -> Path:
    return installed(LIBERO)


@pytest.mark.slow
@pytest.mark.timeout(900)  # the first test with LIBERO installs it (about 1.7 GB) first
def test_the_shipped_libero_spatial_suite_prints_the_success_table_of_its_ten_tasks(libero_site: Path,
                                                                                    tmp_path: Path) -> None:
    """suites/libero_spatial.toml as shipped, with LIBERO installed as tests/_support/pip_sites.py installs it: one
    episode of 2 steps per task, without cameras (a step with them costs a quarter of a second here)."""
    env = {**os.environ, "PYTHONPATH": python_path_with(libero_site)}
    done = subprocess.run([sys.executable, "-m", "plugrl_env_client.suite", str(ROOT / "suites" / "libero_spatial.toml"),
                           "--local-policy", "random", "--num-episodes", "1", "--env.render", "false",
                           "--env.settle-steps", "0", "--env.max-episode-steps", "2", "--output-dir", str(tmp_path),
                           "--exp-name", "spatial", "--no-progress"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    suite = json.loads((tmp_path / "spatial" / "suite.json").read_text())
    assert len(suite["tasks"]) == 10 and suite["tasks"][0]["name"].startswith("pick_up_the_black_bowl_between")
    for task in suite["tasks"]:
        assert (task["env"], task["status"], task["episodes"], task["mean_length"]) == ("LIBERO-v1", "finished", 1, 2)
        assert task["success_rate"] == 0.0, "LIBERO's success check judged the episode"
        run = tmp_path / "spatial" / task["run"]
        (episode,) = [json.loads(line) for line in (run / "rollout" / "proc_000" / "episodes.jsonl").open()]
        assert episode["seed"] == 0 and episode["truncated"]
    assert [json.loads((tmp_path / "spatial" / t["run"] / "client_config.json").read_text())["env"]["task_id"]
            for t in suite["tasks"]] == list(range(10))
    assert "suite libero_spatial: 10 tasks" in done.stdout


# ---------------------------------------------------------------------------------------------- the report


@pytest.mark.slow
def test_plugrl_report_on_a_suite_folder_shows_the_table_and_bars_per_task(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    need("matplotlib")
    from plugrl_env_client.report.cli import main as report_main

    suite = load_suite(suite_of(tmp_path, 'episodes = 3\n[[task]]\nname = "reach"\nenv = "point-v1"\n'
                                          '[[task]]\nname = "no-rule"\nenv = "dummy-v1"\n'
                                          'env_config = { terminated_prob = 0.3 }\n'))
    base = ClientConfig(local_policy="random", output_dir=tmp_path / "runs", exp_name="rep", progress=False)
    assert run_suite(suite, tmp_path / "s.toml", base, [], resume=False) == 0
    root = tmp_path / "runs" / "rep"
    reach, no_rule = table(root)
    assert reach["success_rate"] is not None and no_rule["success_rate"] is None
    assert report_main([str(root)]) == 0
    assert f"report: {root / 'report.html'} (3 figures in {root / 'report'})" in capsys.readouterr().out
    page = (root / "report.html").read_text()
    assert "<h1>suite s</h1>" in page and "2 of 2 tasks done" in page
    assert "<td>reach</td>" in page and "<td>no-rule</td>" in page and "NaN" not in page and "nan" not in page
    assert '<a href="reach">reach</a>' in page
    assert {p.name for p in (root / "report").glob("*.png")} == {"suite_returns.png", "suite_success.png",
                                                                  "suite_lengths.png"}
    assert report_main([str(root / "reach")]) == 0, "a task's run folder is reported alone"
    assert (root / "reach" / "report.html").exists()


# ---------------------------------------------------------------------------------------------- Ray


@pytest.mark.slow
def test_tasks_run_side_by_side_on_a_ray_cluster_with_the_local_table(tmp_path: Path) -> None:
    """Two tasks with --launcher ray on a running cluster: each a driver of its own, both at once (each started
    before the other ended), and with the suite's seeds and the zero policy the table of the same suite run
    locally, one task after the other, with another process count."""
    need("ray")
    from ray.cluster_utils import Cluster

    from plugrl_env_client.launch.config import RayConfig

    suite = load_suite(suite_of(tmp_path, 'seeds = [3, 1, 4, 15, 9]\n[[task]]\nenv = "point-v1"\n'
                                          '[[task]]\nname = "fast"\nenv = "point-v1"\n'
                                          'env_config = { step_size = 0.3 }\n'))
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 2, "include_dashboard": False, "object_store_memory": 80 * 1024**2})
    try:
        base = ClientConfig(local_policy="zero", launcher="ray", num_procs=2, num_envs=2, progress=False,
                            ray=RayConfig(address=cluster.address, num_cpus_per_proc=0.25),
                            output_dir=tmp_path / "runs", exp_name="ray")
        assert run_suite(suite, tmp_path / "s.toml", base, [], resume=False) == 0
    finally:
        cluster.shutdown()
    local = ClientConfig(local_policy="zero", num_envs=3, progress=False, output_dir=tmp_path / "runs",
                         exp_name="local")
    assert run_suite(suite, tmp_path / "s.toml", local, [], resume=False) == 0
    on_ray, here = table(tmp_path / "runs" / "ray"), table(tmp_path / "runs" / "local")
    assert on_ray == [{k: pytest.approx(v, rel=1e-12) if isinstance(v, float) else v for k, v in row.items()}
                      for row in here], "the same episodes (summed in another order)"
    assert [r["episodes"] for r in on_ray] == [5, 5] and on_ray[0]["status"] == "finished"
    runs = [tmp_path / "runs" / "ray" / name for name in ("point-v1-0", "fast")]
    started = [(run / "client_config.json").stat().st_mtime for run in runs]  # written before the processes start
    ended = [(run / "summary.json").stat().st_mtime for run in runs]
    assert max(started) < min(ended), "the tasks ran side by side"


@pytest.mark.slow
def test_the_command_says_what_is_wrong_in_one_line(tmp_path: Path) -> None:
    missing = run_module([str(tmp_path / "nope.toml"), "--local-policy", "random"], tmp_path)
    assert missing.returncode == 1 and "Traceback" not in missing.stderr
    assert missing.stderr.strip() == (f"error: suite file {tmp_path / 'nope.toml'}: cannot read it (No such file or "
                                      "directory) (give the path of a suite file, e.g. suites/demo.toml)")
    path = suite_of(tmp_path, 'episodes = 1\n[[task]]\nenv = "point-v1"\n')
    outside = run_module([str(path), "--exp-name", "../elsewhere"], tmp_path)
    assert outside.returncode == 1 and "--exp-name '../elsewhere' must be a folder name" in outside.stderr
    assert not (tmp_path.parent / "elsewhere").exists()
    helped = run_module(["--help"], tmp_path)
    assert helped.returncode == 0 and "SUITE.toml" in helped.stdout and "--resume" in helped.stdout
    assert "Episodes per task, instead of the suite file's" in " ".join(helped.stdout.split())
