"""The client over a link like a real one: limited bandwidth and a round-trip delay, with camera frames.

Run from the repo root::

    python bench/link.py                               # 25 MB/s, 2 ms round trip; about 1 minute
    python bench/link.py --quick                       # shorter cells, fewer rounds (noisier)
    python bench/link.py --rate-mbytes 10 --rtt-ms 20  # another link

Between the client and the reference server (``plugrl-run-policy-server`` in a subprocess, random policy, horizon
8) sits ``link_proxy.LinkProxy``: each direction carries at most ``--rate-mbytes`` MB/s (10^6 bytes) and adds half
of ``--rtt-ms``. The env is ``LinkFrames-v1``, defined here: 16 envs, each with one 224x224x3 and one 112x112x3
camera, playing back frames MuJoCo rendered once (``bench/frames/halfcheetah.npz``, made by
``bench/render_frames.py``; env i shows frame ``(i + t) % 24`` at its step t), episodes of 50 steps, at almost no
simulation cost: the link is what is measured. H=8, ``reuse-feedback-obs`` on (each observation crosses the link
about once).

Rows (env-steps/s from the env's first step to its last, median over rounds, the rows alternated per round):

* ``raw arrays, no link``: the same run straight to the server (what the machine does without the link);
* ``raw arrays, link``: the images as arrays through the link;
* ``jpeg q90, link``: the images JPEG-encoded per env row through the link, once the client sends them so (the
  row says when it cannot run yet). Target: at least 5x ``raw arrays, link`` over 25 MB/s and 2 ms.

The last lines give the link's ceiling for each (link rate / bytes per env step) from the bytes the client sent.
"""

from __future__ import annotations

import argparse
import dataclasses
import multiprocessing as mp
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from link_proxy import LinkProxy
from machine import ReferenceServer, load_avg, machine_line

from plugrl_env_client.config import ClientConfig, RunnerConfig
from plugrl_env_client.envs.base_env import (
    Action,
    BaseEnv,
    BaseEnvConfig,
    BoolArray,
    Observation,
    RewardArray,
    observation_space,
)
from plugrl_env_client.envs.registry import register_env
from plugrl_env_client.launch.local import LocalLauncher
from plugrl_env_client.launch.process import ProcessJob
from plugrl_env_client.outputs.run_dir import RunDir
from plugrl_env_client.outputs.run_writer import RunWriter
from plugrl_env_client.rollout.budget import EpisodeBudget

FRAMES = Path(__file__).resolve().parent / "frames" / "halfcheetah.npz"
ENV_ID = "LinkFrames-v1"
NUM_ENVS = 16
HORIZON = 8
ACTION_DIM = 6
EPISODE_STEPS = 50
JPEG_TARGET = 5.0
"""jpeg q90 / raw arrays over the same link (25 MB/s, 2 ms)."""


@dataclasses.dataclass
class LinkFramesConfig(BaseEnvConfig):
    frames: str = str(FRAMES)
    """The .npz of camera frames to play back (cam224 [F, 224, 224, 3], cam112 [F, 112, 112, 3])."""


class StepClock:
    """Env steps and the wall clock of the first and the last one, for the rate of one run."""

    def __init__(self) -> None:
        self.steps, self.first, self.last = 0, 0.0, 0.0

    def tick(self, num_envs: int) -> None:
        now = time.perf_counter()
        if not self.steps:
            self.first = now
        self.steps += num_envs
        self.last = now

    def rate(self) -> float:
        return self.steps / (self.last - self.first) if self.last > self.first else 0.0


CLOCK = StepClock()


