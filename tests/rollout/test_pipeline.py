"""Pipelined rollouts (--runner.pipeline K): the same episodes as lockstep, every protocol rule per connection, no
stall against a server that batches by waiting for every connected client, a reconnect in one group, Ctrl-C."""

from __future__ import annotations

import collections
import json
import multiprocessing as mp
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from client_runs import interrupt_once_collecting
from websockets.exceptions import ConnectionClosed
from websockets.sync.server import ServerConnection, serve

from plugrl_env_client.app import run_client
from plugrl_env_client.config import ClientConfig, RunnerConfig
from plugrl_env_client.envs import discover_envs
from plugrl_env_client.envs.base_env import Observation
from plugrl_env_client.errors import ConfigError
from plugrl_env_client.protocol import codec, messages
from plugrl_env_client.records import ProcessStatus
from plugrl_env_client.rollout.budget import EpisodeBudget
from plugrl_env_client.rollout.idle import IdleEnvs
from plugrl_env_client.rollout.loop import Rollout
from plugrl_env_client.rollout.settings import LoopSettings
from plugrl_env_client.timing import Timing

discover_envs()
from probe_protocol import D, check_probe_transcript, probe_script  # noqa: E402

from plugrl_env_client.envs.probe.probe_env import ProbeEnvConfig  # noqa: E402


def episodes_by_env(root: Path) -> dict[int, list[tuple[Any, ...]]]:
    per: dict[int, list[tuple[Any, ...]]] = collections.defaultdict(list)
    for path in sorted(root.glob("rollout/proc_*/episodes.jsonl")):
        for line in path.read_text().splitlines():
            e = json.loads(line)
            per[e["env_index"]].append((e["seed"], e["length"], e["return"], e["terminated"]))
    return per


def test_every_k_gives_the_same_episodes_per_env(tmp_path: Path) -> None:
    """Zero policy: for K = 1, 2, 4 each env's sequence of (seed, length, return) is the same (a run stops at the
    episode target, so an env may have one episode more or less: one list is a prefix of the other)."""
    runs = {}
    for k in (1, 2, 4):
        cfg = ClientConfig(num_envs=12, num_episodes=48, local_policy="zero", output_dir=tmp_path, exp_name=f"k{k}",
                           progress=False, env=ProbeEnvConfig(action_dim=D), runner=RunnerConfig(seed=7, pipeline=k))
        assert run_client(cfg, "Probe-v1") == 0
        runs[k] = episodes_by_env(tmp_path / f"k{k}")
        assert sum(len(v) for v in runs[k].values()) == 48
        summary = json.loads((tmp_path / f"k{k}" / "summary.json").read_text())
        assert summary["completed_episodes"] == 48 and summary["status"] == "finished"
        rows = [json.loads(line) for line in (tmp_path / f"k{k}" / "rollout/proc_000/episodes.jsonl").open()]
        steps = [r["env_steps"] for r in rows]  # the process's count when each episode ended, whatever its group
        assert steps == sorted(steps) and steps[-1] <= summary["timing"]["env_steps"]
        assert steps[-1] >= sum(r["length"] for r in rows), "every step of every recorded episode was counted"
    for k in (2, 4):
        assert set(runs[k]) == set(runs[1]) == set(range(12))
        for env, one in runs[1].items():
            other = runs[k][env]
            m = min(len(one), len(other))
            assert m >= 1 and one[:m] == other[:m], (k, env)
            assert one[0][0] == 7 + env, "the first episode's seed is the process seed plus the env id"


def test_each_connection_keeps_every_protocol_rule(harness, tmp_path: Path) -> None:
    """Two groups, two connections: each transcript passes the probe's checks on its own."""
    h = harness(probe_script(4, stop_after_feedbacks=30))
    cfg = ClientConfig(num_envs=6, server_port=h.port, output_dir=tmp_path, exp_name="run", progress=False,
                       env=ProbeEnvConfig(action_dim=D), runner=RunnerConfig(pipeline=2))
    assert run_client(cfg, "Probe-v1") == 0 and not h.errors
    assert len(h.connections) == 2
    finished = sum(check_probe_transcript(c.received, 4, None, 3) for c in h.connections)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["completed_episodes"] == finished > 0


