"""The env contract as a checklist: run each rule of the batched env API on an env and report, rule by rule.

The rules are PlugRL's conventions (``envs/base_env.py``) together with the env checklist of agentic RL
frameworks such as ROLL (seeded resets, metric keys, info conventions), written for batched envs. Each rule is
one function and they run in a fixed order on one env. A rule passes, warns (the client copes, but something is
probably unintended), fails (a run would stop, or would be wrong) or is skipped (something it needs is broken,
and the reason names the rule that found it). An exception raised by the env inside a rule is that rule's
failure, never the checker's crash.

Two entry points: :func:`check_env` for an env object the caller built, and :func:`check_registered_env`, which
builds a registered env itself, adds the rules that need the registry, and ends with a short real rollout.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import sys
import sysconfig
import tempfile
import textwrap
import traceback
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Literal

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

from plugrl_env_client.envs.base_env import BaseEnv, BaseEnvConfig, Observation, describe_space
from plugrl_env_client.envs.registry import EnvSpec, get_spec, make_env
from plugrl_env_client.errors import ConfigError
from plugrl_env_client.outputs.logs import logging_restored
from plugrl_env_client.rollout import checks

if TYPE_CHECKING:
    from rich.text import Text

Status = Literal["pass", "warn", "fail", "skip"]

DEFAULT_STEPS = 50
"""Batch steps of the run the per-step rules (6, 7, 9, 11, 12) look at."""
GENEROUS_STEPS = 1000
"""Batch steps after which an env with no registered time limit that never ended an episode gets a warning."""
MIN_TIME_LIMIT_STEPS = 200
MAX_TIME_LIMIT_STEPS = 3000
"""Bounds on the steps rule 10 runs to see the env's own time limit (it runs up to twice the registered one)."""
TEXT_ACTION_LENGTH = 16
"""Longest sampled text action (for Text action spaces)."""
ROLLOUT_STEP_CAP = 50
"""Time limit of the rollout rule's episodes: the registered one, but at most this many steps."""

DOCUMENTED_INFO_KEYS: dict[str, str] = {
    "success": "bool (n,): the episode counts as a success when it is true on any step",
    "metrics": "dict of metric name -> per-env values (n,) (or a scalar for the whole batch)",
    "metrics_agg_mode": "dict of metric name -> how to aggregate it over an episode ('mean', 'sum', 'last', ...)",
    "env_instruction": "str, or one str per env: the task instruction",
    "action_is_valid": "bool (n,) or one bool: whether the action could be parsed and applied",
    "no_episode": "bool (n,) or one bool: the env has no episode to give (e.g. its task list is used up)",
}
"""Info keys with a meaning of their own; their values need not be per-env arrays (others do, to be forwarded)."""

_AUTORESET_INFO_KEYS = ("final_obs", "final_observation", "_final_obs", "_final_observation", "final_info",
                        "_final_info")
_COMPOSITE_SPACES = (gym.spaces.Dict, gym.spaces.Tuple, gym.spaces.Graph, gym.spaces.Sequence, gym.spaces.OneOf)
_STATUS_MARK = {"pass": "PASS", "warn": "WARN", "fail": "FAIL", "skip": "SKIP"}
_STATUS_STYLE = {"pass": "green", "warn": "yellow", "fail": "bold red", "skip": "dim"}
_INDENT = " " * 11
_StepValues = tuple[Observation, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]


# ================================================================================================ the report


@dataclasses.dataclass(frozen=True)
class CheckResult:
    """The outcome of one rule: ``seen`` says what was observed (for a skip: why it did not run), ``fix`` what to
    change. A passing rule may carry a note in ``seen``."""

    rule: str
    status: Status
    seen: str = ""
    fix: str = ""
    number: int = 0
    details: str = ""
    """The traceback of an exception the env raised, for logs (not shown in the checklist by default)."""


@dataclasses.dataclass
class CheckReport:
    """Every rule's :class:`CheckResult`, in order; renders as a checklist (plain text or, with rich, in colour)."""

    subject: str
    results: list[CheckResult] = dataclasses.field(default_factory=list)

    @property
    def ok(self) -> bool:
        """No rule failed (warnings and skips do not count)."""
        return not any(r.status == "fail" for r in self.results)

    def result(self, number: int) -> CheckResult:
        """The result of rule ``number`` (1-based, as printed)."""
        for r in self.results:
            if r.number == number:
                return r
        raise KeyError(f"no rule {number} in this report")

    def counts(self) -> dict[Status, int]:
        out: dict[Status, int] = {"pass": 0, "warn": 0, "fail": 0, "skip": 0}
        for r in self.results:
            out[r.status] += 1
        return out

    def summary(self) -> str:
        c = self.counts()
        verdict = "OK" if self.ok else "FAILED"
        return (f"{c['pass']} passed, {c['warn']} warning{'' if c['warn'] == 1 else 's'}, {c['fail']} failed, "
                f"{c['skip']} skipped: {verdict}")

    def lines(self, details: bool = False) -> list[tuple[Status | None, str]]:
        """The checklist as (status, line) pairs; ``status`` is None for lines that belong to the rule above."""
        out: list[tuple[Status | None, str]] = [(None, f"check {self.subject}")]
        for r in self.results:
            out.append((r.status, f"[{_STATUS_MARK[r.status]}] {r.number:>2}. {r.rule}"))
            label = {"pass": "note", "skip": "why"}.get(r.status, "seen")
            for name, text in ((label, r.seen), ("fix", r.fix)):
                if text:
                    out.extend((None, line) for line in _wrap(f"{name}:", text))
            if details and r.details:
                out.extend((None, _INDENT + line) for line in r.details.rstrip().splitlines())
        out.append((None, f"{self.subject}: {self.summary()}"))
        return out

    def render(self, details: bool = False) -> str:
        """Plain text, one line per rule, for terminals without colour and for log files."""
        return "\n".join(line for _, line in self.lines(details))

    def __str__(self) -> str:
        return self.render()

    def to_rich(self, details: bool = False) -> Text:
        """The same checklist as a rich ``Text`` with the marks coloured by status."""
        from rich.text import Text

        text = Text()
        for i, (status, line) in enumerate(self.lines(details)):
            if i:
                text.append("\n")
            if status is None:
                text.append(line, style="bold" if i == 0 else None)
            else:
                mark_end = line.index("]") + 1
                text.append(line[:mark_end], style=_STATUS_STYLE[status])
                text.append(line[mark_end:])
        return text

    def print(self, file: IO[str] | None = None, color: bool | None = None, details: bool = False) -> None:
        """Print to ``file`` (stdout); in colour when ``color`` is True, or by default when ``file`` is a terminal."""
        file = file if file is not None else sys.stdout
        if color is None:
            color = bool(getattr(file, "isatty", lambda: False)())
        if color:
            from rich.console import Console

            Console(file=file, force_terminal=True, highlight=False, soft_wrap=True).print(self.to_rich(details))
        else:
            print(self.render(details), file=file)


