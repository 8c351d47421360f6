"""One rollout process's end: what a failing ``env.close()`` prints (one warning line; the traceback goes to the log)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from file_modules import imported

from plugrl_env_client.app import run_client
from plugrl_env_client.config import ClientConfig
from plugrl_env_client.connection_flags import ConnectionConfig
from plugrl_env_client.server.policies import PolicyConfig, make_policy
from plugrl_env_client.server.server import PolicyServer

LEAKY = Path(__file__).resolve().parents[1] / "_support" / "leaky_envs.py"
WARNING = "WARNING: env BadClose-v1 raised in close(): RuntimeError: simulator already gone"


@pytest.fixture
def leaky(registry: None) -> Iterator[None]:
    with imported(LEAKY, "leaky_envs_under_test"):
        yield


def config(tmp_path: Path, **kwargs: object) -> ClientConfig:
    values: dict = dict(output_dir=tmp_path, exp_name="run", progress=False, num_envs=2, num_episodes=2)
    return ClientConfig(**{**values, **kwargs})


def closing_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[list[str], str]:
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    log = (tmp_path / "run" / "logs" / "client.log").read_text()
    return [line for line in err.splitlines() if "raised in close()" in line], log


def test_a_failing_close_is_one_warning_line_and_its_traceback_is_in_the_log(
        leaky: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_client(config(tmp_path, local_policy="random"), "BadClose-v1") == 0
    lines, log = closing_output(tmp_path, capsys)
    assert lines == [f"{WARNING} (the run's results are written; the traceback is in the run's logs/client.log)"], lines
    assert "Traceback (most recent call last)" in log and 'raise RuntimeError("simulator already gone")' in log


@pytest.mark.slow
def test_a_failing_close_in_spawned_processes_is_one_warning_line_each(leaky: None, tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    server = PolicyServer(make_policy(PolicyConfig(action_dim=2)), host="127.0.0.1", port=0).start()
    try:
        cfg = config(tmp_path, num_procs=2, env_path=[str(LEAKY)], server_port=server.port)
        assert run_client(cfg, "BadClose-v1") == 0
    finally:
        server.shutdown()
    lines, log = closing_output(tmp_path, capsys)
    assert len(lines) == 2 and all(line.startswith(WARNING) for line in lines), lines
    assert log.count("Traceback (most recent call last)") == 2


@pytest.mark.slow
def test_a_server_that_never_answers_is_said_with_a_command_that_starts_one(registry: None, tmp_path: Path,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """The session raises a bare ServerUnreachable; the warning while waiting and the error end with what the user
    can do, in the env's terms (its action space's server command, the embedded policy's flag)."""
    with socket.socket() as s:  # a port where nothing listens
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = config(tmp_path, num_episodes=1, server_port=port, connection=ConnectionConfig(connect_timeout=1))
    assert run_client(cfg, "Dummy-v1") == 1
    err = capsys.readouterr().err
    url = f"ws://127.0.0.1:{port}"
    waiting = [line for line in err.splitlines() if f"waiting for a policy server at {url} (" in line]
    assert len(waiting) == 1 and waiting[0].endswith(
        f"Start one with `plugrl-run-policy-server --port {port} --policy.action-dim 7 --policy.dtype float32`, or run with "
        "`--local-policy random` to use the embedded one."), err
    assert (f"no policy server answered at {url} within 1 s (--connect-timeout); start one with "
            f"`plugrl-run-policy-server --port {port} --policy.action-dim 7 --policy.dtype float32` or use `--local-policy random`") in err, err


def test_a_run_has_one_episode_per_start_seed_or_its_num_episodes_the_fewer_when_both():
    from plugrl_env_client.config import RunnerConfig
    from plugrl_env_client.launch.process import episodes_of_run

    def of(num_episodes: int | None, seeds: tuple[int, ...]) -> int | None:
        return episodes_of_run(ClientConfig(num_episodes=num_episodes, runner=RunnerConfig(start_seeds=seeds)))

    assert of(None, ()) is None
    assert of(7, ()) == 7
    assert of(None, (4, 5, 6)) == 3
    assert of(2, (4, 5, 6)) == 2 and of(9, (4, 5, 6)) == 3
