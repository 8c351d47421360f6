"""Live tracking: what the tracker writes is what TensorBoard reads back (its own event reader), while the run goes
on and at its end, from every process, with nothing that is not finite."""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from children import sigint_default
from extras import need
from waiting import wait_until

from plugrl_env_client.errors import ConfigError
from plugrl_env_client.outputs import tracking
from plugrl_env_client.outputs.tracking import NoTracker, TensorBoardTracker, make_tracker, require
from plugrl_env_client.records import EpisodeRecord
from plugrl_env_client.server.policies import PolicyConfig, make_policy
from plugrl_env_client.server.server import PolicyServer
from plugrl_env_client.timing import Timing


def read_scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar series in ``folder``'s event files, as TensorBoard reads them: tag -> [(step, value)]."""
    accumulator = need("tensorboard.backend.event_processing.event_accumulator")
    events = accumulator.EventAccumulator(str(folder), size_guidance={"scalars": 0})  # 0: keep every event
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def episode(pid: int, ret: float, length: int, success: bool | None, env_steps: int | None = None) -> EpisodeRecord:
    return EpisodeRecord(0, ret, length, success, terminated=True, truncated=False, process_id=pid,
                         env_steps=env_steps)


@pytest.fixture
def tensorboard_files() -> None:
    """The tracker's writer (tensorboardX) and TensorBoard's reader, or the test skipped naming their extras."""
    need("tensorboardX")
    need("tensorboard")


@pytest.mark.usefixtures("tensorboard_files")
def test_what_the_writer_gets_becomes_scalars(tmp_path: Path) -> None:
    tracker = TensorBoardTracker(tmp_path / "tb", flush_period_s=60.0)  # flushed by hand and at close here
    tracker.episode(episode(0, 1.5, 10, True))
    tracker.episode(episode(1, math.nan, 7, None))  # a return that is not finite; no success rule
    tracker.episode(episode(0, -2.0, 3, False))
    tracker.progress(0, Timing(env_steps=100, collect_time_s=2.0, infer_calls=10, infer_wait_s=0.5, reconnects=1))
    tracker.progress(1, Timing(env_steps=60, collect_time_s=3.0, infer_calls=30, infer_wait_s=0.3))
    tracker.progress(0, Timing(env_steps=300, collect_time_s=4.0, infer_calls=20, infer_wait_s=0.7, reconnects=2))
    tracker.close()
    scalars = read_scalars(tmp_path / "tb")
    assert scalars["episode/return"] == [(1, 1.5), (3, -2.0)], "the NaN return is left out, the numbering is kept"
    assert scalars["episode/length"] == [(1, 10.0), (2, 7.0), (3, 3.0)]
    assert scalars["episode/success"] == [(1, 1.0), (3, 0.0)]
    # process 0's latest interval: 200 steps in 2 s; process 1's: 60 in 3 s
    ((step, rate),) = scalars["rollout/env_steps_per_s"]
    assert step == 360 and rate == pytest.approx(100 + 20)
    assert scalars["rollout/env_steps"] == [(360, 360.0)]
    # latest intervals: process 0 waited 0.2 s for 10 infers, process 1 0.3 s for 30
    assert scalars["server/infer_round_trip_ms"] == [(360, pytest.approx(1e3 * 0.5 / 40))]
    assert scalars["server/reconnects"] == [(360, 2.0)]
    for series in scalars.values():
        assert all(math.isfinite(v) for _, v in series)


@pytest.mark.usefixtures("tensorboard_files")
def test_episodes_are_also_stepped_by_the_runs_env_steps(tmp_path: Path) -> None:
    tracker = TensorBoardTracker(tmp_path / "tb", flush_period_s=60.0)
    tracker.episode(episode(0, 1.0, 10, True, env_steps=40))
    tracker.episode(episode(1, 2.0, 12, None, env_steps=30))  # run: 40 + 30
    tracker.episode(episode(0, math.inf, 8, False, env_steps=40))  # same batch step as the first
    tracker.episode(episode(1, 3.0, 5, None))  # no count: only in episode/*
    tracker.episode(episode(0, 4.0, 20, True, env_steps=100))  # run: 100 + 30
    tracker.episode(episode(1, 5.0, 6, None, env_steps=8))  # process 1 started again: its 8 add to the 30
    tracker.close()
    scalars = read_scalars(tmp_path / "tb")
    assert scalars["episode_by_env_steps/length"] == [(40, 10.0), (70, 12.0), (70, 8.0), (130, 20.0), (138, 6.0)]
    assert scalars["episode_by_env_steps/return"] == [(40, 1.0), (70, 2.0), (130, 4.0), (138, 5.0)]
    assert scalars["episode_by_env_steps/success"] == [(40, 1.0), (70, 0.0), (130, 1.0)]
    assert [step for step, _ in scalars["episode/length"]] == [1, 2, 3, 4, 5, 6], "the numbered series is unchanged"


