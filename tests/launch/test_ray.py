"""The Ray launcher: the same results as local processes, exact totals through actor deaths and lost nodes,
placement over nodes, clean stops on signals; and its parts that need no Ray (leases, shipped env files).

Every Ray test shares one test cluster (``ray.cluster_utils.Cluster``: a 2-CPU head node on this machine, plus
nodes that single tests add and remove). Runs connect to it with ``--ray.address``, exactly as a user's run
connects to a cluster, and disconnect at their end.

Tests that kill an actor, lose a node or signal the driver do so at a definite point of the run, never after a
time: the gated env (``tests/_support/ray_gated_env.py``) holds its processes inside a step, the test acts once
they hold, and lets them go on once the run has taken in what it did.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import pickle
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from children import sigint_default
from extras import need
from waiting import wait_until

from plugrl_env_client.app import run_client
from plugrl_env_client.config import ClientConfig, RunnerConfig
from plugrl_env_client.envs import discover_envs
from plugrl_env_client.envs import registry as env_registry
from plugrl_env_client.envs.discovery import EnvSources, user_module_name
from plugrl_env_client.errors import ConfigError
from plugrl_env_client.launch.config import RayConfig
from plugrl_env_client.launch.process import ProcessJob
from plugrl_env_client.launch.ray import sources as ray_sources
from plugrl_env_client.launch.ray.budget import Grant, LeaseBook, LeasedBudget

ray = need("ray")
from ray.cluster_utils import Cluster  # noqa: E402

from plugrl_env_client.launch.ray.placement import Demand  # noqa: E402

SUPPORT = Path(__file__).resolve().parents[1] / "_support"
GATED_ENV = str(SUPPORT / "ray_gated_env.py")
SEEDED_ENV = str(SUPPORT / "seeded_length_env.py")
DOC = Path(__file__).resolve().parents[2] / "docs" / "ray.md"
discover_envs([GATED_ENV])
NODE = {"object_store_memory": 80 * 1024**2}
FAST_HEALTH_CHECKS = {"health_check_period_ms": 500, "health_check_failure_threshold": 3,
                      "health_check_initial_delay_ms": 0}


# ------------------------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """One Ray cluster for the module: a head node with 2 CPUs and a Ray Client server (``client_port``); nodes
    are declared dead within ~2 s."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        client_port = s.getsockname()[1]
    made = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 2, "include_dashboard": False, "ray_client_server_port": client_port,
        "_system_config": FAST_HEALTH_CHECKS, **NODE})
    made.client_port = client_port  # type: ignore[attr-defined]
    try:
        yield made
    finally:
        made.shutdown()


@pytest.fixture
def extra_node(cluster: Cluster) -> Iterator[Any]:
    """Add a node to the cluster for one test (removed afterwards, if the test did not remove it)."""
    added: list[Any] = []

    def add(num_cpus: float) -> Any:
        node = cluster.add_node(num_cpus=num_cpus, **NODE)
        cluster.wait_for_nodes()
        added.append(node)
        return node

    yield add
    for node in added:
        if node in cluster.worker_nodes:
            cluster.remove_node(node)


def ray_config(tmp_path: Path, cluster: Cluster, name: str, **kwargs: Any) -> ClientConfig:
    placement = kwargs.pop("placement", "spread")
    max_restarts = kwargs.pop("max_restarts", 3)
    return ClientConfig(output_dir=tmp_path, exp_name=name, progress=False, launcher="ray",
                        ray=RayConfig(address=cluster.address, placement=placement, max_restarts=max_restarts),
                        **kwargs)


def gated_env(tmp_path: Path, **fields: Any) -> Any:
    """A config of the gated env (``tests/_support/ray_gated_env.py``) whose gate folder is ``tmp_path/gate``."""
    return env_registry.get_spec("RayGated-v1").config_cls(gate=str(tmp_path / "gate"), **fields)


def open_gate(env: Any) -> None:
    """Let every held process of the gated env go on (and later ones not hold)."""
    path = env.open_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()


def wait_for(condition: Callable[[], bool], what: str, proc: subprocess.Popen | None = None,
             timeout_s: float = 300.0) -> None:
    """Wait until ``condition`` holds: an event of the run, not a time (the timeout only keeps a broken run from
    hanging the suite). With ``proc``: fail at once, with its output, when it ends first."""
    wait_until(condition, timeout_s, what, proc=proc, poll_s=0.05)


class Step(NamedTuple):
    """Something a run does (``event`` turns true), and what the test does then."""

    what: str
    event: Callable[[], bool]
    act: Callable[[], None] = lambda: None


@dataclasses.dataclass
class Progress:
    done: int = 0
    error: str = ""


