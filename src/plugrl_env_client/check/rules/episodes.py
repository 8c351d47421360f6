"""Rules 8 to 10: how episodes end and start again.

The client resets only the envs that finished, with a partial ``reset(options={"reset_mask": ...})``, after it has
sent their terminal observations; it truncates at the registered time limit itself. These rules check that the env
plays its part: a partial reset touches only the listed rows (8), ``step`` never resets a row itself (9), and the
env's own episode ends agree with the registered limit (10). None of this shows in one call, so the rules run the
env and watch.
"""

from __future__ import annotations

import numpy as np
from gymnasium.vector import AutoresetMode

from plugrl_env_client.check.harness import (
    Context,
    Finding,
    Outcome,
    Skip,
    Trajectory,
    judge,
    passed,
    steps_text,
)
from plugrl_env_client.check.rules.rows import differences, row_equal
from plugrl_env_client.envs.contract import RESET_IN_STEP, partial_reset_problem, read_reset, rows_text

GENEROUS_STEPS = 1000
"""Batch steps after which an env with no registered time limit that never ended an episode gets a warning."""
MIN_TIME_LIMIT_STEPS = 200
MAX_TIME_LIMIT_STEPS = 3000
"""Bounds on the steps rule 10 runs to see the env's own time limit (it runs up to twice the registered one)."""

_AUTORESET_INFO_KEYS = ("final_obs", "final_observation", "_final_obs", "_final_observation", "final_info",
                        "_final_info")


def rule_partial_reset(ctx: Context) -> Outcome:
    """8. ``reset(options={"reset_mask": m, "reset_indices": idx})`` resets only the listed rows and returns the
    whole batch, the other rows exactly as the last step left them (the client keeps using them).

    The odd rows are reset after one step from ``reset(seed)``, so that an env resetting the first k rows instead of
    the listed ones is caught as well as one ignoring the mask. A run checks the same after every partial reset
    (state arrays only) and stops with the same words
    (:func:`~plugrl_env_client.envs.contract.partial_reset_problem`).
    """
    n = ctx.n
    if n < 2:
        raise Skip("num_envs=1: a partial reset of the only env is a full one; check with num_envs >= 2")
    start = ctx.reset_obs(ctx.seed)
    before = ctx.step(ctx.actions()).obs
    rows = np.arange(1, n, 2)
    mask = np.zeros(n, bool)
    mask[rows] = True
    values, problems = read_reset(n, ctx.reset(None, {"reset_mask": mask, "reset_indices": rows}))
    if values is None:  # the reset contract, for a partial reset (rule 3 saw a full one)
        return judge([Finding("fail", f"resetting envs {rows_text(rows)}: {p.seen}", p.fix)
                      for p in problems if p.severity == "error"])
    after = values[0].copy()
    kept = np.setdiff1d(np.arange(n), rows)
    changed = differences(before, after, kept)
    if changed:  # the words a run stops with when an env does this (one rule, two callers)
        problem = partial_reset_problem(rows, changed)
        return Outcome("fail", problem.seen, problem.fix)
    moved = [int(i) for i in rows if not row_equal(start, int(i), before, int(i))]
    stuck = [i for i in moved if row_equal(before, i, after, i)]
    if stuck:
        return Outcome("fail", f"envs {stuck} were listed for reset but came back exactly as the step left them",
                       "reset the rows of `self.reset_mask(options)`: the client passes options['reset_mask'] "
                       "(bool, n) and options['reset_indices'] (env indices)")
    return passed(f"reset envs {rows_text(rows)} of {n}")


