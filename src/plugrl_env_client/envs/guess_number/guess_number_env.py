"""GuessNumber-v1: a batched number-guessing game for language agents (text in, text out, no dependency).

Each env draws a secret integer uniformly in ``[low, high]`` at reset (env i from its own seed, ``seed + i`` of an
int or ``seed[i]`` of a list; ``self.np_random`` when it has none: the same seed gives the same target, and env i's
target does not depend on env j's). An action is free text; the env reads the
integer inside the *last* ``<answer>N</answer>`` of it (whitespace around N and the tag's case do not matter; N is
ASCII digits with an optional sign) and answers ``Too small.``, ``Too large.`` or ``Correct.``, followed by how many
guesses are left. The whole string is parsed, however long: the env never truncates an action.

Rewards and episode ends:

* a correct guess: reward 1.0, terminated;
* a parsable wrong guess: reward 0 (a guess outside ``[low, high]`` is a valid action and gets the truthful hint);
* no parsable answer: reward ``format_penalty``, ``action_is_valid`` False, an observation saying how to answer, and
  the episode goes on (the turn still counts);
* the ``max_turns``-th guess, when it is not correct: terminated and truncated both True (the env owns this timeout,
  so the registration has no ``max_episode_steps``).

Info, following the conventions language-agent training pipelines read:

* reset: ``env_instruction`` (one str for the whole batch: the rules, the range and the answer format; a runner
  puts it before an episode's first observation, so the observation itself only says how many guesses are left);
* step: ``action_is_valid`` (bool per env), ``metrics`` (one value per env for this step) and
  ``metrics_agg_mode`` (how to aggregate each metric over an episode). The metric keys are the same on every step:

  ============== ======== ==================================================================
  metric         agg      value on this step
  ============== ======== ==================================================================
  success        max      the guess was correct
  action_is_valid mean    the action held a parsable ``<answer>`` (mean: the episode's rate)
  format_errors  sum      1 when it did not (sum: the episode's count)
  turns          last     guesses made in this episode so far (last: the episode length)
  ============== ======== ==================================================================
"""

from __future__ import annotations

import dataclasses
import re
import string
from typing import Any

import gymnasium as gym
import numpy as np

from plugrl_env_client.envs.base_env import Action, BaseEnv, BaseEnvConfig, BoolArray, Observation, RewardArray
from plugrl_env_client.envs.registry import register_env, register_env_config
from plugrl_env_client.errors import ConfigError

MAX_ACTION_LENGTH = 1 << 20
"""The Text space's max_length: far beyond any model's answer. Longer actions are still parsed whole."""

_ANSWER = re.compile(r"<answer>\s*([+-]?[0-9]+)\s*</answer>", re.IGNORECASE)
# Python refuses int() on strings of more than 4300 digits; no guess that long is needed to know its side.
_MAX_DIGITS = 100

METRICS_AGG_MODE = {"success": "max", "action_is_valid": "mean", "format_errors": "sum", "turns": "last"}
"""How each step metric is aggregated over an episode (see the module docstring)."""


@register_env_config("GuessNumber-v1")
@dataclasses.dataclass
class GuessNumberConfig(BaseEnvConfig):
    low: int = 1
    """Smallest possible target (inclusive)."""
    high: int = 100
    """Largest possible target (inclusive)."""
    max_turns: int = 10
    """Guesses per episode; the last one ends the episode (terminated and truncated) unless it is correct."""
    format_penalty: float = -0.1
    """Reward of an action without a parsable <answer>N</answer>."""


def parse_guess(text: str) -> int | None:
    """The integer in the last ``<answer>N</answer>`` of ``text``; None when there is none.

    Leading zeros are dropped first (``int()`` refuses strings of more than 4300 digits, zeros included); a number
    of more than 100 digits is clamped to +-10**100, which keeps its side of any practical target.
    """
    matches = _ANSWER.findall(text)
    if not matches:
        return None
    token: str = matches[-1]
    sign = -1 if token.startswith("-") else 1
    digits = token.lstrip("+-").lstrip("0") or "0"
    if len(digits) > _MAX_DIGITS:
        return sign * 10**_MAX_DIGITS
    return sign * int(digits)


