"""Whole runs through ``run_client`` and the CLI: several processes, every user error, the README commands."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from client_runs import interrupt_once_collecting

from plugrl_env_client.app import run_client
from plugrl_env_client.config import ClientConfig, ConnectionConfig, RunnerConfig
from plugrl_env_client.envs import discover_envs
from plugrl_env_client.report.html import server_url
from plugrl_env_client.server.policies import PolicyConfig, make_policy
from plugrl_env_client.server.server import PolicyServer

ROOT = Path(__file__).resolve().parents[1]
discover_envs()
from exiting_env import ExitingConfig  # noqa: E402
from faulty_env import FaultyConfig  # noqa: E402

from plugrl_env_client.envs.point.point_env import PointEnvConfig  # noqa: E402


@pytest.fixture
def policy_server():
    made = []

    def start(**policy):
        server = PolicyServer(make_policy(PolicyConfig(**policy)), host="127.0.0.1", port=0).start()
        made.append(server)
        return server

    yield start
    for s in made:
        s.shutdown()


def config(tmp_path: Path, **kwargs) -> ClientConfig:
    return ClientConfig(output_dir=tmp_path, exp_name="run", progress=False, **kwargs)


def summary(tmp_path: Path, proc: int | None = None) -> dict:
    path = tmp_path / "run" / ("summary.json" if proc is None else f"rollout/proc_{proc:03d}/summary.json")
    return json.loads(path.read_text())


@pytest.mark.slow
def test_multi_process_run_aggregates_exactly(policy_server, tmp_path):
    server = policy_server(action_dim=2)
    cfg = config(tmp_path, env=PointEnvConfig(), num_envs=3, num_procs=2, num_episodes=12,
                 server_port=server.port, runner=RunnerConfig(max_episode_steps=7))
    assert run_client(cfg, "Point-v1") == 0
    total = summary(tmp_path)
    per = [summary(tmp_path, p) for p in (0, 1)]
    assert total["completed_episodes"] == 12 == sum(s["completed_episodes"] for s in per)
    episodes = [json.loads(line) for p in (0, 1)
                for line in (tmp_path / "run" / f"rollout/proc_{p:03d}/episodes.jsonl").read_text().splitlines()]
    assert len(episodes) == 12
    assert total["all_episodes"]["mean_return"] == pytest.approx(sum(e["return"] for e in episodes) / 12)
    assert total["all_episodes"]["mean_length"] == pytest.approx(sum(e["length"] for e in episodes) / 12)
    assert all(e["length"] <= 7 for e in episodes) and any(e["truncated"] for e in episodes)
    assert total["status"] == "finished" and total["total_processes"] == 2
    assert total["timing"]["env_steps"] == sum(s["timing"]["env_steps"] for s in per)
    client_config = json.loads((tmp_path / "run" / "client_config.json").read_text())
    assert client_config["env_id"] == "Point-v1" and client_config["num_procs"] == 2
    assert client_config["output_dir"] == str(tmp_path) and client_config["env"]["step_size"] == 0.1
    assert client_config["uid"] == "Point-v1" and client_config["env"]["max_episode_steps"] == 7, "PlugRL's keys"
    assert client_config["reconnect_on_server_stop"] is False and client_config["runner"]["uid"] == "Point-v1"
    assert isinstance(client_config["recorder"]["video_fps"], float)
    for p in (0, 1):
        manifest = json.loads((tmp_path / "run" / f"rollout/proc_{p:03d}/manifest.json").read_text())
        assert (manifest["num_envs"], manifest["metric_window"]) == (3, 100)
        assert manifest["args"]["episode_freq"] == 0 and manifest["args"]["metric_window"] == 100
        assert isinstance(manifest["args"]["video_fps"], float) and manifest["effective_episode_freq"] == 0
        assert manifest["full_rollout_video"] is False
        assert isinstance(manifest["command_line"], list)


@pytest.mark.slow
def test_crashed_process_stops_the_others_and_is_named(policy_server, tmp_path, capsys):
    server = policy_server(action_dim=2)
    cfg = config(tmp_path, env=FaultyConfig(fail_process=1, fail_at_step=30), num_envs=2, num_procs=2,
                 server_port=server.port, runner=RunnerConfig(pass_proc_id=True))
    assert run_client(cfg, "Faulty-v1") == 1
    err = capsys.readouterr().err
    assert "process 1 failed" in err and "Faulty-v1 raised in step()" in err and "simulated simulator crash" in err
    total = summary(tmp_path)
    assert total["failed_processes"] == [1] and total["status"] == "failed"
    assert summary(tmp_path, 0)["status"] == "interrupted", "the healthy process stops cleanly and says so"
    kept = [len((tmp_path / "run" / f"rollout/proc_{p:03d}/episodes.jsonl").read_text().splitlines()) for p in (0, 1)]
    assert kept[1] > 0, "the failed process's episodes before the crash are kept"
    assert [summary(tmp_path, p)["completed_episodes"] for p in (0, 1)] == kept
    assert total["completed_episodes"] == sum(kept)


@pytest.mark.slow
def test_killed_process_is_named_and_the_aggregate_is_still_written(policy_server, tmp_path, capsys):
    server = policy_server(action_dim=2)
    cfg = config(tmp_path, env=FaultyConfig(fail_process=1, fail_at_step=30, hard_kill=True), num_envs=2, num_procs=2,
                 server_port=server.port, runner=RunnerConfig(pass_proc_id=True))
    assert run_client(cfg, "Faulty-v1") == 1
    assert "process 1 failed: killed by signal 9" in capsys.readouterr().err
    total = summary(tmp_path)
    assert total["failed_processes"] == [1] and total["process_status"]["1"] == "failed"
    assert total["errors"]["1"] == "killed by signal 9"
    assert summary(tmp_path, 0)["status"] == "interrupted"
    kept = [len((tmp_path / "run" / f"rollout/proc_{p:03d}/episodes.jsonl").read_text().splitlines()) for p in (0, 1)]
    assert kept[1] > 0 and kept[0] == summary(tmp_path, 0)["completed_episodes"]
    assert total["completed_episodes"] == sum(kept), "the killed process's episodes count, read from its episodes.jsonl"


@pytest.mark.slow
def test_a_process_stuck_in_its_env_is_terminated_after_the_grace_time(policy_server, tmp_path, capsys, monkeypatch):
    """Process 1 crashes; process 0 is stuck in env.step, deaf to signals: the run still ends, names both, and
    keeps what was collected."""
    from plugrl_env_client.launch import local

    monkeypatch.setattr(local, "STOP_GRACE_S", 1.0)
    server = policy_server(action_dim=2)
    hung = tmp_path / "hung"  # process 1 crashes only once process 0 is stuck
    cfg = config(tmp_path, env=FaultyConfig(fail_process=1, fail_at_step=30, hang_process=0, hang_at_step=3,
                                            hang_marker=str(hung)),
                 num_envs=2, num_procs=2, server_port=server.port, runner=RunnerConfig(pass_proc_id=True))
    start = time.monotonic()
    assert run_client(cfg, "Faulty-v1") == 1
    assert time.monotonic() - start < 120, "the hung process (a 600 s sleep) did not hold the run"
    err = capsys.readouterr().err
    assert "process 0 failed: did not stop within 1 s of the stop request" in err
    assert "process 1 failed" in err and "simulated simulator crash" in err
    total = summary(tmp_path)
    assert total["process_status"] == {"0": "failed", "1": "failed"}
    assert total["completed_episodes"] > 0


@pytest.mark.slow
def test_env_lock_builds_envs_one_process_at_a_time(policy_server, tmp_path):
    server = policy_server(action_dim=2)
    log = tmp_path / "inits.txt"
    cfg = config(tmp_path, env=FaultyConfig(fail_process=-1, init_log=str(log), init_sleep_s=0.5), num_procs=3,
                 num_episodes=6, server_port=server.port, runner=RunnerConfig(use_env_lock=True))
    assert run_client(cfg, "Faulty-v1") == 0
    spans = sorted(tuple(map(float, line.split())) for line in log.read_text().splitlines())
    assert len(spans) == 3
    assert all(later[0] >= earlier[1] for earlier, later in zip(spans, spans[1:])), f"constructions overlap: {spans}"


@pytest.mark.slow
def test_one_process_stopped_from_outside_fails_the_run(policy_server, tmp_path, capsys):
    server = policy_server(action_dim=2)
    cfg = config(tmp_path, env=FaultyConfig(fail_process=1, fail_at_step=20, sigterm_self=True), num_envs=2,
                 num_procs=2, server_port=server.port, runner=RunnerConfig(pass_proc_id=True))
    assert run_client(cfg, "Faulty-v1") == 1
    assert "process 1 failed: stopped by SIGTERM" in capsys.readouterr().err
    stopped = summary(tmp_path, 1)
    assert stopped["status"] == "failed" and stopped["error"] == "stopped by SIGTERM"
    assert stopped["completed_episodes"] > 0


def test_reusing_an_exp_name_is_refused(policy_server, tmp_path):
    from plugrl_env_client.errors import ConfigError

    server = policy_server(action_dim=2)
    cfg = config(tmp_path, env=PointEnvConfig(), server_port=server.port, num_episodes=1,
                 runner=RunnerConfig(max_episode_steps=3))
    assert run_client(cfg, "Point-v1") == 0
    with pytest.raises(ConfigError, match="already holds a run; to continue that run where it stopped add --resume, or pick another --exp-name"):
        run_client(cfg, "Point-v1")


def test_env_exception_keeps_collected_episodes(policy_server, tmp_path, capsys):
    server = policy_server(action_dim=2)
    cfg = config(tmp_path, env=FaultyConfig(fail_at_step=9), num_envs=2, server_port=server.port,
                 runner=RunnerConfig(pass_proc_id=True))
    assert run_client(cfg, "Faulty-v1") == 1
    assert "env Faulty-v1 raised in step(): RuntimeError: simulated simulator crash" in capsys.readouterr().err
    lines = (tmp_path / "run" / "rollout/proc_000/episodes.jsonl").read_text().splitlines()
    assert len(lines) == 8 and summary(tmp_path)["completed_episodes"] == 8


def test_action_dim_mismatch_says_what_to_do(policy_server, tmp_path, capsys):
    server = policy_server(action_dim=7)
    assert run_client(config(tmp_path, env=PointEnvConfig(), server_port=server.port), "Point-v1") == 1
    err = capsys.readouterr().err
    assert "Expected action shape tail (2,), got (7,)" in err and "--policy.action-dim" in err
    assert summary(tmp_path)["status"] == "failed"


def test_reward_shape_error(policy_server, tmp_path, capsys):
    server = policy_server(action_dim=2)
    cfg = config(tmp_path, env=FaultyConfig(fail_process=-1, reward_shape_bug=True), server_port=server.port)
    assert run_client(cfg, "Faulty-v1") == 1
    assert "Expected reward shape (1,), got ()" in capsys.readouterr().err


def test_no_server_within_connect_timeout(tmp_path, capsys):
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = config(tmp_path, env=PointEnvConfig(), server_port=port, connection=ConnectionConfig(connect_timeout=0.5))
    assert run_client(cfg, "Point-v1") == 1
    err = capsys.readouterr().err
    assert f"ws://127.0.0.1:{port}" in err
    assert f"plugrl-run-policy-server --port {port} --policy.action-dim 2 --policy.dtype float32" in err, err


def test_api_key_is_not_written_to_disk(policy_server, tmp_path):
    server = policy_server(action_dim=2)
    cfg = config(tmp_path, env=PointEnvConfig(), server_port=server.port, connection=ConnectionConfig(api_key="s3cret"), num_episodes=1,
                 runner=RunnerConfig(max_episode_steps=3))
    assert run_client(cfg, "Point-v1") == 0
    for path in (tmp_path / "run").rglob("*"):
        if path.is_file():
            assert "s3cret" not in path.read_text(), path
    assert json.loads((tmp_path / "run" / "client_config.json").read_text())["connection"]["api_key"] == "***"


def test_a_local_policy_run_records_the_port_its_embedded_server_used(tmp_path):
    cfg = config(tmp_path, env=PointEnvConfig(), local_policy="random", num_episodes=2,
                 runner=RunnerConfig(max_episode_steps=3))
    assert run_client(cfg, "Point-v1") == 0
    log = (tmp_path / "run" / "logs" / "client.log").read_text()
    served = re.search(r"embedded random policy serving on (ws://127\.0\.0\.1:(\d+))", log)
    assert served is not None, log
    recorded = json.loads((tmp_path / "run" / "client_config.json").read_text())
    assert recorded["server_url"] == served.group(1) and recorded["server_port"] == int(served.group(2))
    assert recorded["server_host"] == "127.0.0.1" and recorded["local_policy"] == "random"
    assert server_url(recorded) == served.group(1), "the report shows the same"


def test_bad_flag_values_are_refused(tmp_path):
    from plugrl_env_client.errors import ConfigError

    with pytest.raises(ConfigError, match="--num-envs must be >= 1"):
        run_client(config(tmp_path, num_envs=0), "Point-v1")
    with pytest.raises(ConfigError, match="--runner.max-episode-steps must be >= 1, got -1"):
        run_client(config(tmp_path, runner=RunnerConfig(max_episode_steps=-1)), "Point-v1")
    with pytest.raises(ConfigError, match="--local-policy-horizon must be >= 1, got 0"):
        run_client(config(tmp_path, local_policy="random", local_policy_horizon=0), "Point-v1")
    with pytest.raises(ConfigError, match="Did you mean 'Point-v1'"):
        run_client(config(tmp_path), "Pointt-v1")


def test_readme_quickstart_has_exactly_two_commands():
    text = (ROOT / "README.md").read_text()
    quickstart = re.search(r"## Quickstart\n\n```bash\n(.*?)```", text, re.S).group(1).strip().splitlines()
    assert len(quickstart) == 2
    assert quickstart[0].startswith("pip install -e . && plugrl-run-env-client ")
    assert quickstart[1] == 'pip install -e ".[test]" && pytest'


def _cli(args: list[str], cwd: Path, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "plugrl_env_client", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, **kwargs)


@pytest.mark.slow
def test_readme_commands_run(tmp_path):
    """Every command of the README's bash blocks runs as a reader would run it (the two-terminal one against a real
    server subprocess on a free port); only the pip installs of the Quickstart are left out (this is that install)."""
    from doc_commands import DocShell, bash_blocks

    blocks = bash_blocks(ROOT / "README.md")
    ran = 0
    with DocShell(tmp_path, tmp_path / "runs", replace={"examples/": str(ROOT / "examples") + "/"}) as shell:
        for block in blocks:
            commands = [c for c in block.commands if not c.text.startswith("pip install")]
            for result in [shell.run(c) for c in commands] + shell.stop_background():
                assert result.ok, result.describe()
                ran += 1
    assert ran >= 6
    assert (tmp_path / "runs" / "rec" / "report.html").exists()


def test_readme_example_env_is_the_file_on_disk():
    text = (ROOT / "README.md").read_text()
    block = re.search(r"<!-- file: examples/reach_env.py -->\n```python\n(.*?)```", text, re.S).group(1)
    assert block == (ROOT / "examples" / "reach_env.py").read_text()


def test_readme_example_env_file_runs_directly(tmp_path):
    result = subprocess.run([sys.executable, str(ROOT / "examples/reach_env.py"), "reach-v1", "--num-episodes", "2",
                             "--local-policy", "random", "--output-dir", str(tmp_path), "--exp-name", "r", "--no-progress"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["completed_episodes"] == 2


@pytest.mark.slow
def test_cli_user_error_exits_nonzero_without_traceback(tmp_path):
    result = _cli(["point-v1", "--num-envs", "0", "--output-dir", str(tmp_path)], cwd=tmp_path)
    assert result.returncode == 1
    assert "error: --num-envs must be >= 1" in result.stderr and "Traceback" not in result.stderr


def _episodes_of(root: Path, proc: int = 0) -> list[dict]:
    """The episodes of a run, without their wall times (which differ from run to run)."""
    path = root / "run" / f"rollout/proc_{proc:03d}/episodes.jsonl"
    return [{k: v for k, v in json.loads(line).items() if k != "wall_time_s"} for line in path.read_text().splitlines()]


def test_seed_reproduces_a_run_and_processes_get_distinct_seeds(tmp_path):
    def run(sub: str, seed: int, procs: int = 1) -> Path:
        cfg = ClientConfig(output_dir=tmp_path / sub, exp_name="run", progress=False, env=PointEnvConfig(), num_envs=2,
                           num_procs=procs, num_episodes=6, local_policy="zero",
                           runner=RunnerConfig(seed=seed, max_episode_steps=20))
        assert run_client(cfg, "Point-v1") == 0
        return tmp_path / sub

    a, b, c = run("a", 3), run("b", 3), run("c", 4)
    assert _episodes_of(a) == _episodes_of(b), "same seed, same episodes"
    assert _episodes_of(a) != _episodes_of(c), "another seed, other episodes"
    # A zero policy never moves the point: each episode's return is -distance * length, so returns identify the
    # start states. Episodes after the first reset differ from the first ones: the seed reaches only that reset.
    first = _episodes_of(a)
    assert first[0]["return"] != first[2]["return"]


def test_process_seeds_do_not_overlap():
    from plugrl_env_client.launch.process import process_seed
    from plugrl_env_client.utils.registration import make_env

    seeds = [process_seed(3, p, num_envs=4) for p in range(3)]
    assert seeds == [3, 7, 11], "process p starts at seed + p * num_envs: per-env seed ranges never overlap"
    starts = [make_env("Point-v1", num_envs=4).reset(seed=s)[0].states["pos"] for s in seeds]
    assert not np.array_equal(starts[0], starts[1]) and not np.array_equal(starts[1], starts[2])
    assert process_seed(None, 2, 4) is None


@pytest.mark.parametrize("local", [True, False])
def test_env_that_cannot_be_built_is_named_and_the_run_says_why(policy_server, tmp_path, capsys, local):
    server = policy_server(action_dim=2)
    extra = {"local_policy": "random"} if local else {"server_port": server.port}
    cfg = config(tmp_path, env=FaultyConfig(fail_in_init=True), num_episodes=2, **extra)
    assert run_client(cfg, "Faulty-v1") == 1
    err = capsys.readouterr().err
    assert "env Faulty-v1 raised in __init__(): OSError: simulator license not found" in err, err
    total = summary(tmp_path)
    assert total["status"] == "failed" and "simulator license not found" in total["errors"]["0"]


def test_local_policy_builds_the_env_once(tmp_path):
    log = tmp_path / "inits.txt"
    cfg = config(tmp_path, env=FaultyConfig(fail_process=-1, init_log=str(log)), num_episodes=2,
                 local_policy="random")
    assert run_client(cfg, "Faulty-v1") == 0
    assert len(log.read_text().splitlines()) == 1, "the embedded server reads the action space of the real env"


def test_old_constructor_signature_says_which_parameters_init_needs(tmp_path, registry):
    import gymnasium as gym

    from plugrl_env_client.envs.base_env import BaseEnv, BaseEnvConfig
    from plugrl_env_client.errors import ConfigError
    from plugrl_env_client.utils.registration import make_env, register_env

    @register_env("OldSig-v1")
    class OldSig(BaseEnv[BaseEnvConfig]):
        def __init__(self, config, worker_id, total_workers):
            super().__init__(config, num_envs=1)
            self.single_action_space = gym.spaces.Discrete(2)

    with pytest.raises(ConfigError) as info:
        make_env("OldSig-v1", num_envs=2)
    message = str(info.value)
    assert "OldSig.__init__" in message and "def __init__(self, config: MyConfig, num_envs: int = 1, **kwargs)" in message
    assert "worker_id / total_workers" in message and "process_id / total_processes" in message


def test_one_episode_is_said_in_the_singular(tmp_path, capsys):
    cfg = config(tmp_path, env=PointEnvConfig(), num_episodes=1, local_policy="random")
    assert run_client(cfg, "Point-v1") == 0
    out = capsys.readouterr().out
    assert "Point-v1: 1 episode\n" in out


@pytest.mark.slow
def test_local_policy_without_a_target_says_it_runs_until_interrupted(tmp_path):
    res = interrupt_once_collecting(["point-v1", "--local-policy", "random", "--no-progress", "--output-dir",
                                     str(tmp_path), "--exp-name", "run"],
                                    tmp_path / "run" / "rollout" / "proc_000" / "episodes.jsonl")
    assert res.returncode == 130
    assert "collecting until Ctrl-C" in res.stderr


@pytest.mark.slow
def test_version_flag_and_help_into_a_closed_pipe():
    res = subprocess.run([sys.executable, "-m", "plugrl_env_client", "--version"], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0 and res.stdout.strip().startswith("plugrl-env-client ")
    pipe = subprocess.run(f"{sys.executable} -m plugrl_env_client point-v1 --help | head -n 2", shell=True,
                          capture_output=True, text=True, timeout=60)
    assert len(pipe.stdout.splitlines()) == 2
    assert "BrokenPipe" not in pipe.stderr and "Traceback" not in pipe.stderr, pipe.stderr


@pytest.mark.slow
def test_two_processes_with_static_split_and_random_policy_are_reproducible(tmp_path):
    """Static shares and per-process policy streams: the same flags give the same episodes, run after run."""
    def run(sub: str, seed: int) -> list[list[dict]]:
        cfg = ClientConfig(output_dir=tmp_path / sub, exp_name="run", progress=False, env=PointEnvConfig(), num_envs=2,
                           num_procs=2, num_episodes=9, local_policy="random",
                           runner=RunnerConfig(seed=seed, max_episode_steps=15, episode_split="static"))
        assert run_client(cfg, "Point-v1") == 0
        return [_episodes_of(tmp_path / sub, p) for p in (0, 1)]

    a, b, c = run("a", 5), run("b", 5), run("c", 6)
    assert [len(p) for p in a] == [5, 4], "shares of 9 over 2 processes"
    assert a == b, "same seed, same episodes in every process"
    assert a != c


@pytest.mark.slow
def test_recorder_files_come_home_and_are_listed_in_the_manifest(tmp_path):
    """Two processes record every second episode; their files land in their folders, the manifest lists them,
    and the report shows the sampled frames."""
    from plugrl_env_client.envs.dummy.dummy_env import DummyEnvConfig
    from plugrl_env_client.outputs.recording.config import RecorderConfig
    from plugrl_env_client.report.cli import main as report_main

    cfg = config(tmp_path, env=DummyEnvConfig(base_image_size=32, wrist_image_size=16, terminated_prob=0.2),
                 num_envs=2, num_procs=2, num_episodes=8, local_policy="random",
                 recorder=RecorderConfig(episode_freq=2, record_video=True, thread0_only=False))
    assert run_client(cfg, "Dummy-v1") == 0
    for p in (0, 1):
        folder = tmp_path / "run" / "rollout" / f"proc_{p:03d}"
        manifest = json.loads((folder / "manifest.json").read_text())
        listed = set(manifest["files"])
        on_disk = {str(f.relative_to(folder)) for f in folder.rglob("*") if f.is_file()}
        assert listed == on_disk
        assert any(f.startswith("videos/") and f.endswith(".mp4") for f in listed)
        assert any(re.fullmatch(r"sampled/ep_\d{6}/env_00[01]/obs/first/images/base\.png", f) for f in listed)
        assert "metrics/episode_metrics.jsonl" in listed and "metrics/obs_stats.jsonl" in listed
        assert manifest["recorder"]["episodes_recorded"] >= 1
    assert report_main([str(tmp_path / "run")]) == 0
    html = (tmp_path / "run" / "report.html").read_text()
    assert "/obs/first/images/base.png" in html and ".mp4" in html


def test_a_config_built_in_code_without_env_gets_the_envs_defaults(tmp_path):
    cfg = ClientConfig(num_episodes=2, local_policy="random", output_dir=tmp_path, exp_name="run", progress=False)
    assert run_client(cfg, "Point-v1") == 0
    recorded = json.loads((tmp_path / "run" / "client_config.json").read_text())
    assert recorded["env"] == {**json.loads(json.dumps(vars(PointEnvConfig()))), "max_episode_steps": 100}, \
        "the env's defaults, and its registered time limit under PlugRL's name"


def test_metric_window_sets_the_window_of_the_summaries(tmp_path):
    from plugrl_env_client.outputs.recording.config import RecorderConfig

    cfg = ClientConfig(num_envs=2, num_episodes=12, local_policy="random", output_dir=tmp_path, exp_name="run",
                       progress=False, env=PointEnvConfig(), recorder=RecorderConfig(metric_window=5),
                       runner=RunnerConfig(max_episode_steps=7))
    assert run_client(cfg, "Point-v1") == 0
    rows = [json.loads(line) for line in (tmp_path / "run" / "rollout" / "proc_000" / "episodes.jsonl").open()]
    for summary in (json.loads((tmp_path / "run" / name).read_text())
                    for name in ("summary.json", "rollout/proc_000/summary.json")):
        assert summary["metric_window"] == 5
        assert summary["mean_length"] == pytest.approx(np.mean([r["length"] for r in rows[-5:]]))


def test_an_unforeseen_error_still_ends_with_a_summary_that_says_so(tmp_path, monkeypatch, capsys):
    from plugrl_env_client import app

    def broken(*args, **kwargs):
        raise RuntimeError("something nobody foresaw")

    monkeypatch.setattr(app, "_run", broken)
    cfg = ClientConfig(num_envs=2, num_episodes=2, local_policy="random", output_dir=tmp_path, exp_name="run",
                       progress=False, env=PointEnvConfig())
    assert run_client(cfg, "Point-v1") == 1
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["process_status"] == {"0": "failed"}
    assert "internal error: RuntimeError: something nobody foresaw" in capsys.readouterr().err
    assert "Traceback" in (tmp_path / "run" / "logs" / "client.log").read_text()


@pytest.mark.slow
def test_a_process_that_cannot_load_the_env_file_says_why_in_its_summary(tmp_path, capsys, registry):
    """An env file that imports in the launching process but not in a spawned one (it reads something only the
    launcher has): the process's summary says why it could not start, not just its exit code."""
    env_file = tmp_path / "picky_env.py"
    env_file.write_text(
        "import dataclasses, multiprocessing\n"
        "from plugrl_env_client.envs.point.point_env import PointEnv, PointEnvConfig\n"
        "from plugrl_env_client.utils.registration import register_env, register_env_config\n"
        "if multiprocessing.parent_process() is not None:\n"
        "    raise RuntimeError('only the launcher has the license server')\n"
        "@register_env_config('Picky-v1')\n"
        "@dataclasses.dataclass\n"
        "class PickyConfig(PointEnvConfig):\n"
        "    pass\n"
        "@register_env('Picky-v1')\n"
        "class PickyEnv(PointEnv):\n"
        "    pass\n")
    from plugrl_env_client.envs.discovery import discover_envs as discover

    discover([str(env_file)])
    from plugrl_env_client.envs.registry import get_spec

    cfg = config(tmp_path, env=get_spec("Picky-v1").config_cls(), num_envs=1, num_procs=2, local_policy="random",
                 num_episodes=2, env_path=(str(env_file),))
    assert run_client(cfg, "Picky-v1") == 1
    total = summary(tmp_path)
    assert set(total["process_status"].values()) == {"failed"}
    assert "could not load the env sources or the job" in total["errors"]["0"]
    assert "could not load the env sources or the job" in capsys.readouterr().err


