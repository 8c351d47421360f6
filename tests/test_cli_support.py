"""How every command ends: a thread left running (an env's, typically) never keeps a finished command alive.

Each case is a real process: the command's end is the interpreter's, which a test can only watch from outside.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from children import sigint_default

LEAKY = Path(__file__).resolve().parent / "_support" / "leaky_envs.py"
WAIT_S = 60.0
"""How long a test waits for a process that should end; a process still there then is killed (and the test fails)."""


def finish(proc: subprocess.Popen[str], timeout: float = WAIT_S) -> tuple[int, str, str]:
    """Wait for ``proc`` to end; kill it if it does not (then the test fails): (exit code, stdout, stderr)."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"still running {timeout:g} s later; it printed:\n{out}\n{err}")
    return proc.returncode, out, err


def command(body: str) -> subprocess.Popen[str]:
    """A process whose command body (run by ``run_cli``) is ``body``, a function ``body()`` returning an exit code."""
    code = f"import threading, time\nfrom plugrl_env_client.cli_support import run_cli\n{body}\nrun_cli(body, [])\n"
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_a_command_that_leaves_a_thread_running_ends_with_its_code_and_names_the_thread() -> None:
    code, out, err = finish(command(
        "def body():\n"
        "    threading.Thread(target=threading.Event().wait, name='stuck-worker').start()\n"
        "    print('done')\n"
        "    return 3\n"))
    assert (code, out) == (3, "done\n")
    assert "threads still running at exit: 'stuck-worker'" in err, err


def test_a_thread_that_ends_soon_after_the_command_is_waited_for_without_a_word() -> None:
    code, out, err = finish(command(
        "def body():\n"
        "    threading.Thread(target=time.sleep, args=(0.3,), name='flusher').start()\n"
        "    return 0\n"))
    assert (code, err) == (0, "")


def test_a_command_without_threads_left_ends_as_before() -> None:
    code, out, err = finish(command("def body():\n    threading.Thread(target=time.sleep, args=(30,), daemon=True)"
                                    ".start()\n    return 2\n"))
    assert (code, err) == (2, "")


@pytest.mark.slow
@pytest.mark.parametrize("case", ["finished", "failed"])
def test_an_env_thread_never_keeps_the_client_alive_after_its_table(tmp_path: Path, case: str) -> None:
    """An env that starts a non-daemon thread and never stops it: the client prints its table, says which thread it
    leaves behind, and exits with the run's code (without the exit watchdog it never exits at all)."""
    args = ["--local-policy", "random"] if case == "finished" else ["--server-port", "9", "--connect-timeout", "0.5"]
    proc = subprocess.Popen(
        sigint_default([sys.executable, "-m", "plugrl_env_client", "lingering-v1", "--env-path", str(LEAKY),
                        "--num-envs", "2", "--num-episodes", "2", "--output-dir", str(tmp_path), "--no-progress",
                        *args]),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:  # until the table's last line
        lines.append(line)
        if line.startswith("summary: "):
            break
    table_printed = time.monotonic()
    code, out, err = finish(proc)
    took = time.monotonic() - table_printed
    assert "".join(lines).count("status        " + case) == 1, "".join(lines) + out + err
    assert code == (0 if case == "finished" else 1), err
    assert "threads still running at exit: 'sim-worker'" in err, err
    assert took < WAIT_S
    print(f"exited {took:.1f} s after its table")  # a few seconds: the grace threads get at exit
