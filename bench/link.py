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

Rows (env-steps/s from the env's first step to its last, median over rounds, the rows alternated per round; the
bytes the client sent per env step). Through the link the envs run in two pipelined groups (``--runner.pipeline
2``: one group's frames cross the link while the other steps and encodes), and the proxy's link is shared by the
two connections, as a real network path is:

* ``raw arrays, no link``: lockstep, straight to the server (what the machine does without the link);
* ``jpeg q90, no link``: the same with ``--image-codec jpeg``: where the link costs nothing, the codec's time shows;
* ``raw arrays, link``: the images as arrays through the link;
* ``jpeg q90, link``: ``--image-codec jpeg`` (quality 90) through the link. Target: at least 5x ``raw arrays,
  link`` over 25 MB/s and 2 ms;
* ``qoi, link``: ``--image-codec qoi`` (lossless) through the link (information: the client offers qoi only
  because it beats raw arrays over this link);
* ``jpeg q90, link, lockstep``: jpeg through the link without pipelining (information: what the overlap adds).

The last lines give the link's ceiling for raw arrays (link rate / bytes per env step), and the codec's cost per
16-env batch step on loopback: the time ``jpeg q90, no link`` takes per batch step beyond ``raw arrays, no link``,
next to the encode + decode time of one batch of these frames measured alone (information).
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
from machine import ReferenceServer, StepClock, load_avg, machine_line

from plugrl_env_client.config import ClientConfig, ConnectionConfig, RunnerConfig
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
from plugrl_env_client.errors import ConfigError
from plugrl_env_client.launch.local import LocalLauncher
from plugrl_env_client.launch.process import ProcessJob
from plugrl_env_client.outputs.run_dir import RunDir
from plugrl_env_client.outputs.run_writer import RunWriter
from plugrl_env_client.protocol import images
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


def client_cell(port: int, seconds: float, codec: str = "none", pipeline: int = 1) -> Cell:
    """One client run (one process, in this one) of ``seconds`` of stepping against ``port``, with the images sent
    as ``--image-codec codec`` (quality 90) and the envs in ``--runner.pipeline`` groups."""
    global CLOCK
    CLOCK = StepClock()
    config = ClientConfig(num_envs=NUM_ENVS, server_port=port, progress=False, env=LinkFramesConfig(),
                          runner=RunnerConfig(max_episode_steps=EPISODE_STEPS, pipeline=pipeline),
                          connection=ConnectionConfig(image_codec=codec, image_quality=90))  # type: ignore[arg-type]
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


def codec_ms(codec: str) -> float:
    """Encode + decode ms of one batch of the bench env's frames (each image on its own, as the client sends them),
    measured alone."""
    from plugrl_env_client.protocol import images

    env = LinkFramesEnv(LinkFramesConfig(), num_envs=NUM_ENVS)
    obs = env._observe()
    images.decode(images.encode(obs.images["cam112"][:1], codec), codec, (1, 112, 112, 3))  # the imports
    started = time.perf_counter()
    for batch in obs.images.values():
        images.decode(images.encode(batch, codec, 90), codec, batch.shape)
    return (time.perf_counter() - started) * 1e3


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
          f"camera frames) H={HORIZON} reuse on, pipeline 2 through the link; link {args.rate_mbytes:g} MB/s, "
          f"{args.rtt_ms:g} ms RTT; cells of {seconds:g} s, {rounds} round(s), median")
    started = time.perf_counter()
    try:
        images.check_choice("jpeg", 90)
        images.check_choice("qoi", 90)
        codecs = True
    except ConfigError as exc:
        print(f"codec rows not run: {exc}")
        codecs = False
    plan = [("raw arrays, no link", False, "none", 1), ("raw arrays, link", True, "none", 2)]
    if codecs:
        plan[1:1] = [("jpeg q90, no link", False, "jpeg", 1)]
        plan += [("jpeg q90, link", True, "jpeg", 2), ("qoi, link", True, "qoi", 2),
                 ("jpeg q90, link, lockstep", True, "jpeg", 1)]
    cells: dict[str, list[Cell]] = {name: [] for name, *_ in plan}
    with Server() as server, LinkProxy(server.port, args.rate_mbytes, args.rtt_ms) as proxy:
        for _ in range(rounds):
            for name, linked, codec, pipeline in plan:
                cells[name].append(client_cell(proxy.port if linked else server.port, seconds, codec, pipeline))
    rates = {name: statistics.median(c.rate for c in runs) for name, runs in cells.items()}
    sent = {name: statistics.median(c.bytes_per_step for c in runs) for name, runs in cells.items()}
    raw = rates["raw arrays, link"]
    targets = {"jpeg q90, link": JPEG_TARGET}
    for name, rate in rates.items():
        ratio = f"{rate / raw:5.1f} x raw, link" if ", link" in name and name != "raw arrays, link" else ""
        target = targets.get(name)
        judged = verdict(rate / raw, target) if target is not None else verdict(rate, None)
        print(f"  {name:<24} {rate:10,.0f} env-steps/s  {sent[name] / 1e3:8.1f} kB sent/env step  {ratio:<17} "
              f"{judged}")
    link_bytes = args.rate_mbytes * 1e6
    raw_ceiling = link_bytes / sent["raw arrays, link"]
    print(f"link ceiling for raw arrays: {raw_ceiling:,.0f} env-steps/s (measured {raw / raw_ceiling:.0%} of it)")
    if codecs:
        qoi_beats = rates["qoi, link"] > raw
        print(f"qoi over this link: {rates['qoi, link'] / raw:.2f} x raw arrays, link: "
              f"{'beats' if qoi_beats else 'does not beat'} raw arrays (information)")
        extra_ms = (1 / rates["jpeg q90, no link"] - 1 / rates["raw arrays, no link"]) * NUM_ENVS * 1e3
        print(f"jpeg q90 cost per {NUM_ENVS}-env batch step on loopback without limits: {extra_ms:+.2f} ms (run vs "
              f"run); encode + decode of one batch alone: jpeg {codec_ms('jpeg'):.1f} ms, qoi {codec_ms('qoi'):.1f} "
              f"ms (information)")
    print(f"\ntotal bench time {time.perf_counter() - started:.0f} s, load avg {load_avg()}")


if __name__ == "__main__":
    main()
