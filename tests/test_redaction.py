"""The one rule for secrets: URL passwords and ``--api-key`` values never show, everything else stays as it was."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from extras import need

from plugrl_env_client.redaction import REDACTED, redact_argv, redact_text, redact_url
from plugrl_env_client.server.policies import PolicyConfig, make_policy
from plugrl_env_client.server.server import PolicyServer


@pytest.mark.parametrize("url, shown", [
    ("ws://user:secret@127.0.0.1:8000", "ws://user:***@127.0.0.1:8000"),
    ("wss://user:secret@host.example/path?q=1", "wss://user:***@host.example/path?q=1"),
    ("ws://:secret@host:1", "ws://:***@host:1"),
    ("ws://user:p@ss@host:1", "ws://user:***@host:1"),  # a raw '@' in the password: split at the last one
    ("ws://user:secret@[::1]:8000", "ws://user:***@[::1]:8000"),
    ("ws://user@host:1", "ws://***@host:1"),  # user info without a password: may be a token
    ("ws://host:1/path", "ws://host:1/path"),  # no user info: nothing to hide
    ("ws://127.0.0.1:8000", "ws://127.0.0.1:8000"),
    ("ws://user:secret@host:notaport", "ws://user:***@host:notaport"),  # unparsable, still hidden
])
def test_redact_url_hides_the_password_and_keeps_the_rest(url, shown):
    assert redact_url(url) == shown


def test_redact_text_hides_every_url_password_in_a_message():
    text = ("waiting for a policy server at ws://user:secret@127.0.0.1:9 (refused); "
            "invalid server URL 'ws://a:b@c:x': ws://a:b@c:x isn't a valid URI")
    shown = redact_text(text)
    assert "secret" not in shown and ":b@" not in shown
    assert shown.startswith("waiting for a policy server at ws://user:***@127.0.0.1:9 (refused)")
    assert "'ws://a:***@c:x'" in shown
    assert redact_text("no URL here: host:8000, a@b, x:y@z") == "no URL here: host:8000, a@b, x:y@z"


def test_redact_text_hides_a_token_given_as_a_urls_user_name():
    shown = redact_text("no policy server answered at wss://tok3n@gpu.example:8000/ws within 1 s; ws://h:1 too")
    assert shown == "no policy server answered at wss://***@gpu.example:8000/ws within 1 s; ws://h:1 too"


def test_redact_argv_hides_api_key_values_in_both_spellings_and_url_passwords():
    argv = ["plugrl-run-env-client", "point-v1", "--api-key", "K1", "--api-key=K2", "--api_key", "K3",
            "--server-url", "ws://u:pw@h:1", "--server-url=ws://u:pw2@h:1", "--num-envs", "2"]
    shown = redact_argv(argv)
    assert shown == ["plugrl-run-env-client", "point-v1", "--api-key", REDACTED, f"--api-key={REDACTED}",
                     "--api_key", REDACTED, "--server-url", "ws://u:***@h:1", "--server-url=ws://u:***@h:1",
                     "--num-envs", "2"]
    assert argv[3] == "K1", "the caller's list is left as it was"


def test_redact_argv_leaves_other_flags_and_a_trailing_flag_alone():
    assert redact_argv(["x", "--api-keys", "v", "--num-envs", "4"]) == ["x", "--api-keys", "v", "--num-envs", "4"]
    assert redact_argv(["x", "--api-key"]) == ["x", "--api-key"]


# ------------------------------------------------------------------------------------------------ whole runs

KEY = "k3y-SECRET-0123456789"
URL_PASSWORD = "pw-SECRET-9876543210"


@pytest.fixture
def server() -> Iterator[PolicyServer]:
    """The reference server on a free 127.0.0.1 port, for Point-v1's 2-d actions."""
    made = PolicyServer(make_policy(PolicyConfig(action_dim=2)), host="127.0.0.1", port=0).start()
    yield made
    made.shutdown()