def _wrap(label: str, text: str) -> list[str]:
    return textwrap.wrap(text, width=116, initial_indent=f"{_INDENT}{label:<6}", subsequent_indent=_INDENT + " " * 6,
                         break_long_words=False, break_on_hyphens=False) or [f"{_INDENT}{label}"]


# ================================================================================================ entry points


def check_env(env: Any, *, spec: EnvSpec | None = None, seed: int = 0, steps: int = DEFAULT_STEPS) -> CheckReport:
    """Run rules 1-13 on ``env`` (an env object the caller built); rule 14 (the rollout) needs an env id.

    ``spec`` (default: the registered spec of ``env.spec.id``, when the env came from ``make_env``) adds the
    default-config construction to rule 1 and the registered time limit to rule 10. ``steps`` is the length of
    the run rules 6, 7, 9, 11 and 12 look at. The env is closed at the end (rule 13 closes it twice).
    """
    if spec is None:
        spec = _registered_spec_of(env)
    ctx = _Context(env, spec, seed, steps)
    return _run_rules(ctx, _subject(ctx))


def check_registered_env(
    env_id: str, *, num_envs: int = 2, config: BaseEnvConfig | None = None, rollout: bool = True,
    seed: int = 0, steps: int = DEFAULT_STEPS,
) -> CheckReport:
    """Build ``env_id`` from its default config (and from ``config``, when given: the CLI's ``--env.*``), run every
    rule on it, and end with a short rollout against the embedded random policy (unless ``rollout`` is False).

    The rules run on the env built from ``config`` when one is given. An unknown ``env_id`` raises ConfigError.
    """
    spec = get_spec(env_id)
    ctx = _Context(None, spec, seed, steps)
    ctx.env_id, ctx.config, ctx.rollout = spec.uid, config, rollout
    ctx.construction = _construct(ctx, num_envs)
    try:
        return _run_rules(ctx, _subject(ctx, num_envs))
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


def _subject(ctx: _Context, num_envs: int | None = None) -> str:
    name = ctx.spec.uid if ctx.spec is not None else type(ctx.env).__name__
    n = getattr(ctx.env, "num_envs", None) if ctx.env is not None else num_envs
    return f"{name} (num_envs={n}, seed={ctx.seed})"


# ================================================================================================ machinery


class _EnvRaised(Exception):
    """The env raised inside a call the checker made; the rule that made it fails with the exception."""

    def __init__(self, call: str, exc: BaseException) -> None:
        super().__init__(call)
        self.call, self.exc = call, exc


class _Skip(Exception):
    """The rule cannot run; the message says why."""


@dataclasses.dataclass
class _Finding:
    level: Literal["warn", "fail"]
    seen: str
    fix: str


@dataclasses.dataclass
class _Outcome:
    status: Status
    seen: str = ""
    fix: str = ""
    details: str = ""


def _passed(note: str = "") -> _Outcome:
    return _Outcome("pass", note)


def _judge(findings: list[_Finding], note: str = "") -> _Outcome:
    """The worst level of ``findings`` (a pass with ``note`` when there are none), their texts joined."""
    if not findings:
        return _passed(note)
    status: Status = "fail" if any(f.level == "fail" for f in findings) else "warn"
    fixes = list(dict.fromkeys(f.fix for f in findings if f.fix))
    return _Outcome(status, "; ".join(f.seen for f in findings), "; ".join(fixes))


@dataclasses.dataclass
class _StepRecord:
    """One batch step of the shared run: the observation it started from, what it returned, what happened inside."""

    number: int
    before: Observation
    obs: Observation
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    info: dict[str, Any]
    reset_calls: int

    @property
    def done(self) -> np.ndarray:
        return self.terminated | self.truncated


@dataclasses.dataclass
class _Trajectory:
    """The run rules 6, 7, 9, 11 and 12 share: ``reset(seed)``, then ``steps`` steps of sampled actions, the rows
    that finished reset after each step (with a partial reset, as the client does)."""

    observations: list[tuple[str, Observation]]
    steps: list[_StepRecord]
    starts: list[tuple[int, np.ndarray, Observation]]
    """(step number, rows, observation) of every reset: the rows that observation shows freshly reset, after
    that step of the run (0: the first reset)."""
    watched: bool
    """Whether calls of the env's reset() made from inside step() could be watched."""


