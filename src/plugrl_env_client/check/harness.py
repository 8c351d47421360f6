"""How the checker drives an env: the calls it makes, the actions it samples, the short run most rules look at, and
the running of rules one after another, so that the rules (:mod:`plugrl_env_client.check.rules`) say only what
they check.

The env is a black box the checker calls through :class:`Context`. An exception the env raises inside a call
becomes :class:`EnvRaised`, the failure of the rule that made the call (never the checker's crash). The values a
call returns are read with the functions the rollout checks them with (:mod:`plugrl_env_client.envs.contract`):
a value that breaks the contract is :class:`ContractBroken`, again the failure of the rule that asked, since a run
would stop at it.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import sys
import sysconfig
import traceback
import types
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Literal

import gymnasium as gym
import numpy as np

from plugrl_env_client.check.report import CheckReport, CheckResult, Status
from plugrl_env_client.envs import contract
from plugrl_env_client.envs.base_env import BaseEnv, BaseEnvConfig, Observation
from plugrl_env_client.envs.contract import Problem, StepOutput
from plugrl_env_client.envs.registry import EnvSpec

DEFAULT_STEPS = 50
"""Batch steps of the run the per-step rules (6, 7, 9, 11, 12) look at."""
TEXT_ACTION_LENGTH = 16
"""Longest sampled text action (for Text action spaces)."""


# ================================================================================================ outcomes


class EnvRaised(Exception):
    """The env raised inside a call the checker made; the rule that made it fails with the exception."""

    def __init__(self, call: str, exc: BaseException) -> None:
        super().__init__(call)
        self.call, self.exc = call, exc


class ContractBroken(Exception):
    """A value the env returned to a call the checker made breaks the env contract; the rule that made the call
    fails with the contract's problem (a run would stop there)."""

    def __init__(self, call: str, problem: Problem) -> None:
        super().__init__(call)
        self.call, self.problem = call, problem


class Skip(Exception):
    """The rule cannot run; the message says why."""


@dataclasses.dataclass
class Finding:
    """One thing a rule saw: a warning or a failure, with what to change."""

    level: Literal["warn", "fail"]
    seen: str
    fix: str


@dataclasses.dataclass
class Outcome:
    """What one rule concluded (the report adds its number and title)."""

    status: Status
    seen: str = ""
    fix: str = ""
    details: str = ""


def passed(note: str = "") -> Outcome:
    return Outcome("pass", note)


def judge(findings: list[Finding], note: str = "") -> Outcome:
    """The worst level of ``findings`` (a pass with ``note`` when there are none), their texts joined."""
    if not findings:
        return passed(note)
    status: Status = "fail" if any(f.level == "fail" for f in findings) else "warn"
    fixes = list(dict.fromkeys(f.fix for f in findings if f.fix))
    return Outcome(status, "; ".join(f.seen for f in findings), "; ".join(fixes))


def as_finding(problem: Problem) -> Finding:
    """A problem of the env contract as a finding: an error fails the rule, a value the client converts warns."""
    return Finding("warn" if problem.severity == "warning" else "fail", problem.seen, problem.fix)


def findings_of(problems: Iterable[Problem]) -> list[Finding]:
    return [as_finding(p) for p in problems]


def where_raised(exc: BaseException) -> str:
    """`` (at file.py:12 in fn)``: the innermost frame of the traceback in the env's own code, i.e. outside the
    installed libraries and the standard library (numpy's frames say little about what to fix)."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return ""
    library = tuple(p for p in {sysconfig.get_path("purelib"), sysconfig.get_path("platlib"),
                                sysconfig.get_path("stdlib")} if p)
    own = [f for f in frames if not f.filename.startswith(library)]
    last = (own or frames)[-1]
    return f" (at {Path(last.filename).name}:{last.lineno} in {last.name})"


# ================================================================================================ the shared run


@dataclasses.dataclass
class StepRecord:
    """One batch step of the shared run: the observation it started from, what it returned, what happened inside."""

    number: int
    before: Observation
    obs: Observation
    rewards: np.ndarray
    """float32, as the client reads them (:func:`plugrl_env_client.envs.contract.read_step`)."""
    terminated: np.ndarray
    truncated: np.ndarray
    info: dict[str, Any]
    reset_calls: int
    returned_rewards: np.ndarray | None = None
    """The rewards as the env returned them, before the cast: a finite float64 beyond float32's range is finite
    here and inf in ``rewards``."""

    @property
    def done(self) -> np.ndarray:
        return self.terminated | self.truncated


@dataclasses.dataclass
class Trajectory:
    """The run rules 6, 7, 9, 11 and 12 share: ``reset(seed)``, then ``steps`` steps of sampled actions, the rows
    that finished reset after each step (with a partial reset, as the client does)."""

    observations: list[tuple[str, Observation]]
    steps: list[StepRecord]
    starts: list[tuple[int, np.ndarray, Observation]]
    """(step number, rows, observation) of every reset: the rows that observation shows freshly reset, after
    that step of the run (0: the first reset)."""
    watched: bool
    """Whether calls of the env's reset() made from inside step() could be watched."""