def run_cli(tmp_path: Path, *flags: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``plugrl-run-env-client point-v1 <flags>`` as a user runs it, into ``tmp_path/run``."""
    cmd = [sys.executable, "-m", "plugrl_env_client", "point-v1", "--num-envs", "2", "--no-progress",
           "--output-dir", str(tmp_path), "--exp-name", "run", "--runner.max-episode-steps", "5", *flags]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180, env={**os.environ, **(env or {})})


def assert_no_secret_anywhere(run: Path, done: subprocess.CompletedProcess, *secrets: str) -> list[Path]:
    """Not one of ``secrets`` in any file under ``run`` (read as bytes) nor in the command's output; the files."""
    files = [p for p in run.rglob("*") if p.is_file()]
    assert files
    for path in files:
        data = path.read_bytes()
        for secret in secrets:
            assert secret.encode() not in data, f"{secret} in {path}"
    for secret in secrets:
        assert secret not in done.stdout and secret not in done.stderr, (secret, done.stdout, done.stderr)
    return files


def manifest_command(run: Path, proc: int) -> list[str]:
    return json.loads((run / f"rollout/proc_{proc:03d}/manifest.json").read_text())["command_line"]


@pytest.mark.parametrize("spelling", ["--api-key KEY", "--api-key=KEY"])
def test_a_two_process_run_writes_and_prints_neither_the_key_nor_the_url_password(server, tmp_path, spelling):
    """--api-key (both spellings) and ws://user:password@ in --server-url, against a real server, with every output
    on (TensorBoard's event files included): the run connects, and no file of the run folder nor the terminal holds
    either secret."""
    need("tensorboardX")
    key_flags = spelling.replace("KEY", KEY).split()
    url = f"ws://user:{URL_PASSWORD}@127.0.0.1:{server.port}"
    done = run_cli(tmp_path, *key_flags, "--num-procs", "2", "--num-episodes", "4", "--server-url", url,
                   "--tracking", "tensorboard")
    assert done.returncode == 0, (done.stdout, done.stderr)
    run = tmp_path / "run"
    files = assert_no_secret_anywhere(run, done, KEY, URL_PASSWORD)
    assert any("tensorboard" in p.parts for p in files) and (run / "logs" / "client.log") in files
    assert json.loads((run / "summary.json").read_text())["completed_episodes"] == 4
    shown_url = f"ws://user:{REDACTED}@127.0.0.1:{server.port}"
    assert json.loads((run / "client_config.json").read_text())["server_url"] == shown_url
    for proc in (0, 1):
        command = manifest_command(run, proc)
        assert shown_url in command and "--server-url" in command
        assert (["--api-key", REDACTED] == command[command.index("--api-key"):][:2] if len(key_flags) == 2
                else f"--api-key={REDACTED}" in command), command
    assert f"server {shown_url}" in (run / "logs" / "client.log").read_text()


def test_the_key_from_the_environment_is_used_and_not_written(server, tmp_path):
    """$PLUGRL_API_KEY: sent (the run connects) and written nowhere."""
    done = run_cli(tmp_path, "--num-episodes", "2", "--server-port", str(server.port), env={"PLUGRL_API_KEY": KEY})
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert_no_secret_anywhere(tmp_path / "run", done, KEY)
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["completed_episodes"] == 2


def test_messages_about_a_server_that_never_answers_do_not_show_the_url_password(tmp_path):
    """The warning while waiting and the error when --connect-timeout passes name the server by its URL: without the
    password, on the terminal and in every file."""
    with socket.socket() as s:  # a port where nothing listens
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"ws://user:{URL_PASSWORD}@127.0.0.1:{port}"
    done = run_cli(tmp_path, "--num-episodes", "1", "--server-url", url, "--connect-timeout", "1")
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert_no_secret_anywhere(tmp_path / "run", done, URL_PASSWORD)
    shown = f"ws://user:{REDACTED}@127.0.0.1:{port}"
    assert f"waiting for a policy server at {shown}" in done.stderr, done.stderr
    assert f"no policy server answered at {shown} within 1 s" in done.stderr, done.stderr


def test_an_invalid_server_url_is_refused_without_its_password(tmp_path):
    done = run_cli(tmp_path, "--num-episodes", "1", "--server-url", f"ws://user:{URL_PASSWORD}@127.0.0.1:0")
    assert done.returncode != 0
    assert_no_secret_anywhere(tmp_path / "run", done, URL_PASSWORD) if (tmp_path / "run").exists() else None
    assert URL_PASSWORD not in done.stderr + done.stdout
    assert f"--server-url ws://user:{REDACTED}@127.0.0.1:0: the server's port must be from 1 to 65535" in done.stderr


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="needs Linux's /proc")
def test_a_process_hides_its_secrets_from_the_process_list():
    """What ``ps`` and Ray (a driver's job entrypoint) read, ``/proc/<pid>/cmdline``, loses the key and the URL
    password; sys.argv is the redacted command line."""
    code = ("import json, sys; from plugrl_env_client.redaction import hide_secrets_of_this_process as h; "
            "before = open('/proc/self/cmdline', 'rb').read(); changed = h(); "
            "after = open('/proc/self/cmdline', 'rb').read(); "
            "print(json.dumps([changed, sys.argv, len(before), after.decode()]))")
    args = ["--api-key", KEY, f"--api-key={KEY}", "--server-url", f"ws://u:{URL_PASSWORD}@h:1", "--x", "1"]
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    changed, argv, size, after = json.loads(done.stdout)
    assert changed is True and size == len(after.encode())
    assert KEY not in after and URL_PASSWORD not in after
    assert after.rstrip("\0").split("\0")[-7:] == [
        "--api-key", "*" * len(KEY), "--api-key=" + "*" * len(KEY), "--server-url",
        "ws://u:" + "*" * len(URL_PASSWORD) + "@h:1", "--x", "1"]
    assert argv[1:] == ["--api-key", REDACTED, f"--api-key={REDACTED}", "--server-url", f"ws://u:{REDACTED}@h:1",
                        "--x", "1"]