class _Context:
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
        self.construction: list[_Finding] | None = None  # rule 1's findings when the checker built the env
        self.results: dict[int, CheckResult] = {}
        self.space: gym.Space | None = None
        self.observation_space_declared = True  # whether the env came with its single_observation_space (rule 3)
        self._sampler: gym.Space | None = None
        self._trajectory: _Trajectory | None = None
        self._trajectory_error: str | None = None

    @property
    def n(self) -> int:
        return int(self.env.num_envs)

    # ---------------------------------------------------------------------------------------- env calls

    def call(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            raise _EnvRaised(what, exc) from exc

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        what = f"reset(seed={seed})" if options is None else "reset(options={'reset_mask': ..., 'reset_indices': ...})"
        return self.call(what, self.env.reset, seed=seed, options=options)

    def reset_obs(self, seed: int | None = None, options: dict[str, Any] | None = None) -> Observation:
        """A reset's observation (a copy); a reset that does not return one makes the calling rule skip."""
        result = self.reset(seed, options)
        if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], Observation)):
            raise _Skip(f"reset() returned {checks.describe_value(result)}, not (Observation, info) (rule 3)")
        return _copy_obs(result[0])

    def step(self, actions: np.ndarray, what: str = "step(actions)") -> _StepValues:
        """A step's five values, loosely converted (copied observation, raw rewards, bool flags)."""
        return _parse_step(self.call(what, self.env.step, actions), self.n, what)

    def actions(self) -> np.ndarray:
        """A batch of sampled actions, shape ``(n, *single_action_space.shape)`` in the space's dtype: what the
        client hands the env. Samples come from a seeded copy of the space, so the env's own space is untouched."""
        if self.space is None:
            raise _Skip("the env has no usable single_action_space (rule 2)")
        if self._sampler is None:
            try:
                self._sampler = _seeded_copy(self.space, self.seed)
            except Exception:  # a space that cannot be copied: sample from it directly
                self._sampler = self.space
        return np.stack([np.asarray(_sample(self._sampler)) for _ in range(self.n)])

    # ---------------------------------------------------------------------------------------- shared run

    def trajectory(self) -> _Trajectory:
        """The shared run (collected once). If collecting it crashed, the first rule that asked fails with the
        exception and the later ones skip."""
        if self._trajectory is not None:
            return self._trajectory
        if self._trajectory_error is not None:
            raise _Skip(f"the checker's run of the env crashed ({self._trajectory_error})")
        try:
            self._trajectory = self._collect()
        except _EnvRaised as exc:
            self._trajectory_error = f"{exc.call} raised {type(exc.exc).__name__}"
            raise
        except _Skip as exc:
            self._trajectory_error = str(exc)
            raise
        return self._trajectory

    def _collect(self) -> _Trajectory:
        first = self.reset_obs(self.seed)
        traj = _Trajectory([(f"reset(seed={self.seed})", first)], [], [(0, np.arange(self.n), first)], True)
        current = first
        for number in range(1, self.steps + 1):
            actions = self.actions()
            with _watch_reset_calls(self.env) as calls:
                obs, rewards, terminated, truncated, info = self.step(actions, f"step() (step {number} of the run)")
            traj.watched = traj.watched and calls.watched
            record = _StepRecord(number, current, obs, rewards, terminated, truncated, info, calls.count)
            traj.steps.append(record)
            traj.observations.append((f"step {number}", obs))
            current = obs
            done = record.done
            if done.any():
                rows = np.flatnonzero(done)
                current = self.reset_obs(None, {"reset_mask": done.copy(), "reset_indices": rows})
                traj.observations.append((f"the reset after step {number}", current))
                traj.starts.append((number, rows, current))
        return traj


@dataclasses.dataclass
class _Rule:
    number: int
    title: str
    fn: Callable[[_Context], _Outcome]
    needs: tuple[int, ...] = ()
    """Rules that must not have failed (or been skipped) for this one to run."""


def _run_rules(ctx: _Context, subject: str) -> CheckReport:
    report = CheckReport(subject)
    ctx.observation_space_declared = _declares_observation_space(ctx.env)  # before any rule resets the env
    for rule in RULES:
        title = rule.title
        if rule.number == 1 and ctx.config is not None:
            title += " and from the given config"
        outcome = _run_one(ctx, rule)
        result = CheckResult(title, outcome.status, outcome.seen, outcome.fix, rule.number, outcome.details)
        ctx.results[rule.number] = result
        report.results.append(result)
    return report


def _run_one(ctx: _Context, rule: _Rule) -> _Outcome:
    if ctx.env is None and rule.number != 1:
        return _Outcome("skip", "there is no env to check: it could not be built (rule 1)")
    for needed in rule.needs:
        prior = ctx.results[needed]
        if prior.status in ("fail", "skip"):
            verb = "failed" if prior.status == "fail" else "was skipped"
            return _Outcome("skip", f"needs rule {needed}, which {verb}")
    try:
        return rule.fn(ctx)
    except _Skip as exc:
        return _Outcome("skip", str(exc))
    except _EnvRaised as exc:
        return _Outcome("fail", f"{exc.call} raised {type(exc.exc).__name__}: {exc.exc}{_where(exc.exc)}",
                        "fix the exception in the env (its traceback is in the report's details)",
                        "".join(traceback.format_exception(exc.exc)))
    except Exception as exc:  # the checker's own bug: report it on the rule rather than lose the report
        return _Outcome("fail", f"the checker itself raised {type(exc).__name__}: {exc} (a bug in "
                        "plugrl_env_client.check, not in the env)", "",
                        "".join(traceback.format_exception(exc)))


def _where(exc: BaseException) -> str:
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


# ================================================================================================ helpers


def _copy_obs(obs: Observation) -> Observation:
    """A deep copy: envs may return (and later overwrite) their own buffers."""
    out = Observation.__new__(Observation)
    out.images = {k: np.array(v, copy=True) for k, v in obs.images.items()}
    out.states = {k: np.array(v, copy=True) for k, v in obs.states.items()}
    out.text = np.array(obs.text, copy=True)
    return out


def _parse_step(result: Any, n: int, what: str) -> _StepValues:
    if not (isinstance(result, tuple) and len(result) == 5):
        raise _Skip(f"{what} returned {checks.describe_value(result)}, not five values (rule 5)")
    obs, rewards, terminated, truncated, info = result
    if not isinstance(obs, Observation) or obs.batch_size != n or not isinstance(info, dict):
        raise _Skip(f"{what} did not return an Observation of {n} envs and a dict info (rule 5)")
    flags = []
    for name, value in (("terminated", terminated), ("truncated", truncated)):
        arr = np.asarray(value)
        if arr.shape != (n,):
            raise _Skip(f"{what} returned {name} of shape {arr.shape}, not ({n},) (rule 5)")
        flags.append(arr.astype(bool))
    rewards = np.array(rewards, copy=True)
    if rewards.shape != (n,):
        raise _Skip(f"{what} returned rewards of shape {rewards.shape}, not ({n},) (rule 5)")
    return _copy_obs(obs), rewards, flags[0], flags[1], info


def _seeded_copy(space: gym.Space, seed: int) -> gym.Space:
    import copy

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


def _describe_space(space: gym.Space) -> str:
    """A space in one short line, cut at 100 characters (a Dict of many keys is long)."""
    text = describe_space(space)
    return text if len(text) <= 100 else text[:97] + "..."


def _arrays(obs: Observation) -> Iterator[tuple[str, np.ndarray]]:
    """Every array of an observation by display name, text included."""
    for k, v in obs.images.items():
        yield f"images[{k!r}]", v
    for k, v in obs.states.items():
        yield f"states[{k!r}]", v
    yield "text", obs.text


def _layout(obs: Observation) -> dict[str, tuple[tuple[int, ...], str]]:
    return {name: (arr.shape, arr.dtype.str) for name, arr in _arrays(obs) if name != "text"}


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    if a.shape != b.shape:
        return False
    return bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc" and b.dtype.kind in "fc"))


