"""``--resume``: a run stopped in any way (SIGKILL of the launcher or of a rollout process, SIGTERM, SIGHUP)
continues where it stopped. Runs are the command line's, in real processes, stopped with real signals at seeded
random moments; the stopped run is resumed until it ends.

What every resumed run must show: exactly ``--num-episodes`` lines, none twice, a torn last line cut; each env's
episodes are its own sequence continued (episode k from the seed of episode k); with the static split (each env
runs a fixed share), the episodes (process, env, seed, return, length) are the set an uninterrupted run collects.
"""

from __future__ import annotations

import dataclasses
import json
import random
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from children import sigint_default
from waiting import wait_until

from plugrl_env_client.rollout.seeds import episode_seed

ENV_FILE = str(Path(__file__).parent / "_support" / "seeded_length_env.py")
RUN_TIMEOUT_S = 300.0


def _args(out: Path, name: str, *, episodes: int, procs: int = 1, envs: int = 1, pipeline: int = 1,
          group_size: int = 1, pid_dir: Path | None = None, hold_after: int = 0) -> list[str]:
    return ["SeededLength-v1", "--env-path", ENV_FILE, "--local-policy", "zero", "--num-episodes", str(episodes),
            "--num-procs", str(procs), "--num-envs", str(envs), "--runner.pipeline", str(pipeline),
            "--runner.group-size", str(group_size),
            "--runner.episode-split", "static", "--env.pid-dir", str(pid_dir or ""), "--env.hold-after-episodes",
            str(hold_after), "--output-dir", str(out), "--exp-name", name, "--no-progress"]


def _command(args: list[str]) -> list[str]:
    return sigint_default([sys.executable, "-m", "plugrl_env_client", *args])