EXITING_ENV = str(ROOT / "tests" / "_support" / "exiting_env.py")
SAYS = {
    "exit0": "called sys.exit(0) in {call}() (an env that cannot go on should raise an exception",
    "exit2": "called sys.exit(2) in {call}() (exit code 2 is how argparse refuses a command line",
    "keyboard": "raised KeyboardInterrupt in {call}() (env code raised it: no Ctrl-C or SIGTERM reached the client)",
    "base": "raised in {call}(): SimulatorAbort: the simulator gave up (a BaseException, not an Exception",
}


@pytest.mark.slow
@pytest.mark.parametrize("call, how", [("step", "exit0"), ("__init__", "exit2"), ("step", "keyboard"),
                                       ("close", "keyboard")])
def test_env_code_that_ends_the_process_fails_the_run_on_the_command_line(tmp_path, call, how):
    """sys.exit(0) in step() used to end the client with 0, nothing printed and a summary stuck at "starting";
    SystemExit(2) in __init__ (argparse refusing the client's argv) with 2 and an empty stderr; the env's own
    KeyboardInterrupt with 130, as if the user had pressed Ctrl-C."""
    result = _cli(["exiting-v1", "--env-path", EXITING_ENV, "--env.call", call, "--env.how", how, "--num-episodes",
                   "20", "--local-policy", "random", "--no-progress", "--output-dir", str(tmp_path), "--exp-name",
                   "run"], cwd=tmp_path)
    said = f"error: process 0 failed: env Exiting-v1 {SAYS[how].format(call=call)}"
    assert result.returncode == 1 and said in result.stderr, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr
    total = summary(tmp_path)
    assert total["status"] == "failed" and SAYS[how].format(call=call) in total["errors"]["0"]
    episodes = (tmp_path / "run" / "rollout/proc_000/episodes.jsonl").read_text().splitlines()
    expected = {"step": 2, "__init__": 0, "close": 20}[call]
    assert total["completed_episodes"] == len(episodes) == expected, "what came before is kept"