@register_env(ENV_ID, max_episode_steps=EPISODE_STEPS, config=LinkFramesConfig)
class LinkFramesEnv(BaseEnv[LinkFramesConfig]):
    """Plays back the shipped camera frames: env i shows frame (i + t) % F of each camera at its step t."""

    def __init__(self, config: LinkFramesConfig, num_envs: int = 1, **kwargs: Any) -> None:
        super().__init__(config, num_envs=num_envs, **kwargs)
        frames = np.load(config.frames)
        self.cam224, self.cam112 = frames["cam224"], frames["cam112"]
        self.single_action_space = gym.spaces.Box(-1.0, 1.0, (ACTION_DIM,), np.float32)
        self.single_observation_space = observation_space(
            images={"cam224": self.cam224.shape[1:], "cam112": self.cam112.shape[1:]},
            states={"qpos": (ACTION_DIM,)})
        self.t = np.zeros(num_envs, np.int64)

    def _observe(self) -> Observation:
        index = (np.arange(self.num_envs) + self.t) % len(self.cam224)
        return Observation(images={"cam224": self.cam224[index], "cam112": self.cam112[index]},
                           states={"qpos": np.zeros((self.num_envs, ACTION_DIM))})

    def reset(self, *, seed: int | list[int | None] | None = None,
              options: dict[str, Any] | None = None) -> tuple[Observation, dict]:
        self.seed_rngs(seed)
        self.t[self.reset_mask(options)] = 0
        return self._observe(), {}

    def step(self, actions: Action) -> tuple[Observation, RewardArray, BoolArray, BoolArray, dict]:
        self.t += 1
        CLOCK.tick(self.num_envs)
        zeros = np.zeros(self.num_envs, bool)
        return self._observe(), np.zeros(self.num_envs, np.float32), zeros, zeros, {}


def Server() -> ReferenceServer:
    """The reference server answering the bench env's actions."""
    return ReferenceServer(["--policy.action-dim", str(ACTION_DIM), "--policy.action-horizon", str(HORIZON)])


@dataclasses.dataclass
class Cell:
    rate: float
    """env-steps/s, first env step to last"""
    bytes_per_step: float
    """bytes the client sent per env step"""


def client_cell(port: int, seconds: float) -> Cell:
    """One client run (one process, in this one) of ``seconds`` of stepping against ``port``."""
    global CLOCK
    CLOCK = StepClock()
    config = ClientConfig(num_envs=NUM_ENVS, server_port=port, progress=False, env=LinkFramesConfig(),
                          runner=RunnerConfig(max_episode_steps=EPISODE_STEPS))
    budget = EpisodeBudget(None, mp.get_context("spawn"), 1)
    timer = threading.Timer(seconds, budget.stop.set)
    with tempfile.TemporaryDirectory(prefix="plugrl-bench-") as tmp:
        writer = RunWriter(RunDir(Path(tmp) / "run").create(), "bench", 1)
        timer.start()  # connecting and the first reset are inside the cell, but not inside the rate
        try:
            LocalLauncher(config).launch([ProcessJob(ENV_ID, config, 0, f"ws://127.0.0.1:{port}")], budget, writer)
        finally:
            timer.cancel()
        summary = writer.close()
    if summary["status"] not in ("interrupted", "finished"):
        raise RuntimeError(f"the client run ended {summary['status']}: {summary.get('errors')}")
    timing = summary["timing"]
    return Cell(CLOCK.rate(), timing["bytes_sent"] / max(1, timing["env_steps"]))


def jpeg_projection(raw_per_step: float) -> tuple[float, float] | None:
    """(bytes per env step, encode + decode ms per batch) the link would carry with the images JPEG-encoded: the raw
    run's bytes per step with each image's share replaced by its encoded size (frames of one batch, quality 90).
    None without the images extra."""
    from plugrl_env_client.errors import ConfigError
    from plugrl_env_client.protocol import images

    env = LinkFramesEnv(LinkFramesConfig(), num_envs=NUM_ENVS)
    obs = env._observe()
    try:
        images.decode(images.encode(obs.images["cam112"][:1], "jpeg", 90), "jpeg", (1, 112, 112, 3))  # imports
        started = time.perf_counter()
        encoded = {key: images.encode(batch, "jpeg", 90) for key, batch in obs.images.items()}
        for key, rows in encoded.items():
            images.decode(rows, "jpeg", obs.images[key].shape)
        codec_ms = (time.perf_counter() - started) * 1e3
    except ConfigError as exc:
        print(f"jpeg q90 projection: {exc}")
        return None
    raw_images = sum(batch.nbytes for batch in obs.images.values()) / NUM_ENVS
    jpeg_images = sum(len(row) for rows in encoded.values() for row in rows) / NUM_ENVS
    # With reuse-feedback-obs an env's observation crosses once per chunk (every HORIZON steps) and once more at each
    # episode end (the terminal one, in the feedback; the chunk there is cut short): that is the images' share of
    # the bytes per env step, which the projection swaps for the encoded size.
    sent_per_step = 1 / HORIZON + 1 / EPISODE_STEPS
    return max(raw_per_step - (raw_images - jpeg_images) * sent_per_step, jpeg_images * sent_per_step), codec_ms