KEY_ENV = '''
import os

import gymnasium as gym
import numpy as np

from plugrl_env_client.envs.base_env import BaseEnv, BaseEnvConfig, Observation
from plugrl_env_client.utils.registration import register_env


@register_env("Quoting-v1")
class QuotingEnv(BaseEnv[BaseEnvConfig]):
    """An env whose library quotes the API key in its errors, as an HTTP library quotes a header."""

    def __init__(self, config, num_envs=1, **kwargs):
        super().__init__(config, num_envs=num_envs, **kwargs)
        self.single_action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)

    def reset(self, *, seed=None, options=None):
        return Observation(states={"x": np.zeros((self.num_envs, 2))}), {}

    def step(self, actions):
        key = os.environ["PLUGRL_API_KEY"]
        raise RuntimeError(f"invalid Authorization header: Api-Key {key}; the token {key} was refused")
'''

SECRET = "k3y-Secret-0123456789"


def _run_files_and_stderr(tmp_path: Path, env_key: str, env: str = "point-v1",
                          extra: tuple[str, ...] = ()) -> tuple[subprocess.CompletedProcess, list[Path]]:
    out = tmp_path / "runs"
    result = subprocess.run([sys.executable, "-m", "plugrl_env_client", env, "--local-policy", "random",
                             "--num-envs", "2", "--num-episodes", "2", "--runner.max-episode-steps", "5",
                             "--no-progress", "--output-dir", str(out), *extra],
                            capture_output=True, text=True, timeout=120, cwd=tmp_path,
                            env={**os.environ, "PLUGRL_API_KEY": env_key})
    return result, sorted(p for p in out.rglob("*") if p.is_file()) if out.exists() else []


@pytest.mark.slow
def test_a_key_read_with_its_cr_is_refused_at_start_without_showing_it(tmp_path):
    result, files = _run_files_and_stderr(tmp_path, SECRET + "\r")
    assert result.returncode == 1, result.stderr
    assert result.stderr == ("error: the API key in $PLUGRL_API_KEY cannot be sent in the handshake's Authorization "
                             "header: it holds a carriage return (CR: a key file saved with CR LF line ends?) at "
                             f"character {len(SECRET) + 1} of {len(SECRET) + 1}; give the key alone, printable ASCII "
                             "without spaces (a key read from a file saved with CR LF line ends: remove the CR, e.g. "
                             "with tr -d '\\r')\n")
    for path in files:
        assert SECRET not in path.read_text(errors="replace"), path


@pytest.mark.slow
def test_an_exception_that_quotes_the_key_reaches_no_output_with_it(tmp_path):
    """A library's error text holding the key (after Api-Key, and alone) fails the run: stderr, the log with its
    traceback and both summaries say what failed, with the key hidden."""
    (tmp_path / "quoting_env.py").write_text(KEY_ENV)
    result, files = _run_files_and_stderr(tmp_path, SECRET, "quoting-v1",
                                          ("--env-path", str(tmp_path / "quoting_env.py")))
    assert result.returncode == 1, result.stderr
    assert "RuntimeError: invalid Authorization header: Api-Key ***; the token *** was refused" in result.stderr
    assert SECRET not in result.stderr + result.stdout
    names = {p.name for p in files}
    assert {"summary.json", "client.log"} <= names, names
    for path in files:
        text = path.read_text(errors="replace")
        assert SECRET not in text, path
    log = next(p for p in files if p.name == "client.log").read_text()
    assert "Traceback" in log and "the token *** was refused" in log


def test_redact_text_hides_known_keys_and_the_value_after_api_key(monkeypatch):
    monkeypatch.setenv("PLUGRL_API_KEY", SECRET + "\r\n")
    text = f"bad header: 'Api-Key {SECRET}\\r\\n' from {SECRET!r} and Api-Key other-value"
    shown = redact_text(text)
    assert SECRET not in shown and "other-value" not in shown
    assert shown == "bad header: 'Api-Key ***' from '***' and Api-Key ***"
    assert redact_text("send 'Authorization: Api-Key <key>'") == "send 'Authorization: Api-Key <key>'"