@pytest.mark.slow
@pytest.mark.parametrize("call, how, procs, pipeline", [
    ("step", "keyboard", 1, 1), ("reset", "base", 1, 1), ("close", "exit0", 1, 1),
    ("reset", "keyboard", 1, 1), ("close", "keyboard", 1, 1), ("step", "base", 1, 1),
    ("step", "exit0", 2, 1), ("__init__", "keyboard", 2, 1),
    ("step", "keyboard", 1, 2), ("__init__", "exit2", 1, 2),
])
def test_env_code_that_ends_the_process_is_the_envs_failure(tmp_path, capsys, call, how, procs, pipeline):
    """In one process, in spawned ones, and with pipelined groups: the run fails with the env, the call and what it
    did, in the summary and on stderr; a KeyboardInterrupt of the env's is not taken for the user's Ctrl-C."""
    failing = procs - 1  # with two processes only the second one's env fails; the first one is stopped
    episodes = 40 if procs == 1 else 1_000_000  # the healthy process must not finish its share before it is stopped
    cfg = config(tmp_path, env=ExitingConfig(call=call, how=how, process=failing), num_envs=2, num_procs=procs,
                 num_episodes=episodes, local_policy="random", runner=RunnerConfig(pipeline=pipeline, pass_proc_id=True))
    assert run_client(cfg, "Exiting-v1") == 1
    said = f"env Exiting-v1 {SAYS[how].format(call=call)}"
    assert f"error: process {failing} failed: {said}" in capsys.readouterr().err
    total = summary(tmp_path)
    assert total["status"] == "failed" and said in total["errors"][str(failing)]
    assert total["failed_processes"] == [failing]
    if procs == 2:
        assert total["process_status"]["0"] == "interrupted", "the healthy process was stopped, not failed"
    if call == "close":
        assert total["completed_episodes"] == 40, "the episodes came before the close, and are all kept"