def rule_no_reset_in_step(ctx: Context) -> Outcome:
    """9. ``step`` never resets an env: a finished env's row holds its terminal observation until the client calls
    ``reset`` (it sends that observation to the server first).

    What is checked, from the most to the least direct evidence:

    * calls of the env's own ``reset`` (any class in its MRO, however called) while ``step`` runs, seen by a
      profile hook;
    * ``metadata["autoreset_mode"]`` other than ``DISABLED``, and the ``final_obs``/``final_info`` info keys that
      gymnasium's autoresetting vector envs add;
    * a finished row whose observation equals one this row had right after a reset (the fresh ``reset(seed)`` or an
      earlier reset of the run) while differing from the observation before the step: it jumped back to a start.
      Exact for envs with fixed or seed-replayed starts;
    * a step counter that went back: a state column that changed by the same amount on every step that did not
      end an episode (a time index, a countdown), but changed the other way on a step that did.

    An env with random starts and no counter-like state that resets rows with a helper of its own is out of reach
    of a black-box check; the first point still catches the common ``self.reset(...)`` inside ``step``.
    """
    traj = ctx.trajectory()
    findings = []
    mode = getattr(ctx.env, "metadata", {}).get("autoreset_mode")
    if mode is not None and mode != AutoresetMode.DISABLED:
        findings.append(Finding("fail", f"metadata declares autoreset_mode={mode}",
                                "keep BaseEnv's AutoresetMode.DISABLED and reset only in reset()"))
    calls = [rec.number for rec in traj.steps if rec.reset_calls]
    if calls:
        findings.append(Finding("fail", f"{RESET_IN_STEP.seen} (at {steps_text(calls)} of the run)",
                                RESET_IN_STEP.fix))
    keys = sorted({k for rec in traj.steps for k in rec.info if k in _AUTORESET_INFO_KEYS})
    if keys:
        findings.append(Finding("fail", f"info carries {keys}, keys of an env that resets in step",
                                "return the terminal observation itself and let the client reset (disable the "
                                "inner env's autoreset)"))
    ends = sum(int(rec.done.sum()) for rec in traj.steps)
    findings += _jumps_to_start(traj) + _counter_jumps(traj, ctx.n)
    if findings:
        return judge(findings)
    watched = "" if traj.watched else " (reset() calls could not be watched: another profiler is active)"
    if ends == 0:
        return passed(f"no env finished an episode in {len(traj.steps)} steps, so only reset() calls were "
                      f"watched{watched}")
    return passed(f"{ends} episode ends in {len(traj.steps)} steps{watched}")


def _jumps_to_start(traj: Trajectory) -> list[Finding]:
    seen: list[str] = []
    for rec in traj.steps:
        for i in np.flatnonzero(rec.done).tolist():
            if row_equal(rec.before, i, rec.obs, i):
                continue  # the step changed nothing: a start that is also terminal proves nothing
            starts = [obs for after, rows, obs in traj.starts if after < rec.number and i in rows]
            if any(row_equal(rec.obs, i, start, i) for start in starts):
                seen.append(f"env {i} at step {rec.number}")
    if not seen:
        return []
    return [Finding("fail", f"the observation of a finished env equals its observation right after a reset "
                    f"({', '.join(seen[:3])}): the row came back reset instead of terminal",
                    "return the terminal observation of a finished env; the client resets it after sending it")]


def _counter_jumps(traj: Trajectory, n: int) -> list[Finding]:
    for key in traj.steps[0].obs.states if traj.steps else ():
        found = _counter_jump(traj, key, n)
        if found is not None:
            return [found]
    return []


def _counter_jump(traj: Trajectory, key: str, n: int) -> Finding | None:
    """A column of ``states[key]`` that changes by the same amount on every step that does not end an episode (a
    time index, a countdown), but went the other way on one that did."""
    steady: list[np.ndarray] = []
    at_end: list[tuple[int, int, np.ndarray]] = []  # (step, env, change of that env's row)
    for rec in traj.steps:
        a, b = rec.before.states.get(key), rec.obs.states.get(key)
        if a is None or b is None or a.shape != b.shape or a.dtype.kind not in "iuf" or b.dtype.kind not in "iuf":
            return None
        change = b.reshape(n, -1).astype(np.float64) - a.reshape(n, -1).astype(np.float64)
        steady.append(change[~rec.done])
        at_end.extend((rec.number, i, change[i]) for i in np.flatnonzero(rec.done).tolist())
    changes = np.concatenate(steady) if steady else np.zeros((0, 0))
    if not at_end or changes.shape[0] < 3:
        return None
    counter = np.isclose(changes, changes[0], rtol=1e-6, atol=1e-12).all(axis=0) & (changes[0] != 0)
    for number, i, change in at_end:
        back = np.flatnonzero(counter & (np.sign(change) == -np.sign(changes[0])))
        if back.size:
            col = int(back[0])
            return Finding("fail", f"states[{key!r}] column {col} changes by {changes[0, col]:+g} every step but went "
                           f"back on the step that ended env {i}'s episode (step {number}): the env reset the row "
                           "inside step", "return the terminal observation of a finished env; the client resets it")
    return None