class BatchingServer:
    """Answers infers only once every connected client has one waiting, as PlugRL's default scheduler does.

    A client that blocks on one connection's reply while another of its connections could still step (and so
    send the infer the server waits for) stalls this server for good.
    """

    def __init__(self, horizon: int, action_dim: int) -> None:
        self.horizon, self.action_dim = horizon, action_dim
        self.cond = threading.Condition()
        self.connected = 0
        self.waiting = 0
        self.generation = 0
        self.batches = 0
        self._server = serve(self._handle, "127.0.0.1", 0, compression=None, max_size=None)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    @property
    def port(self) -> int:
        return self._server.socket.getsockname()[1]

    def _handle(self, ws: ServerConnection) -> None:
        with self.cond:
            self.connected += 1
        try:
            ws.send(codec.packb(messages.metadata_message({"action_horizon": self.horizon,
                                                           "action_dim": self.action_dim})))
            while True:
                msg = codec.unpackb(ws.recv())
                if msg["message_type"] != "infer":
                    continue
                with self.cond:
                    self.waiting += 1
                    generation = self.generation
                    if self.waiting >= self.connected:  # a full batch: release everyone waiting
                        self.waiting = 0
                        self.generation += 1
                        self.batches += 1
                        self.cond.notify_all()
                    else:
                        while self.generation == generation:
                            self.cond.wait()
                ids = msg["env_indices"]
                ws.send(codec.packb(messages.ActionReply(ids, np.zeros((self.horizon, len(ids), self.action_dim))).message()))
        except ConnectionClosed:
            pass
        finally:
            with self.cond:
                self.connected -= 1
                if self.waiting and self.waiting >= self.connected:
                    self.waiting = 0
                    self.generation += 1
                    self.cond.notify_all()

    def shutdown(self) -> None:
        self._server.shutdown()


@pytest.mark.slow
@pytest.mark.parametrize("pipeline", [2, 3])
def test_a_batching_server_never_stalls(tmp_path: Path, pipeline: int) -> None:
    server = BatchingServer(horizon=4, action_dim=D)
    try:
        cmd = [sys.executable, "-m", "plugrl_env_client", "probe-v1", "--num-envs", str(3 * pipeline),
               "--runner.pipeline", str(pipeline), "--num-episodes", "60", "--server-port", str(server.port),
               "--env.action-dim", str(D), "--output-dir", str(tmp_path), "--exp-name", "b", "--no-progress"]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=90)
        assert res.returncode == 0, res.stderr
        assert json.loads((tmp_path / "b" / "summary.json").read_text())["completed_episodes"] == 60
        assert server.batches > 10
    finally:
        server.shutdown()


def test_a_close_on_one_connection_drops_only_that_groups_chunks(harness, tmp_path: Path) -> None:
    """The second connection is resynced once mid-run; the first never notices; every episode counts once."""
    calls = [0]

    def script(conn: Any) -> None:
        conn.send_metadata(action_horizon=4, action_dim=D)
        infers = 0
        while True:
            msg = conn.recv()
            if msg["message_type"] == "infer":
                infers += 1
                if conn.index == 1 and infers == 6:  # the second connection to arrive: resync it once
                    conn.close(1001, messages.REASON_RESYNC)
                    return
                conn.send_zero_action(msg, 4, D)
                calls[0] += 1

    h = harness(script)
    cfg = ClientConfig(num_envs=6, num_episodes=40, server_port=h.port, output_dir=tmp_path, exp_name="run",
                       progress=False, env=ProbeEnvConfig(action_dim=D), runner=RunnerConfig(pipeline=2))
    assert run_client(cfg, "Probe-v1") == 0 and not h.errors
    assert len(h.connections) == 3, "one reconnect, for the group that was closed"
    kinds = [[m["message_type"] for m in c.received] for c in h.connections]
    for k in kinds:
        assert k[0] == "infer" and all(a != b for a, b in zip(k, k[1:]))
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["completed_episodes"] == 40 and summary["timing"]["reconnects"] == 1
    lengths = {e: [x[1] for x in eps] for e, eps in episodes_by_env(tmp_path / "run").items()}
    assert all(length == 3 + 2 * (e % 3) for e, ls in lengths.items() for length in ls)


@pytest.mark.slow
def test_ctrl_c_in_a_pipelined_run_writes_outputs(tmp_path: Path) -> None:
    episodes = tmp_path / "run" / "rollout" / "proc_000" / "episodes.jsonl"
    res = interrupt_once_collecting(["probe-v1", "--num-envs", "6", "--runner.pipeline", "3", "--local-policy",
                                     "random", "--output-dir", str(tmp_path), "--exp-name", "run", "--no-progress"],
                                    episodes)
    assert res.returncode == 130, res.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["completed_episodes"] == len(episodes.read_text().splitlines()) > 0
    assert summary["status"] == "interrupted"