# ---------------------------------------------------------------------------------------------- the run's folder


def _one_error_line(result: subprocess.CompletedProcess) -> str:
    """The run failed with one ``error:`` line on stderr and nothing else there (no traceback, no logging noise)."""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 1, (result.returncode, result.stderr)
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


@pytest.mark.slow
@pytest.mark.parametrize("exp_name", ["../escape", "a/b", "..", ".", "<absolute>"])
def test_an_exp_name_that_is_a_path_is_refused(tmp_path, exp_name):
    """--exp-name ../escape used to write the run outside --output-dir."""
    out = tmp_path / "out"
    exp_name = str(tmp_path / "escape") if exp_name == "<absolute>" else exp_name
    result = _cli(["point-v1", "--local-policy", "random", "--num-episodes", "1", "--output-dir", str(out),
                   "--exp-name", exp_name], cwd=tmp_path)
    line = _one_error_line(result)
    assert f"--exp-name {exp_name!r} must be a folder name" in line and "--output-dir" in line, line
    assert not out.exists() and not (tmp_path / "escape").exists(), "nothing is written"


@pytest.mark.slow
@pytest.mark.parametrize("flags", [["--server-port", "0"], ["--server-url", "ws://127.0.0.1:0"]])
def test_port_0_of_an_external_server_is_refused(tmp_path, flags):
    """--server-port 0 without --local-policy used to wait for ever for ws://127.0.0.1:0."""
    result = _cli(["point-v1", *flags, "--output-dir", str(tmp_path / "out")], cwd=tmp_path)
    line = _one_error_line(result)
    assert f"{' '.join(flags)}: the server's port must be from 1 to 65535" in line, line
    assert "--local-policy random" in line


