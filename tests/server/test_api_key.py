"""``--api-key`` of the reference server: a handshake without the key gets HTTP 401 over both WebSocket libraries,
the client stops at once with a message that names ``--api-key``, the key is never printed, and a server that
other machines can reach without a key says so when it starts."""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys

import pytest
from extras import need
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from plugrl_env_client.protocol import codec, messages
from plugrl_env_client.server.cli import main
from plugrl_env_client.server.policies import PolicyConfig, make_policy
from plugrl_env_client.server.server import PolicyServer
from plugrl_env_client.server.ws_server import authorized

KEY = "s3cret-KEY-0123456789"
SERVER = [sys.executable, "-c", "from plugrl_env_client.server.cli import main; main()"]
CLIENT = [sys.executable, "-m", "plugrl_env_client", "point-v1", "--num-envs", "2", "--num-episodes", "2",
          "--runner.max-episode-steps", "5", "--no-progress", "--connect-timeout", "20"]


@pytest.fixture(params=["websockets", "picows"])
def keyed_server(request):
    if request.param == "picows":
        need("picows")
    server = PolicyServer(make_policy(PolicyConfig(action_dim=2)), host="127.0.0.1", port=0,
                          transport=request.param, api_key=KEY).start()
    yield server
    server.shutdown()


def _handshake(url: str, header: str | None):
    headers = {} if header is None else {"Authorization": header}
    return connect(url, additional_headers=headers, compression=None, proxy=None, open_timeout=10)


@pytest.mark.parametrize("header", [None, "Api-Key wrong", f"Api-Key {KEY}x", f"Bearer {KEY}", KEY, f"api-key {KEY}",
                                    "Api-Key caf\u00e9"])
def test_a_handshake_without_the_key_gets_401(keyed_server, header):
    with pytest.raises(InvalidStatus) as info:
        _handshake(keyed_server.url, header)
    response = info.value.response
    assert response.status_code == 401
    assert response.headers.get("WWW-Authenticate") == "Api-Key"
    assert KEY not in response.body.decode()
    assert keyed_server.connections == 0


@pytest.mark.parametrize("header,why", [(None, "no Authorization header"),
                                        (f"Bearer {KEY}", "an Authorization header without the Api-Key scheme"),
                                        (f"Api-Key {KEY}x", "an API key that is not this server's")])
def test_each_refused_handshake_is_logged_with_the_peer_never_the_key(keyed_server, caplog, header, why):
    with caplog.at_level(logging.WARNING), pytest.raises(InvalidStatus):
        _handshake(keyed_server.url, header)
    said = [r.getMessage() for r in caplog.records if "refused the WebSocket handshake" in r.getMessage()]
    assert len(said) == 1 and said[0].endswith(f"with HTTP 401: {why}"), said
    assert KEY not in caplog.text
    if keyed_server._server.__class__.__name__ == "_WebsocketsListener":
        assert said[0].startswith("refused the WebSocket handshake of ('127.0.0.1', "), said


def test_a_handshake_with_the_key_is_served(keyed_server):
    with _handshake(keyed_server.url, f"Api-Key {KEY}") as ws:
        meta = messages.parse_metadata(codec.unpackb(ws.recv(timeout=10)))
    assert meta.action_dim == 2


def test_authorized_compares_the_whole_header():
    assert authorized(None, []) and authorized(None, ["anything"])
    assert authorized(KEY, [f"Api-Key {KEY}"])
    assert authorized(KEY, ["Basic dXNlcjpwYXNz", f"Api-Key {KEY}"])  # another scheme beside it (a URL's user info)
    for header in ("", "Api-Key", f"Api-Key {KEY[:-1]}", f"Api-Key  {KEY}", f"Api-Key {KEY} ", "Api-Key \udcff"):
        assert not authorized(KEY, [header]), header
    assert not authorized(KEY, [])
    assert not authorized(KEY, ["Basic dXNlcjpwYXNz", "Api-Key wrong"])


