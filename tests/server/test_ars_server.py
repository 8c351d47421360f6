"""ARS behind the reference server, over real loopback sockets: the server's protocol tests with ``--policy.name
ars``, which env runs which rollout, errors that end the run, and whole client runs (determinism, several
processes and pipelined groups, ``--local-policy ars`` and its report)."""

from __future__ import annotations

import importlib.util
import json
import logging
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from extras import need
from websockets.sync.client import connect

from plugrl_env_client.app import run_client
from plugrl_env_client.config import ClientConfig, RunnerConfig
from plugrl_env_client.envs import discover_envs
from plugrl_env_client.protocol import codec, messages
from plugrl_env_client.server.policies import make_policy
from plugrl_env_client.server.registry import config_of
from plugrl_env_client.server.server import PolicyServer

discover_envs()
import conformance_envs  # noqa: E402,F401  (TextOnly-v1: Box actions, text-only observations)

from plugrl_env_client.envs.point.point_env import PointEnvConfig  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _server_tests():
    spec = importlib.util.spec_from_file_location("server_protocol_tests", Path(__file__).with_name("test_server.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# The server's protocol tests, collected here again: in this module their server_factory serves ARS. (Those that
# check what the random policy answers, or patch its act(), stay with the random policy only.)
_tests = _server_tests()
test_violations_close_with_resync = _tests.test_violations_close_with_resync
test_text_frame_is_a_violation = _tests.test_text_frame_is_a_violation
test_max_episodes_ends_the_run_for_every_client = _tests.test_max_episodes_ends_the_run_for_every_client
test_episode_log_counts_only_masked_rows = _tests.test_episode_log_counts_only_masked_rows
test_false_success_flags_without_a_rule_are_not_a_zero_success_rate = (
    _tests.test_false_success_flags_without_a_rule_are_not_a_zero_success_rate)
test_a_success_shows_the_rule_and_earlier_false_flags_become_failures = (
    _tests.test_a_success_shows_the_rule_and_earlier_false_flags_become_failures)
test_a_success_flag_in_info_makes_an_all_false_run_a_real_zero = (
    _tests.test_a_success_flag_in_info_makes_an_all_false_run_a_real_zero)
test_rules_are_judged_per_connection = _tests.test_rules_are_judged_per_connection
test_a_real_client_run_of_an_env_without_a_rule_logs_no_success_rate = (
    _tests.test_a_real_client_run_of_an_env_without_a_rule_logs_no_success_rate)
test_plugrl_client_feedback_shape_is_accepted_and_counted = _tests.test_plugrl_client_feedback_shape_is_accepted_and_counted
test_feedback_for_envs_without_step_state_is_ignored_with_one_warning = (
    _tests.test_feedback_for_envs_without_step_state_is_ignored_with_one_warning)
test_a_client_that_drops_the_socket_is_a_note_not_an_error = _tests.test_a_client_that_drops_the_socket_is_a_note_not_an_error
test_info_that_cannot_be_split_per_env_is_a_violation = _tests.test_info_that_cannot_be_split_per_env_is_a_violation
test_info_that_breaks_the_exchange_is_a_violation = _tests.test_info_that_breaks_the_exchange_is_a_violation
test_values_that_are_not_m_shaped_pass_through = _tests.test_values_that_are_not_m_shaped_pass_through
test_shutdown_tells_clients_with_server_shutdown = _tests.test_shutdown_tells_clients_with_server_shutdown
test_picows_server_refuses_text_frames = _tests.test_picows_server_refuses_text_frames


def _ars_factory(transport: str):
    made = []

    def start(**kwargs):
        policy = make_policy(config_of(**{"name": "ars", **kwargs.pop("policy", {})}))
        server = PolicyServer(policy, host="127.0.0.1", port=0, transport=transport, **kwargs).start()
        made.append(server)
        return server

    return start, made


@pytest.fixture
def server_factory():
    start, made = _ars_factory("websockets")
    yield start
    for s in made:
        s.shutdown()


@pytest.fixture
def picows_server_factory():
    need("picows")
    start, made = _ars_factory("picows")
    yield start
    for s in made:
        s.shutdown()


# ------------------------------------------------------------------------------------------------ one env, one rollout


def states(n: int, value: float = 1.0, size: int = 2) -> dict:
    return {"images": {}, "states": {"x": np.full((n, size), value)}, "text": np.array(["hi"] * n)}


def infer(ws, ids, step_ids=None, obs=None) -> np.ndarray:
    ids = np.asarray(ids, np.int64)
    steps = np.zeros(len(ids), np.int64) if step_ids is None else np.asarray(step_ids, np.int64)
    ws.send(codec.packb(messages.InferRequest(obs or states(len(ids)), ids, steps).message()))
    return messages.parse_action(codec.unpackb(ws.recv(timeout=10)), ids).actions


def feedback(ws, ids, rewards, done) -> None:
    ids = np.asarray(ids, np.int64)
    m = len(ids)
    flags = np.asarray(done, bool)
    info = {"episode": {"r": np.asarray(rewards, np.float32), "l": np.ones(m, np.int64), "s": np.zeros(m, bool),
                        "mask": flags}} if flags.any() else {}
    ws.send(codec.packb(messages.Feedback(ids, np.zeros(m, np.int64), states(m),
                                          np.asarray(rewards, np.float32), flags, np.zeros(m, bool), info).message()))


def open_client(server):
    ws = connect(server.url, compression=None, max_size=None, proxy=None).__enter__()
    meta = messages.parse_metadata(codec.unpackb(ws.recv(timeout=10)))
    return ws, meta


def wait_until(condition, what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_metadata_says_ars_with_horizon_1_by_default(server_factory):
    _, meta = open_client(server_factory(policy={"action_dim": 3}))
    assert meta.action_horizon == 1 and meta.action_dim == 3 and meta.raw["algorithm"] == "ARS V2-t"
    _, meta = open_client(server_factory(policy={"action_dim": 3, "action_horizon": 4}))
    assert meta.action_horizon == 4


def test_each_env_of_each_connection_runs_one_rollout_and_connections_pool(server_factory):
    """Env 0 and env 1 of connection A get the + and - rollouts of direction 0 (opposite actions for the same
    state), connection B's env 0 and 1 those of direction 1; the iteration ends when all four episodes are in,
    whichever connection they came from."""
    server = server_factory(policy={"action_dim": 2, "directions": 2, "top_directions": 1, "seed": 1})
    a, _ = open_client(server)
    b, _ = open_client(server)
    first = infer(a, [0, 1])
    second = infer(b, [0, 1])
    assert first.shape == (1, 2, 2) and np.allclose(first[0, 0], -first[0, 1]) and first[0, 0].any()
    assert np.allclose(second[0, 0], -second[0, 1]) and not np.allclose(first[0, 0], second[0, 0])
    feedback(a, [0, 1], [1.0, 2.0], [True, True])
    feedback(b, [0, 1], [3.0, 4.0], [True, True])
    learner = server.policy.learner
    wait_until(lambda: learner.iteration == 1, "the iteration to end")
    record = learner.records[-1]
    assert record["returns_plus"] == [1.0, 3.0] and record["returns_minus"] == [2.0, 4.0]
    assert record["connections"] == 2 and record["episodes"] == 4
    a.close()
    b.close()


def test_an_episode_over_several_chunks_keeps_its_rollout_and_sums_their_rewards(server_factory):
    server = server_factory(policy={"action_dim": 1, "directions": 1, "top_directions": 1, "seed": 2})
    ws, _ = open_client(server)
    start = infer(ws, [0, 1])
    feedback(ws, [0, 1], [1.5, 0.5], [False, True])  # env 1's episode ends; env 0's goes on
    again = infer(ws, [0, 1], step_ids=[1, 0])
    assert np.array_equal(again[0, 0], start[0, 0])  # the same rollout, the same state: the same action
    assert not again[0, 1].any()  # env 1's next episode: both rollouts are out, so an evaluation (weights 0)
    feedback(ws, [0, 1], [2.25, 7.0], [True, True])
    learner = server.policy.learner
    wait_until(lambda: learner.iteration == 1, "the iteration to end")
    assert learner.records[-1]["returns_plus"] == [3.75] and learner.records[-1]["returns_minus"] == [0.5]
    assert learner.records[-1]["eval_mean_return"] == 7.0
    ws.close()


def test_a_connection_closed_mid_episode_gives_its_rollout_to_the_next_env(server_factory):
    server = server_factory(policy={"action_dim": 1, "directions": 1, "top_directions": 1, "seed": 3})
    learner = server.policy.learner
    gone, _ = open_client(server)
    plus = infer(gone, [0])
    gone.close()
    wait_until(lambda: len(learner._pending) == 2, "the closed connection's rollout to come back")
    ws, _ = open_client(server)
    again = infer(ws, [0, 1])
    assert np.array_equal(again[0, 0], plus[0, 0]) and np.allclose(again[0, 1], -plus[0, 0])
    ws.close()


def test_an_env_that_joins_mid_episode_runs_the_current_policy_and_is_not_counted(server_factory):
    """After a reconnect the client's envs are mid-episode (step_ids > 0): their returns would not be whole
    episodes, so they count nowhere; their next episodes get rollouts."""
    server = server_factory(policy={"action_dim": 1, "directions": 1, "top_directions": 1, "seed": 4})
    learner = server.policy.learner
    ws, _ = open_client(server)
    joined = infer(ws, [0], step_ids=[5])
    assert not joined.any()  # the current policy: weights 0
    feedback(ws, [0], [9.0], [True])
    fresh = infer(ws, [0])
    assert fresh.any()  # a rollout
    assert learner.episodes == 0 and learner.env_steps == 0
    ws.close()


# ------------------------------------------------------------------------------------------------ errors


def close_of(ws) -> tuple[int, str]:
    from websockets.exceptions import ConnectionClosed

    with pytest.raises(ConnectionClosed) as info:
        ws.recv(timeout=10)
    return info.value.rcvd.code, info.value.rcvd.reason


def test_an_env_without_state_arrays_ends_the_run_with_a_clear_error(server_factory, caplog):
    server = server_factory(policy={"action_dim": 2})
    other, _ = open_client(server)
    ws, _ = open_client(server)
    text_only = {"images": {}, "states": {"_batch": np.zeros((2, 0), np.float32)}, "text": np.array(["a", "b"])}
    ws.send(codec.packb(messages.InferRequest(text_only, np.arange(2), np.zeros(2, np.int64)).message()))
    assert close_of(ws) == (1001, messages.REASON_STOP)
    assert close_of(other) == (1001, messages.REASON_STOP)  # the run is over for every client
    assert "this env sends none (only images and/or text)" in server.failure
    assert any(r.levelname == "ERROR" and "cannot serve this env" in r.getMessage() for r in caplog.records)


def test_a_state_size_that_changes_mid_run_ends_the_run(server_factory):
    server = server_factory(policy={"action_dim": 2})
    ws, _ = open_client(server)
    infer(ws, [0])
    feedback(ws, [0], [1.0], [True])
    ws.send(codec.packb(messages.InferRequest(states(1, size=3), np.arange(1), np.zeros(1, np.int64)).message()))
    assert close_of(ws) == (1001, messages.REASON_STOP)
    assert "changed mid-run" in server.failure and "'x': 3" in server.failure


@pytest.mark.slow
def test_the_server_process_exits_1_with_the_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-c", "from plugrl_env_client.server.cli import main; main()", "--port", str(port),
           "--policy.name", "ars", "--policy.action-dim", "2"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert "Policy server (ars, action_dim=2, horizon=1" in line, line
        with connect(f"ws://127.0.0.1:{port}", compression=None, proxy=None) as ws:
            ws.recv(timeout=10)
            text_only = {"images": {}, "states": {}, "text": np.array(["a"])}
            ws.send(codec.packb(messages.InferRequest(text_only, np.arange(1), np.zeros(1, np.int64)).message()))
            assert close_of(ws) == (1001, messages.REASON_STOP)
        assert proc.wait(timeout=30) == 1
        assert "error: ARS learns a linear policy on the env's state arrays" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()


# ------------------------------------------------------------------------------------------------ client runs


def ars_server(**policy) -> PolicyServer:
    settings = {"name": "ars", "action_dim": 2, "directions": 2, "top_directions": 1, "seed": 3, **policy}
    return PolicyServer(make_policy(config_of(**settings)), host="127.0.0.1", port=0).start()


def client_config(tmp_path: Path, name: str, **kwargs) -> ClientConfig:
    return ClientConfig(output_dir=tmp_path, exp_name=name, progress=False, env=PointEnvConfig(), **kwargs)


def episodes_of(root: Path, proc: int = 0) -> list[tuple[int, float, int]]:
    lines = (root / f"rollout/proc_{proc:03d}/episodes.jsonl").read_text().splitlines()
    return [(e["env_index"], e["return"], e["length"]) for e in map(json.loads, lines)]


@pytest.mark.slow
def test_one_lockstep_process_gets_the_same_returns_run_after_run(tmp_path):
    """The same --policy.seed and --runner.seed: the same episodes and iterations, bit for bit; another policy
    seed draws other directions."""
    runs = []
    for name, seed in (("a", 3), ("b", 3), ("c", 4)):
        server = ars_server(seed=seed)
        try:
            cfg = client_config(tmp_path, name, num_envs=3, num_episodes=24, server_port=server.port,
                                runner=RunnerConfig(seed=5, max_episode_steps=20))
            assert run_client(cfg, "Point-v1") == 0
            wait_until(lambda s=server: s.log.episodes == 24, "the server to take in the last feedback")
            runs.append((episodes_of(tmp_path / name), [r["returns_plus"] for r in server.policy.learner.records]))
        finally:
            server.shutdown()
    assert runs[0] == runs[1] and len(runs[0][1]) >= 3
    assert runs[0][0] != runs[2][0]


@pytest.mark.slow
@pytest.mark.parametrize("layout", [{"num_procs": 2, "num_envs": 2}, {"num_envs": 4, "pipeline": 2}],
                         ids=["two-processes", "two-pipelined-groups"])
def test_processes_and_pipelined_groups_pool_into_one_iteration(tmp_path, layout):
    server = ars_server(directions=4, top_directions=2)
    try:
        runner = RunnerConfig(seed=1, max_episode_steps=15, pipeline=layout.pop("pipeline", 1))
        cfg = client_config(tmp_path, "run", num_episodes=24, server_port=server.port, runner=runner, **layout)
        assert run_client(cfg, "Point-v1") == 0
        learner = server.policy.learner
        wait_until(lambda: learner.iteration >= 2, "two iterations")
        assert all(r["episodes"] == 8 * r["iteration"] for r in learner.records)
        assert max(r["connections"] for r in learner.records) == 2
    finally:
        server.shutdown()


def test_a_server_action_dim_that_does_not_match_the_env_stops_the_client(tmp_path):
    server = ars_server(action_dim=3)
    try:
        cfg = client_config(tmp_path, "run", num_episodes=2, server_port=server.port)
        assert run_client(cfg, "Point-v1") == 1
        error = json.loads((tmp_path / "run" / "summary.json").read_text())["errors"]
        assert "Expected action shape tail (2,), got (3,)" in json.dumps(error)
        assert "--policy.action-dim 2" in json.dumps(error)
    finally:
        server.shutdown()


@pytest.mark.slow
def test_local_policy_ars_learns_saves_its_policy_and_the_report_shows_the_curve(tmp_path, caplog):
    """``--local-policy ars`` on Point-v1: horizon 1, the policy and its iteration log in the run folder, the
    returns rise, and plugrl-report draws them."""
    need("matplotlib")
    caplog.set_level(logging.INFO, logger="plugrl_env_client")
    cfg = client_config(tmp_path, "ars", num_envs=8, num_episodes=300, local_policy="ars", runner=RunnerConfig(seed=2))
    assert run_client(cfg, "Point-v1") == 0
    root = tmp_path / "ars"
    assert "'action_horizon': 1" in (root / "logs" / "client.log").read_text()
    lines = [json.loads(line) for line in (root / "policy" / "ars.jsonl").read_text().splitlines()]
    assert len(lines) >= 10 and [r["iteration"] for r in lines] == list(range(1, len(lines) + 1))
    with np.load(root / "policy" / "ars.npz") as saved:
        assert saved["weights"].shape == (2, 4) and int(saved["iteration"]) == len(lines)
    returns = [e[1] for e in episodes_of(root)]
    first, last = np.mean(returns[:100]), np.mean(returns[-100:])
    assert last > first + 15, (first, last)
    from plugrl_env_client.report.cli import main as report

    assert report([str(root)]) == 0
    assert (root / "report.html").exists() and any((root / "report").glob("return*.png"))


def test_local_policy_ars_on_an_env_without_states_exits_1_with_the_reason(tmp_path, capsys):
    cfg = ClientConfig(output_dir=tmp_path, exp_name="t", progress=False, num_envs=2, num_episodes=4,
                       local_policy="ars")
    assert run_client(cfg, "TextOnly-v1") == 1
    err = capsys.readouterr().err
    assert "--local-policy ars stopped the run: ARS learns a linear policy on the env's state arrays" in err


@pytest.mark.parametrize("env_id", ["Counting-v1", "Gym-v1"], ids=["text-actions", "discrete-actions"])
def test_local_policy_ars_needs_a_box_of_floats(tmp_path, env_id, registry):
    import agent_envs

    from plugrl_env_client.envs.gym.gym_env import GymEnvConfig

    env = GymEnvConfig(id="CartPole-v1") if env_id == "Gym-v1" else agent_envs.CountingConfig()
    cfg = ClientConfig(output_dir=tmp_path, exp_name="t", progress=False, num_episodes=1, local_policy="ars", env=env)
    assert run_client(cfg, env_id) == 1
    error = json.dumps(json.loads((tmp_path / "t" / "summary.json").read_text())["errors"])
    assert "needs a gymnasium Box action space of floats" in error


@pytest.mark.slow
def test_the_readme_training_commands_run(tmp_path):
    """The README's Swimmer commands (train, report, train embedded, evaluate the saved policy),
    as a reader runs them, each client cut to one episode of 50 steps per env: one iteration, so there is a policy
    to evaluate (the static split gives every env one of those episodes, so every direction gets its rollout)."""
    need("mujoco")
    from doc_commands import Command, DocShell, fenced_blocks

    readme = ROOT / "README.md"
    fences = [f for f in fenced_blocks(readme)
              if (f.comment or "") == "long-running: tests/server/test_ars_server.py::test_the_readme_training_commands_run"]
    assert len(fences) == 2
    ran = 0
    with DocShell(tmp_path, tmp_path / "runs") as shell:
        for fence in fences:
            for k, line in enumerate(fence.body.splitlines()):
                if not line.strip() or line.startswith("#"):
                    continue
                if line.startswith("plugrl-run-env-client"):
                    num_envs = re.search(r" --num-envs (\d+)", line)
                    assert num_envs is not None, line
                    line = (re.sub(r" --num-episodes \d+", "", line)
                            + f" --num-episodes {num_envs.group(1)} --runner.max-episode-steps 50")
                result = shell.run(Command(readme, fence.line + 1 + k, line))
                assert result.ok, result.describe()
                ran += 1
            for result in shell.stop_background():
                assert result.ok, result.describe()
    assert ran == 6
    assert (tmp_path / "runs" / "swimmer" / "report.html").exists()
    assert json.loads((tmp_path / "swimmer" / "ars.jsonl").read_text().splitlines()[0])["iteration"] == 1