def test_port_0_with_the_embedded_server_is_any_free_port(tmp_path):
    cfg = config(tmp_path, server_port=0, local_policy="random", num_episodes=1, runner=RunnerConfig(max_episode_steps=3))
    assert run_client(cfg, "Point-v1") == 0


@pytest.mark.slow
@pytest.mark.parametrize("where", ["file", "under-a-file"])
def test_an_output_dir_that_is_a_file_is_one_error_line(tmp_path, where):
    """It used to be a NotADirectoryError / FileExistsError traceback."""
    (tmp_path / "afile").write_text("not a folder\n")
    output_dir = tmp_path / "afile" if where == "file" else tmp_path / "afile" / "runs"
    result = _cli(["point-v1", "--local-policy", "random", "--num-episodes", "1", "--output-dir", str(output_dir)],
                  cwd=tmp_path)
    line = _one_error_line(result)
    assert f"--output-dir {output_dir}: cannot write the run folder: {tmp_path / 'afile'} is a file, not a folder" in line
    assert (tmp_path / "afile").read_text() == "not a folder\n"


def test_an_output_dir_on_a_read_only_disk_is_one_error_line(tmp_path):
    """It used to be an ``OSError: [Errno 30]`` traceback."""
    from small_disk import small_tmpfs

    with small_tmpfs(tmp_path / "ro", "100k", read_only=True) as ro:
        result = _cli(["point-v1", "--local-policy", "random", "--num-episodes", "1", "--output-dir", str(ro),
                       "--exp-name", "run"], cwd=tmp_path)
    line = _one_error_line(result)
    assert f"cannot write the run folder: {ro / 'run'} is on a read-only file system" in line, line
    assert "pick another --output-dir" in line


