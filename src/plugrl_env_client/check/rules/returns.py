"""Rules 3 to 5: what ``reset`` and ``step`` return, and seeded resets.

Rules 3 and 5 are the env contract itself (:func:`plugrl_env_client.envs.contract.read_reset` and
:func:`~plugrl_env_client.envs.contract.read_step`, the functions the rollout checks every reset and step with),
reported in full rather than stopped at the first broken rule. Rule 4 is the checker's own: it needs several
resets to see whether the seed reaches the env's randomness.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from plugrl_env_client.check.harness import Context, Outcome, findings_of, judge, passed
from plugrl_env_client.check.rules.rows import differences, row_equal
from plugrl_env_client.envs.contract import read_reset, read_step


def rule_reset_returns(ctx: Context) -> Outcome:
    """3. ``reset(seed=...)`` returns ``(Observation, dict)`` with one row per env."""
    _, problems = read_reset(ctx.n, ctx.reset(ctx.seed))
    return judge(findings_of(problems), "" if ctx.observation_space_declared else UNDECLARED_OBSERVATION_SPACE)


UNDECLARED_OBSERVATION_SPACE = (
    "single_observation_space is not declared in __init__ (the first reset derives it): a Gymnasium wrapper that "
    "reads it when it is made, like NormalizeObservation, fails on an env not reset yet; declare it in __init__, "
    "self.single_observation_space = observation_space(images={...}, states={...})")
"""Rule 3's note for an env that leaves its observation space to the first reset (the client copes)."""


def rule_seeding(ctx: Context) -> Outcome:
    """4. The same seed gives the same first observation (also after a step); different seeds give different ones.

    Identical observations for different seeds are fine for an env whose start is fixed, or whose random start
    does not show in the first observation (a hidden number to guess). Both pass when ``reset(seed=s)`` seeded
    ``self.np_random`` with ``s`` (``self.seed_rngs(seed)``): then the seed does reach the env's randomness.
    Otherwise the checker cannot tell a fixed start from an ignored seed, and warns.
    """
    first = ctx.reset_obs(ctx.seed)
    seeded = getattr(ctx.env, "_np_random_seed", None) == ctx.seed and _is_generator(ctx.env)
    fixed_start = seeded and _rng_untouched_after_seeding(ctx.env, ctx.seed)
    if ctx.results[2].status == "pass":  # a step in between: reset must restore everything a step changes
        ctx.call("step(actions)", ctx.env.step, ctx.actions())
    again = ctx.reset_obs(ctx.seed)
    diff = differences(first, again)
    if diff:
        return Outcome("fail", f"two reset(seed={ctx.seed}) calls returned different observations: {'; '.join(diff)}",
                       "call self.seed_rngs(seed) first in reset() and draw every random start from self.np_random; "
                       "reset all the state reset() reads")
    others = [ctx.seed + k for k in (1, 2, 3)]
    if all(not differences(first, ctx.reset_obs(s)) for s in others):
        if fixed_start:
            return passed("the start does not depend on the seed: reset() draws nothing from self.np_random "
                          "(a fixed start state)")
        if seeded:
            return passed("the first observation does not depend on the seed, but reset() seeds self.np_random "
                          "with it and draws from it (a start state the observation does not show)")
        return Outcome("warn", f"reset(seed={ctx.seed}) and reset(seed={others}) returned identical observations",
                       "fine if the env has no randomness at reset; otherwise it ignores the seed: call "
                       "self.seed_rngs(seed) and draw the start from self.np_random")
    if ctx.n > 1 and all(row_equal(first, 0, first, i) for i in range(1, ctx.n)):
        return Outcome("warn", f"the seed changes the start, but all {ctx.n} envs of the batch start from the same "
                       "observation", "draw each env's start separately (e.g. all rows from self.np_random)")
    return passed()


def _is_generator(env: Any) -> bool:
    return isinstance(getattr(env, "_np_random", None), np.random.Generator)


def _rng_untouched_after_seeding(env: Any, seed: int) -> bool:
    """``env.np_random`` is in the state seeding it with ``seed`` leaves it in: nothing was drawn since."""
    fresh, _ = gym.utils.seeding.np_random(seed)
    return bool(env._np_random.bit_generator.state == fresh.bit_generator.state)


def rule_step_returns(ctx: Context) -> Outcome:
    """5. ``step`` returns exactly ``(obs, rewards float32 (n,), terminated bool (n,), truncated bool (n,), info
    dict)``. Other numeric reward dtypes are a warning: the client casts them."""
    ctx.reset(ctx.seed)
    _, problems = read_step(ctx.n, ctx.call("step(actions)", ctx.env.step, ctx.actions()))
    return judge(findings_of(problems))