@register_env("GuessNumber-v1", best_reward_threshold_for_success=1.0)
class GuessNumberEnv(BaseEnv[GuessNumberConfig]):
    """A number-guessing game per env, answered in text (<answer>N</answer>): for language agents, no dependency.

    The module docstring has the rules, the rewards and the info."""

    metadata = {**BaseEnv.metadata, "per_env_seeds": True}

    def __init__(self, config: GuessNumberConfig, num_envs: int = 1, **kwargs: Any) -> None:
        if config.low > config.high:
            raise ConfigError(f"GuessNumber-v1 needs --env.low <= --env.high, got low={config.low} high={config.high}")
        if config.max_turns < 1:
            raise ConfigError(f"GuessNumber-v1 needs --env.max-turns >= 1, got {config.max_turns}")
        if not np.isfinite(config.format_penalty):
            raise ConfigError(f"--env.format-penalty must be a finite number, got {config.format_penalty}")
        super().__init__(config, num_envs=num_envs, **kwargs)
        # printable ASCII describes what a policy is expected to send; step() accepts any str (non-ASCII too).
        self.single_action_space = gym.spaces.Text(max_length=MAX_ACTION_LENGTH, min_length=0, charset=string.printable)
        self.target = np.zeros(num_envs, dtype=np.int64)
        self.turns = np.zeros(num_envs, dtype=np.int64)
        self.text: list[str] = [""] * num_envs

    @property
    def instruction(self) -> str:
        """The rules, the range and the answer format (``info["env_instruction"]`` of every reset)."""
        c = self.config
        return (
            f"Let's play Guess the Number. I am thinking of an integer between {c.low} and {c.high} (inclusive). "
            f"You have {c.max_turns} guesses. After each guess I answer 'Too small.', 'Too large.' or 'Correct.'. "
            f"Put your guess in answer tags, e.g. <answer>{(c.low + c.high) // 2}</answer>; if your reply has "
            "several, only the last one counts."
        )

    def _left(self, i: int) -> str:
        left = self.config.max_turns - int(self.turns[i])
        return f"You have {left} guess{'es' if left != 1 else ''} left."

    def reset(self, *, seed: int | list[int | None] | None = None,
              options: dict[str, Any] | None = None) -> tuple[Observation, dict]:
        self.seed_rngs(seed)
        mask = self.reset_mask(options)
        for i, rng in self.env_rngs(seed, mask):  # env i's target from its own seed
            self.target[i] = rng.integers(self.config.low, self.config.high + 1)
        self.turns[mask] = 0
        for i in np.flatnonzero(mask).tolist():
            self.text[i] = f"Make your first guess. {self._left(i)}"
        return Observation(text=list(self.text)), {"env_instruction": self.instruction}

    def step(self, actions: Action) -> tuple[Observation, RewardArray, BoolArray, BoolArray, dict]:
        texts = np.asarray(actions, dtype=object).reshape(-1)
        if texts.shape[0] != self.num_envs:
            raise ValueError(f"GuessNumber-v1 got {texts.shape[0]} actions for {self.num_envs} envs; pass one str per env")
        n = self.num_envs
        reward = np.zeros(n, dtype=np.float32)
        success = np.zeros(n, dtype=bool)
        valid = np.zeros(n, dtype=bool)
        self.turns += 1
        out_of_turns = self.turns >= self.config.max_turns
        for i in range(n):
            guess = parse_guess(str(texts[i]))
            target = int(self.target[i])
            if guess is None:
                reward[i] = self.config.format_penalty
                feedback = ("Invalid answer: put your guess as an integer in answer tags, "
                            f"e.g. <answer>{(self.config.low + self.config.high) // 2}</answer>.")
            else:
                valid[i] = True
                success[i] = guess == target
                feedback = "Correct." if success[i] else ("Too small." if guess < target else "Too large.")
            if success[i]:
                reward[i] = 1.0
                self.text[i] = f"Correct. You found {target} in {int(self.turns[i])} turns."
            elif out_of_turns[i]:
                self.text[i] = f"{feedback} No guesses left: the number was {target}."
            else:
                self.text[i] = f"{feedback} {self._left(i)}"
        timeout = out_of_turns & ~success
        terminated = success | timeout
        info = {
            "action_is_valid": valid.copy(),
            "metrics": {
                "success": success,
                "action_is_valid": valid,
                "format_errors": (~valid).astype(np.int64),
                "turns": self.turns.copy(),
            },
            "metrics_agg_mode": dict(METRICS_AGG_MODE),
        }
        return Observation(text=list(self.text)), reward, terminated, timeout.copy(), info