def _differences(a: Observation, b: Observation, rows: np.ndarray | None = None) -> list[str]:
    """Where ``a`` and ``b`` differ, restricted to ``rows``: ``states['pos'] in envs [0, 1]``-style phrases."""
    names_a, names_b = dict(_arrays(a)), dict(_arrays(b))
    out = []
    if names_a.keys() != names_b.keys():
        out.append(f"the keys differ ({sorted(names_a)} and {sorted(names_b)})")
    for name in names_a.keys() & names_b.keys():
        x, y = names_a[name], names_b[name]
        if x.shape != y.shape:
            out.append(f"{name} has shape {x.shape} and then {y.shape}")
            continue
        idx = np.arange(x.shape[0]) if rows is None else rows
        differ = [int(i) for i in idx if not _same(x[i], y[i])]
        if differ:
            out.append(f"{name} in envs {differ}")
    return sorted(out)


def _row_equal(a: Observation, i: int, b: Observation, j: int) -> bool:
    names_a, names_b = dict(_arrays(a)), dict(_arrays(b))
    if names_a.keys() != names_b.keys():
        return False
    return all(names_a[k].shape[1:] == names_b[k].shape[1:] and _same(names_a[k][i], names_b[k][j]) for k in names_a)


def _rows(rows: np.ndarray | list[int]) -> str:
    shown = [int(i) for i in list(rows)[:10]]
    return str(shown) if len(rows) <= 10 else f"{str(shown)[:-1]}, ... ({len(rows)} in all)]"


def _steps_text(numbers: list[int]) -> str:
    shown = ", ".join(str(s) for s in numbers[:5])
    return f"step {shown}" if len(numbers) == 1 else f"steps {shown}" + (", ..." if len(numbers) > 5 else "")


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


# ================================================================================================ the rules


def rule_constructs(ctx: _Context) -> _Outcome:
    """1. The env builds from its registered config's defaults (every ``--env.*`` flag has a working default),
    and from the config the caller gives; ``num_envs`` is what was asked for."""
    findings = list(ctx.construction or [])
    if ctx.construction is None:  # check_env: the caller built the env
        env = ctx.env
        if not isinstance(env, BaseEnv):
            findings.append(_Finding("fail", f"the env is a {type(env).__name__}, not a BaseEnv",
                                     "subclass plugrl_env_client.envs.base_env.BaseEnv[YourConfig]"))
        n = getattr(env, "num_envs", None)
        if not isinstance(n, int | np.integer) or int(n) < 1:
            ctx.env = None
            findings.append(_Finding("fail", f"env.num_envs is {n!r}",
                                     "call super().__init__(config, num_envs=num_envs) in the env's __init__"))
            return _judge(findings)
        if ctx.spec is None:
            return _judge(findings, "an env object was given, with no registered spec to build one from its default "
                          "config")
        try:
            make_env(ctx.spec.uid, num_envs=int(n)).close()
        except Exception as exc:
            findings.append(_construction_failure(ctx.spec, int(n), None, exc))
    return _judge(findings)