def test_an_output_dir_with_no_room_for_the_run_folder_is_one_error_line(tmp_path):
    from small_disk import small_tmpfs

    with small_tmpfs(tmp_path / "tiny", "16k") as tiny:
        result = _cli(["point-v1", "--local-policy", "random", "--num-episodes", "1", "--num-procs", "2",
                       "--output-dir", str(tiny), "--exp-name", "run"], cwd=tmp_path)
    line = _one_error_line(result)
    assert f"cannot write the run folder: no space left on device in {tiny / 'run'}" in line, line


@pytest.mark.slow
@pytest.mark.parametrize("procs", [1, 2])
def test_a_full_disk_stops_the_run_and_loses_nothing_written(tmp_path, procs):
    """On a 200 KiB disk that fills during the run: it used to be a thousand lines of tracebacks and ``--- Logging
    error ---`` blocks and no summary.json. Now the run stops, every episode line is whole and counted in the summary,
    and one message names the folder."""
    from small_disk import small_tmpfs

    with small_tmpfs(tmp_path / "disk", "200k") as disk:
        result = _cli(["point-v1", "--local-policy", "random", "--num-episodes", "1000000", "--num-envs", "32",
                       "--num-procs", str(procs), "--no-progress", "--output-dir", str(disk), "--exp-name", "run"],
                      cwd=tmp_path)
        line = _one_error_line(result)
        assert f"error: no space left on device in {disk / 'run'} (writing rollout/proc_" in line, line
        assert "every episode written before is whole" in line
        assert "Logging error" not in result.stdout + result.stderr and "Traceback" not in result.stdout
        lines = []
        for pid in range(procs):
            text = (disk / "run" / f"rollout/proc_{pid:03d}/episodes.jsonl").read_text()
            assert text == "" or text.endswith("\n"), "no line is cut short"
            lines += [json.loads(line) for line in text.splitlines()]
            assert json.loads((disk / "run" / f"rollout/proc_{pid:03d}/manifest.json").read_text())
        total = json.loads((disk / "run" / "summary.json").read_text())
        assert not (disk / "run" / ".plugrl-space-reserve").exists(), "the reserve is given back"
    assert total["completed_episodes"] == len(lines) > 0, "the summary counts every episode on disk"
    assert total["status"] == "failed" and set(total["failed_processes"]) == set(range(procs))
    assert "no space left on device" in total["errors"]["0"]
    assert f"Point-v1: {len(lines)} episodes" in result.stdout


