"""``--runner.pipeline auto``: the choice rule on made-up figures, the splits it may pick, single-instance envs, and
one real run against a reference server that takes its time."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from plugrl_env_client.config import ClientConfig, RunnerConfig
from plugrl_env_client.envs.base_env import BaseEnv
from plugrl_env_client.envs.registry import get_spec, register_env
from plugrl_env_client.errors import ConfigError
from plugrl_env_client.launch.process import ProcessJob, choose_pipeline, group_sizes
from plugrl_env_client.rollout.pipeline_auto import (
    MAX_GROUPS,
    Probe,
    ProbeBudget,
    allowed_groups,
    choose_groups,
)
from plugrl_env_client.timing import Timing


def probe(step_ms: float, wait_ms: float) -> Probe:
    return Probe(step_ms / 1e3, wait_ms / 1e3, wait_ms / 1e3 * 8, 24, 3)


@pytest.mark.parametrize("step_ms,wait_ms,groups", [
    (10.0, 0.0, 1),    # a server that answers at once: lockstep
    (10.0, 0.4, 1),    # waiting 4 % of a batch step: not worth splitting
    (10.0, 1.25, 2),   # a round trip of one batch step every 8 steps: two groups hide it
    (10.0, 5.0, 2),    # exactly what two groups hide
    (10.0, 6.0, 4),    # more than two can hide, less than four
    (10.0, 40.0, 4),   # more than any allowed split hides: the most groups allowed
    (0.0, 1.0, 4),     # an env that takes no measurable time: all waiting
])
def test_the_fewest_groups_that_hide_the_wait(step_ms, wait_ms, groups):
    chosen, why = choose_groups(probe(step_ms, wait_ms), [1, 2, 4])
    assert chosen == groups, why
    assert why


def test_only_allowed_splits_are_chosen():
    assert choose_groups(probe(10.0, 6.0), [1, 2]) == (2, "the wait (60% of a batch step) is more than 2 groups "
                                                           "can hide")
    assert choose_groups(probe(10.0, 9.0), [1])[0] == 1


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


def test_the_probe_figures_come_from_a_lockstep_timing():
    timing = Timing(batch_steps=24, infer_calls=3, env_step_s=0.24, infer_wait_s=0.06)
    measured = Probe.of(timing)
    assert measured.batch_step_s == pytest.approx(0.01)
    assert measured.wait_per_batch_step_s == pytest.approx(0.0025)
    assert measured.round_trip_s == pytest.approx(0.02)
    assert measured.to_json() == {"batch_step_ms": 10.0, "wait_per_batch_step_ms": 2.5, "round_trip_ms": 20.0,
                                  "batch_steps": 24, "infers": 3}


def test_the_probe_budget_ends_after_its_batch_steps_or_its_stop():
    timing = Timing()
    budget = ProbeBudget(timing, batch_steps=3)
    assert not budget.finished() and not budget.claim()
    timing.batch_steps = 3
    assert budget.finished() and budget.exhausted()
    stopped = ProbeBudget(Timing())
    stopped.stop.set()
    assert stopped.finished()


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
        group_sizes(config, single)
    assert group_sizes(ClientConfig(num_envs=4, runner=RunnerConfig(pipeline="auto")), single) == [4]


def test_auto_keeps_a_single_instance_env_whole_without_probing(single):
    """No env is built and no server asked (there is none at this URL): nothing needs measuring."""
    job = ProcessJob(single, ClientConfig(num_envs=4, runner=RunnerConfig(pipeline="auto")), 0, "ws://127.0.0.1:1")
    choice = choose_pipeline(job)
    assert (choice.groups, choice.probe) == (1, None)
    assert "only once per process" in choice.why


@pytest.mark.slow
def test_auto_splits_against_a_slow_server_and_records_its_choice(tmp_path: Path):
    """Point-v1 x16 steps in well under a millisecond; the server takes 20 ms per infer: the wait is more than
    any split hides, so auto takes the most groups (4), says so in the log, client_config.json and the summary,
    and the run collects its episodes with them."""
    server = subprocess.Popen([sys.executable, "-c", "from plugrl_env_client.server.cli import main; main()",
                               "--port", "0", "--policy.action-dim", "2", "--policy.latency-ms", "20"],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = server.stdout.readline()
        assert "listening on ws://127.0.0.1:" in line, line
        port = line.rsplit(":", 1)[1].split()[0]
        done = subprocess.run([sys.executable, "-m", "plugrl_env_client", "Point-v1", "--num-envs", "16",
                               "--num-episodes", "20", "--server-port", port, "--runner.pipeline", "auto",
                               "--output-dir", str(tmp_path), "--exp-name", "auto", "--no-progress"],
                              capture_output=True, text=True, timeout=240)
    finally:
        server.terminate()
        server.wait(timeout=60)
    assert done.returncode == 0, done.stderr
    run = tmp_path / "auto"
    runner = json.loads((run / "client_config.json").read_text())["runner"]
    assert (runner["pipeline"], runner["pipeline_chosen"]) == ("auto", 4)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["completed_episodes"] == 20
    assert summary["pipeline"]["groups"] == 4 and summary["pipeline"]["probe"]["round_trip_ms"] >= 20
    assert "--runner.pipeline auto: 4 group(s) of 4 envs" in (run / "logs" / "client.log").read_text()