def rule_time_limit(ctx: Context) -> Outcome:
    """10. The env's own episode ends agree with the registered ``max_episode_steps`` (the client marks truncated
    at that limit itself), and something ends episodes.

    The env is stepped (finished rows reset as the client does) up to twice the registered limit (at least
    ``MIN_TIME_LIMIT_STEPS``), so an own time limit of the env's that is longer or shorter than the registered one
    shows; the run stops early once every env has ended two episodes. An env that terminates every episode at
    exactly the limit reports a time limit as a termination. With no registered limit, an env that ends no episode
    within ``GENEROUS_STEPS`` steps gets a warning: runs with ``--num-episodes`` would never end.
    """
    limit = ctx.spec.max_episode_steps if ctx.spec is not None else None
    budget = GENEROUS_STEPS if limit is None else min(max(2 * limit + 1, MIN_TIME_LIMIT_STEPS), MAX_TIME_LIMIT_STEPS)
    n = ctx.n
    length = np.zeros(n, np.int64)
    ends: list[tuple[int, int, bool]] = []  # (env, length, truncated by the env itself)
    per_env = np.zeros(n, np.int64)
    ctx.reset(ctx.seed)
    taken = 0
    for taken in range(1, budget + 1):
        out = ctx.step(ctx.actions(), f"step() (step {taken} of the time-limit run)")
        terminated, truncated = out.terminated, out.truncated
        length += 1
        done = terminated | truncated
        for i in np.flatnonzero(done):
            ends.append((int(i), int(length[i]), bool(truncated[i] and not terminated[i])))
        if done.any():
            per_env += done
            length[done] = 0
            rows = np.flatnonzero(done)
            ctx.reset(None, {"reset_mask": done.copy(), "reset_indices": rows})
        if (per_env >= 2).all():
            break
    truncations = sorted({ln for _, ln, trunc in ends if trunc})
    terminations = [ln for _, ln, trunc in ends if not trunc]
    flag = "--runner.max-episode-steps"
    if limit is None:
        if not ends:
            where = f"register_env({ctx.spec.uid if ctx.spec else '...'!r}, max_episode_steps=...)"
            return Outcome("warn", f"no episode ended within {taken} steps and the env has no registered "
                           "max_episode_steps: a run with --num-episodes would never finish",
                           f"end episodes in the env (terminated/truncated), or give a time limit: {where}, or run "
                           f"with {flag}")
        return passed(f"{len(ends)} episode ends within {taken} steps, no registered time limit")
    findings = []
    longer = [ln for ln in truncations if ln > limit]
    shorter = [ln for ln in truncations if ln < limit]
    if longer:
        findings.append(Finding("warn", f"the env truncates episodes itself after {longer} steps, beyond the "
                                f"registered max_episode_steps={limit}: the client truncates at {limit} first, so "
                                "the env's own limit never applies",
                                f"make them agree: register max_episode_steps={longer[0]} or change the env's "
                                "limit"))
    if shorter:
        findings.append(Finding("warn", f"the env truncates episodes itself after {shorter} steps, before the "
                                f"registered max_episode_steps={limit}: the registered limit never applies (nor "
                                f"{flag} above {max(shorter)})",
                                f"make them agree: register max_episode_steps={max(shorter)} or change the env's "
                                "limit"))
    if len(terminations) >= 2 and set(terminations) == {limit} and not truncations:
        findings.append(Finding("warn", f"every episode ended terminated at exactly max_episode_steps={limit}",
                                "a time limit is a truncation: return truncated=True (terminated=False) when time "
                                "runs out"))
    if truncations == [limit]:
        note = f"the env truncates at its registered limit of {limit} steps itself"
    else:
        note = f"the env does not truncate by itself within {taken} steps; the client truncates at {limit}"
    return judge(findings, note)