@pytest.mark.slow
def test_recorder_files_that_fill_the_disk_stop_the_run_with_one_message(tmp_path):
    """Sampled images and full rollouts of every episode on a 1 MiB disk: the recorder's writer thread used to log a
    traceback per file and episode (about a thousand lines). Now the run stops with the one message, the recorder says
    once how many recorded episodes it could not write, and every episode line is whole and counted."""
    from small_disk import small_tmpfs

    with small_tmpfs(tmp_path / "disk", "1m") as disk:
        result = _cli(["dummy-v1", "--local-policy", "random", "--num-episodes", "1000000", "--num-envs", "4",
                       "--recorder.episode-freq", "1", "--recorder.record-full-rollout", "--no-progress",
                       "--output-dir", str(disk), "--exp-name", "run"], cwd=tmp_path)
        assert result.returncode == 1, result.stderr
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert f"error: no space left on device in {disk / 'run'} (writing rollout/proc_000/" in lines[-1], lines
        assert all(line.startswith("WARNING: recorder: ") for line in lines[:-1]) and len(lines) <= 4, lines
        assert "Traceback" not in result.stdout + result.stderr, result.stderr
        text = (disk / "run" / "rollout/proc_000/episodes.jsonl").read_text()
        assert text == "" or text.endswith("\n"), "no line is cut short"
        manifest = json.loads((disk / "run" / "rollout/proc_000/manifest.json").read_text())
        total = json.loads((disk / "run" / "summary.json").read_text())
    assert total["completed_episodes"] == len(text.splitlines()) > 0
    assert total["status"] == "failed"
    recorder = manifest.get("recorder", manifest)
    assert recorder["errors"] and "no space left on device" in recorder["errors"][0], manifest