def verdict(value: float, target: float | None) -> str:
    if target is None:
        return "(information)"
    return f"target >= {target:g}: {'met' if value >= target else 'NOT MET'}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="shorter cells, fewer rounds (noisier)")
    parser.add_argument("--rate-mbytes", type=float, default=25.0, help="link bandwidth each way, MB/s (10^6 B)")
    parser.add_argument("--rtt-ms", type=float, default=2.0, help="link round trip, ms (half of it each way)")
    args = parser.parse_args()
    if not args.rate_mbytes > 0 or not args.rtt_ms >= 0:
        parser.error(f"--rate-mbytes must be > 0 and --rtt-ms >= 0 (got {args.rate_mbytes:g}, {args.rtt_ms:g})")
    seconds, rounds = (3.0, 1) if args.quick else (8.0, 3)
    print(f"{machine_line('gymnasium', 'websockets', 'msgpack')}; {ENV_ID} n={NUM_ENVS} (224x224x3 + 112x112x3 "
          f"camera frames) H={HORIZON} reuse on; link {args.rate_mbytes:g} MB/s, {args.rtt_ms:g} ms RTT; cells of "
          f"{seconds:g} s, {rounds} round(s), median")
    started = time.perf_counter()
    cells: dict[str, list[Cell]] = {"raw arrays, no link": [], "raw arrays, link": []}
    with Server() as server, LinkProxy(server.port, args.rate_mbytes, args.rtt_ms) as proxy:
        for _ in range(rounds):
            cells["raw arrays, no link"].append(client_cell(server.port, seconds))
            cells["raw arrays, link"].append(client_cell(proxy.port, seconds))
    rates = {name: statistics.median(c.rate for c in runs) for name, runs in cells.items()}
    sent = {name: statistics.median(c.bytes_per_step for c in runs) for name, runs in cells.items()}
    for name, rate in rates.items():
        print(f"  {name:<24} {rate:10,.0f} env-steps/s  {sent[name] / 1e3:8.1f} kB sent/env step  "
              f"{verdict(rate, None)}")
    print(f"  {'jpeg q90, link':<24} {'-':>10}              not run: the client does not send encoded images "
          f"yet  target >= {JPEG_TARGET:g} x raw arrays, link: NOT MET")
    link_bytes = args.rate_mbytes * 1e6
    raw_ceiling = link_bytes / sent["raw arrays, link"]
    print(f"link ceiling for raw arrays: {raw_ceiling:,.0f} env-steps/s (measured "
          f"{rates['raw arrays, link'] / raw_ceiling:.0%} of it)")
    projected = jpeg_projection(sent["raw arrays, link"])
    if projected is not None:
        per_step, codec_ms = projected
        ceiling = link_bytes / per_step
        print(f"jpeg q90 projected (images encoded by protocol/images.py, the rest of each message as sent): "
              f"{per_step / 1e3:.1f} kB/env step, link ceiling {ceiling:,.0f} env-steps/s = "
              f"{ceiling / rates['raw arrays, link']:.1f} x raw arrays, link; encode + decode {codec_ms:.1f} ms per "
              f"16-env batch (a projection, not a measured run)")
    print(f"\ntotal bench time {time.perf_counter() - started:.0f} s, load avg {load_avg()}")


if __name__ == "__main__":
    main()