def _run(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(_command(args), capture_output=True, text=True, timeout=RUN_TIMEOUT_S)


def _whole_lines(run: Path) -> int:
    return sum(f.read_bytes().count(b"\n") for f in run.glob("rollout/proc_*/episodes.jsonl"))


def _episodes(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for f in sorted(run.glob("rollout/proc_*/episodes.jsonl"))
            for line in f.read_text().splitlines()]


def _key(row: dict[str, Any]) -> tuple:
    return row["process_id"], row["env_index"], row["seed"], row["return"], row["length"]


def _stop_at(args: list[str], run: Path, at: int, sig: int, victim: Path | None = None) -> subprocess.CompletedProcess:
    """Start the run, and once ``at`` episodes are on disk send ``sig`` to its launcher (or, with ``victim``, a
    folder of pid files, to a rollout process that is not the launcher); how the launcher ended."""
    proc = subprocess.Popen(_command(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: _whole_lines(run) >= at, RUN_TIMEOUT_S, f"{at} episodes in {run}", proc=proc)
        if victim is None:
            proc.send_signal(sig)
        else:
            pids = sorted(int(p.read_text()) for p in victim.glob("pid-*") if int(p.read_text()) != proc.pid)
            assert pids, "no rollout process wrote its pid"
            subprocess.run(["kill", f"-{int(sig)}", str(pids[0])], check=True)
        out, err = proc.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        proc.kill()
        proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


_references: dict[tuple, list[dict[str, Any]]] = {}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The episodes of an uninterrupted run with the given flags (run once per flag set in this module)."""

    def episodes(**flags: Any) -> list[dict[str, Any]]:
        key = tuple(sorted((k, tuple(v) if isinstance(v, (list, tuple)) else v) for k, v in flags.items()))
        if key not in _references:
            out = tmp_path_factory.mktemp("reference")
            extra = list(flags.pop("extra", ()))
            done = _run([*_args(out, "whole", **flags), *extra])
            assert done.returncode == 0, done.stderr
            _references[key] = _episodes(out / "whole")
        return _references[key]

    return episodes


def _check_exact(run: Path, episodes: int) -> list[dict[str, Any]]:
    """Exactly ``episodes`` lines, none twice, counted as such by summary.json; the rows."""
    rows = _episodes(run)
    repeated = [k for k, n in Counter(_key(r) for r in rows).items() if n > 1]
    assert not repeated, f"episodes recorded twice: {repeated}"
    summary = json.loads((run / "summary.json").read_text())
    assert len(rows) == summary["completed_episodes"] == episodes, (len(rows), summary["completed_episodes"])
    assert sum(s["episodes"] for s in summary["segments"]) == episodes, summary["segments"]
    return rows


@pytest.mark.slow
@pytest.mark.parametrize("procs", [1, 2])
def test_sigkill_of_the_launcher_twice_then_resumed_gives_the_uninterrupted_run(tmp_path, uninterrupted, procs):
    rng = random.Random(1000 + procs)
    target = 40
    args = _args(tmp_path, "run", episodes=target, procs=procs)
    run = tmp_path / "run"
    reference = uninterrupted(episodes=target, procs=procs)

    first = _stop_at(args, run, rng.randint(1, target // 3), signal.SIGKILL)
    assert first.returncode == -signal.SIGKILL
    with (run / "rollout" / "proc_000" / "episodes.jsonl").open("ab") as f:
        f.write(b'{"env_index": 0, "return": 0.5, "len')  # a line the kill cut short
    now = _whole_lines(run)
    second = _stop_at([*args, "--resume"], run, rng.randint(now + 1, now + (target - now) // 2), signal.SIGKILL)
    assert second.returncode == -signal.SIGKILL
    last = _run([*args, "--resume"])
    assert last.returncode == 0, last.stderr

    rows = _check_exact(run, target)
    assert sorted(map(_key, rows)) == sorted(map(_key, reference))
    segments = json.loads((run / "summary.json").read_text())["segments"]
    assert [s["status"] for s in segments] == ["killed", "killed", "finished"], segments
    assert all(s["started"] and s["ended"] for s in segments), segments
    manifest = json.loads((run / "rollout" / "proc_000" / "manifest.json").read_text())
    assert len(manifest["segments"]) == 3

    again = _run([*args, "--resume"])
    assert again.returncode == 0, again.stderr
    assert f"{run} is finished: it has its {target} of --num-episodes {target} episodes" in again.stdout
    assert len(json.loads((run / "summary.json").read_text())["segments"]) == 3, "a finished run is left as it was"


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_run_stopped_by_sigterm_or_sighup_is_resumed_not_beside_itself(tmp_path, uninterrupted, sig):
    rng = random.Random(int(sig))
    target, at = 40, rng.randint(1, 13)
    gate = tmp_path / "gate"
    gate.mkdir()
    (gate / "closed").touch()  # the run holds once it has `at` episodes, until the test opens the gate
    args = _args(tmp_path, "run", episodes=target, pid_dir=gate, hold_after=at)
    run = tmp_path / "run"
    proc = subprocess.Popen(_command(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: _whole_lines(run) >= at, RUN_TIMEOUT_S, f"{at} episodes", proc=proc)
        beside = _run([*args, "--resume"])  # the run is alive: refused
        (gate / "closed").unlink()
        proc.send_signal(sig)
        proc.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        proc.kill()
        proc.wait()
    assert beside.returncode == 1
    assert f"--resume: {run} is in use by a run that is still alive (process {proc.pid} holds" in beside.stderr
    assert proc.returncode == 128 + sig
    stopped = json.loads((run / "summary.json").read_text())["segments"]
    assert [s["status"] for s in stopped] == ["interrupted"], stopped

    resumed = _run([*args, "--resume"])
    assert resumed.returncode == 0, resumed.stderr
    rows = _check_exact(run, target)
    assert sorted(map(_key, rows)) == sorted(map(_key, uninterrupted(episodes=target)))
    timing = json.loads((run / "summary.json").read_text())["timing"]
    assert timing["env_steps"] >= sum(r["length"] for r in rows), "the timing adds up both segments'"

    from plugrl_env_client.report.build import build_report

    page = build_report(run).page.read_text()
    assert "The run ran in 2 segments (resumed once with --resume)" in page
    assert "<td class=\"text\">interrupted</td>" in page and "<td class=\"text\">finished</td>" in page


@pytest.mark.slow
def test_sigkill_of_a_rollout_process_then_resumed_gives_the_uninterrupted_run(tmp_path, uninterrupted):
    rng = random.Random(7)
    target = 40
    pids = tmp_path / "pids"
    pids.mkdir()
    args = _args(tmp_path, "run", episodes=target, procs=2, pid_dir=pids)
    run = tmp_path / "run"
    stopped = _stop_at(args, run, rng.randint(2, target // 3), signal.SIGKILL, victim=pids)
    assert stopped.returncode == 1, stopped.stderr
    resumed = _run([*args, "--resume"])
    assert resumed.returncode == 0, resumed.stderr
    rows = _check_exact(run, target)
    reference = uninterrupted(episodes=target, procs=2)
    assert sorted(map(_key, rows)) == sorted(map(_key, reference))


@pytest.mark.slow
@pytest.mark.parametrize("pipeline, group_size", [(1, 1), (2, 1), (1, 2)])
def test_several_envs_per_process_resumed_give_the_uninterrupted_run(tmp_path, uninterrupted, pipeline, group_size):
    """4 envs per process, lockstep, in 2 pipeline groups, or in seed groups of 2: each env runs its own static
    share (23 episodes per process: 6, 6, 6 and 5), so the run SIGKILLed mid-way and resumed has the uninterrupted
    run's episodes (process, env, seed, return, length), and each env's lines are its episodes 0, 1, ... from their
    own seeds (a seed group's: the group's)."""
    from plugrl_env_client.rollout.budget import env_shares

    rng = random.Random(11 + pipeline + 10 * group_size)
    target, procs, envs = 46, 2, 4
    flags = dict(episodes=target, procs=procs, envs=envs, pipeline=pipeline, group_size=group_size)
    args = _args(tmp_path, "run", **flags)
    run = tmp_path / "run"
    stopped = _stop_at(args, run, rng.randint(target // 4, target // 2), signal.SIGKILL)
    assert stopped.returncode == -signal.SIGKILL
    assert _whole_lines(run) < target, "the run was stopped before its end"
    resumed = _run([*args, "--resume"])
    assert resumed.returncode == 0, resumed.stderr
    rows = _check_exact(run, target)
    reference = uninterrupted(**flags)
    assert sorted(map(_key, rows)) == sorted(map(_key, reference))

    per_env = Counter((r["process_id"], r["env_index"]) for r in rows)
    for p in range(procs):
        assert [per_env[p, i] for i in range(envs)] == env_shares(target, procs, p, envs) == [6, 6, 6, 5]
        for i in range(envs):
            seeds = [r["seed"] for r in rows if (r["process_id"], r["env_index"]) == (p, i)]
            if group_size == 1:
                expected = [p * envs + i] + [episode_seed(p * envs, p, i, k) for k in range(1, len(seeds))]
            else:
                expected = [episode_seed(p * envs, p, i // group_size, k) for k in range(len(seeds))]
            assert seeds == expected, (p, i)


@pytest.mark.slow
def test_a_resumed_seed_group_runs_again_the_group_episode_a_member_had_in_flight(tmp_path):
    """GuessNumber-v1 in seed groups of 2 under a random text policy (members of a group take different numbers of
    guesses), SIGKILLed while some member had finished a group episode its partner had not: after --resume every
    env has run exactly its share, its episodes the group's episodes 0, 1, 2, ... with none left out or run twice."""
    from plugrl_env_client.rollout.budget import env_shares

    target, procs, envs, size = 602, 2, 4, 2
    args = ["guessnumber-v1", "--env.high", "4", "--num-envs", str(envs), "--num-procs", str(procs), "--num-episodes",
            str(target), "--runner.group-size", str(size), "--runner.episode-split", "static", "--local-policy", "text",
            "--local-policy-horizon", "1", "--local-policy-choices", *(f"<answer>{k}</answer>" for k in range(1, 5)),
            "--output-dir", str(tmp_path), "--exp-name", "run", "--no-progress"]
    run = tmp_path / "run"

    def apart() -> list[tuple[int, int]]:
        """(process, group) whose members have different numbers of episodes on disk."""
        counts = Counter((r["process_id"], r["env_index"]) for r in _episodes(run))
        return [(p, g) for p in range(procs) for g in range(envs // size)
                if len({counts[p, g * size + m] for m in range(size)}) > 1]

    proc = subprocess.Popen(_command(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: _whole_lines(run) >= target // 4 and bool(apart()), RUN_TIMEOUT_S,
                   "a group whose members are apart", proc=proc)
        proc.kill()
        proc.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        proc.kill()
        proc.wait()
    assert apart() and _whole_lines(run) < target, "stopped mid-way, with a member ahead of its partner"
    resumed = _run([*args, "--resume"])
    assert resumed.returncode == 0, resumed.stderr
    rows = _episodes(run)
    assert len(rows) == target == json.loads((run / "summary.json").read_text())["completed_episodes"]
    for p in range(procs):
        assert [sum((r["process_id"], r["env_index"]) == (p, i) for r in rows) for i in range(envs)] == env_shares(
            target, procs, p, envs)
        for i in range(envs):
            seeds = sorted(r["seed"] for r in rows if (r["process_id"], r["env_index"]) == (p, i))
            assert seeds == sorted(episode_seed(p * envs, p, i // size, k) for k in range(len(seeds))), (p, i)


@pytest.mark.slow
def test_a_start_seeds_run_of_two_processes_refuses_other_seeds_and_once_finished_is_left_as_it_was(tmp_path):
    """The command line, 2 processes: a run of start seeds 0-3 resumed with 104-111 is refused naming the flag
    (it would have mixed both lists in one run); resumed with its own seeds, it says it is finished and no file
    changes."""
    args = ["point-v1", "--local-policy", "random", "--num-procs", "2", "--runner.max-episode-steps", "3",
            "--output-dir", str(tmp_path), "--exp-name", "run", "--no-progress", "--runner.start-seeds"]
    first = _run([*args, "0", "1", "2", "3"])
    assert first.returncode == 0, first.stderr
    run = tmp_path / "run"
    assert sorted(r["seed"] for r in _episodes(run)) == [0, 1, 2, 3]
    before = _files(run)
    other = _run([*args, *map(str, range(104, 112)), "--resume"])
    assert other.returncode == 1
    assert "error: --resume: --runner.start-seeds is [104, 105, 106, 107, 108, 109, 110, 111] now but [0, 1, 2, 3]" in (
        other.stderr), other.stderr
    again = _run([*args, "0", "1", "2", "3", "--resume"])
    assert again.returncode == 0, again.stderr
    assert f"{run} is finished: it has its 4 episodes, one per seed of --runner.start-seeds" in again.stdout
    assert _files(run) == before


# ------------------------------------------------------------------------------------------ refusals, in process


@pytest.fixture
def finished_run(tmp_path):
    from plugrl_env_client.app import run_client
    from plugrl_env_client.config import ClientConfig, RunnerConfig
    from plugrl_env_client.envs import discover_envs
    from plugrl_env_client.envs.point.point_env import PointEnvConfig

    discover_envs()
    cfg = ClientConfig(output_dir=tmp_path, exp_name="run", local_policy="zero", num_episodes=2, progress=False,
                       env=PointEnvConfig(), runner=RunnerConfig(max_episode_steps=3))
    assert run_client(cfg, "point-v1") == 0
    return cfg


def test_a_flag_that_defines_the_run_must_be_the_stopped_runs(finished_run, tmp_path):
    from plugrl_env_client.app import run_client
    from plugrl_env_client.errors import ConfigError

    cfg = dataclasses.replace(finished_run, resume=True)
    changes = {
        "--num-envs is 2 now but 1": dataclasses.replace(cfg, num_envs=2),
        "--num-episodes is 3 now but 2": dataclasses.replace(cfg, num_episodes=3),
        "--runner.seed is 1 now but 0": dataclasses.replace(cfg, runner=dataclasses.replace(cfg.runner, seed=1)),
        "--runner.episode-split is \"shared\" now": dataclasses.replace(
            cfg, runner=dataclasses.replace(cfg.runner, episode_split="shared")),
        "--runner.max-episode-steps is 4 now but 3": dataclasses.replace(
            cfg, runner=dataclasses.replace(cfg.runner, max_episode_steps=4)),
        "--env.step-size is 0.2 now but 0.1": dataclasses.replace(cfg, env=dataclasses.replace(cfg.env, step_size=0.2)),
    }
    for said, changed in changes.items():
        with pytest.raises(ConfigError, match=f"^--resume: {said}.* in {tmp_path / 'run'}'s client_config.json"):
            run_client(changed, "point-v1")


def test_flags_that_do_not_change_the_episodes_may_differ_and_a_finished_run_says_so(finished_run, tmp_path, capsys):
    from plugrl_env_client.app import run_client

    cfg = dataclasses.replace(finished_run, resume=True, progress=True, server_port=9, tracking="none")
    before = _files(tmp_path / "run")
    assert run_client(cfg, "point-v1") == 0
    assert f"{tmp_path / 'run'} is finished: it has its 2 of --num-episodes 2 episodes; nothing to resume" in (
        capsys.readouterr().out)
    assert _files(tmp_path / "run") == before


def _files(run: Path) -> dict[str, bytes]:
    """Every file of a run folder and its bytes, but the lock file (which names the process that last held it)."""
    from plugrl_env_client.outputs.run_dir import LOCK_NAME

    return {str(f.relative_to(run)): f.read_bytes() for f in sorted(run.rglob("*")) if f.is_file()
            and f.name != LOCK_NAME}


def _point(tmp_path: Path, **flags: Any) -> Any:
    """A small point-v1 run's config (3 steps per episode, the embedded zero policy, in this process)."""
    from plugrl_env_client.config import ClientConfig, RunnerConfig
    from plugrl_env_client.envs import discover_envs
    from plugrl_env_client.envs.point.point_env import PointEnvConfig

    discover_envs()
    runner = RunnerConfig(max_episode_steps=3, start_seeds=tuple(flags.pop("start_seeds", ())))
    return ClientConfig(output_dir=tmp_path, exp_name="run", local_policy="zero", progress=False,
                        env=PointEnvConfig(), runner=runner, **flags)


def _lines(run: Path) -> list[bytes]:
    return (run / "rollout" / "proc_000" / "episodes.jsonl").read_bytes().splitlines(keepends=True)


def _same_episode(line: bytes) -> tuple:
    row = json.loads(line)
    return row["env_index"], row["seed"], row["return"], row["length"]


def test_every_flag_is_either_one_that_defines_the_run_or_one_a_resume_may_change():
    """A flag added to the client's config or its runner section must be put in one of the two tables: a resume
    compares exactly the flags that decide which episodes a run has."""
    from plugrl_env_client.app import MAY_CHANGE, RUN_DEFINING
    from plugrl_env_client.config import ClientConfig, RunnerConfig

    flags = [(f.name,) for f in dataclasses.fields(ClientConfig) if f.name != "runner"]
    flags += [("runner", f.name) for f in dataclasses.fields(RunnerConfig)]
    for flag in flags:
        assert (flag in RUN_DEFINING) + (flag in MAY_CHANGE) == 1, flag
    assert set(RUN_DEFINING) | set(MAY_CHANGE) <= {*flags, ("env_id",), ("env_kwargs",)}
    assert {("runner", "seed"), ("runner", "start_seeds"), ("num_episodes",), ("runner", "episode_split"),
            ("env_id",), ("env",)} <= set(RUN_DEFINING)


def test_other_start_seeds_are_refused_naming_the_flag_and_nothing_changes(tmp_path):
    """A run of start seeds 0-3, resumed with start seeds 104-111, would have mixed both lists in one run."""
    from plugrl_env_client.app import run_client
    from plugrl_env_client.errors import ConfigError

    cfg = _point(tmp_path, start_seeds=range(4))
    assert run_client(cfg, "point-v1") == 0
    before = _files(tmp_path / "run")
    other = dataclasses.replace(cfg, resume=True, runner=dataclasses.replace(cfg.runner, start_seeds=tuple(
        range(104, 112))))
    with pytest.raises(ConfigError, match=r"^--resume: --runner.start-seeds is \[104, 105, 106, 107, 108, 109, 110, "
                                          r"111\] now but \[0, 1, 2, 3\] in .*client_config.json"):
        run_client(other, "point-v1")
    two = dataclasses.replace(other, num_envs=2)
    with pytest.raises(ConfigError, match=r"^--resume: --num-envs is 2 now but 1; --runner.start-seeds is .* now but "
                                          r"\[0, 1, 2, 3\] in .*pass the stopped run's values"):
        run_client(two, "point-v1")
    assert _files(tmp_path / "run") == before


def test_a_finished_start_seeds_run_says_it_is_finished_and_changes_nothing(tmp_path, capsys):
    from plugrl_env_client.app import run_client

    cfg = _point(tmp_path, start_seeds=range(4))
    assert run_client(cfg, "point-v1") == 0
    before = _files(tmp_path / "run")
    capsys.readouterr()
    assert run_client(dataclasses.replace(cfg, resume=True), "point-v1") == 0
    assert (f"{tmp_path / 'run'} is finished: it has its 4 episodes, one per seed of --runner.start-seeds; nothing "
            "to resume") in capsys.readouterr().out
    assert _files(tmp_path / "run") == before, "a finished run is left as it was: no segment, summary or manifest"


@pytest.mark.parametrize("start_seeds", [(), (5, 6, 7, 8)])
def test_blank_lines_at_the_end_are_no_episodes_and_the_missing_ones_are_collected(tmp_path, start_seeds):
    """Two episodes gone and two blank lines in their place: the run has 2 of its 4 episodes, so --resume collects
    the missing two (the same episodes), and the summary counts the 4 episode lines, not the 6 lines."""
    from plugrl_env_client.app import run_client

    cfg = _point(tmp_path, start_seeds=start_seeds, num_episodes=None if start_seeds else 4)
    assert run_client(cfg, "point-v1") == 0
    run = tmp_path / "run"
    whole = _lines(run)
    assert len(whole) == 4
    (run / "rollout" / "proc_000" / "episodes.jsonl").write_bytes(b"".join(whole[:2]) + b"\n  \n")
    assert run_client(dataclasses.replace(cfg, resume=True), "point-v1") == 0
    episodes = [line for line in _lines(run) if line.strip()]
    assert sorted(map(_same_episode, episodes)) == sorted(map(_same_episode, whole))
    summary = json.loads((run / "summary.json").read_text())
    assert summary["completed_episodes"] == 4 and [s["episodes"] for s in summary["segments"]] == [2, 2], summary


def test_a_garbage_line_at_the_end_is_refused_naming_it_and_nothing_changes(tmp_path):
    """A line that is no episode is never counted as one: the run is not declared finished with episodes missing,
    and the refusal names the line."""
    from plugrl_env_client.app import run_client
    from plugrl_env_client.errors import ConfigError

    cfg = _point(tmp_path, num_episodes=4)
    assert run_client(cfg, "point-v1") == 0
    run = tmp_path / "run"
    episodes = run / "rollout" / "proc_000" / "episodes.jsonl"
    episodes.write_bytes(b"".join(_lines(run)[:2]) + b'{"env_index": 0, "return": 1.0}\n\n')
    before = _files(run)
    with pytest.raises(ConfigError, match=f"^cannot resume: line 3 of {episodes} is not an episode record \\(it "
                                          "has no 'length'\\); delete that line, then --resume again"):
        run_client(dataclasses.replace(cfg, resume=True), "point-v1")
    assert _files(run) == before


def test_resume_is_refused_while_the_run_is_alive_and_without_a_run(finished_run, tmp_path):
    from plugrl_env_client.app import run_client
    from plugrl_env_client.errors import ConfigError
    from plugrl_env_client.outputs.run_dir import RunLock

    cfg = dataclasses.replace(finished_run, resume=True)
    alive = RunLock(tmp_path / "run")
    assert alive.acquire()
    try:
        with pytest.raises(ConfigError, match=f"{tmp_path / 'run'} is in use by a run that is still alive"):
            run_client(cfg, "point-v1")
    finally:
        alive.release()
    with pytest.raises(ConfigError, match="holds no run to resume \\(no such folder\\)"):
        run_client(dataclasses.replace(cfg, exp_name="other"), "point-v1")
    with pytest.raises(ConfigError, match="already holds a run; to continue that run where it stopped add --resume"):
        run_client(finished_run, "point-v1")
    with pytest.raises(ConfigError, match="^--resume continues the run in --output-dir/<exp-name>: pass the stopped "
                                          "run's --exp-name"):
        run_client(dataclasses.replace(cfg, exp_name=None), "point-v1")


@pytest.mark.slow
def test_a_run_stopped_by_a_full_disk_is_resumed_once_space_is_freed(tmp_path, uninterrupted):
    """A disk that fills stops the run (every line whole); once it has room again, --resume ends the run with the
    uninterrupted run's episodes. Needs root to mount the small disk (skipped otherwise)."""
    from small_disk import small_tmpfs

    target = 1500
    with small_tmpfs(tmp_path / "disk", "200k") as disk:
        args = [*_args(disk, "run", episodes=target), "--env.step-sleep-s", "0"]
        full = _run(args)
        assert full.returncode == 1 and f"no space left on device in {disk / 'run'}" in full.stderr, full.stderr
        stopped = _whole_lines(disk / "run")
        assert 0 < stopped < target
        grown = subprocess.run(["mount", "-o", "remount,size=16m", str(disk)], capture_output=True, text=True,
                               timeout=30)
        assert grown.returncode == 0, grown.stderr
        resumed = _run([*args, "--resume"])
        assert resumed.returncode == 0, resumed.stderr
        rows = _check_exact(disk / "run", target)
        segments = json.loads((disk / "run" / "summary.json").read_text())["segments"]
    assert [(s["status"], s["episodes"]) for s in segments] == [("failed", stopped), ("finished", target - stopped)]
    reference = uninterrupted(episodes=target, extra=("--env.step-sleep-s", "0"))
    assert sorted(map(_key, rows)) == sorted(map(_key, reference))