def _construct(ctx: _Context, num_envs: int) -> list[_Finding]:
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
            findings.append(_Finding(
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
        findings.append(_Finding("fail", f"built with num_envs={num_envs}, env.num_envs is {got!r}",
                                 "pass num_envs on: super().__init__(config, num_envs=num_envs, **kwargs)"))
        with contextlib.suppress(Exception):
            env.close()
        env = None
    ctx.env = env
    return findings


def _construction_failure(spec: EnvSpec, n: int, config: BaseEnvConfig | None, exc: Exception) -> _Finding:
    which = "its default config" if config is None else f"the given config {config!r}"
    fix = ("every field of the env's config needs a default the env can be built with (the CLI builds the config "
           "with no arguments and turns each field into an --env.* flag)" if config is None else
           "the env cannot be built with these --env.* values: change them, or make the env accept them")
    return _Finding("fail", f"make_env({spec.uid!r}, num_envs={n}) with {which} raised {type(exc).__name__}: {exc}"
                            f"{_where(exc)}", fix)


def rule_action_space(ctx: _Context) -> _Outcome:
    """2. ``single_action_space`` is a gymnasium Space the client can carry (one array per env), and a batch of
    actions sampled from it steps. The client builds every action batch in that shape and dtype."""
    space = getattr(ctx.env, "single_action_space", None)
    if space is None:
        return _Outcome("fail", "env.single_action_space is not set",
                        "set `self.single_action_space = gymnasium.spaces.Box(low, high, shape, np.float32)` (the "
                        "space of one env's action) in __init__")
    if not isinstance(space, gym.Space):
        return _Outcome("fail", f"single_action_space is {checks.describe_value(space)}, not a gymnasium Space",
                        "use a gymnasium.spaces Box, Discrete, MultiDiscrete, MultiBinary or Text")
    if isinstance(space, _COMPOSITE_SPACES):
        return _Outcome("fail", f"single_action_space is {_describe_space(space)}: the client sends one array per env",
                        "use a Box (flatten the parts into one vector), Discrete, MultiDiscrete, MultiBinary or Text")
    ctx.space = space
    actions = ctx.actions()
    try:
        ctx.reset(ctx.seed)
    except _EnvRaised as exc:
        raise _Skip(f"single_action_space is {_describe_space(space)}, but sampled actions could not be stepped: "
                    f"{exc.call} raised {type(exc.exc).__name__} (rule 3)") from None
    try:
        ctx.call("step(actions sampled from single_action_space)", ctx.env.step, actions)
    except _EnvRaised as exc:
        return _Outcome("fail", f"step() with actions of shape {actions.shape} and dtype {actions.dtype} sampled from "
                        f"{_describe_space(space)} raised {type(exc.exc).__name__}: {exc.exc}{_where(exc.exc)}",
                        "make single_action_space describe what step() accepts (shape, dtype, bounds); step() gets "
                        "an array (num_envs, *single_action_space.shape)", "".join(traceback.format_exception(exc.exc)))
    return _passed(_describe_space(space))


def rule_reset_returns(ctx: _Context) -> _Outcome:
    """3. ``reset(seed=...)`` returns ``(Observation, dict)`` with one row per env."""
    result = ctx.reset(ctx.seed)
    if not (isinstance(result, tuple) and len(result) == 2):
        return _Outcome("fail", f"reset(seed={ctx.seed}) returned {checks.describe_value(result)}",
                        "return `observation, info` (info may be {})")
    obs, info = result
    findings = []
    if not isinstance(obs, Observation):
        findings.append(_Finding("fail", f"its first value is {checks.describe_value(obs)}, not an Observation",
                                 "wrap the arrays: Observation(images=..., states=..., text=...)"))
    elif obs.batch_size != ctx.n:
        findings.append(_Finding("fail", f"the Observation holds {obs.batch_size} envs, the env has num_envs={ctx.n}",
                                 "return every env's row, with the batch as the leading axis of every array"))
    if not isinstance(info, dict):
        findings.append(_Finding("fail", f"info is {checks.describe_value(info)}, not a dict",
                                 "return a dict as info ({} when there is nothing to report)"))
    return _judge(findings, "" if ctx.observation_space_declared else UNDECLARED_OBSERVATION_SPACE)


UNDECLARED_OBSERVATION_SPACE = (
    "single_observation_space is not declared in __init__ (the first reset derives it): a Gymnasium wrapper that "
    "reads it when it is made, like NormalizeObservation, fails on an env not reset yet; declare it in __init__, "
    "self.single_observation_space = observation_space(images={...}, states={...})")
"""Rule 3's note for an env that leaves its observation space to the first reset (the client copes)."""


def _declares_observation_space(env: Any) -> bool:
    """Whether ``env`` (a BaseEnv, possibly inside Gymnasium wrappers) has its observation space before any reset;
    other envs are taken to have one."""
    base = getattr(env, "unwrapped", env)
    return not isinstance(base, BaseEnv) or "_single_observation_space" in vars(base)


def rule_seeding(ctx: _Context) -> _Outcome:
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
    diff = _differences(first, again)
    if diff:
        return _Outcome("fail", f"two reset(seed={ctx.seed}) calls returned different observations: {'; '.join(diff)}",
                        "call self.seed_rngs(seed) first in reset() and draw every random start from self.np_random; "
                        "reset all the state reset() reads")
    others = [ctx.seed + k for k in (1, 2, 3)]
    if all(not _differences(first, ctx.reset_obs(s)) for s in others):
        if fixed_start:
            return _passed("the start does not depend on the seed: reset() draws nothing from self.np_random "
                           "(a fixed start state)")
        if seeded:
            return _passed("the first observation does not depend on the seed, but reset() seeds self.np_random "
                           "with it and draws from it (a start state the observation does not show)")
        return _Outcome("warn", f"reset(seed={ctx.seed}) and reset(seed={others}) returned identical observations",
                        "fine if the env has no randomness at reset; otherwise it ignores the seed: call "
                        "self.seed_rngs(seed) and draw the start from self.np_random")
    if ctx.n > 1 and all(_row_equal(first, 0, first, i) for i in range(1, ctx.n)):
        return _Outcome("warn", f"the seed changes the start, but all {ctx.n} envs of the batch start from the same "
                        "observation", "draw each env's start separately (e.g. all rows from self.np_random)")
    return _passed()


def _is_generator(env: Any) -> bool:
    return isinstance(getattr(env, "_np_random", None), np.random.Generator)


def _rng_untouched_after_seeding(env: Any, seed: int) -> bool:
    """``env.np_random`` is in the state seeding it with ``seed`` leaves it in: nothing was drawn since."""
    fresh, _ = gym.utils.seeding.np_random(seed)
    return bool(env._np_random.bit_generator.state == fresh.bit_generator.state)


def rule_step_returns(ctx: _Context) -> _Outcome:
    """5. ``step`` returns exactly ``(obs, rewards float32 (n,), terminated bool (n,), truncated bool (n,), info
    dict)``. Other float reward dtypes are a warning: the client casts them."""
    ctx.reset(ctx.seed)
    result = ctx.call("step(actions)", ctx.env.step, ctx.actions())
    n = ctx.n
    if not (isinstance(result, tuple) and len(result) == 5):
        got = len(result) if isinstance(result, tuple) else checks.describe_value(result)
        fix = "return (obs, reward, terminated, truncated, info)"
        if isinstance(result, tuple) and len(result) == 4:
            fix += ": that is the old gym API: split done into terminated and truncated"
        return _Outcome("fail", f"step() returned {got} values" if isinstance(got, int) else f"step() returned {got}",
                        fix)
    obs, rewards, terminated, truncated, info = result
    findings = []
    if not isinstance(obs, Observation):
        findings.append(_Finding("fail", f"the observation is {checks.describe_value(obs)}, not an Observation",
                                 "wrap the arrays: Observation(images=..., states=..., text=...)"))
    elif obs.batch_size != n:
        findings.append(_Finding("fail", f"the Observation holds {obs.batch_size} envs, the env has num_envs={n}",
                                 "return every env's row, with the batch as the leading axis"))
    r = np.asarray(rewards)
    if r.shape != (n,):
        findings.append(_Finding("fail", f"rewards have shape {r.shape}", f"return one reward per env: shape ({n},)"))
    if r.dtype != np.float32:
        level: Literal["warn", "fail"] = "warn" if r.dtype.kind == "f" else "fail"
        casts = " (the client casts them to float32)" if level == "warn" else ""
        findings.append(_Finding(level, f"rewards have dtype {r.dtype}{casts}", "return `reward.astype(np.float32)`"))
    for name, value in (("terminated", terminated), ("truncated", truncated)):
        arr = np.asarray(value)
        if arr.shape != (n,):
            findings.append(_Finding("fail", f"{name} has shape {arr.shape}", f"return one flag per env: shape ({n},)"))
        if arr.dtype != np.bool_:
            findings.append(_Finding("fail", f"{name} has dtype {arr.dtype}",
                                     f"return a bool array: `np.asarray({name}, dtype=bool)`"))
    if not isinstance(info, dict):
        findings.append(_Finding("fail", f"info is {checks.describe_value(info)}, not a dict",
                                 "return a dict as info ({} when there is nothing to report)"))
    return _judge(findings)


def rule_finite(ctx: _Context) -> _Outcome:
    """6. No NaN or inf in rewards (after the client's cast to float32) or in float state arrays, over the run.
    Images are uint8 and cannot hold either."""
    traj = ctx.trajectory()
    bad_rewards: dict[int, list[int]] = {}
    for rec in traj.steps:
        r = rec.rewards
        if r.dtype.kind in "fiu":
            with np.errstate(over="ignore"):
                rows = checks.non_finite_rows(r.astype(np.float32))
            if rows is not None:
                bad_rewards[rec.number] = rows.tolist()
    bad_states: dict[str, list[str]] = {}
    for where, obs in traj.observations:
        for key, arr in obs.states.items():
            rows = checks.non_finite_rows(arr)
            if rows is not None:
                bad_states.setdefault(key, []).append(f"{where} (envs {_rows(rows)})")
    findings = []
    if bad_rewards:
        first = next(iter(bad_rewards))
        findings.append(_Finding("fail", f"rewards were NaN or inf at {_steps_text(list(bad_rewards))} (envs "
                                 f"{_rows(bad_rewards[first])} at step {first})",
                                 "find where the env produces them (a division by zero, a diverging simulation) and "
                                 f"return finite values; to run anyway: {checks.REWARDS_FLAG}"))
    for key, places in bad_states.items():
        findings.append(_Finding("fail", f"states[{key!r}] held NaN or inf at {', '.join(places[:3])}"
                                 + (", ..." if len(places) > 3 else ""),
                                 f"return finite observations; to send them anyway: {checks.OBSERVATIONS_FLAG}"))
    return _judge(findings, f"checked over {len(traj.steps)} steps")


def rule_layout(ctx: _Context) -> _Outcome:
    """7. Images are uint8 ``(n, h, w, c)`` (channels last); states are numeric with the batch leading; each key
    keeps its shape and dtype over the run (servers size their inputs from the first observation)."""
    traj = ctx.trajectory()
    findings: dict[str, _Finding] = {}
    first_where, first_obs = traj.observations[0]
    first = _layout(first_obs)
    for where, obs in traj.observations:
        for key, img in obs.images.items():
            name = f"images[{key!r}]"
            if img.dtype != np.uint8:
                findings.setdefault(name + "dtype", _Finding(
                    "fail", f"{name} has dtype {img.dtype} (at {where})",
                    "images must be uint8: `(img * 255).clip(0, 255).astype(np.uint8)` for values in [0, 1]; put "
                    "other arrays (depth, features) in states"))
            if img.ndim != 4:
                findings.setdefault(name + "ndim", _Finding(
                    "fail", f"{name} has shape {img.shape} (at {where})",
                    "images are (n, height, width, channels): add a channel axis with `img[..., None]`"))
            elif img.shape[1] in (1, 3, 4) and img.shape[3] not in (1, 3, 4):
                findings.setdefault(name + "chw", _Finding(
                    "fail", f"{name} has shape {img.shape}, which looks channels-first (n, c, h, w) (at {where})",
                    "images are channels last: `np.moveaxis(img, 1, -1)`"))
        for key, arr in obs.states.items():
            name = f"states[{key!r}]"
            if arr.dtype.kind not in "biuf":
                findings.setdefault(name + "dtype", _Finding(
                    "fail", f"{name} has dtype {arr.dtype} (at {where})",
                    "states are numeric arrays (put strings in text, other values in info)"))
            if arr.ndim == 0 or arr.shape[0] != ctx.n:
                findings.setdefault(name + "batch", _Finding(
                    "fail", f"{name} has shape {arr.shape} (at {where})", f"put the batch first: ({ctx.n}, ...)"))
        layout = _layout(obs)
        if layout != first:
            changed = sorted(k for k in layout.keys() | first.keys() if layout.get(k) != first.get(k))
            findings.setdefault("layout", _Finding(
                "warn", f"{', '.join(changed)} changed shape, dtype or presence between {first_where} and {where}",
                "return the same keys with the same shapes and dtypes on every reset and step"))
    return _judge(list(findings.values()))


def rule_partial_reset(ctx: _Context) -> _Outcome:
    """8. ``reset(options={"reset_mask": m, "reset_indices": idx})`` resets only the listed rows and returns the
    whole batch, the other rows exactly as the last step left them (the client keeps using them).

    The odd rows are reset after one step from ``reset(seed)``, so that an env resetting the first k rows instead of
    the listed ones is caught as well as one ignoring the mask.
    """
    n = ctx.n
    if n < 2:
        raise _Skip("num_envs=1: a partial reset of the only env is a full one; check with num_envs >= 2")
    start = ctx.reset_obs(ctx.seed)
    before, *_ = ctx.step(ctx.actions())
    rows = np.arange(1, n, 2)
    mask = np.zeros(n, bool)
    mask[rows] = True
    result = ctx.reset(None, {"reset_mask": mask, "reset_indices": rows})
    if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], Observation)):
        return _Outcome("fail", f"the partial reset returned {checks.describe_value(result)}",
                        "return (Observation, info) for the whole batch")
    after = _copy_obs(result[0])
    if after.batch_size != n:
        return _Outcome("fail", f"resetting envs {_rows(rows)} returned an Observation of {after.batch_size} envs",
                        "return the whole batch: rows that were not reset keep their last observation")
    kept = np.setdiff1d(np.arange(n), rows)
    changed = _differences(before, after, kept)
    if changed:
        return _Outcome("fail", f"resetting envs {_rows(rows)} changed rows it was not asked to reset: "
                        f"{'; '.join(changed)}",
                        "reset only the rows of `mask = self.reset_mask(options)` (options['reset_mask'] or "
                        "options['reset_indices']) and leave the others as they are")
    moved = [int(i) for i in rows if not _row_equal(start, int(i), before, int(i))]
    stuck = [i for i in moved if _row_equal(before, i, after, i)]
    if stuck:
        return _Outcome("fail", f"envs {stuck} were listed for reset but came back exactly as the step left them",
                        "reset the rows of `self.reset_mask(options)`: the client passes options['reset_mask'] "
                        "(bool, n) and options['reset_indices'] (env indices)")
    return _passed(f"reset envs {_rows(rows)} of {n}")