@contextlib.contextmanager
def gate_opened_after(env: Any, *steps: Step, timeout_s: float = 300.0) -> Iterator[Progress]:
    """While the block runs a run of the gated env: a thread waits for each step's event in turn and does its act,
    then opens the gate. The gate opens whatever happens (an event does not come, an act raises, the block ends
    first), so no process waits on it for ever; the yielded progress says how many steps were done, and why not
    all (a test asserts they were)."""
    ended = threading.Event()
    progress = Progress()

    def watch() -> None:
        deadline = time.monotonic() + timeout_s
        try:
            for step in steps:
                while not step.event():
                    if ended.is_set() or time.monotonic() > deadline:
                        progress.error = f"the run ended, or {timeout_s:g} s passed, before {step.what}"
                        return
                    ended.wait(0.05)
                step.act()
                progress.done += 1
        except Exception as exc:
            progress.error = f"after {step.what}: {type(exc).__name__}: {exc}"
        finally:
            open_gate(env)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield progress
    finally:
        ended.set()
        watcher.join(timeout=60)


def files_exist(*paths: Path) -> Callable[[], bool]:
    return lambda: all(p.exists() for p in paths)


def log_says(run: Path, text: str) -> Callable[[], bool]:
    log = run / "logs" / "client.log"
    return lambda: log.exists() and text in log.read_text()


