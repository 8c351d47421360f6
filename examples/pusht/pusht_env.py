"""PushT-v1: gym-pusht's PushT task as a batched env, a real simulator defined outside the package.

A round pusher (the agent) pushes a T-shaped block onto a fixed T-shaped target on a 512 x 512 table. Each copy
observes a 96 x 96 camera image (``images["pixels"]``) and the pusher's position (``states["agent_pos"]``). Its
action is the next target position of the pusher, (x, y) in [0, 512]. An episode terminates when the block covers
more than 95 % of the target; that step's ``info["success"]`` is True and the client counts the episode a success.

Run it (see README.md next to this file)::

    pip install -r examples/pusht/requirements.txt
    python examples/pusht/pusht_env.py pusht-v1 --num-envs 4 --num-episodes 2 --local-policy random
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Literal

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

from plugrl_env_client.envs.base_env import Action, BaseEnv, BaseEnvConfig, BoolArray, Observation, RewardArray
from plugrl_env_client.errors import ConfigError
from plugrl_env_client.utils.registration import register_env, register_env_config

GYM_ID = "gym_pusht/PushT-v0"
MAX_EPISODE_STEPS = 300
"""The time limit gym-pusht registers PushT-v0 with (and the one LeRobot evaluates PushT policies with)."""


@register_env_config("PushT-v1")
@dataclasses.dataclass
class PushTConfig(BaseEnvConfig):
    image_size: int = 96
    """Height and width of images["pixels"], in pixels."""
    instruction: str = "Push the T-shaped block onto the T-shaped target."
    """The text sent with every observation (for language-conditioned policies)."""
    damping: float | None = None
    """Velocity damping of the physics (gym-pusht's default: none)."""
    vectorization: Literal["sync", "async"] = "sync"
    """sync: all copies in this process; async: one subprocess per copy (it pays off only with idle cores)."""


@register_env("PushT-v1", max_episode_steps=MAX_EPISODE_STEPS)
class PushTEnv(BaseEnv[PushTConfig]):
    """gym-pusht's PushT: push a T-shaped block onto a T-shaped target, seen through a 96 x 96 camera."""

    def __init__(self, config: PushTConfig, num_envs: int = 1, **kwargs: Any) -> None:
        super().__init__(config, num_envs=num_envs, **kwargs)
        import_gym_pusht()
        # The client applies the time limit (registered above; --runner.max-episode-steps changes it), so the
        # copies are made without gym-pusht's own TimeLimit, which would otherwise cut every episode at 300.
        spec = dataclasses.replace(gym.spec(GYM_ID), max_episode_steps=None)
        # Gymnasium's vector env batches the copies. DISABLED: it never resets inside step; it seeds copy i
        # with seed + i and resets only the copies of a reset_mask, keeping the other rows, as BaseEnv requires.
        self.envs = gym.make_vec(
            spec,
            num_envs=self.num_envs,
            vectorization_mode=config.vectorization,
            vector_kwargs={"autoreset_mode": AutoresetMode.DISABLED},  # copy=True (default): fresh arrays each call
            obs_type="pixels_agent_pos",
            render_mode="rgb_array",
            observation_width=config.image_size,
            observation_height=config.image_size,
            damping=config.damping,
        )
        self.single_action_space = self.envs.single_action_space  # Box(0, 512, (2,), float32)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Observation, dict]:
        mask = self.reset_mask(options)
        # Other options go to the copies being reset, e.g. gym-pusht's "reset_to_state": [agent x, agent y,
        # block x, block y, block angle] to start from a chosen layout.
        inner = {k: v for k, v in (options or {}).items() if k not in ("reset_mask", "reset_indices")}
        if not mask.all():
            inner["reset_mask"] = mask
        obs, info = self.envs.reset(seed=seed, options=inner or None)
        return self._observe(obs), info

    def step(self, actions: Action) -> tuple[Observation, RewardArray, BoolArray, BoolArray, dict]:
        obs, rewards, terminated, truncated, info = self.envs.step(np.asarray(actions, dtype=np.float32))
        # gym-pusht reports success as info["is_success"]; the client counts info["success"] (bool per env).
        info["success"] = np.asarray(info.get("is_success", np.zeros(self.num_envs)), dtype=bool)
        return self._observe(obs), rewards.astype(np.float32), terminated, truncated, info

    def close_extras(self, **kwargs: Any) -> None:
        self.envs.close()

    def _observe(self, obs: dict[str, np.ndarray]) -> Observation:
        return Observation(
            images={"pixels": obs["pixels"]},  # uint8 (n, image_size, image_size, 3)
            states={"agent_pos": obs["agent_pos"].astype(np.float32)},  # pusher (x, y) in [0, 512]
            text=self.config.instruction,
        )


def import_gym_pusht() -> None:
    """Import gym_pusht, which registers PushT-v0 with Gymnasium (imported here, not at the top, so that
    ``--help`` works without it and a missing install is one clear message)."""
    os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")  # gym_pusht draws with pygame, which greets on import
    try:
        import gym_pusht  # noqa: F401
    except ImportError as exc:
        raise ConfigError(f"PushT-v1 needs gym-pusht ({exc}): pip install -r examples/pusht/requirements.txt") from None


if __name__ == "__main__":
    from plugrl_env_client.cli import main

    main()