def rule_no_reset_in_step(ctx: _Context) -> _Outcome:
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
        findings.append(_Finding("fail", f"metadata declares autoreset_mode={mode}",
                                 "keep BaseEnv's AutoresetMode.DISABLED and reset only in reset()"))
    calls = [rec.number for rec in traj.steps if rec.reset_calls]
    if calls:
        findings.append(_Finding("fail", f"step() called the env's reset() (at {_steps_text(calls)} of the run)",
                                 "do not reset inside step(): return the terminal observation with terminated or "
                                 "truncated set; the client calls reset(options={'reset_mask': ...}) for finished "
                                 "envs"))
    keys = sorted({k for rec in traj.steps for k in rec.info if k in _AUTORESET_INFO_KEYS})
    if keys:
        findings.append(_Finding("fail", f"info carries {keys}, keys of an env that resets in step",
                                 "return the terminal observation itself and let the client reset (disable the "
                                 "inner env's autoreset)"))
    ends = sum(int(rec.done.sum()) for rec in traj.steps)
    findings += _jumps_to_start(traj) + _counter_jumps(traj, ctx.n)
    if findings:
        return _judge(findings)
    watched = "" if traj.watched else " (reset() calls could not be watched: another profiler is active)"
    if ends == 0:
        return _passed(f"no env finished an episode in {len(traj.steps)} steps, so only reset() calls were "
                       f"watched{watched}")
    return _passed(f"{ends} episode ends in {len(traj.steps)} steps{watched}")