@pytest.mark.usefixtures("tensorboard_files")
def test_a_resumed_run_continues_its_curves(tmp_path: Path) -> None:
    """The second segment of a run writes into the same folder: its episodes are numbered after the first's, and its
    env steps (its processes count from zero again) are added to the first segment's."""
    first = TensorBoardTracker(tmp_path / "tb", flush_period_s=60.0)
    earlier = [episode(0, 1.0, 10, True, env_steps=40), episode(1, 2.0, 12, None, env_steps=30),
               episode(0, 3.0, 5, False, env_steps=60)]
    for record in earlier:
        first.episode(record)
    first.close()
    second = TensorBoardTracker(tmp_path / "tb", flush_period_s=60.0)
    second.continue_from(earlier)
    second.episode(episode(0, 4.0, 7, True, env_steps=70))  # 90 steps before, then 70 of process 0's new count
    second.episode(episode(1, 5.0, 9, None, env_steps=20))
    second.progress(0, Timing(env_steps=75, collect_time_s=1.0))
    second.close()
    scalars = read_scalars(tmp_path / "tb")
    assert scalars["episode/length"] == [(1, 10.0), (2, 12.0), (3, 5.0), (4, 7.0), (5, 9.0)]
    assert scalars["episode_by_env_steps/return"] == [(40, 1.0), (70, 2.0), (90, 3.0), (160, 4.0), (180, 5.0)]
    assert scalars["rollout/env_steps"] == [(165, 165.0)]


@pytest.mark.usefixtures("tensorboard_files")
def test_the_events_are_on_disk_while_the_tracker_runs(tmp_path: Path) -> None:
    tracker = TensorBoardTracker(tmp_path / "tb", flush_period_s=0.2)
    try:
        for k in range(5):
            tracker.episode(episode(0, float(k), k + 1, None))

        def five_returns() -> bool:
            return len(read_scalars(tmp_path / "tb").get("episode/return", [])) == 5

        wait_until(five_returns, 30.0, "the timer's flush of five episodes")
    finally:
        tracker.close()
    tracker.close()  # a second close does nothing
    tracker.episode(episode(0, 9.0, 1, None))  # nor does a note after it
    assert len(read_scalars(tmp_path / "tb")["episode/return"]) == 5


def test_none_tracks_nothing_and_a_missing_library_names_the_extra(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    assert isinstance(make_tracker("none", tmp_path), NoTracker) and not (tmp_path / tracking.FOLDER).exists()
    monkeypatch.setitem(sys.modules, "tensorboardX", None)  # as if it were not installed
    with pytest.raises(ConfigError, match=r"--tracking tensorboard needs tensorboardX .*plugrl-env-client\[tensorboard\]"):
        require("tensorboard")
    require("none")


@pytest.fixture
def slow_server():
    """A reference server that takes 20 ms to answer each infer: a run's episodes take their time."""
    server = PolicyServer(make_policy(PolicyConfig(action_dim=2)), host="127.0.0.1", port=0, latency_ms=20.0).start()
    yield server
    server.shutdown()


@pytest.mark.slow
@pytest.mark.usefixtures("tensorboard_files")
def test_a_run_is_tracked_from_every_process_while_it_goes_on(slow_server: PolicyServer, tmp_path: Path) -> None:
    run = tmp_path / "run"
    client = subprocess.Popen(sigint_default([
        sys.executable, "-m", "plugrl_env_client", "point-v1", "--tracking", "tensorboard", "--num-procs", "2",
        "--num-envs", "2", "--env.max-episode-steps", "6", "--server-port", str(slow_server.port), "--no-progress",
        "--output-dir", str(tmp_path), "--exp-name", "run"]), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        live: dict[str, list[tuple[int, float]]] = {}

        def tracked() -> bool:
            if not (run / "tensorboard").is_dir():
                return False
            live.update(read_scalars(run / "tensorboard"))
            return len(live.get("episode/return", ())) >= 4 and bool(live.get("server/infer_round_trip_ms"))

        wait_until(tracked, 90.0, "episodes and round trips in the TensorBoard events", proc=client)
        assert client.poll() is None, "read while the run goes on"
        client.send_signal(signal.SIGINT)
        out, err = client.communicate(timeout=90)
    finally:
        client.kill()
        client.wait()
    assert client.returncode == 128 + signal.SIGINT, err
    assert live["server/infer_round_trip_ms"][0][1] >= 20.0, "each infer waited for the server's 20 ms"
    final = read_scalars(run / "tensorboard")
    summary = json.loads((run / "summary.json").read_text())
    assert len(final["episode/return"]) == summary["completed_episodes"] >= len(live["episode/return"])
    assert [step for step, _ in final["episode/length"]] == list(range(1, summary["completed_episodes"] + 1))
    lines = {p: (run / f"rollout/proc_{p:03d}/episodes.jsonl").read_text().splitlines() for p in (0, 1)}
    assert all(lines.values()), "both processes' episodes are in the series"
    assert sorted(v for _, v in final["episode/length"]) == sorted(
        float(json.loads(line)["length"]) for p in (0, 1) for line in lines[p])
    by_steps = [step for step, _ in final["episode_by_env_steps/length"]]
    assert len(by_steps) == summary["completed_episodes"] and by_steps == sorted(by_steps)
    assert by_steps[-1] == sum(json.loads(lines[p][-1])["env_steps"] for p in (0, 1)), "the run's env steps"
    assert sorted(v for _, v in final["episode_by_env_steps/return"]) == sorted(v for _, v in final["episode/return"])
    assert final["rollout/env_steps"][-1][1] <= summary["timing"]["env_steps"]
    assert all(v > 0 for _, v in final["rollout/env_steps_per_s"])
    for series in final.values():
        assert all(math.isfinite(v) for _, v in series)
