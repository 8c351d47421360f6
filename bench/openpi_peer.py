"""openpi's side of ``bench/openpi.py``, run in children with openpi's own packages first on the import path
(``openpi-client`` needs numpy below 2): it imports numpy, openpi's packages and nothing of this package.

* :class:`CamsSim`: one simulated env with a fixed step cost (the CPU spins, as a simulator computes) and two
  square uint8 cameras, an 8-d state and an instruction. The bench's ``OpenpiBench-v1`` steps a batch of them, and
  the loop below one, so both sides do the same work per env step.
* ``serve PORT INFERENCE_MS HORIZON``: openpi's ``WebsocketPolicyServer`` serving :class:`SleepPolicy`, whose every
  ``infer`` blocks for the inference time (the server runs it on its event loop: one request at a time).
* ``loop URL SECONDS REPLAN STEP_MS CAMERA EPISODE [ENV_ID SITE]``: the peer, openpi's ``WebsocketClientPolicy`` driven the way
  openpi's LIBERO example drives it: one env, sequential; when the plan of actions is empty, one inference whose
  first ``REPLAN`` actions become the plan; every step waits for it. Prints one JSON line: env steps, the seconds
  from the first step to the last, finished episodes. With ``ENV_ID`` (``--libero``) it steps one env of that
  registered env of the package instead (:class:`PackageSim`, cameras off), run with the package's numpy first and
  openpi's client imported from ``SITE`` after it.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import sys
import time

import numpy as np

INSTRUCTION = "put the bowl on the plate"
STATE_DIM = 8
ACTION_DIM = 7


class CamsSim:
    """One env: ``step`` spins the CPU for ``step_ms`` and renders both ``camera`` x ``camera`` cameras afresh
    (a copy each, marked with the step); episodes last ``episode`` steps."""

    def __init__(self, step_ms: float = 2.0, camera: int = 224, episode: int = 50, seed: int = 0) -> None:
        self.step_s, self.episode = step_ms / 1e3, episode
        rng = np.random.default_rng(seed)
        self.agentview = np.broadcast_to(rng.integers(0, 256, 3, dtype=np.uint8), (camera, camera, 3)).copy()
        self.wrist = np.broadcast_to(rng.integers(0, 256, 3, dtype=np.uint8), (camera, camera, 3)).copy()
        self.state = np.zeros(STATE_DIM, np.float32)
        self.t = 0

    def observe(self) -> dict[str, np.ndarray]:
        return {"agentview": self.agentview.copy(), "wrist": self.wrist.copy(), "state": self.state.copy()}

    def reset(self) -> dict[str, np.ndarray]:
        self.t = 0
        self.state[:] = 0
        return self.observe()

    def step(self, action: np.ndarray) -> tuple[dict[str, np.ndarray], bool]:
        """The observation after ``action``, and whether the episode is over."""
        end = time.perf_counter() + self.step_s
        while time.perf_counter() < end:  # the simulator's work
            pass
        self.t += 1
        self.state[:ACTION_DIM] += 0.01 * np.asarray(action, np.float32)[:ACTION_DIM]
        self.agentview[0, 0, 0] = self.wrist[0, 0, 0] = self.t % 256
        return self.observe(), self.t >= self.episode


class PackageSim:
    """One env of the package's registered ``env_id`` (built with ``render=False``), stepped as :class:`CamsSim` is:
    its ``states.state``, and the episode over after ``episode`` steps or when the env ends it."""

    def __init__(self, env_id: str, episode: int) -> None:
        from plugrl_env_client.envs.discovery import discover_envs
        from plugrl_env_client.envs.registry import get_spec, make_env

        discover_envs()
        self.env = make_env(env_id, 1, dataclasses.replace(get_spec(env_id).config_cls(), render=False))
        self.episode, self.t = episode, 0

    def reset(self) -> dict[str, np.ndarray]:
        self.t = 0
        obs, _ = self.env.reset(seed=0)
        return {"state": np.asarray(obs.states["state"][0], np.float32)}

    def step(self, action: np.ndarray) -> tuple[dict[str, np.ndarray], bool]:
        obs, _, terminated, truncated, _ = self.env.step(np.asarray(action, np.float32)[None])
        self.t += 1
        done = self.t >= self.episode or bool(terminated[0] or truncated[0])
        return {"state": np.asarray(obs.states["state"][0], np.float32)}, done


def serve(port: int, inference_ms: float, horizon: int) -> None:
    from openpi_client import base_policy
    from openpi_server import WebsocketPolicyServer

    class SleepPolicy(base_policy.BasePolicy):
        """A chunk of ``horizon`` small actions after ``inference_ms`` of blocking, as a model's forward pass."""

        def infer(self, obs: dict) -> dict:
            time.sleep(inference_ms / 1e3)
            return {"actions": np.full((horizon, ACTION_DIM), 0.1, np.float32)}

    server = WebsocketPolicyServer(SleepPolicy(), host="127.0.0.1", port=port, metadata={"bench": "sleep"})
    print(f"serving on {port}", flush=True)
    server.serve_forever()


def loop(url: str, seconds: float, replan: int, step_ms: float, camera: int, episode: int,
         env_id: str | None = None) -> dict[str, float]:
    """openpi's LIBERO example's loop structure around openpi's own client, for ``seconds`` of stepping."""
    from openpi_client import image_tools
    from openpi_client.websocket_client_policy import WebsocketClientPolicy

    client = WebsocketClientPolicy(host=url)
    sim = CamsSim(step_ms, camera, episode) if env_id is None else PackageSim(env_id, episode)
    steps = episodes = 0
    first = last = 0.0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        obs, done = sim.reset(), False
        plan: collections.deque[np.ndarray] = collections.deque()
        while not done and time.perf_counter() < deadline:
            element = {key: image_tools.convert_to_uint8(image_tools.resize_with_pad(obs[name], 224, 224))
                       for key, name in (("observation/image", "agentview"), ("observation/wrist_image", "wrist"))
                       if name in obs}
            if not plan:
                element.update({"observation/state": obs["state"], "prompt": INSTRUCTION})
                chunk = client.infer(element)["actions"]
                if len(chunk) < replan:
                    raise RuntimeError(f"the server returned {len(chunk)} actions; the loop executes {replan}")
                plan.extend(chunk[:replan])
            obs, done = sim.step(np.asarray(plan.popleft().tolist(), np.float32))
            last = time.perf_counter()
            first = first or last
            steps += 1
        episodes += done
    return {"steps": steps, "seconds": last - first, "episodes": episodes}


def main(argv: list[str]) -> None:
    if argv[:1] == ["serve"] and len(argv) == 4:
        serve(int(argv[1]), float(argv[2]), int(argv[3]))
    elif argv[:1] == ["loop"] and len(argv) in (7, 9):
        env_id = None
        if len(argv) == 9:
            env_id = argv[7]
            sys.path.append(argv[8])  # openpi's client after the package's numpy
        print(json.dumps(loop(argv[1], float(argv[2]), int(argv[3]), float(argv[4]), int(argv[5]), int(argv[6]),
                              env_id)), flush=True)
    else:
        sys.exit("usage: openpi_peer.py serve PORT INFERENCE_MS HORIZON | "
                 "loop URL SECONDS REPLAN STEP_MS CAMERA EPISODE [ENV_ID SITE]")


if __name__ == "__main__":
    main(sys.argv[1:])
