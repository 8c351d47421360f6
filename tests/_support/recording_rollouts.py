"""A fake rollout that drives an EpisodeRecorder as the real one does (env groups with their own rows and global
env ids, partial resets, steps, episode ends), the content it observes, and readers of what the recorder wrote."""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

import numpy as np
import pytest

from plugrl_env_client.envs.base_env import Observation
from plugrl_env_client.outputs.recording.config import RecorderConfig
from plugrl_env_client.outputs.recording.recorder import EpisodeRecorder
from plugrl_env_client.records import EpisodeRecord

CAM = (16, 16, 3)
WRIST = (15, 17, 3)  # odd height and width: videos must pad it
SAMPLE = "sampled/ep_000001/env_000/obs"
"""The sample folder of a process's first completed episode, in env 0."""
EVERYTHING = dict(record_video=True, record_full_rollout=True, record_obs_stats=True, record_episode_metrics=True)


def image(env: int, t: int, shape: tuple[int, int, int]) -> np.ndarray:
    """Smooth content (video codecs keep it well), distinct for every env and step."""
    base = (25 * t + 40 * env) % 200
    img = np.empty(shape, np.uint8)
    img[..., 0] = base
    img[..., 1] = base + 2 * np.arange(shape[1])[None, :]
    img[..., 2] = 255 - base
    return img


def state(env: int, t: int) -> np.ndarray:
    return np.array([env, t, env * 10 + t * 0.5])


def text(env: int, t: int) -> str:
    return f"env {env} step {t}"


def action(env: int, t: int) -> np.ndarray:
    return np.array([env, -t], np.float32)


def reward(env: int, t: int) -> float:
    return env + t / 8  # exact in float32


class MemorySink:
    """An in-memory sink (write_bytes only, so the recorder rewrites its JSON-lines files)."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}

    def write_bytes(self, relpath: str, data: bytes) -> None:
        self.files[relpath] = data


@dataclasses.dataclass
class Log:
    """What the fake rollout did: episode starts in order, the episodes that ended (start -> env, length), their
    completion numbers (start -> the process's count of ended episodes when it ended) and each start's number of
    its env's episode (from 1)."""

    starts: list[int] = dataclasses.field(default_factory=list)
    current: dict[int, int] = dataclasses.field(default_factory=dict)
    ended: dict[int, tuple[int, int]] = dataclasses.field(default_factory=dict)
    completed: dict[int, int] = dataclasses.field(default_factory=dict)
    env_episode: dict[int, int] = dataclasses.field(default_factory=dict)


class Group:
    """One env group of a pipelined rollout: its own batch rows, mapped to the process's global env ids."""

    def __init__(self, rec: EpisodeRecorder, env_ids: list[int], log: Log) -> None:
        self.rec, self.ids, self.log = rec, np.asarray(env_ids), log
        self.t = np.zeros(len(env_ids), int)

    def obs(self) -> Observation:
        pairs = list(zip(self.ids.tolist(), self.t.tolist()))
        return Observation(
            images={"cam": np.stack([image(e, t, CAM) for e, t in pairs]),
                    "wrist": np.stack([image(e, t, WRIST) for e, t in pairs])},
            states={"pos": np.stack([state(e, t) for e, t in pairs])},
            text=[text(e, t) for e, t in pairs])

    def reset(self, rows: list[int]) -> None:
        self.t[rows] = 0
        for env in self.ids[rows].tolist():
            self.log.current[env] = len(self.log.starts)
            self.log.env_episode[len(self.log.starts)] = self.log.starts.count(env) + 1
            self.log.starts.append(env)
        self.rec.on_reset(self.obs(), self.ids[rows], np.asarray(rows))

    def step(self) -> None:
        self.t += 1
        pairs = list(zip(self.ids.tolist(), self.t.tolist()))
        actions = np.stack([action(e, t) for e, t in pairs])
        rewards = np.array([reward(e, t) for e, t in pairs], np.float32)
        self.rec.on_step(self.obs(), actions, rewards, self.ids)

    def end(self, env: int) -> None:
        length = int(self.t[list(self.ids).index(env)])
        start = self.log.current.pop(env)
        self.log.ended[start] = (env, length)
        self.log.completed[start] = len(self.log.completed) + 1
        ret = sum(reward(env, t) for t in range(1, length + 1))
        self.rec.on_episode_end(EpisodeRecord(env, ret, length, env % 2 == 0 if env < 2 else None, terminated=True,
                                              truncated=False, metrics={"dist": 0.5 * env}), last_info(env, length))


def last_info(env: int, length: int) -> dict[str, Any]:
    """An env's part of its last step's info, as the rollout hands it over: numpy values, one of them NaN."""
    return {"dist": np.float32(env + length / 4), "goal": np.array([env, length]), "bad": np.float64("nan"),
            "sub": {"flag": np.bool_(env % 2 == 0)}}


def scenario(rec: EpisodeRecorder) -> Log:
    """Two groups (env ids 0,1 and 2,3), partial resets in both, episodes of different lengths, two still running at
    the end. Starts: 0 env0, 1 env1, 2 env2, 3 env3, 4 env1, 5 env3, 6 env2, 7 env0, 8 env1."""
    log = Log()
    a, b = Group(rec, [0, 1], log), Group(rec, [2, 3], log)
    a.reset([0, 1])
    b.reset([0, 1])
    a.step()
    b.step()
    a.step()
    a.end(1)
    a.reset([1])
    b.step()
    b.end(3)
    b.end(2)
    b.reset([1, 0])  # rows in reverse: env 3 starts before env 2
    a.step()
    a.end(0)
    a.end(1)
    a.reset([0, 1])
    b.step()
    b.end(2)
    b.end(3)
    a.step()
    return log


def recorder(sink: Any, k: int = 1, process_id: int = 0, num_envs: int = 4, **options: Any) -> EpisodeRecorder:
    limits = {name: options.pop(name) for name in ("max_frames", "queue_episodes", "queue_bytes") if name in options}
    return EpisodeRecorder(RecorderConfig(episode_freq=k, **options), process_id, num_envs, sink, **limits)


def recorded(files: Any) -> set[tuple[int, int]]:
    """(completion number, env) pairs named by the files."""
    found = set()
    for relpath in files:
        match = re.search(r"ep_?(\d{6})[_/]env_?(\d{3})", relpath)
        if match:
            found.add((int(match.group(1)), int(match.group(2))))
    return found


def strict_lines(data: bytes) -> list[dict[str, Any]]:
    def refuse(constant: str) -> None:
        raise AssertionError(f"non-strict JSON constant {constant}")

    return [json.loads(line, parse_constant=refuse) for line in data.decode().splitlines()]


def warnings_of(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and text in r.getMessage()]
