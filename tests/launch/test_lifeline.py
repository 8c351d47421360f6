"""Children end with their parent: SIGKILL a launcher (as a scheduler's preemption or the OOM killer does) and
every process it started is gone within seconds, whatever it was doing; the lifeline's parts one by one.

Processes are followed through ``/proc`` (``tests/_support/process_tree.py``), so these tests run on Linux only.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from process_tree import command_line, descendants, kill_all, wait_all_gone
from waiting import wait_until

from plugrl_env_client.server.policies import PolicyConfig, make_policy
from plugrl_env_client.server.server import PolicyServer

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="follows processes through /proc")

SUPPORT = Path(__file__).resolve().parents[1] / "_support"
FAULTY_ENV = str(SUPPORT / "faulty_env.py")
WITHIN_S = 5.0
"""Every child of a dead launcher is gone within this (its lifeline gives it 3 s to stop)."""


def _env() -> dict[str, str]:
    paths = [str(SUPPORT), *os.environ.get("PYTHONPATH", "").split(os.pathsep)]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}


def _episodes_written(path: Path) -> bool:
    return path.exists() and path.stat().st_size > 0


def kill_and_follow(proc: subprocess.Popen, expect: int, named: tuple[str, ...] = ()) -> tuple[float, set]:
    """SIGKILL ``proc`` once it has at least ``expect`` descendants, among them one whose command line holds each of
    ``named``; (seconds until its last one was gone, those still alive after 30 s: killed here, so that none
    outlives the test)."""
    def ready() -> bool:
        below = descendants(proc.pid)
        commands = " ".join(command_line(p) for p in below)
        return len(below) >= expect and all(name in commands for name in named)

    wait_until(ready, 60, f"{expect} processes below the launcher ({', '.join(named) or 'any'})", proc=proc)
    below = descendants(proc.pid)
    proc.kill()
    proc.wait()
    waited, left = wait_all_gone(below, 30.0)
    kill_all(left)
    return waited, {command_line(p) for p in left}


@pytest.fixture
def policy_server():
    server = PolicyServer(make_policy(PolicyConfig(action_dim=2)), host="127.0.0.1", port=0).start()
    yield server
    server.shutdown()


def client(tmp_path: Path, *flags: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "plugrl_env_client", *flags, "--no-progress", "--output-dir", str(tmp_path),
           "--exp-name", "run"]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=_env())


@pytest.mark.slow
@pytest.mark.parametrize("server, start_method", [("embedded", "spawn"), ("external", "spawn"),
                                                  ("embedded", "forkserver"), ("embedded", "fork")])
def test_sigkill_of_a_two_process_launcher_ends_every_process_it_started(tmp_path, policy_server, server,
                                                                         start_method):
    """Both processes collecting, then the launcher is SIGKILLed: before, both and multiprocessing's resource
    tracker were still there 15 s later (reconnecting for ever to the embedded server that died with the launcher,
    or stepping on against an external one). With forkserver the fork server is there too; with fork only the two
    processes (and their SIGTERM used to wait for ever: they were forked while the launcher held signals)."""
    where = ["--local-policy", "random"] if server == "embedded" else ["--server-port", str(policy_server.port)]
    proc = client(tmp_path, "point-v1", "--num-procs", "2", "--num-envs", "2", "--runner.start-method", start_method,
                  *where)
    files = [tmp_path / "run" / "rollout" / f"proc_{p:03d}" / "episodes.jsonl" for p in (0, 1)]
    try:
        wait_until(lambda: all(map(_episodes_written, files)), 120, "episodes of both processes", proc=proc)
        named = ("multiprocessing.resource_tracker",) + (("forkserver",) if start_method == "forkserver" else ())
        if start_method == "fork":  # forked children need no tracker of their own
            named = ()
        waited, left = kill_and_follow(proc, expect=2 + len(named), named=named)
    finally:
        proc.kill()
        proc.wait()
    assert not left, f"still running 30 s after the launcher died: {left}"
    assert waited <= WITHIN_S, f"the launcher's processes took {waited:.1f} s to end"
    for path in files:  # what reached the launcher before it died is there, line by line
        assert all(json.loads(line)["length"] >= 1 for line in path.read_text().splitlines()[:-1])


@pytest.mark.slow
def test_sigkill_of_a_pipelined_launcher_leaves_no_process(tmp_path):
    """--runner.pipeline 2 runs its groups in the launcher itself; what it starts (the resource tracker of its
    shared counters) ends with it."""
    proc = client(tmp_path, "point-v1", "--runner.pipeline", "2", "--num-envs", "2", "--local-policy", "random")
    episodes = tmp_path / "run" / "rollout" / "proc_000" / "episodes.jsonl"
    try:
        wait_until(lambda: _episodes_written(episodes), 120, "episodes", proc=proc)
        waited, left = kill_and_follow(proc, expect=1)
    finally:
        proc.kill()
        proc.wait()
    assert not left and waited <= WITHIN_S, (waited, left)


@pytest.mark.slow
def test_a_process_deaf_to_sigterm_is_ended_once_its_grace_time_is_up(tmp_path, policy_server):
    """Process 0 hangs in a step with SIGTERM ignored (a simulator stuck in C code): its lifeline's watchdog ends
    it anyway."""
    hung = tmp_path / "hung"
    proc = client(tmp_path, "faulty-v1", "--env-path", FAULTY_ENV, "--env.fail-process", "-1", "--env.hang-process",
                  "0", "--env.hang-at-step", "3", "--env.hang-marker", str(hung), "--runner.pass-proc-id",
                  "--num-procs", "2", "--server-port", str(policy_server.port))
    try:
        wait_until(hung.exists, 120, "process 0 hanging in its step", proc=proc)
        waited, left = kill_and_follow(proc, expect=3)
    finally:
        proc.kill()
        proc.wait()
    assert not left and waited <= WITHIN_S, (waited, left)


# ------------------------------------------------------------------------------------------------ the parts


@pytest.mark.slow
@pytest.mark.parametrize("how, orderly", [("kernel", True), ("watchdog", True), ("late", True), ("deaf", False)])
def test_an_orphaned_child_stops_by_each_way(tmp_path, how, orderly):
    """``kernel``: the parent-death signal; ``watchdog``: the parent's sentinel alone (no prctl); ``late``: the
    parent died before the child set up its lifeline (the check after prctl); ``deaf``: SIGTERM ignored, ended by
    the watchdog after its grace time. Orderly: stopped by SIGTERM as by any stop, so it closes its env."""
    code = f"from lifeline_children import parent_main; parent_main({str(tmp_path)!r}, {how!r})"
    parent = subprocess.Popen([sys.executable, "-c", code], env=_env(), stderr=subprocess.PIPE, text=True)
    try:
        wait_until((tmp_path / "child.pid").exists, 60, "the child's start", proc=parent)
        if how != "late":
            wait_until((tmp_path / "armed").exists, 60, "the child's lifeline", proc=parent)
        child = descendants(parent.pid)
        assert len(child) >= 1, "the child (and the resource tracker, if any)"
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        killed = time.monotonic()
        if how == "late":
            (tmp_path / "go").touch()
        waited, left = wait_all_gone(child, 30.0)
        kill_all(left)
    finally:
        parent.kill()
        parent.wait()
    assert not left, {command_line(p) for p in left}
    assert time.monotonic() - killed <= WITHIN_S, waited
    assert (tmp_path / "stopped").exists() is orderly
