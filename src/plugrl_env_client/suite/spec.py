"""A suite file: what tasks a suite runs, read from TOML (``tomllib`` on Python 3.11+, ``tomli`` on 3.10).

The format (docs/evaluation.md has it with examples)::

    name = "demo"                      # the suite's name (default: the file's stem)
    episodes = 8                       # episodes per task (a task may override it)
    seeds = [0, 1, 2, 3, 4, 5, 6, 7]   # optional: episode k of every task starts from seeds[k]; episodes = len(seeds)

    [[task]]
    env = "point-v1"                   # an env id, in any case
    name = "point"                     # default: <env id>-<position, from 0>
    env_config = { step_size = 0.2 }   # fields of the env's config, as --env.* would set them
    episodes = 4                       # overrides the suite's (not with seeds)
    local_policy = "text"              # with --local-policy: this task's embedded policy (any registered one)
    local_policy_choices = ["<answer>3</answer>"]
    server_url = "ws://host:8000"      # this task's policy server (instead of the command line's), or a list of them

Every mistake is a :class:`~plugrl_env_client.errors.ConfigError` that reads ``<suite file>: task <name>: <what>
(<fix>)``, found before anything runs: an env id is looked up in the env registry and a ``local_policy`` in the
policy registry (so the env files of ``--env-path`` must be imported first), and a name must make a folder on any
file system, whatever suffix the runner adds to it.
"""

from __future__ import annotations

import collections
import dataclasses
import re
import sys
from pathlib import Path
from typing import Any

from plugrl_env_client.envs.discovery import unknown_id_help
from plugrl_env_client.envs.registry import UnknownEnvError
from plugrl_env_client.envs.registry import get_spec as env_spec
from plugrl_env_client.errors import ConfigError
from plugrl_env_client.server.registry import registered_names as registered_policies
from plugrl_env_client.server.registry import unknown_policy

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

SUITE_KEYS = {"name", "episodes", "seeds", "task"}
TASK_KEYS = {"name", "env", "env_config", "episodes", "local_policy", "local_policy_choices", "server_url"}
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_RETRY = re.compile(r".*-retry-[0-9]+")

NAME_MAX = 255
"""The longest name of a file or folder (in bytes) that file systems take."""
RETRY_RESERVE = len("-retry-999999")
"""What the runner may append to a task's name for its run folder (``<task>-retry-<n>``)."""
STAMP_RESERVE = len("-YYYYmmdd-HHMMSS-0123abcd")
"""What the runner appends to a suite's name for its default folder (``<name>-<YYYYmmdd-HHMMSS>-<8 hex>``)."""
RESERVED = ("suite.toml", "suite.json", "suite.csv", "report.html", "report")
"""The files of a suite's folder beside its tasks' run folders (plugrl-report writes the last two)."""


@dataclasses.dataclass(frozen=True)
class Task:
    """One task of a suite: an env, its config fields, and how many episodes it runs."""

    name: str
    env: str
    env_config: dict[str, Any]
    episodes: int
    local_policy: str | None = None
    local_policy_choices: tuple[str, ...] | None = None
    server_url: tuple[str, ...] = ()
    """This task's policy servers (empty: the command line's)."""
    file: Path | None = dataclasses.field(default=None, compare=False, repr=False)
    """The suite file the task is read from (named in errors)."""

    @property
    def where(self) -> str:
        """How an error names the task: ``suite file <file>: task '<name>'``."""
        return f"suite file {self.file}: task {self.name!r}" if self.file is not None else f"task {self.name!r}"


@dataclasses.dataclass(frozen=True)
class Suite:
    name: str
    tasks: tuple[Task, ...]
    seeds: tuple[int, ...] = ()
    """Start seed of episode k of every task (empty: the run's derived seeds)."""


def load_suite(path: Path) -> Suite:
    """The suite of the TOML file ``path``."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"suite file {path}: cannot read it ({exc.strerror or exc}) (give the path of a suite "
                          "file, e.g. suites/demo.toml)") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"suite file {path}: not valid TOML: {exc} (fix the file there)") from None
    return parse_suite(data, path)


def problem(where: str, what: str, fix: str) -> ConfigError:
    """The error of a suite: ``<where>: <what> (<fix>)``."""
    return ConfigError(f"{where}: {what} ({fix})")


def parse_suite(data: dict[str, Any], path: Path) -> Suite:
    """The suite a parsed TOML document describes; ``path`` names it in errors."""
    where = f"suite file {path}"
    _no_unknown_keys(data, SUITE_KEYS, where)
    name = data.get("name", path.stem)
    _check_name(name, where, "name", NAME_MAX - STAMP_RESERVE,
                "the suite's folder is <name>-<YYYYmmdd-HHMMSS>-<8 hex> unless --exp-name names it")
    seeds = data.get("seeds", [])
    if not isinstance(seeds, list) or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0
                                              for s in seeds):
        raise problem(where, f"seeds must be a list of integers >= 0, got {seeds!r}", "e.g. seeds = [0, 1, 2, 3]")
    episodes = data.get("episodes", len(seeds) if seeds else None)
    if seeds and episodes != len(seeds):
        raise problem(where, f"episodes = {episodes} but seeds has {len(seeds)}: with seeds every task runs one "
                      "episode per seed", "leave episodes out or make them agree")
    tables = data.get("task")
    if not isinstance(tables, list) or not tables:
        raise problem(where, "no [[task]] table", "add at least one, e.g.\n[[task]]\nenv = \"point-v1\"")
    tasks = [_task(t, i, episodes, bool(seeds), path) for i, t in enumerate(tables)]
    _names_differ(tasks, where)
    return Suite(name, tuple(tasks), tuple(seeds))


def _check_name(name: Any, where: str, what: str, longest: int, why: str) -> None:
    """``name`` makes a folder on any file system: letters, digits, '.', '_', '-', a letter or digit first, at
    most ``longest`` bytes (``why``: what is appended to it)."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise problem(where, f"{what} must be a folder name, got {name!r}",
                      "letters, digits, '.', '_' and '-', starting with a letter or digit")
    if len(name.encode()) > longest:
        raise problem(where, f"{what} is {len(name.encode())} bytes long, more than a folder name can hold ({why}; "
                      f"a name is at most {NAME_MAX} bytes)", f"shorten it to {longest} bytes or fewer")