def process_gone(pid: int) -> bool:
    """No process ``pid`` any more (or only its zombie)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def read(run: Path, name: str) -> Any:
    return json.loads((run / name).read_text())


def episodes(run: Path, pid: int) -> list[dict[str, Any]]:
    lines = (run / "rollout" / f"proc_{pid:03d}" / "episodes.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def without_wall_time(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in row.items() if k != "wall_time_s"} for row in rows]


# ------------------------------------------------------------------------------------------------ leases


def test_static_leases_are_the_rest_of_each_share_and_return_when_an_epoch_ends():
    book = LeaseBook(target=5, num_procs=2, split="static")
    assert book.start(0, 0) == Grant(3, final=True)
    assert book.start(1, 0) == Grant(2, final=True)
    assert book.record(0, 0) and book.record(0, 0)
    book.end(0)  # the actor died with its third episode unreported
    assert book.record(0, 0) is False, "a record of an epoch that ended does not count"
    assert book.start(0, 1) == Grant(1, final=True)
    assert book.record(0, 1)
    assert book.record(0, 1) is False, "never more than the share"
    assert book.recorded == [3, 0] and book.remaining_share(1) == 2


def test_a_resumed_runs_static_leases_are_the_rest_of_each_share():
    book = LeaseBook(10, 2, "static", recorded=[4, 2])  # shares 5 and 5, of which 4 and 2 were recorded before
    assert (book.start(0, epoch=1).total, book.start(1, epoch=1).total) == (1, 3)
    assert book.total_recorded == 6 and not book.reached


def test_a_refused_actor_gets_the_lease_of_one_that_died():
    book = LeaseBook(target=4, num_procs=2, split="shared")
    assert book.start(0, 0).total == 0 and book.start(1, 0).total == 0, "leases come on request"
    seq = 0
    while book.pool():
        seq += 1
        book.request(0, 0, seq)
    assert book.request(0, 0, seq + 1).total == 4
    refused = book.request(1, 0, 1)
    assert refused == Grant(0, final=False, answered=1)
    budget = LeasedBudget(4, Grant())
    budget._asked = 1  # as if it had asked: the answer refuses, so it waits for a push instead of asking again
    budget.update(refused)
    assert budget.claim() is False
    assert book.record(0, 0)
    pushes = book.end(0)  # process 0 died with three episodes leased and unreported
    assert set(pushes) == {1} and pushes[1].total == 2, "half the pool for the one running epoch"
    budget.update(pushes[1])
    assert [budget.claim() for _ in range(3)] == [True, True, False]


def test_shared_leases_deliver_exactly_the_target_through_random_deaths():
    """Actors claim from leases, deliver records late, and die with undelivered ones (some for good): exactly the
    target is recorded, and every episode claimed by a dead epoch is collected again by someone."""
    rng = random.Random(7)
    target, procs = 57, 4
    book = LeaseBook(target, procs, "shared")
    epochs = [0] * procs
    budgets: list[LeasedBudget] = []
    pending: list[list[int]] = [[] for _ in range(procs)]
    lost: set[int] = set()

    def asker(pid: int) -> Any:
        def ask(seq: int) -> None:
            grant = book.request(pid, epochs[pid], seq)
            if grant is not None:
                budgets[pid].update(grant)
        return ask

    for pid in range(procs):
        budgets.append(LeasedBudget(target, Grant(), ask=asker(pid)))
        budgets[pid].update(book.start(pid, 0))
    rounds = 0
    while not book.reached:
        rounds += 1
        assert rounds < 10_000
        pid = rng.choice([p for p in range(procs) if p not in lost])
        roll = rng.random()
        if roll < 0.6:
            if budgets[pid].claim(pid):
                pending[pid].append(epochs[pid])
        elif roll < 0.9:  # a batch reaches the driver
            for epoch in pending[pid]:
                assert book.record(pid, epoch)
            pending[pid].clear()
        elif roll < 0.95:  # the actor dies: what it did not deliver is lost
            pending[pid].clear()
            for other, grant in book.end(pid).items():
                budgets[other].update(grant)
            if len(lost) < procs - 1 and rng.random() < 0.3:
                lost.add(pid)  # not restarted: its lease must reach the others
                continue
            epochs[pid] += 1
            budgets[pid] = LeasedBudget(target, Grant(), ask=asker(pid))
            budgets[pid].update(book.start(pid, epochs[pid]))
        for other, grant in book.finals().items():
            budgets[other].update(grant)
        assert book.total_recorded <= target
    assert book.total_recorded == target
    assert lost, "the simulation lost some actors for good"
    assert all(b.finished(pid) for pid, b in enumerate(budgets) if pid not in lost), \
        "every running epoch learns the run is complete"


def test_leased_budget_stops_on_the_flag_and_when_the_final_lease_is_used():
    budget = LeasedBudget(3, Grant(2, final=True))
    assert budget.claim() and not budget.finished()
    assert budget.claim() and budget.finished() and budget.exhausted()
    assert budget.claim() is False
    unlimited = LeasedBudget(None, Grant())
    assert all(unlimited.claim() for _ in range(100)) and not unlimited.finished()
    unlimited.stop.set()
    assert unlimited.finished() and not unlimited.exhausted()


def test_resources_flag_is_checked():
    assert Demand.from_config(RayConfig(resources='{"sim": 2}', num_gpus_per_proc=0.5)).bundle() == {
        "CPU": 1.0, "GPU": 0.5, "sim": 2.0}
    for bad in ("sim", '{"sim": "x"}', '{"CPU": 1}', "[1]", '{"sim": -1}'):
        with pytest.raises(ConfigError, match="--ray.resources"):
            Demand.from_config(RayConfig(resources=bad))


# ------------------------------------------------------------------------------------------------ env files


def test_worker_imports_the_uploaded_copy_and_reads_the_job_with_its_classes(tmp_path, registry):
    """A node without the driver's file finds the copy Ray unpacked on its sys.path, and the job's env config
    (a class of the user's file) comes back as that copy's class."""
    driver_dir, unpacked = tmp_path / "driver" / "envs", tmp_path / "_ray_pkg_abc"
    driver_dir.mkdir(parents=True)
    source = driver_dir / "reach_env.py"
    shutil.copy(GATED_ENV, source)
    source.write_text(source.read_text().replace("RayGated-v1", "Reach-v7"))
    before = env_registry.snapshot()
    EnvSources((str(driver_dir),)).load()  # the driver imports the folder
    shipped = ray_sources.prepare(EnvSources((str(driver_dir),)))
    assert shipped.uploads == (str(driver_dir.resolve()),)
    config = env_registry.get_spec("Reach-v7").config_cls(episode_length=9)
    data = pickle.dumps(ProcessJob("Reach-v7", ClientConfig(env=config), 0, "ws://x:1"))

    env_registry.restore(before)  # now play the worker: the driver's folder is not there
    shutil.copytree(driver_dir, unpacked / "envs")
    shutil.rmtree(driver_dir)
    remap = ray_sources.load(shipped, search=[str(unpacked)])
    job = ray_sources.loads_job(data, remap)
    copy = (unpacked / "envs" / "reach_env.py").resolve()
    assert type(job.config.env).__module__ == user_module_name(copy) != user_module_name(source.resolve())
    assert job.config.env.episode_length == 9
    assert env_registry.get_spec("Reach-v7").config_cls is type(job.config.env)


def test_worker_without_the_file_says_where_it_should_come_from(tmp_path):
    source = tmp_path / "gone_env.py"
    source.write_text("X = 1\n")
    shipped = ray_sources.prepare(EnvSources((str(source),)))
    source.unlink()
    with pytest.raises(ConfigError, match="gone_env.py is not on this node"):
        ray_sources.load(shipped, search=[str(tmp_path / "elsewhere")])


# ------------------------------------------------------------------------------------------------ whole runs


@pytest.mark.slow
def test_ray_runs_give_the_local_launchers_episodes_and_aggregate(cluster, tmp_path):
    from plugrl_env_client.envs.point.point_env import PointEnvConfig

    flags = dict(env=PointEnvConfig(), num_envs=2, num_procs=2, num_episodes=6, local_policy="zero",
                 runner=RunnerConfig(max_episode_steps=20))
    assert run_client(ClientConfig(output_dir=tmp_path, exp_name="local", progress=False, **flags), "Point-v1") == 0
    assert run_client(ray_config(tmp_path, cluster, "ray", **flags), "Point-v1") == 0
    local, remote = read(tmp_path / "local", "summary.json"), read(tmp_path / "ray", "summary.json")
    for key in ("completed_episodes", "all_episodes", "status", "process_status", "mean_return"):
        assert remote[key] == local[key], key
    assert remote["completed_episodes"] == 6
    for pid in (0, 1):
        assert without_wall_time(episodes(tmp_path / "ray", pid)) == without_wall_time(episodes(tmp_path / "local", pid))
        assert read(tmp_path / "ray", f"rollout/proc_{pid:03d}/summary.json")["completed_episodes"] == 3
    nodes = read(tmp_path / "ray", "ray_nodes.json")
    assert set(nodes["processes"]) == {"0", "1"}
    assert sum(n["completed_episodes"] for n in nodes["nodes"].values()) == 6
    assert sum(n["env_steps"] for n in nodes["nodes"].values()) == remote["timing"]["env_steps"] > 0
    log = (tmp_path / "ray" / "logs" / "client.log").read_text()
    assert "[proc_000@" in log and "[proc_001@" in log, "worker log lines come home tagged with process and node"


@pytest.mark.slow
def test_ray_client_address_runs_with_uploaded_env_files(cluster, tmp_path):
    """``--ray.address ray://host:port`` (Ray Client): the same run, env file uploaded through the client."""
    cfg = ray_config(tmp_path, cluster, "run", num_envs=2, num_procs=2, num_episodes=10, local_policy="zero",
                     env_path=(GATED_ENV,), env=gated_env(tmp_path), runner=RunnerConfig(episode_split="shared"))
    cfg.ray.address = f"ray://127.0.0.1:{cluster.client_port}"
    assert run_client(cfg, "RayGated-v1") == 0
    summary = read(tmp_path / "run", "summary.json")
    assert summary["completed_episodes"] == 10 == sum(len(episodes(tmp_path / "run", p)) for p in (0, 1))
    assert summary["process_status"] == {"0": "finished", "1": "finished"}


@pytest.mark.slow
def test_env_defined_in_the_script_that_was_run_reaches_the_workers(cluster, tmp_path):
    """``python my_env.py <env-id> --launcher ray``: the workers import the script (not as ``__main__``)."""
    script = Path(__file__).resolve().parents[2] / "examples" / "reach_env.py"
    cmd = [sys.executable, str(script), "reach-v1", "--num-envs", "2", "--num-procs", "2", "--num-episodes", "4",
           "--local-policy", "random", "--output-dir", str(tmp_path), "--exp-name", "run", "--no-progress",
           "--launcher", "ray", "--ray.address", cluster.address]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, (done.stdout, done.stderr)
    summary = read(tmp_path / "run", "summary.json")
    assert summary["completed_episodes"] == 4 and summary["status"] == "finished"


@pytest.mark.slow
def test_env_code_that_calls_sys_exit_in_an_actor_fails_the_run_with_its_message(cluster, tmp_path):
    """In an actor the rollout runs in a thread, where a SystemExit would only end that thread: the process fails
    with the env's message, the other one is stopped, and the run exits 1."""
    cfg = ray_config(tmp_path, cluster, "run", num_envs=2, num_procs=2, num_episodes=40, local_policy="zero",
                     env_path=(GATED_ENV,), env=gated_env(tmp_path, exit_process=1, kill_after_steps=4),
                     runner=RunnerConfig(pass_proc_id=True))
    assert run_client(cfg, "RayGated-v1") == 1
    summary = read(tmp_path / "run", "summary.json")
    assert summary["status"] == "failed" and summary["failed_processes"] == [1]
    assert summary["errors"]["1"].startswith("env RayGated-v1 called sys.exit(0) in step()"), summary["errors"]


@pytest.mark.slow
def test_a_full_disk_fails_a_ray_run_once_and_keeps_every_episode_written(cluster, tmp_path):
    """The actors write into the same run folder as local processes do: a disk that fills is an output failure of
    the process, not an actor death to restart, and the run ends with the summary counting every line on disk."""
    from small_disk import small_tmpfs

    from plugrl_env_client.envs.point.point_env import PointEnvConfig

    with small_tmpfs(tmp_path / "disk", "200k") as disk:
        cfg = ray_config(disk, cluster, "run", env=PointEnvConfig(), num_envs=32, num_procs=2, num_episodes=10**6,
                         local_policy="zero")
        started = time.monotonic()
        assert run_client(cfg, "Point-v1") == 1
        took = time.monotonic() - started
        summary = read(disk / "run", "summary.json")
        lines = sum(len(episodes(disk / "run", pid)) for pid in (0, 1))
        for pid in (0, 1):
            text = (disk / "run" / "rollout" / f"proc_{pid:03d}" / "episodes.jsonl").read_text()
            assert text == "" or text.endswith("\n"), "no line is cut short"
    assert summary["status"] == "failed" and summary["completed_episodes"] == lines > 0
    assert any("no space left on device" in e for e in summary["errors"].values()), summary["errors"]
    assert took < 120, f"the run took {took:.0f} s to stop"


@pytest.mark.slow
@pytest.mark.parametrize("split,max_restarts", [("static", 3), ("shared", 3), ("shared", 0)])
def test_killed_actor_is_restarted_and_the_total_stays_exact(cluster, tmp_path, split, max_restarts):
    """Process 0 kills itself in its 4th step; process 1 holds in its 4th step until the driver has taken in the
    death (restarted the actor, or given it up), so the run is mid-collection then, whichever process is faster."""
    env = gated_env(tmp_path, kill_process=0, kill_after_steps=4, hold_after_steps=4)
    cfg = ray_config(tmp_path, cluster, "run", max_restarts=max_restarts, num_envs=2, num_procs=2, num_episodes=40,
                     local_policy="zero", env_path=(GATED_ENV,), env=env,
                     runner=RunnerConfig(pass_proc_id=True, episode_split=split))
    run = tmp_path / "run"
    taken_in = f"Ray restarts it (restart 1 of {max_restarts})" if max_restarts else "more than --ray.max-restarts 0"
    with gate_opened_after(env, Step(f"the driver logged {taken_in!r}", log_says(run, taken_in))) as progress:
        code = run_client(cfg, "RayGated-v1")
    assert env.killed_file().exists(), "process 0 killed itself"
    assert progress.done == 1, f"process 1 held until the driver had taken in the death: {progress.error}"
    summary = read(run, "summary.json")
    rows = [episodes(run, pid) for pid in (0, 1)]
    seeds = [r["seed"] for pid_rows in rows for r in pid_rows if r["seed"] is not None]
    assert len(seeds) == len(set(seeds)), "a restarted process starts from fresh seeds"
    nodes = read(run, "ray_nodes.json")
    log = (run / "logs" / "client.log").read_text()
    if max_restarts:
        assert code == 0
        assert summary["completed_episodes"] == 40 == sum(map(len, rows))
        assert summary["process_status"] == {"0": "finished", "1": "finished"}
        assert nodes["processes"]["0"]["restarts"] == 1 and nodes["processes"]["1"]["restarts"] == 0
        assert "Ray restarts it (restart 1 of 3)" in log
        if split == "static":
            assert [len(r) for r in rows] == [20, 20]
    else:  # lost for good: reported, and the other process collects the rest
        assert code == 1
        assert summary["process_status"] == {"0": "failed", "1": "finished"}
        assert "more than --ray.max-restarts 0" in summary["errors"]["0"]
        assert summary["completed_episodes"] == 40 == sum(map(len, rows))


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_signal_on_the_driver_stops_every_actor_and_writes_outputs(cluster, tmp_path, sig):
    """The signal comes while both processes hold in a step, with episodes recorded: mid-collection for sure (the
    run has no episode target, and the gate opens right after the signal)."""
    env = gated_env(tmp_path, hold_after_steps=4)
    cmd = [sys.executable, "-m", "plugrl_env_client", "RayGated-v1", "--env-path", GATED_ENV, "--env.gate", env.gate,
           "--env.hold-after-steps", "4", "--runner.pass-proc-id", "--num-envs", "2", "--num-procs", "2",
           "--local-policy", "random", "--output-dir", str(tmp_path), "--exp-name", "run", "--no-progress",
           "--launcher", "ray", "--ray.address", cluster.address]
    proc = subprocess.Popen(sigint_default(cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    run = tmp_path / "run"
    files = [run / "rollout" / f"proc_{p:03d}" / "episodes.jsonl" for p in (0, 1)]
    try:
        wait_for(lambda: files_exist(env.held_file(0), env.held_file(1))()
                 and all(f.exists() and f.stat().st_size for f in files),
                 "hold of both processes with episodes recorded", proc)
        proc.send_signal(sig)
        open_gate(env)
        out, err = proc.communicate(timeout=120)
    finally:
        open_gate(env)
        proc.kill()
        proc.wait()
    assert proc.returncode == 128 + sig, (out, err)
    summary = read(run, "summary.json")
    assert summary["completed_episodes"] == sum(len(episodes(run, p)) for p in (0, 1)) > 0
    assert summary["process_status"] == {"0": "interrupted", "1": "interrupted"}
    assert "Traceback" not in err


@pytest.mark.slow
def test_sigkill_of_the_driver_leaves_no_actor_process_of_the_run(cluster, tmp_path):
    """SIGKILL of the driver (preemption, the OOM killer) while both actors hold in a step: Ray ends the actors of
    a job whose driver died (they are not detached), so none of the run's actor processes is left 30 s later."""
    from process_tree import kill_all, wait_all_gone

    env = gated_env(tmp_path, hold_after_steps=4)
    cmd = [sys.executable, "-m", "plugrl_env_client", "RayGated-v1", "--env-path", GATED_ENV, "--env.gate", env.gate,
           "--env.hold-after-steps", "4", "--runner.pass-proc-id", "--num-envs", "2", "--num-procs", "2",
           "--local-policy", "random", "--output-dir", str(tmp_path), "--exp-name", "run", "--no-progress",
           "--launcher", "ray", "--ray.address", cluster.address]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    actors: set[tuple[int, int]] = set()
    try:
        wait_for(files_exist(env.held_file(0), env.held_file(1)), "hold of both processes", proc)
        for p in (0, 1):
            pid = int(env.held_file(p).read_text())
            actors.add((pid, int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])))
        proc.kill()
        proc.wait()
        waited, left = wait_all_gone(actors, 30.0)
        print(f"the actors were gone {waited:.1f} s after the driver")
    finally:
        proc.kill()
        proc.wait()
        kill_all(actors)  # none, unless the test fails
        open_gate(env)
    assert len(actors) == 2 and not left, f"actor processes {sorted(left)} outlived their driver by 30 s"


@pytest.mark.slow
def test_a_ray_run_whose_driver_was_killed_is_resumed_to_the_uninterrupted_runs_episodes(cluster, tmp_path):
    """SIGKILL of the driver once both actors have a seeded random number of episodes, then --resume on Ray: exactly
    --num-episodes lines, none twice, the same episodes (process, env, seed, return, length) as an uninterrupted
    local run's (static split, two envs per process with shares of 8 and 7, per-env seeds, the zero policy), and
    ray_nodes.json kept per segment."""
    at = random.Random(5).randint(1, 6)
    gate = tmp_path / "gate"
    gate.mkdir()
    (gate / "closed").touch()  # every process holds once it has `at` episodes, until the driver is gone

    def command(name: str, *extra: str) -> list[str]:
        return [sys.executable, "-m", "plugrl_env_client", "SeededLength-v1", "--env-path", SEEDED_ENV,
                "--env.pid-dir", str(gate), "--env.hold-after-episodes", str(at), "--num-procs", "2", "--num-envs", "2",
                "--num-episodes", "30", "--local-policy", "zero", "--output-dir", str(tmp_path), "--exp-name", name,
                "--no-progress", *extra]

    on_ray = ["--launcher", "ray", "--ray.address", cluster.address]
    run = tmp_path / "run"
    files = [run / "rollout" / f"proc_{p:03d}" / "episodes.jsonl" for p in (0, 1)]
    proc = subprocess.Popen(sigint_default(command("run", *on_ray)), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        wait_for(lambda: all(f.exists() and f.read_bytes().count(b"\n") >= at for f in files),
                 f"{at} episodes of each process", proc)
        # the driver writes ray_nodes.json every 10 s while it runs: the first segment's must exist to be kept
        wait_for(lambda: (run / "ray_nodes.json").exists(), "the first segment's ray_nodes.json", proc)
        proc.kill()
        proc.wait()
    finally:
        proc.kill()
        proc.wait()
        (gate / "closed").unlink()
    wait_until_idle(cluster)
    resumed = subprocess.run(sigint_default([*command("run", *on_ray), "--resume"]), capture_output=True, text=True,
                             timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    whole = subprocess.run(sigint_default(command("whole")), capture_output=True, text=True, timeout=300)
    assert whole.returncode == 0, whole.stderr

    def keys(folder: Path) -> list[tuple]:
        return sorted((r["process_id"], r["env_index"], r["seed"], r["return"], r["length"])
                      for p in (0, 1) for r in episodes(folder, p))

    assert len(keys(run)) == len(set(keys(run))) == 30 == read(run, "summary.json")["completed_episodes"]
    assert keys(run) == keys(tmp_path / "whole")
    assert sorted(Counter((k[0], k[1]) for k in keys(run)).items()) == [((0, 0), 8), ((0, 1), 7), ((1, 0), 8),
                                                                       ((1, 1), 7)]
    assert [s["status"] for s in read(run, "summary.json")["segments"]] == ["killed", "finished"]
    assert (run / "ray_nodes.segment-1.json").exists() and (run / "ray_nodes.json").exists()


def wait_until_idle(cluster: Cluster, timeout_s: float = 60.0) -> None:
    """Wait until no CPU of the cluster is held (actors of an earlier run release theirs asynchronously): PACK is
    best effort, so a node still partly held would make Ray spread the bundles."""
    import ray

    ray.init(address=cluster.address, logging_level=logging.WARNING)
    try:
        wait_until(lambda: ray.available_resources().get("CPU", 0) >= ray.cluster_resources().get("CPU", 0),
                   timeout_s, "idle cluster (every CPU released)", poll_s=0.2)
    finally:
        ray.shutdown()


@pytest.mark.slow
def test_spread_uses_different_nodes_and_pack_one(cluster, extra_node, tmp_path):
    from plugrl_env_client.envs.point.point_env import PointEnvConfig

    extra_node(num_cpus=2)
    flags = dict(env=PointEnvConfig(), num_envs=1, num_procs=2, num_episodes=2, local_policy="zero",
                 runner=RunnerConfig(max_episode_steps=5))
    placed = {}
    for placement in ("spread", "pack"):
        wait_until_idle(cluster)
        assert run_client(ray_config(tmp_path, cluster, placement, placement=placement, **flags), "Point-v1") == 0
        processes = read(tmp_path / placement, "ray_nodes.json")["processes"]
        placed[placement] = {processes[p]["node_id"] for p in ("0", "1")}
    assert len(placed["spread"]) == 2
    assert len(placed["pack"]) == 1


@pytest.mark.slow
def test_lost_node_restarts_its_actor_on_another_and_the_total_stays_exact(cluster, extra_node, tmp_path):
    """The node goes while both processes hold in their 4th step (placed, collecting, far from their shares); the
    gate opens once the driver has taken in the loss and the lost actor's process has ended (it outlives its node
    by a moment: let go earlier, it could finish its share and report it first)."""
    doomed = extra_node(num_cpus=1)
    wait_until_idle(cluster)  # the head's 2 CPUs free: one process on each node
    env = gated_env(tmp_path, hold_after_steps=4)
    cfg = ray_config(tmp_path, cluster, "run", num_envs=2, num_procs=2, num_episodes=60, local_policy="zero",
                     env_path=(GATED_ENV,), env=env, runner=RunnerConfig(pass_proc_id=True, episode_split="static"))
    run = tmp_path / "run"
    held_pids: list[int] = []

    def remove_node() -> None:
        held_pids.extend(int(env.held_file(p).read_text()) for p in (0, 1))
        cluster.remove_node(doomed, allow_graceful=False)

    steps = (Step("both processes held", files_exist(env.held_file(0), env.held_file(1)), act=remove_node),
             Step("the driver restarted the lost actor", log_says(run, "Ray restarts it (restart 1 of 3)")),
             Step("the lost actor's process ended", lambda: any(map(process_gone, held_pids))))
    with gate_opened_after(env, *steps) as progress:
        assert run_client(cfg, "RayGated-v1") == 0
    assert progress.done == 3, f"the node was lost, and the loss taken in, while both processes held: {progress.error}"
    summary = read(run, "summary.json")
    assert summary["completed_episodes"] == 60 == sum(len(episodes(run, p)) for p in (0, 1))
    assert [len(episodes(run, p)) for p in (0, 1)] == [30, 30]
    processes = read(run, "ray_nodes.json")["processes"]
    moved = [p for p in processes.values() if p["restarts"]]
    assert len(moved) == 1, processes
    assert moved[0]["nodes"][0] == doomed.node_id and moved[0]["nodes"][-1] == cluster.head_node.node_id


# ------------------------------------------------------------------------------------------------ the doc


@pytest.mark.slow
def test_the_docs_one_machine_run_and_node_table_work(tmp_path):
    """docs/ray.md: the one-machine command runs (a private Ray instance), and its per-node table reads the run."""
    from doc_commands import DocShell, bash_blocks

    blocks = bash_blocks(DOC)
    (try_it,) = [b for b in blocks if len(b.commands) == 1 and "--ray.address local" in b.commands[0].text]
    with DocShell(tmp_path / "work", tmp_path / "runs", timeout_s=180) as shell:
        results = shell.run_block(try_it)
    assert all(r.ok for r in results), "\n\n".join(r.describe() for r in results)
    (run,) = [p.parent for p in (tmp_path / "runs").glob("*/ray_nodes.json")]
    assert read(run, "summary.json")["completed_episodes"] == 20
    (table,) = [c for b in blocks for c in b.commands if c.text.startswith("python -c") and "ray_nodes.json" in c.text]
    shown = subprocess.run(["bash", "-c", table.text.replace("runs/<exp>/", f"{run}/")], capture_output=True,
                           text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    (line,) = shown.stdout.splitlines()  # one machine, both processes on it
    ip, _hostname, processes, rate = line.split()
    assert processes == "2" and float(rate) > 0
    assert ip == read(run, "ray_nodes.json")["processes"]["0"]["ip"]


class _FlakyRay:
    """Stands in for the ``ray`` module in ``_init``: fails its first ``init`` calls with the given errors."""

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.inits = 0
        self.shutdowns = 0

    def init(self, **kwargs: Any) -> None:
        self.inits += 1
        if self.errors:
            raise self.errors.pop(0)

    def shutdown(self) -> None:
        self.shutdowns += 1


@pytest.mark.slow
def test_init_connects_again_once_when_the_client_server_failed_to_start(caplog):
    from plugrl_env_client.launch.ray import cluster as ray_cluster

    failed = ConnectionError(f"Initialization failure from server:\nRuntimeError: {ray_cluster.CLIENT_SERVER_FAILED[0]}.")
    flaky = _FlakyRay(failed)
    ray_cluster._init(flaky, {"address": "ray://head:10001"})
    assert (flaky.inits, flaky.shutdowns) == (2, 1)
    assert "failed to start; connecting again" in caplog.text

    zombie = _FlakyRay(ConnectionError('Initialization failure from server:\nTraceback (most recent call last):\n  File '
                                       '"proxier.py", line 1, in start_specific_server\npsutil.ZombieProcess: ...'))
    ray_cluster._init(zombie, {"address": "ray://head:10001"})
    assert zombie.inits == 2, "the proxy's traceback of a server that died at once is retried too"

    twice = _FlakyRay(failed, failed)
    with pytest.raises(ConnectionError, match=ray_cluster.CLIENT_SERVER_FAILED[0]):
        ray_cluster._init(twice, {"address": "ray://head:10001"})
    assert twice.inits == 2

    other = _FlakyRay(ConnectionError("no cluster"))
    with pytest.raises(ConnectionError, match="no cluster"):
        ray_cluster._init(other, {"address": "auto"})
    assert other.inits == 1, "other connection errors are reported at once"


# ------------------------------------------------------------------------------------------------ secrets


def test_a_ray_run_keeps_the_key_and_the_url_password_out_of_everything(cluster, tmp_path):
    """--api-key and a password in --server-url, with --launcher ray: not in the run folder, not on the terminal,
    not in the driver's command line as the OS shows it (what Ray records as the job's entrypoint), and not in the
    Ray session's logs. The processes hold in a step while the driver's command line is read."""
    import psutil

    from plugrl_env_client.server.policies import PolicyConfig, make_policy
    from plugrl_env_client.server.server import PolicyServer

    key, password = "ray-k3y-SECRET-5550123", "ray-pw-SECRET-5550321"
    env = gated_env(tmp_path, hold_after_steps=2)
    server = PolicyServer(make_policy(PolicyConfig(action_dim=2)), host="127.0.0.1", port=0).start()
    port = server.port
    url = f"ws://user:{password}@127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "plugrl_env_client", "raygated-v1", "--env-path", GATED_ENV, "--env.gate", env.gate,
           "--env.hold-after-steps", "2", "--runner.pass-proc-id", "--num-procs", "2", "--num-envs", "2",
           "--num-episodes", "6", "--api-key", key, "--server-url", url, "--output-dir", str(tmp_path),
           "--exp-name", "run", "--no-progress", "--launcher", "ray", "--ray.address", cluster.address]
    shown: list[str] = []
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        with gate_opened_after(env, Step("both processes hold", files_exist(env.held_file(0), env.held_file(1)),
                                         lambda: shown.extend(psutil.Process(proc.pid).cmdline()))) as progress:
            out, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
        proc.wait()
        server.shutdown()
    assert progress.done == 1, progress.error
    assert proc.returncode == 0, (out, err)
    assert key not in " ".join(shown) and password not in " ".join(shown), shown
    assert "--api-key" in shown and f"ws://user:{'*' * len(password)}@127.0.0.1:{port}" in shown
    assert read(tmp_path / "run", "summary.json")["completed_episodes"] == 6
    for path in [p for p in (tmp_path / "run").rglob("*") if p.is_file()]:
        data = path.read_bytes()
        assert key.encode() not in data and password.encode() not in data, path
    assert key not in out + err and password not in out + err, (out, err)
    logs = Path(cluster.head_node.get_logs_dir_path())
    for path in [p for p in logs.rglob("*") if p.is_file()]:
        data = path.read_bytes()
        assert key.encode() not in data and password.encode() not in data, path
