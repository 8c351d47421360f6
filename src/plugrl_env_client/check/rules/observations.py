"""Rules 6 and 7: the values and the layout of what the env returns, over the whole shared run.

The rollout checks each observation as it comes and stops at the first NaN or the first float image; these rules
look at every observation of the run with the same checks (:func:`plugrl_env_client.envs.contract.non_finite_states`,
:func:`~plugrl_env_client.envs.contract.observation_problems`) and list each problem once, at the first place it
showed. Rule 7 adds what no single observation shows (a layout that changes during the run) and what only looks
wrong (channels-first images): the client would send those without complaint.
"""

from __future__ import annotations

import numpy as np

from plugrl_env_client.check.harness import Context, Finding, Outcome, as_finding, judge, steps_text
from plugrl_env_client.check.rules.rows import layout_of
from plugrl_env_client.envs.contract import (
    OBSERVATIONS_FLAG,
    REWARDS_FLAG,
    non_finite_rows,
    non_finite_states,
    observation_problems,
    rows_text,
)


def rule_finite(ctx: Context) -> Outcome:
    """6. No NaN or inf in rewards, no finite reward beyond float32's range (the client casts rewards to float32),
    and no NaN or inf in float state arrays, over the run.
    Images are uint8 and cannot hold either."""
    traj = ctx.trajectory()
    bad_rewards: dict[int, list[int]] = {}
    too_large: dict[int, tuple[list[int], float]] = {}  # finite rewards the cast to float32 made infinite
    for rec in traj.steps:
        rows = non_finite_rows(rec.rewards)
        if rows is None:
            continue
        returned = rec.returned_rewards
        if returned is not None and returned.dtype.kind == "f":
            with np.errstate(invalid="ignore"):
                finite = rows[np.isfinite(returned[rows])]
            if finite.size:
                too_large[rec.number] = (finite.tolist(), float(returned[finite[0]]))
            rows = np.setdiff1d(rows, finite)
        if rows.size:
            bad_rewards[rec.number] = rows.tolist()
    bad_states: dict[str, list[str]] = {}
    for where, obs in traj.observations:
        for key, rows in non_finite_states(obs).items():
            bad_states.setdefault(key, []).append(f"{where} (envs {rows_text(rows)})")
    findings = []
    if bad_rewards:
        first = next(iter(bad_rewards))
        findings.append(Finding("fail", f"rewards were NaN or inf at {steps_text(list(bad_rewards))} (envs "
                                f"{rows_text(bad_rewards[first])} at step {first})",
                                "find where the env produces them (a division by zero, a diverging simulation) and "
                                f"return finite values; to run anyway: {REWARDS_FLAG}"))
    if too_large:
        first = next(iter(too_large))
        listed, value = too_large[first]
        findings.append(Finding("fail", f"rewards did not fit float32 at {steps_text(list(too_large))} ({value:g} for "
                                f"envs {rows_text(listed)} at step {first}; float32's largest is "
                                f"{float(np.finfo(np.float32).max):g}): the client sends float32, where they become inf",
                                "scale the rewards into float32's range; to run anyway (they become 0.0): "
                                f"{REWARDS_FLAG}"))
    for key, places in bad_states.items():
        findings.append(Finding("fail", f"states[{key!r}] held NaN or inf at {', '.join(places[:3])}"
                                + (", ..." if len(places) > 3 else ""),
                                f"return finite observations; to send them anyway: {OBSERVATIONS_FLAG}"))
    return judge(findings, f"checked over {len(traj.steps)} steps")


def rule_layout(ctx: Context) -> Outcome:
    """7. Images are uint8 ``(n, h, w, c)`` (channels last); states are numeric with the batch leading; each key
    keeps its shape and dtype over the run (servers size their inputs from the first observation)."""
    traj = ctx.trajectory()
    findings: dict[str, Finding] = {}
    first_where, first_obs = traj.observations[0]
    first = layout_of(first_obs)
    for where, obs in traj.observations:
        for problem in observation_problems(ctx.n, obs, where):
            findings.setdefault(problem.key, as_finding(problem))
        for key, img in obs.images.items():
            if img.dtype == np.uint8 and img.ndim == 4 and img.shape[1] in (1, 3, 4) and img.shape[3] not in (1, 3, 4):
                name = f"images[{key!r}]"
                findings.setdefault(name + " channels", Finding(
                    "fail", f"{name} has shape {img.shape}, which looks channels-first (n, c, h, w) (at {where})",
                    "images are channels last: `np.moveaxis(img, 1, -1)`"))
        layout = layout_of(obs)
        if layout != first:
            changed = sorted(k for k in layout.keys() | first.keys() if layout.get(k) != first.get(k))
            findings.setdefault("layout", Finding(
                "warn", f"{', '.join(changed)} changed shape, dtype or presence between {first_where} and {where}",
                "return the same keys with the same shapes and dtypes on every reset and step"))
    return judge(list(findings.values()))