CHDIR_ENV = Path(__file__).parent / "_support" / "chdir_env.py"


@pytest.mark.slow
@pytest.mark.parametrize("procs", [1, 2])
@pytest.mark.parametrize("when", ["import", "init"])
def test_an_env_that_changes_the_working_folder_does_not_move_the_runs_outputs(tmp_path, when, procs):
    """An env file given by a relative --env-path that chdirs as it is imported, or in its constructor: the run's
    outputs all go to the --output-dir the command was given, relative to where it was started, whole (and the
    spawned processes still find the env file)."""
    start, elsewhere = tmp_path / "start", tmp_path / "elsewhere"
    start.mkdir()
    elsewhere.mkdir()
    (start / "chdir_env.py").write_text(CHDIR_ENV.read_text())
    env = {k: v for k, v in os.environ.items() if k != "PLUGRL_TEST_CHDIR_AT_IMPORT"}
    if when == "import":
        env["PLUGRL_TEST_CHDIR_AT_IMPORT"] = str(elsewhere)
    chdir = ["--env.chdir-to", str(elsewhere)] if when == "init" else []
    done = subprocess.run(
        [sys.executable, "-m", "plugrl_env_client", "chdirpoint-v1", "--env-path", "chdir_env.py", *chdir,
         "--local-policy", "random", "--num-episodes", "4", "--num-procs", str(procs), "--output-dir", "runs",
         "--exp-name", "run", "--no-progress"],
        cwd=start, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    run = start / "runs" / "run"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["completed_episodes"] == 4, summary
    lines = [line for f in sorted(run.glob("rollout/proc_*/episodes.jsonl")) for line in f.read_text().splitlines()]
    assert len(lines) == 4
    assert (run / "logs" / "client.log").stat().st_size > 0
    assert json.loads((run / "client_config.json").read_text())["output_dir"] == str(start / "runs")
    assert not any(elsewhere.iterdir()), f"outputs under the env's folder: {sorted(elsewhere.rglob('*'))}"


def test_readme_example_policy_is_the_file_on_disk_and_serves_a_run(tmp_path):
    text = (ROOT / "README.md").read_text()
    block = re.search(r"<!-- file: examples/steer_policy.py -->\n```python\n(.*?)```", text, re.S).group(1)
    assert block == (ROOT / "examples" / "steer_policy.py").read_text()
    result = _cli(["point-v1", "--env-path", str(ROOT / "examples/steer_policy.py"), "--local-policy", "steer",
                   "--num-envs", "4", "--num-episodes", "8", "--output-dir", str(tmp_path), "--exp-name", "s",
                   "--no-progress"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "s" / "summary.json").read_text())
    assert summary["completed_episodes"] == 8 and summary["mean_success_rate"] == 1.0, "every episode reaches the goal"