def _jumps_to_start(traj: _Trajectory) -> list[_Finding]:
    seen: list[str] = []
    for rec in traj.steps:
        for i in np.flatnonzero(rec.done).tolist():
            if _row_equal(rec.before, i, rec.obs, i):
                continue  # the step changed nothing: a start that is also terminal proves nothing
            starts = [obs for after, rows, obs in traj.starts if after < rec.number and i in rows]
            if any(_row_equal(rec.obs, i, start, i) for start in starts):
                seen.append(f"env {i} at step {rec.number}")
    if not seen:
        return []
    return [_Finding("fail", f"the observation of a finished env equals its observation right after a reset "
                     f"({', '.join(seen[:3])}): the row came back reset instead of terminal",
                     "return the terminal observation of a finished env; the client resets it after sending it")]


def _counter_jumps(traj: _Trajectory, n: int) -> list[_Finding]:
    for key in traj.steps[0].obs.states if traj.steps else ():
        found = _counter_jump(traj, key, n)
        if found is not None:
            return [found]
    return []


def _counter_jump(traj: _Trajectory, key: str, n: int) -> _Finding | None:
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
            return _Finding("fail", f"states[{key!r}] column {col} changes by {changes[0, col]:+g} every step but went "
                            f"back on the step that ended env {i}'s episode (step {number}): the env reset the row "
                            "inside step", "return the terminal observation of a finished env; the client resets it")
    return None


def rule_time_limit(ctx: _Context) -> _Outcome:
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
        _, _, terminated, truncated, _ = ctx.step(ctx.actions(), f"step() (step {taken} of the time-limit run)")
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
            return _Outcome("warn", f"no episode ended within {taken} steps and the env has no registered "
                            "max_episode_steps: a run with --num-episodes would never finish",
                            f"end episodes in the env (terminated/truncated), or give a time limit: {where}, or run "
                            f"with {flag}")
        return _passed(f"{len(ends)} episode ends within {taken} steps, no registered time limit")
    findings = []
    longer = [ln for ln in truncations if ln > limit]
    shorter = [ln for ln in truncations if ln < limit]
    if longer:
        findings.append(_Finding("warn", f"the env truncates episodes itself after {longer} steps, beyond the "
                                 f"registered max_episode_steps={limit}: the client truncates at {limit} first, so "
                                 "the env's own limit never applies",
                                 f"make them agree: register max_episode_steps={longer[0]} or change the env's "
                                 "limit"))
    if shorter:
        findings.append(_Finding("warn", f"the env truncates episodes itself after {shorter} steps, before the "
                                 f"registered max_episode_steps={limit}: the registered limit never applies (nor "
                                 f"{flag} above {max(shorter)})",
                                 f"make them agree: register max_episode_steps={max(shorter)} or change the env's "
                                 "limit"))
    if len(terminations) >= 2 and set(terminations) == {limit} and not truncations:
        findings.append(_Finding("warn", f"every episode ended terminated at exactly max_episode_steps={limit}",
                                 "a time limit is a truncation: return truncated=True (terminated=False) when time "
                                 "runs out"))
    if truncations == [limit]:
        note = f"the env truncates at its registered limit of {limit} steps itself"
    else:
        note = f"the env does not truncate by itself within {taken} steps; the client truncates at {limit}"
    return _judge(findings, note)


def rule_info(ctx: _Context) -> _Outcome:
    """11. Info values are per-env arrays (leading dim n, a dtype the wire carries), possibly in nested dicts, or
    one of the documented keys (:data:`DOCUMENTED_INFO_KEYS`). Anything else is a warning: the client leaves it out
    of the feedback it sends. ``info["episode"]`` is the client's own key."""
    traj = ctx.trajectory()
    notes: dict[str, str] = {}
    for rec in traj.steps:
        for key, value in rec.info.items():
            if key == "episode":
                notes.setdefault("'episode'", "info['episode'] is written by the client (episode statistics) and "
                                 "would replace the env's")
            elif key in DOCUMENTED_INFO_KEYS:
                _documented(key, value, ctx.n, notes)
            else:
                _per_env(f"info[{key!r}]", value, ctx.n, notes)
    if not notes:
        return _passed()
    return _Outcome("warn", "; ".join(list(notes.values())[:6]) + ("; ..." if len(notes) > 6 else ""),
                    f"return per-env arrays (leading dim {ctx.n}) or leave the value out; documented keys: "
                    f"{', '.join(DOCUMENTED_INFO_KEYS)}")


def _per_env(path: str, value: Any, n: int, notes: dict[str, str]) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _per_env(f"{path}[{k!r}]", v, n, notes)
        return
    if isinstance(value, np.ndarray) and value.ndim >= 1 and value.shape[0] == n:
        if value.dtype.kind in "OVc":
            notes.setdefault(path, f"{path} has dtype {value.dtype}, which cannot be sent")
        return
    what = f"an array of shape {value.shape}" if isinstance(value, np.ndarray) else checks.describe_value(value)
    hint = " (return np.asarray(...))" if isinstance(value, list | tuple) and len(value) == n else ""
    notes.setdefault(path, f"{path} is {what}{hint}: dropped from feedback")


def _documented(key: str, value: Any, n: int, notes: dict[str, str]) -> None:
    path = f"info[{key!r}]"
    if key == "success":
        arr = np.asarray(value) if isinstance(value, np.ndarray) else None
        if arr is None or arr.shape != (n,) or arr.dtype.kind not in "biu":
            notes.setdefault(path, f"{path} is {checks.describe_value(value)}: the client counts success only from "
                             f"a bool array of shape ({n},)")
    elif key in ("metrics", "metrics_agg_mode") and not isinstance(value, dict):
        notes.setdefault(path, f"{path} is {checks.describe_value(value)}, not a dict of metric name -> value")
    elif key == "metrics":
        for name, v in value.items():
            if not (isinstance(v, np.ndarray | np.generic | int | float | bool)):
                notes.setdefault(f"{path}[{name!r}]", f"{path}[{name!r}] is {checks.describe_value(v)}, not a number "
                                 "or a per-env array")