class Context:
    """The env under check and what earlier rules learned about it."""

    def __init__(self, env: Any, spec: EnvSpec | None, seed: int, steps: int) -> None:
        self.env = env
        self.spec = spec
        self.seed = int(seed)
        self.steps = max(int(steps), 1)
        self.env_id: str | None = None  # set for registered envs: the rollout rule needs it
        self.config: BaseEnvConfig | None = None
        self.rollout = False
        self.closed = False  # rule 13 ran
        self.construction: list[Finding] | None = None  # rule 1's findings when the checker built the env
        self.results: dict[int, CheckResult] = {}
        self.space: gym.Space | None = None
        self.observation_space_declared = True  # whether the env came with its single_observation_space (rule 3)
        self._sampler: gym.Space | None = None
        self.returned_rewards: np.ndarray | None = None  # the latest step's rewards as the env returned them (any dtype)
        self._trajectory: Trajectory | None = None
        self._trajectory_error: str | None = None

    @property
    def n(self) -> int:
        return int(self.env.num_envs)

    # ---------------------------------------------------------------------------------------- env calls

    def call(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            raise EnvRaised(what, exc) from exc

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        return self.call(_reset_call(seed, options), self.env.reset, seed=seed, options=options)

    def reset_obs(self, seed: int | None = None, options: dict[str, Any] | None = None) -> Observation:
        """A reset's observation as the client reads it (a copy); a reset that breaks the reset contract is
        :class:`ContractBroken`."""
        what = _reset_call(seed, options)
        values, problems = contract.read_reset(self.n, self.call(what, self.env.reset, seed=seed, options=options))
        if values is None:
            raise ContractBroken(what, _first_error(problems))
        return values[0].copy()

    def step(self, actions: np.ndarray, what: str = "step(actions)") -> StepOutput:
        """A step's values as the client reads them (rewards float32, flags bool), copied: envs may overwrite their
        own buffers later. A step that breaks the step contract is :class:`ContractBroken`."""
        result = self.call(what, self.env.step, actions)
        out, problems = contract.read_step(self.n, result, warnings=False)
        if out is None:
            raise ContractBroken(what, _first_error(problems))
        self.returned_rewards = np.array(result[1], copy=True)  # read_step accepted it: numeric, shape (n,)
        return StepOutput(out.obs.copy(), out.rewards.copy(), out.terminated.copy(), out.truncated.copy(), out.info,
                          out.zeroed_rewards)

    def actions(self) -> np.ndarray:
        """A batch of sampled actions, shape ``(n, *single_action_space.shape)`` in the space's dtype: what the
        client hands the env. Samples come from a seeded copy of the space, so the env's own space is untouched."""
        if self.space is None:
            raise Skip("the env has no usable single_action_space (rule 2)")
        if self._sampler is None:
            try:
                self._sampler = _seeded_copy(self.space, self.seed)
            except Exception:  # a space that cannot be copied: sample from it directly
                self._sampler = self.space
        return np.stack([np.asarray(_sample(self._sampler)) for _ in range(self.n)])

    # ---------------------------------------------------------------------------------------- shared run

    def trajectory(self) -> Trajectory:
        """The shared run (collected once). If collecting it crashed, the first rule that asked fails with the
        exception and the later ones skip."""
        if self._trajectory is not None:
            return self._trajectory
        if self._trajectory_error is not None:
            raise Skip(f"the checker's run of the env {self._trajectory_error}")
        try:
            self._trajectory = self._collect()
        except EnvRaised as exc:
            self._trajectory_error = f"crashed ({exc.call} raised {type(exc.exc).__name__})"
            raise
        except ContractBroken as exc:
            self._trajectory_error = f"stopped ({exc.call} broke the env contract)"
            raise
        except Skip as exc:
            self._trajectory_error = f"could not run ({exc})"
            raise
        return self._trajectory

    def _collect(self) -> Trajectory:
        first = self.reset_obs(self.seed)
        traj = Trajectory([(f"reset(seed={self.seed})", first)], [], [(0, np.arange(self.n), first)], True)
        current = first
        for number in range(1, self.steps + 1):
            actions = self.actions()
            with _watch_reset_calls(self.env) as calls:
                out = self.step(actions, f"step() (step {number} of the run)")
            traj.watched = traj.watched and calls.watched
            record = StepRecord(number, current, out.obs, out.rewards, out.terminated, out.truncated, out.info,
                                calls.count, self.returned_rewards)
            traj.steps.append(record)
            traj.observations.append((f"step {number}", out.obs))
            current = out.obs
            done = record.done
            if done.any():
                rows = np.flatnonzero(done)
                current = self.reset_obs(None, {"reset_mask": done.copy(), "reset_indices": rows})
                traj.observations.append((f"the reset after step {number}", current))
                traj.starts.append((number, rows, current))
        return traj


def _reset_call(seed: int | None, options: dict[str, Any] | None) -> str:
    return f"reset(seed={seed})" if options is None else "reset(options={'reset_mask': ..., 'reset_indices': ...})"


def _first_error(problems: list[Problem]) -> Problem:
    return next(p for p in problems if p.severity == "error")


# ================================================================================================ running rules


@dataclasses.dataclass
class Rule:
    number: int
    title: str
    fn: Callable[[Context], Outcome]
    needs: tuple[int, ...] = ()
    """Rules that must not have failed (or been skipped) for this one to run."""


def run_rules(ctx: Context, rules: Iterable[Rule], subject: str) -> CheckReport:
    """Each rule in order on ``ctx``'s env, into one report."""
    report = CheckReport(subject)
    ctx.observation_space_declared = _declares_observation_space(ctx.env)  # before any rule resets the env
    for rule in rules:
        title = rule.title
        if rule.number == 1 and ctx.config is not None:
            title += " and from the given config"
        outcome = _run_one(ctx, rule)
        result = CheckResult(title, outcome.status, outcome.seen, outcome.fix, rule.number, outcome.details)
        ctx.results[rule.number] = result
        report.results.append(result)
    return report


def _declares_observation_space(env: Any) -> bool:
    """Whether ``env`` (a BaseEnv, possibly inside Gymnasium wrappers) has its observation space before any reset;
    other envs are taken to have one."""
    base = getattr(env, "unwrapped", env)
    return not isinstance(base, BaseEnv) or "_single_observation_space" in vars(base)


def _run_one(ctx: Context, rule: Rule) -> Outcome:
    if ctx.env is None and rule.number != 1:
        return Outcome("skip", "there is no env to check: it could not be built (rule 1)")
    for needed in rule.needs:
        prior = ctx.results[needed]
        if prior.status in ("fail", "skip"):
            verb = "failed" if prior.status == "fail" else "was skipped"
            return Outcome("skip", f"needs rule {needed}, which {verb}")
    try:
        return rule.fn(ctx)
    except Skip as exc:
        return Outcome("skip", str(exc))
    except ContractBroken as exc:
        return Outcome("fail", f"{exc.call}: {exc.problem.seen}", exc.problem.fix)
    except EnvRaised as exc:
        return Outcome("fail", f"{exc.call} raised {type(exc.exc).__name__}: {exc.exc}{where_raised(exc.exc)}",
                       "fix the exception in the env (its traceback is in the report's details)",
                       "".join(traceback.format_exception(exc.exc)))
    except Exception as exc:  # the checker's own bug: report it on the rule rather than lose the report
        return Outcome("fail", f"the checker itself raised {type(exc).__name__}: {exc} (a bug in "
                       "plugrl_env_client.check, not in the env)", "",
                       "".join(traceback.format_exception(exc)))


# ================================================================================================ helpers


def steps_text(numbers: list[int]) -> str:
    """``step 3``, or ``steps 3, 6, 9`` (the first five, then ``...``)."""
    shown = ", ".join(str(s) for s in numbers[:5])
    return f"step {shown}" if len(numbers) == 1 else f"steps {shown}" + (", ..." if len(numbers) > 5 else "")


def _seeded_copy(space: gym.Space, seed: int) -> gym.Space:
    sampler = copy.deepcopy(space)
    sampler.seed(seed)
    return sampler


def _sample(space: gym.Space) -> Any:
    """One action; Text actions are kept short (a Text space's max_length can be huge, a client's answers are
    not), with lengths within the space's bounds."""
    if isinstance(space, gym.spaces.Text):
        low = int(space.min_length)
        high = max(low, min(int(space.max_length), TEXT_ACTION_LENGTH))
        return space.sample(mask=(int(space.np_random.integers(low, high + 1)), None))
    return space.sample()


class _ResetWatch:
    count = 0
    watched = True


@contextlib.contextmanager
def _watch_reset_calls(env: Any) -> Iterator[_ResetWatch]:
    """Count calls of the env's own ``reset`` (any class in its MRO, however called: ``self.reset``, ``super()``,
    ``Cls.reset(self)``) while the block runs, with a profile hook that looks only at function entries."""
    watch = _ResetWatch()
    codes = {f.__code__ for cls in type(env).__mro__ if isinstance(f := cls.__dict__.get("reset"), types.FunctionType)}
    previous = sys.getprofile()
    if previous is not None or not codes:  # another profiler is active: do not displace it
        watch.watched = False
        yield watch
        return

    def hook(frame: types.FrameType, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code in codes:
            watch.count += 1

    sys.setprofile(hook)
    try:
        yield watch
    finally:
        sys.setprofile(previous)
