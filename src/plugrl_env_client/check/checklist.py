"""The env contract as a checklist: run each rule of the batched env API on an env and report, rule by rule.

The rules are PlugRL's conventions (``envs/base_env.py``, ``envs/contract.py``) together with the env checklist of
agentic RL frameworks such as ROLL (seeded resets, metric keys, info conventions), written for batched envs. Each
rule is one function (:mod:`plugrl_env_client.check.rules`) and they run in a fixed order on one env
(:mod:`plugrl_env_client.check.harness`). A rule passes, warns (the client copes, but something is probably
unintended), fails (a run would stop, or would be wrong) or is skipped (something it needs is broken, and the
reason names the rule that found it). An exception raised by the env inside a rule is that rule's failure, never
the checker's crash.

Two entry points: :func:`check_env` for an env object the caller built, and :func:`check_registered_env`, which
builds a registered env itself, adds the rules that need the registry, and ends with a short real rollout.
"""

from __future__ import annotations

import contextlib
from typing import Any

from plugrl_env_client.check.harness import DEFAULT_STEPS, Context, run_rules
from plugrl_env_client.check.report import CheckReport
from plugrl_env_client.check.rules import RULES
from plugrl_env_client.check.rules.setup import construct
from plugrl_env_client.envs.base_env import BaseEnvConfig
from plugrl_env_client.envs.registry import EnvSpec, get_spec
from plugrl_env_client.errors import ConfigError


def check_env(env: Any, *, spec: EnvSpec | None = None, seed: int = 0, steps: int = DEFAULT_STEPS) -> CheckReport:
    """Run rules 1-13 on ``env`` (an env object the caller built); rule 14 (the rollout) needs an env id.

    ``spec`` (default: the registered spec of ``env.spec.id``, when the env came from ``make_env``) adds the
    default-config construction to rule 1 and the registered time limit to rule 10. ``steps`` is the length of
    the run rules 6, 7, 9, 11 and 12 look at. The env is closed at the end (rule 13 closes it twice).
    """
    if spec is None:
        spec = _registered_spec_of(env)
    ctx = Context(env, spec, seed, steps)
    return run_rules(ctx, RULES, _subject(ctx))


def check_registered_env(
    env_id: str, *, num_envs: int = 2, config: BaseEnvConfig | None = None, rollout: bool = True,
    seed: int = 0, steps: int = DEFAULT_STEPS,
) -> CheckReport:
    """Build ``env_id`` from its default config (and from ``config``, when given: the CLI's ``--env.*``), run every
    rule on it, and end with a short rollout against the embedded policy offered for its action space (unless
    ``rollout`` is False).

    The rules run on the env built from ``config`` when one is given. An unknown ``env_id`` raises ConfigError.
    """
    spec = get_spec(env_id)
    ctx = Context(None, spec, seed, steps)
    ctx.env_id, ctx.config, ctx.rollout = spec.uid, config, rollout
    ctx.construction = construct(ctx, num_envs)
    try:
        return run_rules(ctx, RULES, _subject(ctx, num_envs))
    finally:
        if ctx.env is not None and not ctx.closed:  # interrupted before rule 13: the env is ours to close
            with contextlib.suppress(Exception):
                ctx.env.close()


def _registered_spec_of(env: Any) -> EnvSpec | None:
    env_id = getattr(getattr(env, "spec", None), "id", None)
    if not isinstance(env_id, str):
        return None
    try:
        spec = get_spec(env_id)
    except ConfigError:
        return None
    return spec if isinstance(env, spec.env_cls) else None


def _subject(ctx: Context, num_envs: int | None = None) -> str:
    name = ctx.spec.uid if ctx.spec is not None else type(ctx.env).__name__
    n = getattr(ctx.env, "num_envs", None) if ctx.env is not None else num_envs
    return f"{name} (num_envs={n}, seed={ctx.seed})"