def rule_metric_keys(ctx: _Context) -> _Outcome:
    """12. When the env reports ``info["metrics"]``, it reports the same metric names on every step (trainers
    aggregate metrics by name over an episode; a name that comes and goes breaks the aggregate)."""
    traj = ctx.trajectory()
    seen = [(rec.number, _metric_names(rec.info)) for rec in traj.steps]
    reported = [(number, names) for number, names in seen if names is not None]
    if not reported:
        return _passed("the env reports no info['metrics']")
    first_step, first = seen[0]
    for number, names in seen[1:]:
        if names != first:
            def show(x: frozenset[str] | None) -> str:
                return "no info['metrics']" if x is None else str(sorted(x))
            return _Outcome("fail", f"info['metrics'] had {show(first)} at step {first_step} and {show(names)} at "
                            f"step {number}", "report every metric name on every step (a neutral value when it "
                            "does not apply)")
    modes = [rec.info.get("metrics_agg_mode") for rec in traj.steps]
    if any(isinstance(m, dict) for m in modes):
        missing = sorted(first - set().union(*(set(m) for m in modes if isinstance(m, dict)))) if first else []
        if missing:
            return _Outcome("warn", f"metrics {missing} have no entry in info['metrics_agg_mode']",
                            "give every metric an aggregation mode ('mean', 'sum', 'last', ...)")
    return _passed(f"{len(first or ())} metrics on every step")


def _metric_names(info: dict[str, Any]) -> frozenset[str] | None:
    metrics = info.get("metrics")
    if not isinstance(metrics, dict):
        return None
    return frozenset(str(k) for k in metrics)


def rule_close(ctx: _Context) -> _Outcome:
    """13. ``close()`` releases the env and a second ``close()`` is harmless (the client may close twice on error
    paths). After this rule the env is closed."""
    ctx.closed = True
    ctx.call("close() (the first)", ctx.env.close)
    ctx.call("close() (the second)", ctx.env.close)
    return _passed()


def rule_rollout(ctx: _Context) -> _Outcome:
    """14. A short rollout with the real client and the embedded random policy (the text policy for a Text action
    space) completes: 2 episodes of at most ``ROLLOUT_STEP_CAP`` steps. It runs only for a registered env, and only
    when no earlier rule failed (the rollout would stop at the first of them)."""
    if ctx.env_id is None or ctx.spec is None:
        raise _Skip("check_env() was given an env object; check_registered_env(env_id) runs the rollout")
    if not ctx.rollout:
        raise _Skip("rollout=False")
    failed = [r.number for r in ctx.results.values() if r.status == "fail"]
    if failed:
        raise _Skip(f"rules {failed} failed; the rollout would stop at the first of them")
    from plugrl_env_client.app import run_client
    from plugrl_env_client.config import ClientConfig, RunnerConfig

    cap = min(ctx.spec.max_episode_steps or ROLLOUT_STEP_CAP, ROLLOUT_STEP_CAP)
    policy: Any = "text" if isinstance(ctx.space, gym.spaces.Text) else "random"
    env_config = ctx.config if ctx.config is not None else ctx.spec.config_cls()
    with tempfile.TemporaryDirectory(prefix="plugrl-check-") as tmp, _captured_run() as (out, err):
        config = ClientConfig(num_envs=ctx.n, num_episodes=2, local_policy=policy, output_dir=Path(tmp),
                              exp_name="check", progress=False, env=env_config,
                              runner=RunnerConfig(seed=ctx.seed, max_episode_steps=cap))
        try:
            code = run_client(config, ctx.env_id)
        except Exception as exc:
            return _Outcome("fail", f"the client raised {type(exc).__name__}: {exc}", "see the message",
                            "".join(traceback.format_exception(exc)))
    if code in (130, 143):
        raise KeyboardInterrupt
    if code != 0:
        errors = [line.removeprefix("error: ") for line in err.getvalue().splitlines() if line.startswith("error:")]
        message = "; ".join(errors) or err.getvalue().strip()[-500:] or f"exit code {code}"
        return _Outcome("fail", f"the rollout stopped: {message}",
                        f"fix what the message says (rerun with: plugrl-run-env-client {ctx.env_id} --num-envs {ctx.n} "
                        f"--num-episodes 2 --local-policy {policy})")
    return _passed(f"2 episodes against the embedded {policy} policy (at most {cap} steps each)")


@contextlib.contextmanager
def _captured_run() -> Iterator[tuple[io.StringIO, io.StringIO]]:
    """Capture what a client run prints, and undo the logging setup it makes for its own run folder."""
    out, err = io.StringIO(), io.StringIO()
    with logging_restored(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        yield out, err


RULES: tuple[_Rule, ...] = (
    _Rule(1, "constructs from its default config", rule_constructs),
    _Rule(2, "single_action_space is a gymnasium Space, and sampled actions step", rule_action_space),
    _Rule(3, "reset(seed=...) returns (Observation, dict) with one row per env", rule_reset_returns),
    _Rule(4, "same seed, same first observation; different seeds, different ones", rule_seeding, (3,)),
    _Rule(5, "step returns (obs, rewards float32 (n,), terminated bool (n,), truncated bool (n,), info dict)",
          rule_step_returns, (2, 3)),
    _Rule(6, "no NaN or inf in rewards or observations", rule_finite, (2, 3, 5)),
    _Rule(7, "images uint8 (n, h, w, c); states numeric with the batch leading", rule_layout, (2, 3, 5)),
    _Rule(8, "a partial reset changes only the listed rows and returns the whole batch", rule_partial_reset,
          (2, 3, 5)),
    _Rule(9, "step never resets an env itself", rule_no_reset_in_step, (2, 3, 5)),
    _Rule(10, "episodes end, consistently with the registered time limit", rule_time_limit, (2, 3, 5)),
    _Rule(11, "info values are per-env arrays (leading dim n) or documented keys", rule_info, (2, 3, 5)),
    _Rule(12, "info['metrics'] has the same keys on every step", rule_metric_keys, (2, 3, 5)),
    _Rule(13, "close() twice is harmless", rule_close),
    _Rule(14, "a short rollout against the embedded random (or text) policy completes", rule_rollout),
)
"""The checklist, in order."""