@pytest.mark.parametrize("value,words", [
    ("", "--api-key is empty"),
    ("two words", "--api-key cannot travel in an HTTP header: it holds a space at character 4 of 9"),
    ("caf\u00e9", "--api-key cannot travel in an HTTP header: it holds a character that is not ASCII at character 4"),
    ("s3cret-key\r", "--api-key cannot travel in an HTTP header: it holds a carriage return (CR: a key file saved "
                     "with CR LF line ends?) at character 11 of 11"),
])
def test_a_key_that_cannot_be_sent_is_a_one_line_error(value, words, capsys):
    with pytest.raises(SystemExit) as info:
        main(["--port", "0", "--api-key", value])
    assert info.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {words}") and err.count("\n") == 1
    if value:
        assert value not in err


def _start(args: list[str], env: dict[str, str] | None = None) -> tuple[subprocess.Popen[str], int, str]:
    """The server process, its port and its listening line."""
    proc = subprocess.Popen([*SERVER, "--port", "0", "--policy.action-dim", "2", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})})
    line = proc.stdout.readline()
    found = re.search(r"listening on ws://[^:]+:(\d+)", line)
    if found is None:
        proc.kill()
        raise AssertionError(f"no listening line: {line!r} {proc.communicate(timeout=30)}")
    return proc, int(found.group(1)), line


def _stop(proc: subprocess.Popen[str]) -> tuple[str, str]:
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    return out, err


def test_a_client_without_the_right_key_stops_at_once_and_with_it_runs(tmp_path):
    """End to end, over real sockets: the server takes its key from $PLUGRL_SERVER_API_KEY; a client process with a
    wrong key or none exits 1 with the message that names --api-key (no retrying until --connect-timeout), one
    with the key collects its episodes; the key appears in no output of either side."""
    proc, port, listening = _start([], env={"PLUGRL_SERVER_API_KEY": KEY})
    try:
        client_env = {k: v for k, v in os.environ.items() if k != "PLUGRL_API_KEY"}
        runs = []
        for name, extra in (("none", []), ("wrong", ["--api-key", "not-the-key"]), ("right", ["--api-key", KEY])):
            runs.append(subprocess.run([*CLIENT, "--server-port", str(port), "--output-dir", str(tmp_path),
                                        "--exp-name", name, *extra], capture_output=True, text=True, timeout=120,
                                       env=client_env))
    finally:
        out, err = _stop(proc)
    for refused in runs[:2]:
        assert refused.returncode == 1, refused.stderr
        assert refused.stderr.startswith("error: process 0 failed: the server at ")
        assert (f"the server at ws://127.0.0.1:{port} refused the WebSocket handshake with HTTP 401; check the URL "
                "and --api-key / $PLUGRL_API_KEY") in refused.stderr
        assert "Traceback" not in refused.stderr
    assert runs[2].returncode == 0, runs[2].stderr[-3000:]
    assert (tmp_path / "right" / "summary.json").exists()
    assert "API key required" in listening
    assert KEY not in listening + out + err + runs[2].stdout + runs[2].stderr
    assert "without an API key" not in err


@pytest.mark.parametrize("keyed", [False, True])
def test_a_server_others_can_reach_warns_when_it_has_no_key(keyed):
    """Bound to every address (0.0.0.0) without a key: one warning line at start; with a key, none. The listening
    line says when a key is required."""
    proc, _, listening = _start(["--host", "0.0.0.0", *(["--api-key", KEY] if keyed else [])])
    _, err = _stop(proc)
    warnings = [line for line in err.splitlines() if "without an API key" in line]
    if keyed:
        assert warnings == [] and "API key required" in listening
    else:
        assert len(warnings) == 1
        assert "anyone who reaches this port can feed the policy; give --api-key KEY" in warnings[0]


def test_a_loopback_server_without_a_key_does_not_warn():
    proc, _, listening = _start([])
    _, err = _stop(proc)
    assert "without an API key" not in err and "API key required" not in listening
