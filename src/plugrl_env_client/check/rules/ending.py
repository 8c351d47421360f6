"""Rules 13 and 14: closing the env, and a short real rollout.

Rule 13 closes the env the other rules used (twice: the client may, on its error paths). Rule 14 then runs the
client itself, as ``plugrl-run-env-client`` would, against the embedded policy, on a fresh env: the one check that
exercises everything at once, reported in the client's own words when it stops.
"""

from __future__ import annotations

import contextlib
import io
import tempfile
import traceback
from collections.abc import Iterator
from pathlib import Path

from plugrl_env_client.check.harness import Context, Outcome, Skip, passed
from plugrl_env_client.envs.base_env import describe_space
from plugrl_env_client.outputs.logs import logging_restored
from plugrl_env_client.server.registry import default_policy

ROLLOUT_STEP_CAP = 50
"""Time limit of the rollout rule's episodes: the registered one, but at most this many steps."""


def rule_close(ctx: Context) -> Outcome:
    """13. ``close()`` releases the env and a second ``close()`` is harmless (the client may close twice on error
    paths). After this rule the env is closed."""
    ctx.closed = True
    ctx.call("close() (the first)", ctx.env.close)
    ctx.call("close() (the second)", ctx.env.close)
    return passed()


def rule_rollout(ctx: Context) -> Outcome:
    """14. A short rollout with the real client and the embedded policy offered for the env's action space (the
    registry's :func:`~plugrl_env_client.server.registry.default_policy`: random for numeric spaces, text for a
    Text space) completes: 2 episodes of at most ``ROLLOUT_STEP_CAP`` steps. It runs only for a registered env, and only
    when no earlier rule failed: a real run stops at most such failures (a reset() inside step() included) and
    collects wrong data at the others, so the rollout would only repeat them."""
    if ctx.env_id is None or ctx.spec is None:
        raise Skip("check_env() was given an env object; check_registered_env(env_id) runs the rollout")
    if not ctx.rollout:
        raise Skip("rollout=False")
    failed = [r.number for r in ctx.results.values() if r.status == "fail"]
    if failed:
        raise Skip(f"rules {failed} failed; the rollout runs once every rule passes (a real run stops at most such "
                   "failures, a reset() inside step() included, and collects wrong data at the others)")
    if ctx.space is None:
        raise Skip("the env has no usable single_action_space (rule 2)")
    policy = default_policy(ctx.space)
    if policy is None:
        raise Skip(f"no registered policy is offered for the action space {describe_space(ctx.space)}; register "
                   "one that answers it with @register_policy(NAME, default=True) in a file given as --env-path "
                   "(docs/custom-policies.md)")
    from plugrl_env_client.app import run_client
    from plugrl_env_client.config import ClientConfig, RunnerConfig

    cap = min(ctx.spec.max_episode_steps or ROLLOUT_STEP_CAP, ROLLOUT_STEP_CAP)
    env_config = ctx.config if ctx.config is not None else ctx.spec.config_cls()
    with tempfile.TemporaryDirectory(prefix="plugrl-check-") as tmp, _captured_run() as (out, err):
        config = ClientConfig(num_envs=ctx.n, num_episodes=2, local_policy=policy, output_dir=Path(tmp),
                              exp_name="check", progress=False, env=env_config,
                              runner=RunnerConfig(seed=ctx.seed, max_episode_steps=cap))
        try:
            code = run_client(config, ctx.env_id)
        except Exception as exc:
            return Outcome("fail", f"the client raised {type(exc).__name__}: {exc}", "see the message",
                           "".join(traceback.format_exception(exc)))
    if code in (130, 143):
        raise KeyboardInterrupt
    if code != 0:
        errors = [line.removeprefix("error: ") for line in err.getvalue().splitlines() if line.startswith("error:")]
        message = "; ".join(errors) or err.getvalue().strip()[-500:] or f"exit code {code}"
        return Outcome("fail", f"the rollout stopped: {message}",
                       f"fix what the message says (rerun with: plugrl-run-env-client {ctx.env_id} --num-envs {ctx.n} "
                       f"--num-episodes 2 --local-policy {policy})")
    return passed(f"2 episodes against the embedded {policy} policy (at most {cap} steps each)")


@contextlib.contextmanager
def _captured_run() -> Iterator[tuple[io.StringIO, io.StringIO]]:
    """Capture what a client run prints, and undo the logging setup it makes for its own run folder."""
    out, err = io.StringIO(), io.StringIO()
    with logging_restored(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        yield out, err