@pytest.mark.parametrize("num_envs, pipeline, group_size, message", [
    (5, 2, 1, "--num-envs 5 does not split into --runner.pipeline 2 equal groups"),
    (8, 2, 3, "--runner.group-size 3 must divide the envs of each pipeline group (4"),
    (4, 0, 1, "--runner.pipeline must be >= 1"),
])
def test_a_split_that_does_not_fit_is_a_clear_error(tmp_path: Path, num_envs: int, pipeline: int, group_size: int,
                                                    message: str) -> None:
    cfg = ClientConfig(num_envs=num_envs, local_policy="zero", num_episodes=1, output_dir=tmp_path, exp_name="x",
                       progress=False, env=ProbeEnvConfig(), runner=RunnerConfig(pipeline=pipeline,
                                                                                 group_size=group_size))
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(".", r"\.")):
        run_client(cfg, "Probe-v1")


def test_pipelined_stage_shares_add_up_to_at_most_the_whole(tmp_path: Path) -> None:
    """The groups' round trips overlap each other and the stepping: the process's infer_wait_s is the time it sat
    with nothing to step, so its stage shares still add up to at most 1."""
    from plugrl_env_client.envs.point.point_env import PointEnvConfig
    from plugrl_env_client.server.policies import PolicyConfig, make_policy
    from plugrl_env_client.server.server import PolicyServer

    server = PolicyServer(make_policy(PolicyConfig(action_dim=2, action_horizon=4)), host="127.0.0.1", port=0,
                          latency_ms=5.0).start()
    try:
        cfg = ClientConfig(num_envs=8, num_episodes=40, server_port=server.port, output_dir=tmp_path, exp_name="run",
                           progress=False, env=PointEnvConfig(), runner=RunnerConfig(pipeline=4, max_episode_steps=10))
        assert run_client(cfg, "Point-v1") == 0
    finally:
        server.shutdown()
    timing = json.loads((tmp_path / "run" / "rollout/proc_000/summary.json").read_text())["timing"]
    shares = {k: v for k, v in timing.items() if k.endswith("_frac")}
    assert timing["infer_wait_s"] > 0 and 0 < sum(shares.values()) <= 1.0 + 1e-6, shares


class _ScriptedGroup:
    """The parts of an EnvGroup the pipelined loop drives, with replies that arrive when the test says."""

    def __init__(self, reply_in_at_poll: bool, on_take: Any = None) -> None:
        self.timing = Timing()
        self.idle, self.started = IdleEnvs(1), 0.0  # one env, which never retires
        self.awaiting_actions, self.has_actions = False, False
        self.reply_in_at_poll, self.on_take = reply_in_at_poll, on_take
        self.steps = self.waited = 0

    @property
    def session(self) -> _ScriptedGroup:
        return self  # what the loop asks of a group's session is wait(): the group answers it itself here

    def wait(self, peers: Any = ()) -> None:
        for group in (self, *peers):
            assert group.awaiting_actions, "the loop waited for a reply it had taken already"
            group.waited += 1
            group.reply_in_at_poll = True

    def connect(self) -> None: ...

    def flush_feedback(self) -> None: ...

    def close(self) -> None: ...

    def reset_all(self) -> Observation:
        return Observation(states={"x": np.zeros((1, 1))})

    def needs_actions(self) -> bool:
        return not self.has_actions

    def ask_for_actions(self, obs: Observation) -> None:
        self.awaiting_actions = True

    def take_actions(self, timeout: float | None = 0.0) -> bool:
        assert self.awaiting_actions, "the loop waited for a reply it had taken already"
        if timeout is not None and not self.reply_in_at_poll:
            return False
        self.awaiting_actions, self.has_actions = False, True
        if self.on_take is not None:
            self.on_take()
        return True

    def can_step(self) -> bool:
        return self.has_actions

    def step(self) -> None:
        self.has_actions = False
        self.steps += 1

    def finish_episodes(self, step: None) -> Observation:
        return self.reset_all()


class _NoSink:
    def episode(self, record: Any) -> None: ...

    def progress(self, *args: Any) -> None: ...

    def artifact(self, *args: Any, **kwargs: Any) -> None: ...


def test_a_reply_taken_as_the_run_stops_is_not_waited_for_again() -> None:
    """The stop comes while a reply is being picked up (the run's time is over, Ctrl-C): that group then does not
    step, and the loop, finding nothing stepped, waits for the other group's reply, never for the one it has."""
    budget = EpisodeBudget(None, mp.get_context("spawn"), 1)
    first = _ScriptedGroup(reply_in_at_poll=True, on_take=budget.stop.set)
    second = _ScriptedGroup(reply_in_at_poll=False)
    settings = LoopSettings(env_id="Scripted", process_id=0, seed=None, max_episode_steps=None, replan_steps=None,
                            success_threshold=None)
    status = Rollout([first, second], settings, budget, _NoSink()).run()  # type: ignore[list-item]
    assert status is ProcessStatus.INTERRUPTED
    assert (first.steps, second.steps) == (0, 0) and not first.awaiting_actions
    assert (first.waited, second.waited) == (0, 1), "the loop waited for the reply it did not have, once"