def _names_differ(tasks: list[Task], where: str) -> None:
    """Every task's run folder is its own, on case-insensitive file systems too."""
    names = collections.Counter(t.name for t in tasks)
    twice = sorted(n for n, count in names.items() if count > 1)
    if twice:
        raise problem(where, f"task names must differ (each is a run folder); {', '.join(twice)} appear(s) more "
                      "than once", "give those tasks a name")
    by_case = collections.defaultdict(list)
    for name in names:
        by_case[name.lower()].append(name)
    same = [" and ".join(repr(n) for n in group) for group in by_case.values() if len(group) > 1]
    if same:
        raise problem(where, f"task names {same[0]} differ only in case, and would share a run folder on a file "
                      "system that ignores case (macOS, Windows)", "rename one of them")


def _task(table: Any, index: int, episodes: Any, seeded: bool, path: Path) -> Task:
    where = f"suite file {path}: task {index}"
    if not isinstance(table, dict):
        raise problem(where, "must be a [[task]] table", "write it as [[task]] followed by its keys")
    env = table.get("env")
    if not isinstance(env, str) or not env:
        raise problem(where, "has no env", "add env = \"<env id>\"; plugrl-run-env-client --help lists them")
    name = table.get("name", f"{env.lower()}-{index}")
    where = f"suite file {path}: task {name!r}"
    _check_name(name, where, "name", NAME_MAX - RETRY_RESERVE,
                "a task run again goes to <name>-retry-<n>")
    if _RETRY.fullmatch(name):
        raise problem(where, f"name must not end in -retry-<n>, got {name!r}",
                      "that ending names the run folders of a task run again; rename it")
    if name.lower() in RESERVED:
        raise problem(where, f"name {name!r} is a file of the suite's folder ({', '.join(RESERVED)})",
                      "rename the task")
    _no_unknown_keys(table, TASK_KEYS, where)
    if "episodes" in table and seeded:
        raise problem(where, "episodes cannot be set per task when the suite has seeds (every task runs one episode "
                      "per seed)", "remove it")
    count = table.get("episodes", episodes)
    if count is None:
        raise problem(where, "how many episodes?", "set episodes = N at the top of the file, or in the task")
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise problem(where, f"episodes must be an integer >= 1, got {count!r}", "e.g. episodes = 8")
    try:
        env_spec(env)
    except UnknownEnvError as exc:
        raise problem(where, str(exc).rstrip("."), "name a registered env."
                      + unknown_id_help(exc.uid, one_off=False).rstrip(".")) from None
    env_config = table.get("env_config", {})
    if not isinstance(env_config, dict):
        raise problem(where, f"env_config must be a table, got {env_config!r}", "e.g. env_config = { step_size = 0.2 }")
    policy = table.get("local_policy")
    if policy is not None and (not isinstance(policy, str) or policy not in registered_policies()):
        what = unknown_policy(policy) if isinstance(policy, str) else f"must be a policy's name, got {policy!r}"
        raise problem(where, f"local_policy: {what.rstrip('.')}", "name a registered policy; a policy of your own "
                      "is registered with @register_policy in a file given as --env-path")
    choices = table.get("local_policy_choices")
    if choices is not None and (not isinstance(choices, list) or not all(isinstance(c, str) for c in choices)):
        raise problem(where, f"local_policy_choices must be a list of strings, got {choices!r}",
                      "e.g. local_policy_choices = [\"<answer>3</answer>\"]")
    url = table.get("server_url")
    urls = tuple(url) if isinstance(url, list) else (url,) if url is not None else ()
    if (url is not None and not urls) or not all(isinstance(u, str) and u.startswith(("ws://", "wss://")) for u in urls):
        raise problem(where, f"server_url must be ws://host:port or wss://host:port (or a list of them), got {url!r}",
                      "e.g. server_url = \"ws://gpu-box:8000\"")
    return Task(name, env, dict(env_config), count, policy, tuple(choices) if choices is not None else None, urls,
                path)


def _no_unknown_keys(table: dict[str, Any], known: set[str], where: str) -> None:
    unknown = sorted(set(table) - known)
    if unknown:
        raise problem(where, f"unknown key(s) {', '.join(unknown)}", f"the keys are {', '.join(sorted(known))}")


__all__ = ["Suite", "Task", "load_suite", "parse_suite", "problem"]
