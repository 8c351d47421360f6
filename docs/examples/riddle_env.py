"""Riddle-v1: answer each riddle of a fixed list once. The worked example of docs/language-agents.md.

A text env for language agents: the policy reads a riddle and replies in free text; the env reads the last
``<answer>...</answer>`` of the reply and looks for the riddle's answer word in it. Every reset deals an env the next
riddle of a shuffled deck; once the deck is used up, a reset has no episode to give that env
(``info["no_episode"]``), and a run ends when no env has a riddle left.

Rewards: 1.0 for the right word (the episode ends, terminated); 0.0 for a wrong one; ``format_penalty`` for a reply
without an answer tag, which still uses up an attempt. The last wrong attempt ends the episode with terminated and
truncated both True: a limit the env owns, so the registration has no ``max_episode_steps``.

Run it directly: ``python docs/examples/riddle_env.py riddle-v1 --num-envs 2 --num-episodes 6 --local-policy text``.
"""

from __future__ import annotations

import dataclasses
import re
import string
from typing import Any

import gymnasium as gym
import numpy as np

from plugrl_env_client.envs.base_env import Action, BaseEnv, BaseEnvConfig, BoolArray, Observation, RewardArray
from plugrl_env_client.utils.registration import register_env

RIDDLES = (
    ("What has keys but cannot open a single lock?", "piano"),
    ("What has hands but cannot clap?", "clock"),
    ("What gets wetter the more it dries?", "towel"),
    ("What has a neck but no head?", "bottle"),
    ("What has one eye but cannot see?", "needle"),
    ("What can you catch but not throw?", "cold"),
)
"""The env's whole dataset: (riddle, answer word) pairs."""

RULES = "Solve the riddle. Put your answer, one word, in answer tags, e.g. <answer>word</answer>.\nRiddle: "
ANSWER = re.compile(r"<answer>(.*?)</answer>", re.IGNORECASE | re.DOTALL)
METRICS_AGG_MODE = {"solved": "max", "format_errors": "sum", "attempts": "last"}
"""How the client aggregates each step metric over an episode."""


@dataclasses.dataclass
class RiddleConfig(BaseEnvConfig):
    attempts: int = 3
    """Replies per riddle; the last one ends the episode (terminated and truncated) unless it is right."""
    format_penalty: float = -0.1
    """Reward of a reply without <answer>...</answer>."""


def parse_answer(reply: str) -> str | None:
    """The text of the last ``<answer>...</answer>`` of ``reply``, lower-cased; None when it has none."""
    found = ANSWER.findall(reply)
    return found[-1].strip().lower() if found else None


@register_env("Riddle-v1", best_reward_threshold_for_success=1.0, config=RiddleConfig)
class RiddleEnv(BaseEnv[RiddleConfig]):
    """``num_envs`` riddle solvers sharing one deck of riddles."""

    def __init__(self, config: RiddleConfig, num_envs: int = 1, **kwargs: Any) -> None:
        super().__init__(config, num_envs=num_envs, **kwargs)
        # Any printable reply; the env parses the whole string, however long.
        self.single_action_space = gym.spaces.Text(max_length=1 << 20, min_length=0, charset=string.printable)
        self.deck: list[int] = []  # riddles not dealt yet (dealt from the end)
        self.riddle = np.full(num_envs, -1)  # the riddle of each env; -1: it has none left
        self.attempts = np.zeros(num_envs, np.int64)
        self.text = [""] * num_envs

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Observation, dict]:
        self.seed_rngs(seed)
        if isinstance(seed, int):  # a seeded reset starts a new deck, shuffled by the seed
            self.deck = self.np_random.permutation(len(RIDDLES)).tolist()
        for i in np.flatnonzero(self.reset_mask(options)).tolist():
            self.riddle[i] = self.deck.pop() if self.deck else -1
            self.attempts[i] = 0
            self.text[i] = f"You have {self.config.attempts} attempts." if self.riddle[i] >= 0 else ""
        info = {
            "env_instruction": [RULES + RIDDLES[r][0] if r >= 0 else "" for r in self.riddle.tolist()],
            "no_episode": self.riddle < 0,  # these envs got no riddle: the client retires them
        }
        return Observation(text=self.text), info

    def step(self, actions: Action) -> tuple[Observation, RewardArray, BoolArray, BoolArray, dict]:
        replies = np.asarray(actions, dtype=object).reshape(-1)  # one str per env
        n = self.num_envs
        reward = np.zeros(n, np.float32)
        solved = np.zeros(n, bool)
        valid = np.zeros(n, bool)
        live = self.riddle >= 0  # a retired env's row is stepped too (with a placeholder): leave it as it is
        self.attempts[live] += 1
        for i in np.flatnonzero(live).tolist():
            answer = parse_answer(str(replies[i]))
            valid[i] = answer is not None
            solved[i] = answer is not None and RIDDLES[self.riddle[i]][1] in re.findall(r"[a-z]+", answer)
            left = self.config.attempts - int(self.attempts[i])
            if solved[i]:
                reward[i], self.text[i] = 1.0, "Right!"
            elif answer is None:
                reward[i] = self.config.format_penalty
                self.text[i] = f"No <answer>...</answer> in your reply. Attempts left: {left}."
            else:
                self.text[i] = f"{answer!r} is not it. Attempts left: {left}."
        out_of_attempts = live & ~solved & (self.attempts >= self.config.attempts)
        info = {
            "action_is_valid": valid,
            "metrics": {"solved": solved, "format_errors": (live & ~valid).astype(np.int64),
                        "attempts": self.attempts.copy()},
            "metrics_agg_mode": dict(METRICS_AGG_MODE),
        }
        return Observation(text=self.text), reward, solved | out_of_attempts, out_of_attempts, info


if __name__ == "__main__":
    from plugrl_env_client.cli import main

    main()
