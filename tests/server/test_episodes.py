"""The reference server's episode accounting: memory that does not grow with the episodes, and the episode file."""

from __future__ import annotations

import json
import logging
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from websockets.sync.client import connect

from plugrl_env_client.protocol import codec, messages
from plugrl_env_client.server.episodes import EpisodeFile, Source
from plugrl_env_client.server.info import FinishedEpisodes
from plugrl_env_client.server.policies import PolicyConfig, make_policy
from plugrl_env_client.server.server import PolicyServer

N = 16


def obs(n: int = N) -> dict:
    return {"images": {}, "states": {"x": np.zeros((n, 3))}, "text": np.array(["hi"] * n)}


class Client:
    """One connection of ``N`` envs whose every chunk ends all their episodes."""

    def __init__(self, server: PolicyServer) -> None:
        self.ws = connect(server.url, compression=None, max_size=None, proxy=None).__enter__()
        messages.parse_metadata(codec.unpackb(self.ws.recv(timeout=10)))
        self.ids = np.arange(N, dtype=np.int64)
        self.step = 0

    def episodes(self, rounds: int, returns: np.ndarray | None = None) -> None:
        done = np.ones(N, bool)
        for _ in range(rounds):
            self.ws.send(codec.packb(messages.InferRequest(obs(), self.ids, np.full(N, self.step, np.int64)).message()))
            messages.parse_action(codec.unpackb(self.ws.recv(timeout=10)), self.ids)
            info = {"is_step_success": np.zeros(N, bool),
                    "episode": {"r": np.ones(N, np.float32) if returns is None else returns,
                                "l": np.full(N, 10, np.int64), "s": np.zeros(N, bool), "mask": done}}
            self.ws.send(codec.packb(messages.Feedback(self.ids, np.full(N, self.step, np.int64), obs(),
                                                       np.ones(N, np.float32), done, np.zeros(N, bool),
                                                       info).message()))
            self.step += 1

    def close(self) -> None:
        self.ws.close()


@pytest.mark.slow
def test_server_memory_does_not_grow_with_the_episodes_it_counted():
    """After a warm-up, 3,200 further episodes (from fresh connections, as clients that come and go) leave the
    server's Python heap where it was: running totals and a bounded window, nothing kept per episode or per
    closed connection. At the 5 KB per episode a server once kept, that would be 16 MB."""
    server = PolicyServer(make_policy(PolicyConfig(action_dim=2)), host="127.0.0.1", port=0).start()
    tracemalloc.start()
    try:
        def run(episodes: int) -> None:
            for _ in range(episodes // (N * 25)):
                client = Client(server)
                client.episodes(25)
                client.close()

        run(1_200)
        before, _ = tracemalloc.get_traced_memory()
        run(3_200)
        client = Client(server)
        client.episodes(1)  # every feedback before it has been counted
        client.close()
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        server.shutdown()
    assert server.log.episodes == 1_200 + 3_200 + N
    grew = (after - before) / 2**20
    assert grew < 1.0, f"the server's heap grew by {grew:.2f} MB over 3,200 episodes"


def test_the_episode_file_has_a_strict_json_line_per_episode(tmp_path):
    path = tmp_path / "log" / "episodes.jsonl"
    server = PolicyServer(make_policy(PolicyConfig(action_dim=2)), host="127.0.0.1", port=0, episode_log=path).start()
    try:
        client = Client(server)
        returns = np.ones(N, np.float32)
        returns[3] = np.nan
        returns[4] = np.inf
        client.episodes(2, returns)
        client.episodes(1)
        client.close()
    finally:
        server.shutdown()
    lines = [json.loads(line, parse_constant=lambda c: pytest.fail(f"{c} in the episode file"))
             for line in path.read_text().splitlines()]
    assert len(lines) == 3 * N
    assert [line["env_index"] for line in lines] == list(range(N)) * 3
    assert {line["connection"] for line in lines} == {1} and {line["stream"] for line in lines} == {None}
    assert lines[3]["return"] is None and lines[4]["return"] is None and lines[5]["return"] == 1.0
    assert {line["length"] for line in lines} == {10} and {line["success"] for line in lines} == {False}


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (a device on which every write fails)")
def test_a_failing_episode_file_is_said_once_and_ends_the_file_only(caplog):
    """A full disk: one error line naming the file, then the file is given up (the server goes on serving)."""
    file = EpisodeFile(Path("/dev/full"))
    report = FinishedEpisodes(np.arange(N), np.ones(N), np.full(N, 10, np.int64), None)
    for _ in range(2_000):  # past any buffer: the device refuses the write itself
        file.write(Source(1), list(range(N)), report)
    file.close()
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "/dev/full" in errors[0] and "serving" in errors[0], errors
