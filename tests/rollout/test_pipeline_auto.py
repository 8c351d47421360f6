"""``--runner.pipeline auto``: the choice rule on made-up figures, the splits it may pick, single-instance envs, and
one real run against a reference server that takes its time."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from plugrl_env_client.config import ClientConfig, RunnerConfig
from plugrl_env_client.envs.base_env import BaseEnv
from plugrl_env_client.envs.registry import get_spec, register_env
from plugrl_env_client.errors import ConfigError
from plugrl_env_client.launch.process import ProcessJob, choose_pipeline, group_sizes, with_pipeline
from plugrl_env_client.rollout.pipeline_auto import (
    MAX_GROUPS,
    WORTH_SPLITTING,
    Probe,
    ProbeBudget,
    allowed_groups,
    choose_split,
    estimated_s,
)
from plugrl_env_client.timing import Timing


def probe(step_ms: float, round_trip_ms: float, client_ms: float = 0.0, asking: float = 1.0) -> Probe:
    """A probe of 24 batch steps whose lockstep asked for actions at ``asking`` of them (chunks that stay
    together: no episode ended)."""
    infers = round(24 * asking)
    return Probe(step_ms / 1e3, round_trip_ms * infers / 24 / 1e3, round_trip_ms / 1e3, 24, infers, client_ms / 1e3)


@pytest.mark.parametrize("step_ms,round_trip_ms,client_ms,asking,groups", [
    (10.0, 0.0, 0.0, 1.0, 1),     # a server that answers at once: lockstep
    (10.0, 3.2, 0.0, 0.125, 1),   # waiting 4 % of a batch step: a split would save less than 5 %
    (10.0, 10.0, 0.0, 1.0, 4),    # a round trip of one batch step at every step: four groups hide the most
    (10.0, 5.0, 0.0, 1.0, 2),     # exactly what two groups hide: four cost as much, and the fewer is taken
    (10.0, 6.0, 2.0, 1.0, 2),     # the client's work per group makes 4 groups slower than 2
    (10.0, 40.0, 0.0, 1.0, 4),    # more than any allowed split hides: the most groups allowed
    (0.0, 8.0, 0.0, 0.125, 1),    # an env that takes no time: nothing to hide the wait behind
    (0.06, 1.04, 0.3, 0.125, 1),  # a tiny env whose client work dominates: more groups cost more than they hide
])
def test_the_split_the_rule_takes(step_ms, round_trip_ms, client_ms, asking, groups):
    chosen, why = choose_split(probe(step_ms, round_trip_ms, client_ms, asking), [1, 2, 4])
    assert chosen == groups, why
    assert why


def test_the_estimate_of_each_split():
    measured = probe(10.0, 6.0, 2.0)
    assert estimated_s(measured, 1) == pytest.approx(0.018)  # 10 + 2 + 6
    assert estimated_s(measured, 2) == pytest.approx(0.013)  # 10 + 1.5 * 2, the wait hidden behind 6.5
    assert estimated_s(measured, 4) == pytest.approx(0.015)  # 10 + 2.5 * 2
    assert estimated_s(probe(10.0, 80.0, asking=0.125), 4) == pytest.approx(0.01 + 0.0725 / 8)  # 7.5 of 80 hidden
    assert estimated_s(measured, 2, work_s=0.0) == pytest.approx(0.011)  # 10 + (6 - 5) left unhidden


def test_a_probe_that_took_no_step_keeps_lockstep():
    assert choose_split(Probe(0.0, 0.0, 0.0, 0, 0), [1, 2, 4]) == (1, "the probe took no step")


def test_only_allowed_splits_are_chosen():
    chosen, why = choose_split(probe(10.0, 10.0), [1, 2])
    assert chosen == 2 and why == "about 15 ms per batch step instead of lockstep's 20 ms"
    assert choose_split(probe(10.0, 9.0), [1]) == (1, "no other split is allowed")


def drifting(probe: Probe, num_envs: int, rows_per_env_step: float) -> Probe:
    return dataclasses.replace(probe, num_envs=num_envs, rows_per_env_step=rows_per_env_step, chunks_drift=True)


def test_chunks_that_drift_apart_are_asked_for_as_a_running_rollout_asks():
    """A probe starts every env afresh, so its chunks start together; once episodes end at different steps, each
    env starts a chunk at a step with the chance of its rows per env step, independently of the others."""
    fresh = probe(10.0, 8.0, asking=3 / 24)
    assert fresh.asking(16) == fresh.asking(4) == pytest.approx(0.125), "chunks that stay together"
    drifted = drifting(fresh, 16, 0.125)
    assert drifted.asking(16) == pytest.approx(1 - 0.875 ** 16)
    assert drifted.asking(8) == pytest.approx(1 - 0.875 ** 8)


def test_envs_of_a_seed_group_ask_as_one():
    """Envs of one ``--runner.group-size`` group restart together, so their chunks end together: 8 envs in seed
    groups of 4 ask at a step as 2 independent units do."""
    drifted = drifting(probe(10.0, 8.0, asking=0.5), 16, 0.125)
    grouped = dataclasses.replace(drifted, seed_group=4)
    assert grouped.asking(8) == pytest.approx(1 - 0.875 ** 2)
    assert drifted.asking(8) == pytest.approx(1 - 0.875 ** 8)
    assert grouped.to_json()["seed_group"] == 4
    timing = Timing()
    budget = ProbeBudget(timing, batch_steps=2, seed_group=4)
    timing.batch_steps, timing.env_steps = 1, 8
    budget.finished()
    timing.batch_steps, timing.env_steps = 2, 16
    assert budget.finished() and budget.probe().seed_group == 4


def test_a_probes_figures_from_hopper_pick_the_split_that_ran_fastest():
    """Hopper-v5 x16, H=8, a server holding each reply about one batch step: a probe's own figures (a fresh start:
    9 infers in 23 batch steps), and the rates measured after it in a running rollout, in ms per batch step:
    lockstep 11.4, 2 groups 7.8-8.1, 4 groups 6.5."""
    plain = Probe(4.46e-3, 2.09e-3, 5.34e-3, 23, 9, 0.90e-3, 16, 0.145, True)
    assert estimated_s(plain, 1) == pytest.approx(0.0103, abs=3e-4)
    assert estimated_s(plain, 2) == pytest.approx(0.0076, abs=3e-4)
    assert estimated_s(plain, 4) < estimated_s(plain, 2)
    groups, why = choose_split(plain, [1, 2, 4])
    assert groups == 4, why


def test_a_further_group_must_save_what_a_split_must():
    """Two splits estimated within the noise of a probe (its estimates move by a few percent between runs): the
    tie goes to fewer groups, and the log says what was passed over."""
    plain = Probe(3.16e-3, 0.5 * 4.17e-3, 4.17e-3, 24, 12, 0.5e-3, 16, 0.146, False, asks_per_batch_step=0.5)
    assert estimated_s(plain, 4) < estimated_s(plain, 2) < estimated_s(plain, 4) / (1 - WORTH_SPLITTING)
    groups, why = choose_split(plain, [1, 2, 4])
    assert groups == 2, why
    assert "; 4 groups at " in why and why.endswith(" ms is within 5%"), why
    slow = dataclasses.replace(plain, round_trip_s=8e-3, asks_per_batch_step=1.0)  # four groups hide clearly more
    assert choose_split(slow, [1, 2, 4])[0] == 4


@pytest.mark.parametrize("plain,expected", [
    ((1.0, 3.0, 0.0, 0.125), 4),  # 2 groups save 4.5 % of lockstep: not enough; 4 save 6.8 %
    ((0.0, 0.0), 1),  # nothing takes time, so nothing is saved
    ((10.0, 1.6, 0.5, 0.125), 1),  # under 5 %: lockstep
])
def test_a_split_must_save_five_percent_of_lockstep(plain, expected):
    groups, why = choose_split(probe(*plain), [1, 2, 4])
    assert groups == expected, why


@pytest.mark.parametrize("num_envs,group_size,allowed", [
    (16, 1, [1, 2, 4]), (6, 1, [1, 2]), (7, 1, [1]), (2, 1, [1, 2]), (1, 1, [1]),
    (16, 8, [1, 2]),  # each pipeline group holds whole seed groups
    (12, 3, [1, 2, 4]), (12, 4, [1]), (12, 6, [1, 2]),
])
def test_allowed_splits_divide_the_envs_into_whole_seed_groups(num_envs, group_size, allowed):
    assert allowed_groups(num_envs, group_size) == allowed
    assert max(allowed) <= MAX_GROUPS


def test_a_single_instance_env_is_never_split():
    assert allowed_groups(16, 1, single_instance=True) == [1]


def test_the_probe_figures_come_from_two_lockstep_timings():
    before = Timing(batch_steps=1, infer_calls=1, infer_rows=16, env_steps=16, env_step_s=0.01, infer_wait_s=0.02)
    after = Timing(batch_steps=25, infer_calls=4, infer_rows=64, env_steps=376, idle_env_steps=24, env_step_s=0.25,
                   infer_wait_s=0.08)
    measured = Probe.between(before, after, wall_s=0.36, chunks_drift=True)
    assert (measured.batch_steps, measured.infers, measured.num_envs) == (24, 3, 16)
    assert measured.rows_per_env_step == pytest.approx(48 / 384) and measured.chunks_drift  # idle envs count
    assert measured.asks == pytest.approx(3 / 24)
    assert measured.batch_step_s == pytest.approx(0.01)
    assert measured.wait_per_batch_step_s == pytest.approx(0.0025)
    assert measured.round_trip_s == pytest.approx(0.02)
    assert measured.overhead_s == pytest.approx(0.0025)  # (0.36 - 0.24 - 0.06) / 24
    assert measured.to_json() == {"batch_step_ms": 10.0, "wait_per_batch_step_ms": 2.5, "client_per_batch_step_ms": 2.5,
                                  "round_trip_ms": 20.0, "batch_steps": 24, "infers": 3, "num_envs": 16,
                                  "asks_per_batch_step": 0.125, "rows_per_env_step": 0.125, "chunks_drift": True,
                                  "seed_group": 1}
    from_start = Probe.between(before, after, wall_s=0.36, start=Timing())
    assert from_start.asks == pytest.approx(4 / 25) and from_start.rows_per_env_step == pytest.approx(64 / 400)
    assert from_start.round_trip_s == measured.round_trip_s, "times stay the window's"


def test_asks_are_counted_from_the_probes_start():
    """Chunks of 8 that stay together: infers at batch steps 0, 8 and 16 of 24. A window from the first step on
    would see 2 infers in 23 steps; from the start, one every 8 steps."""
    timing = Timing()
    budget = ProbeBudget(timing, batch_steps=24)
    for step in range(24):
        if step % 8 == 0:
            timing.infer_calls += 1
            timing.infer_rows += 16
        timing.batch_steps += 1
        timing.env_steps += 16
        budget.finished()
    measured = budget.probe()
    assert measured.asks == pytest.approx(1 / 8) and measured.rows_per_env_step == pytest.approx(1 / 8)
    assert measured.infers == 2, "the window's own count, for the round trip"
    assert not measured.chunks_drift


def ended_at(steps: list[int], num_envs: int = 4) -> ProbeBudget:
    """A probe of ``num_envs`` envs whose episodes ended at ``steps`` (one claim per episode)."""
    timing = Timing()
    budget = ProbeBudget(timing, batch_steps=24)
    for step in range(1, 25):
        timing.batch_steps, timing.env_steps = step, step * num_envs
        for _ in range(steps.count(step)):
            assert not budget.claim()
        budget.finished()
    return budget


def test_chunks_drift_when_some_envs_episodes_end_while_others_go_on():
    assert ended_at([5, 7, 7, 12]).probe().chunks_drift
    assert ended_at([10]).probe().chunks_drift
    assert not ended_at([10, 10, 10, 10, 20, 20, 20, 20]).probe().chunks_drift, "fixed-length episodes end together"
    assert not ended_at([]).probe().chunks_drift


def test_the_probe_budget_measures_from_the_first_step_to_its_end():
    timing = Timing()
    budget = ProbeBudget(timing, batch_steps=3)
    assert not budget.finished()
    assert budget.probe().batch_steps == 0, "nothing measured before the first step"
    timing.batch_steps, timing.env_step_s = 1, 0.5  # connecting, the first reset and step: left out
    assert not budget.finished()
    timing.batch_steps, timing.env_step_s, timing.infer_calls, timing.infer_wait_s = 3, 0.52, 1, 0.004
    assert budget.finished() and budget.exhausted()
    measured = budget.probe()
    assert measured.batch_steps == 2 and measured.batch_step_s == pytest.approx(0.01)
    assert measured.wait_per_batch_step_s == pytest.approx(0.002)
    assert not measured.chunks_drift
    timing = Timing(batch_steps=1, env_steps=2)
    ending = ProbeBudget(timing, batch_steps=2)
    assert not ending.finished()
    assert not ending.claim(), "a probe's episodes are never recorded"
    timing.batch_steps, timing.env_steps = 2, 4
    assert ending.finished() and ending.probe().chunks_drift  # one env of two ended
    stopped = ProbeBudget(Timing())
    stopped.stop.set()
    assert stopped.finished()


def test_the_choice_becomes_the_runs_config():
    config = ClientConfig(num_envs=8, runner=RunnerConfig(pipeline="auto", align_chunks=3))
    chosen = with_pipeline(config, 2).runner
    assert (chosen.pipeline, chosen.align_chunks) == (2, 3), "auto never changes --runner.align-chunks"
    assert config.runner.pipeline == "auto", "the given config is left as it was"


@pytest.fixture
def single(registry):
    @register_env("OnlyOnce-v1", single_instance=True)
    class OnlyOnce(BaseEnv):
        pass

    yield "OnlyOnce-v1"


def test_single_instance_is_a_registration_flag(single):
    assert get_spec(single).single_instance
    assert not get_spec("Point-v1").single_instance


def test_a_single_instance_env_split_by_hand_is_a_clear_error(single):
    config = ClientConfig(num_envs=4, runner=RunnerConfig(pipeline=2))
    with pytest.raises(ConfigError, match=r"OnlyOnce-v1 can exist only once per process .* --runner.pipeline 1"):
        group_sizes(config, get_spec(single))
    assert group_sizes(ClientConfig(num_envs=4, runner=RunnerConfig(pipeline="auto")), get_spec(single)) == [4]


def test_auto_keeps_a_single_instance_env_whole_without_probing(single):
    """No env is built and no server asked (there is none at this URL): nothing needs measuring."""
    job = ProcessJob(single, ClientConfig(num_envs=4, runner=RunnerConfig(pipeline="auto")), 0, "ws://127.0.0.1:1")
    choice = choose_pipeline(job)
    assert (choice.groups, choice.probe) == (1, None)
    assert "only once per process" in choice.why


SLOW_STEP_ENV = str(Path(__file__).resolve().parents[1] / "_support" / "slow_step_env.py")


@pytest.mark.slow
def test_auto_splits_against_a_slow_server_and_records_its_choice(tmp_path: Path):
    """An env whose batch step takes 10 ms, a server that holds each infer back 30 ms and answers one action at a
    time: lockstep waits three times as long as it steps, so auto splits (into 4 groups on an idle machine, 2 when
    the client's own work per group weighs more), says so in the log, client_config.json and the summary, and the
    run collects its episodes with that many groups."""
    server = subprocess.Popen([sys.executable, "-c", "from plugrl_env_client.server.cli import main; main()",
                               "--port", "0", "--policy.action-dim", "2", "--policy.latency-ms", "30",
                               "--policy.action-horizon", "1"],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = server.stdout.readline()
        assert "listening on ws://127.0.0.1:" in line, line
        port = line.rsplit(":", 1)[1].split()[0]
        done = subprocess.run([sys.executable, "-m", "plugrl_env_client", "SlowStep-v1", "--env-path", SLOW_STEP_ENV,
                               "--num-envs", "16", "--num-episodes", "16", "--server-port", port,
                               "--runner.pipeline", "auto", "--output-dir", str(tmp_path), "--exp-name", "auto",
                               "--no-progress"],
                              capture_output=True, text=True, timeout=240)
    finally:
        server.terminate()
        server.wait(timeout=60)
    assert done.returncode == 0, done.stderr
    run = tmp_path / "auto"
    runner = json.loads((run / "client_config.json").read_text())["runner"]
    assert runner["pipeline"] == "auto" and runner["pipeline_chosen"] in (2, 4)
    assert runner["align_chunks"] == 0 and runner["align_chunks_chosen"] == 0, "auto never aligns chunks"
    groups = runner["pipeline_chosen"]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["completed_episodes"] == 16
    assert summary["pipeline"]["groups"] == groups
    probe = summary["pipeline"]["probe"]
    assert probe["round_trip_ms"] >= 30 and probe["batch_step_ms"] >= 10
    assert f"--runner.pipeline auto: {groups} group(s) of {16 // groups} envs" in (run / "logs" / "client.log").read_text()


def test_auto_is_chosen_once_per_run_before_its_processes_start(registry, tmp_path: Path):
    """A process takes the number of groups the run chose: one given ``auto`` still unresolved fails at once, with
    nothing built and nothing asked of a server (there is none at this URL), saying who resolves it."""
    from plugrl_env_client.launch.process import run_process
    from plugrl_env_client.outputs.run_dir import RunDir
    from plugrl_env_client.outputs.run_writer import RunWriter
    from plugrl_env_client.records import ProcessStatus
    from plugrl_env_client.rollout.budget import EpisodeBudget

    writer = RunWriter(RunDir(tmp_path / "run").create(), "run", 1)
    config = ClientConfig(num_envs=4, progress=False, runner=RunnerConfig(pipeline="auto"))
    try:
        result = run_process(ProcessJob("Point-v1", config, 0, "ws://127.0.0.1:1"), EpisodeBudget(4), writer)
    finally:
        writer.close()
    assert result.status is ProcessStatus.FAILED
    assert "choose_pipeline() picks the number of groups once per run" in (result.error or "")
