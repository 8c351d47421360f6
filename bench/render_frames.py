"""Render the camera frames bench/link.py plays back: real simulator images, not noise or solid colours.

A link's cost depends on what crosses it, and images compress (or not) by what they show: a MuJoCo scene's floor,
sky and moving body are what a robot camera sends. This script renders them once, so the bench needs no simulator
and no OpenGL, and every run plays back the same bytes::

    python bench/render_frames.py        # writes bench/frames/halfcheetah.npz (extra mujoco; about 10 s)

HalfCheetah-v5 (Gymnasium), seeded random actions, its tracking camera at 224x224 and at 112x112 (two env objects
stepped with the same actions, so the two cameras show the same moments). The file holds ``cam224``
``[F, 224, 224, 3]`` and ``cam112`` ``[F, 112, 112, 3]`` uint8, in ``np.savez_compressed``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

FRAMES = 24
"""Frames per camera: enough that 16 envs, each starting at its own frame, show different images."""
EVERY = 4
"""Simulator steps between two kept frames (the body moves visibly between them)."""
OUT = Path(__file__).resolve().parent / "frames" / "halfcheetah.npz"


def render(frames: int = FRAMES, every: int = EVERY, seed: int = 0) -> dict[str, np.ndarray]:
    """``cam224`` and ``cam112``: ``frames`` frames of HalfCheetah-v5 under seeded random actions."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from plugrl_env_client.envs.gym.gym_env import headless_rendering

    headless_rendering()  # MUJOCO_GL=egl (or osmesa) without a display
    import gymnasium as gym

    envs = {size: gym.make("HalfCheetah-v5", render_mode="rgb_array", width=size, height=size) for size in (224, 112)}
    for env in envs.values():
        env.reset(seed=seed)
    actions = np.random.default_rng(seed).uniform(-1, 1, (frames * every, 6)).astype(np.float32)
    out: dict[str, list[np.ndarray]] = {f"cam{size}": [] for size in envs}
    for t, action in enumerate(actions):
        for env in envs.values():
            env.step(action)
        if t % every == every - 1:
            for size, env in envs.items():
                out[f"cam{size}"].append(np.asarray(env.render(), dtype=np.uint8))
    for env in envs.values():
        env.close()
    return {name: np.stack(images) for name, images in out.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=FRAMES)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    images = render(args.frames)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.out, **images)
    shapes = ", ".join(f"{k} {list(v.shape)}" for k, v in images.items())
    print(f"wrote {args.out} ({args.out.stat().st_size / 1e6:.2f} MB): {shapes}")


if __name__ == "__main__":
    main()
