"""A scripted policy served by the real ``openpi_server.WebsocketPolicyServer``, run as a child with openpi's own
packages on its path (:mod:`openpi_site`): ``python openpi_scripted_server.py PORT LOG [HORIZON]``.

Every request is checked against what :mod:`openpi_env` rendered (:mod:`openpi_pixels`) (its keys, and each image against
``openpi_client.image_tools.resize_with_pad`` of the env's own image) and logged to LOG as one JSON line; the
reply is a chunk of HORIZON steps whose first component is 0.5. The server says it is up by printing its port."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from openpi_client import base_policy, image_tools
from openpi_server import WebsocketPolicyServer

sys.path.insert(0, str(Path(__file__).parent))
from openpi_pixels import INSTRUCTION, camera


class Scripted(base_policy.BasePolicy):
    def __init__(self, log: Path, horizon: int) -> None:
        self.log, self.horizon = log, horizon

    def infer(self, obs: dict) -> dict:
        state = obs["observation/state"]
        row, step = int(state[0]), int(state[1])
        seen = {
            "keys": sorted(obs),
            "row": row, "step": step,
            "prompt": obs.get("prompt"),
            "image": [list(obs["observation/image"].shape), obs["observation/image"].dtype.str],
            "image_as_openpi": bool(np.array_equal(obs["observation/image"],
                                                   image_tools.resize_with_pad(camera(row, step), 224, 224))),
            "wrist_as_openpi": bool(np.array_equal(obs["observation/wrist_image"],
                                                   image_tools.resize_with_pad(camera(row, step, True), 224, 224))),
            "prompt_ok": obs.get("prompt") == INSTRUCTION,
        }
        with self.log.open("a") as f:
            f.write(json.dumps(seen) + "\n")
        actions = np.zeros((self.horizon, 7), np.float32)
        actions[:, 0] = 0.5
        return {"actions": actions}


if __name__ == "__main__":
    port, log = int(sys.argv[1]), Path(sys.argv[2])
    horizon = int(sys.argv[3]) if len(sys.argv) > 3 else 10
    server = WebsocketPolicyServer(Scripted(log, horizon), host="127.0.0.1", port=port, metadata={"scripted": True})
    print(f"serving on {port}", flush=True)
    server.serve_forever()
