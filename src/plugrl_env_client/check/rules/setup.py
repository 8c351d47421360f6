"""Rules 1 and 2: the env builds from its config, and its action space is one the client can fill.

Rule 1 runs before any other call: for a registered env the checker builds the env itself (:func:`construct`), from
the default config (what the CLI does with no ``--env.*`` flag) and from the caller's. Rule 2 reads the action
space through the env contract (:func:`plugrl_env_client.envs.contract.action_space_problem`, what the rollout
refuses at start) and then steps a batch of actions sampled from it.
"""

from __future__ import annotations

import contextlib
import traceback

import numpy as np

from plugrl_env_client.check.harness import Context, EnvRaised, Finding, Outcome, Skip, judge, passed, where_raised
from plugrl_env_client.envs.base_env import BaseEnv, BaseEnvConfig
from plugrl_env_client.envs.contract import action_space_problem, short_space
from plugrl_env_client.envs.registry import EnvSpec, make_env


def rule_constructs(ctx: Context) -> Outcome:
    """1. The env builds from its registered config's defaults (every ``--env.*`` flag has a working default),
    and from the config the caller gives; ``num_envs`` is what was asked for."""
    findings = list(ctx.construction or [])
    if ctx.construction is None:  # check_env: the caller built the env
        env = ctx.env
        if not isinstance(env, BaseEnv):
            findings.append(Finding("fail", f"the env is a {type(env).__name__}, not a BaseEnv",
                                    "subclass plugrl_env_client.envs.base_env.BaseEnv[YourConfig]"))
        n = getattr(env, "num_envs", None)
        if not isinstance(n, int | np.integer) or int(n) < 1:
            ctx.env = None
            findings.append(Finding("fail", f"env.num_envs is {n!r}",
                                    "call super().__init__(config, num_envs=num_envs) in the env's __init__"))
            return judge(findings)
        if ctx.spec is None:
            return judge(findings, "an env object was given, with no registered spec to build one from its default "
                         "config")
        try:
            make_env(ctx.spec.uid, num_envs=int(n)).close()
        except Exception as exc:
            findings.append(_construction_failure(ctx.spec, int(n), None, exc))
    return judge(findings)


def construct(ctx: Context, num_envs: int) -> list[Finding]:
    """Rule 1 for a registered env: build it from the default config and from ``ctx.config``; the env the other
    rules check is the latter when given (the one the caller will run)."""
    assert ctx.spec is not None
    spec, findings = ctx.spec, []
    default_env = None
    try:
        default_env = make_env(spec.uid, num_envs=num_envs)
    except Exception as exc:
        findings.append(_construction_failure(spec, num_envs, None, exc))
    env = default_env
    if ctx.config is not None:
        if not isinstance(ctx.config, spec.config_cls):
            findings.append(Finding(
                "fail", f"the given config is a {type(ctx.config).__name__}, but {spec.uid} is registered with "
                f"{spec.config_cls.__name__}", f"pass a {spec.config_cls.__name__} (its fields are the --env.* flags)"))
            env = None
        else:
            try:
                env = make_env(spec.uid, num_envs=num_envs, config=ctx.config)
            except Exception as exc:
                findings.append(_construction_failure(spec, num_envs, ctx.config, exc))
                env = None
        if default_env is not None:
            with contextlib.suppress(Exception):
                default_env.close()
    if env is not None and getattr(env, "num_envs", None) != num_envs:
        got = getattr(env, "num_envs", None)
        findings.append(Finding("fail", f"built with num_envs={num_envs}, env.num_envs is {got!r}",
                                "pass num_envs on: super().__init__(config, num_envs=num_envs, **kwargs)"))
        with contextlib.suppress(Exception):
            env.close()
        env = None
    ctx.env = env
    return findings


def _construction_failure(spec: EnvSpec, n: int, config: BaseEnvConfig | None, exc: Exception) -> Finding:
    which = "its default config" if config is None else f"the given config {config!r}"
    fix = ("every field of the env's config needs a default the env can be built with (the CLI builds the config "
           "with no arguments and turns each field into an --env.* flag)" if config is None else
           "the env cannot be built with these --env.* values: change them, or make the env accept them")
    return Finding("fail", f"make_env({spec.uid!r}, num_envs={n}) with {which} raised {type(exc).__name__}: {exc}"
                           f"{where_raised(exc)}", fix)


def rule_action_space(ctx: Context) -> Outcome:
    """2. ``single_action_space`` is a gymnasium Space the client can carry (one array per env), and a batch of
    actions sampled from it steps. The client builds every action batch in that shape and dtype."""
    problem = action_space_problem(ctx.env)
    if problem is not None:
        return Outcome("fail", problem.seen, problem.fix)
    space = ctx.space = ctx.env.single_action_space
    actions = ctx.actions()
    try:
        ctx.reset(ctx.seed)
    except EnvRaised as exc:
        raise Skip(f"single_action_space is {short_space(space)}, but sampled actions could not be stepped: "
                   f"{exc.call} raised {type(exc.exc).__name__} (rule 3)") from None
    try:
        ctx.call("step(actions sampled from single_action_space)", ctx.env.step, actions)
    except EnvRaised as exc:
        return Outcome("fail", f"step() with actions of shape {actions.shape} and dtype {actions.dtype} sampled from "
                       f"{short_space(space)} raised {type(exc.exc).__name__}: {exc.exc}{where_raised(exc.exc)}",
                       "make single_action_space describe what step() accepts (shape, dtype, bounds); step() gets "
                       "an array (num_envs, *single_action_space.shape)", "".join(traceback.format_exception(exc.exc)))
    return passed(short_space(space))
