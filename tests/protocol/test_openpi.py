"""openpi's wire protocol from the client's side, over real sockets on 127.0.0.1: the client against the real
``openpi-server`` package serving a scripted policy (in a child with openpi's own packages, :mod:`openpi_site`),
and against hostile openpi servers written here with websockets (a traceback frame and a 1011 close, a chunk of the
wrong shape, a reply without ``actions``, no metadata), which end the run with a clear error, never a hang."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import openpi_env  # noqa: F401  (registers OpenpiCams-v1)
import pytest
from doc_commands import free_port
from openpi_pixels import LENGTH
from openpi_site import install_openpi, python_path_with
from waiting import wait_until

from plugrl_env_client.app import run_client
from plugrl_env_client.config import ClientConfig, ConnectionConfig, RunnerConfig
from plugrl_env_client.connection_flags import OpenpiConfig
from plugrl_env_client.envs import discover_envs
from plugrl_env_client.protocol import codec

discover_envs()  # Point-v1
SUPPORT = Path(__file__).parents[1] / "_support"


@pytest.fixture(scope="module")
def openpi_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return install_openpi(tmp_path_factory.mktemp("openpi-site"))


def start_openpi_server(site: Path, log: Path, horizon: int = 10) -> tuple[subprocess.Popen, str]:
    """The real openpi server with the scripted policy, in a child; its URL once it listens."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(SUPPORT / "openpi_scripted_server.py"), str(port), str(log),
                             str(horizon)], env={"PYTHONPATH": python_path_with(site), "PATH": "/usr/bin:/bin"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    wait_until(lambda: proc.stdout.readline().startswith("serving"), 60, "the openpi server listening", proc=proc)
    return proc, f"ws://127.0.0.1:{port}"


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()


def openpi_run(tmp_path: Path, urls: tuple[str, ...], **kwargs) -> ClientConfig:
    fields = dict(num_envs=4, num_episodes=4, output_dir=tmp_path / "runs", exp_name="run", progress=False,
                  server_url=urls, connection=ConnectionConfig(protocol="openpi", connect_timeout=30),
                  openpi=OpenpiConfig(preset="libero"), runner=RunnerConfig(replan_steps=5))
    fields.update(kwargs)
    return ClientConfig(**fields)


@pytest.mark.slow
def test_the_client_runs_episodes_against_openpis_own_server(openpi_site: Path, tmp_path: Path) -> None:
    """Two replicas of openpi's server: 4 envs over 4 connections spread over both; every request carries the
    libero preset's keys, images resized exactly as openpi's client resizes them, the instruction as prompt; the
    first 5 steps of each 10-step chunk are executed (reward = the first action component, 0.5)."""
    logs = [tmp_path / "a.jsonl", tmp_path / "b.jsonl"]
    servers = [start_openpi_server(openpi_site, log) for log in logs]
    try:
        assert run_client(openpi_run(tmp_path, tuple(url for _, url in servers)), "OpenpiCams-v1") == 0
    finally:
        for proc, _ in servers:
            stop(proc)
    summary = json.loads((tmp_path / "runs/run/summary.json").read_text())
    assert summary["completed_episodes"] == 4 and summary["protocol"] == "openpi"
    assert summary["mean_return"] == pytest.approx(0.5 * LENGTH) and summary["mean_length"] == LENGTH
    seen = [json.loads(line) for log in logs for line in log.read_text().splitlines()]
    assert all(log.read_text() for log in logs), "both replicas served requests"
    assert {tuple(s["keys"]) for s in seen} == {("observation/image", "observation/state", "observation/wrist_image",
                                                "prompt")}
    assert all(s["image"] == [[224, 224, 3], "|u1"] and s["image_as_openpi"] and s["wrist_as_openpi"]
               and s["prompt_ok"] for s in seen), seen[:3]
    # a request every 5 steps of each env's 12-step episode (steps 0, 5, 10), one env per request
    assert sorted(s["step"] for s in seen if s["row"] == 0) == [0, 5, 10]
    assert summary["timing"]["server_timed_replies"] == len(seen) == summary["timing"]["infer_calls"]
    assert summary["timing"]["server_infer_s"] > 0


# ------------------------------------------------------------------------------------------ hostile servers


def point_run(tmp_path: Path, port: int, **connection) -> ClientConfig:
    return ClientConfig(num_envs=2, num_episodes=2, output_dir=tmp_path / "runs", exp_name="run", progress=False,
                        server_url=(f"ws://127.0.0.1:{port}",),
                        connection=ConnectionConfig(protocol="openpi", **connection))


def answer(conn, reply) -> None:
    """Metadata, then ``reply(request)`` for every request until the client leaves."""
    conn.send({})
    while True:
        request = codec.unpackb(conn.ws.recv())
        conn.received.append(request)
        reply(conn, request)


@pytest.mark.slow
@pytest.mark.parametrize("reply, expected", [
    (lambda conn, request: (conn.ws.send("Traceback (most recent call last):\n  File \"policy.py\", line 3\n"
                                         "ValueError: the model ran out of memory\n"),
                            conn.ws.close(1011, "Internal server error. Traceback included in previous frame.")),
     "its traceback ends: 'ValueError: the model ran out of memory'"),
    (lambda conn, request: conn.send({"actions": np.zeros((10, 3), np.float32)}),
     "Expected action shape tail (2,), got (3,)"),
    (lambda conn, request: conn.send({"action": np.zeros((10, 2), np.float32)}),
     "the openpi server's reply has no 'actions' (it holds ['action'])"),
], ids=["traceback", "wrong-shape", "no-actions"])
def test_a_hostile_openpi_server_ends_the_run_with_a_clear_error(harness, tmp_path, capsys, reply, expected):
    server = harness(lambda conn: answer(conn, reply))
    assert run_client(point_run(tmp_path, server.port), "Point-v1") == 1
    err = capsys.readouterr().err
    assert expected in err, err
    request = server.connections[0].received[0]
    assert set(request) == {"images", "states", "prompt"} and request["images"] == {}, "the observation as it is"
    assert request["states"]["pos"].shape == (2,) and request["prompt"] == "move to the goal", "one env's row"


@pytest.mark.slow
def test_a_server_that_sends_no_metadata_is_named_within_the_connect_timeout(harness, tmp_path, capsys):
    server = harness(lambda conn: conn.ws.recv())  # accepts, says nothing
    assert run_client(point_run(tmp_path, server.port, connect_timeout=1.0), "Point-v1") == 1
    err = capsys.readouterr().err
    assert "sent no metadata within 1 s (--connect-timeout); is it an openpi policy server?" in err, err


@pytest.mark.slow
def test_a_plugrl_server_is_told_apart(harness, tmp_path, capsys):
    server = harness(lambda conn: (conn.send_metadata(protocol_version=1), conn.ws.recv()))
    assert run_client(point_run(tmp_path, server.port), "Point-v1") == 1
    assert "the server speaks PlugRL v1" in capsys.readouterr().err
