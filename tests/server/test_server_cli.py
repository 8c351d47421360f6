"""``plugrl-run-policy-server``: bad flag values are one-line errors, and the server really serves."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import numpy as np
import pytest
from extras import need
from websockets.sync.client import connect

from plugrl_env_client.protocol import codec, messages
from plugrl_env_client.server.cli import main


@pytest.mark.parametrize(
    "args,words",
    [(["--policy.dtype", "foo"], "--policy.dtype 'foo' is not a numpy dtype"),
     (["--policy.dtype", "<U3"], "is not numeric"),
     (["--policy.action-horizon", "0"], "--policy.action-horizon) must be >= 1"),
     (["--policy.action-dim", "-1"], "--policy.action-dim must be >= 0"),
     (["--policy.latency-ms", "-5"], "--policy.latency-ms must be a finite number >= 0")],
)
def test_bad_values_exit_1_with_a_message(args, words, capsys):
    """As for every plugrl command: a value the user can fix is one line on stderr and exit code 1."""
    with pytest.raises(SystemExit) as info:
        main(args)
    assert info.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and words in err and "Traceback" not in err


def test_unknown_policy_name_is_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--policy.name", "greedy"])
    assert info.value.code == 2


@pytest.mark.slow
def test_a_taken_port_is_a_one_line_error():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run([sys.executable, "-c", "from plugrl_env_client.server.cli import main; main()",
                               "--port", str(port)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith("error: ") and "Traceback" not in done.stderr


def test_version_is_printed_as_by_every_command(capsys):
    from plugrl_env_client.version import __version__

    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0 and capsys.readouterr().out.strip() == f"plugrl-env-client {__version__}"


@pytest.mark.slow
def test_serves_int_actions_from_the_command_line():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-c", "from plugrl_env_client.server.cli import main; main()", "--port", str(port),
           "--policy.dtype", "int64", "--policy.action-dim", "0", "--policy.low", "0", "--policy.high", "2"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert f"listening on ws://127.0.0.1:{port}" in proc.stdout.readline()
        with connect(f"ws://127.0.0.1:{port}", compression=None, proxy=None) as ws:
            meta = messages.parse_metadata(codec.unpackb(ws.recv(timeout=10)))
            assert meta.action_dim == 0 and meta.action_horizon == 4
            ids = np.arange(5, dtype=np.int64)
            obs = {"images": {}, "states": {"x": np.zeros((5, 1))}, "text": np.array(["a"] * 5)}
            ws.send(codec.packb(messages.InferRequest(obs, ids, np.zeros(5, np.int64)).message()))
            reply = messages.parse_action(codec.unpackb(ws.recv(timeout=10)), ids)
        assert reply.actions.shape == (4, 5) and reply.actions.dtype == np.int64
        assert set(np.unique(reply.actions)) <= {0, 1, 2}
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.mark.slow
def test_serves_over_picows_with_latency_from_the_command_line():
    need("picows")
    cmd = [sys.executable, "-c", "from plugrl_env_client.server.cli import main; main()", "--port", "0",
           "--transport", "picows", "--policy.latency-ms", "300", "--policy.action-dim", "2"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = proc.stdout.readline()
        assert "latency=300 ms, picows" in line, line
        url = line.rsplit(" ", 1)[1].strip()
        with connect(url, compression=None, max_size=None, proxy=None) as ws:
            messages.parse_metadata(codec.unpackb(ws.recv(timeout=10)))
            ids = np.arange(3, dtype=np.int64)
            obs = {"images": {}, "states": {"x": np.zeros((3, 1))}, "text": np.array(["a"] * 3)}
            start = time.monotonic()
            ws.send(codec.packb(messages.InferRequest(obs, ids, np.zeros(3, np.int64)).message()))
            reply = messages.parse_action(codec.unpackb(ws.recv(timeout=10)), ids)
            assert time.monotonic() - start >= 0.3
        assert reply.actions.shape == (4, 3, 2)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
