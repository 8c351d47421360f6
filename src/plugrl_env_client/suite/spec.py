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
    local_policy = "text"              # with --local-policy: this task's embedded policy
    local_policy_choices = ["<answer>3</answer>"]
    server_url = "ws://host:8000"      # this task's policy server (instead of the command line's), or a list of them

Every mistake is a :class:`~plugrl_env_client.errors.ConfigError` naming the file, the task and what to change.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path
from typing import Any, Literal, cast

from plugrl_env_client.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

LocalPolicy = Literal["random", "zero", "text", "ars"]
LOCAL_POLICIES = ("random", "zero", "text", "ars")
SUITE_KEYS = {"name", "episodes", "seeds", "task"}
TASK_KEYS = {"name", "env", "env_config", "episodes", "local_policy", "local_policy_choices", "server_url"}
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclasses.dataclass(frozen=True)
class Task:
    """One task of a suite: an env, its config fields, and how many episodes it runs."""

    name: str
    env: str
    env_config: dict[str, Any]
    episodes: int
    local_policy: LocalPolicy | None = None
    local_policy_choices: tuple[str, ...] | None = None
    server_url: tuple[str, ...] = ()
    """This task's policy servers (empty: the command line's)."""


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
        raise ConfigError(f"suite file {path}: cannot read it ({exc.strerror or exc}); give the path of a suite "
                          "file (e.g. suites/demo.toml)") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"suite file {path}: not valid TOML: {exc}") from None
    return parse_suite(data, path)


def parse_suite(data: dict[str, Any], path: Path) -> Suite:
    """The suite a parsed TOML document describes; ``path`` names it in errors."""
    where = f"suite file {path}"
    _no_unknown_keys(data, SUITE_KEYS, where)
    name = data.get("name", path.stem)
    if not isinstance(name, str) or not _NAME.match(name):
        raise ConfigError(f"{where}: name must be a folder name (letters, digits, '.', '_', '-'), got {name!r}")
    seeds = data.get("seeds", [])
    if not isinstance(seeds, list) or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0
                                              for s in seeds):
        raise ConfigError(f"{where}: seeds must be a list of integers >= 0, e.g. seeds = [0, 1, 2, 3]; got {seeds!r}")
    episodes = data.get("episodes", len(seeds) if seeds else None)
    if seeds and episodes != len(seeds):
        raise ConfigError(f"{where}: episodes = {episodes} but seeds has {len(seeds)}: with seeds every task runs one "
                          "episode per seed; leave episodes out or make them agree")
    tables = data.get("task")
    if not isinstance(tables, list) or not tables:
        raise ConfigError(f"{where}: no [[task]] table; add at least one, e.g.\n[[task]]\nenv = \"point-v1\"")
    tasks = [_task(t, i, episodes, bool(seeds), where) for i, t in enumerate(tables)]
    names = [t.name for t in tasks]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(f"{where}: task names must differ (each is a run folder); {', '.join(twice)} appear(s) "
                          "more than once: give those tasks a name")
    return Suite(name, tuple(tasks), tuple(seeds))


def _task(table: Any, index: int, episodes: Any, seeded: bool, where: str) -> Task:
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: task {index} must be a [[task]] table")
    env = table.get("env")
    if not isinstance(env, str) or not env:
        raise ConfigError(f"{where}: task {index} has no env; add env = \"<env id>\" (plugrl-run-env-client --help "
                          "lists them)")
    name = table.get("name", f"{env.lower()}-{index}")
    where = f"{where}: task {name!r}"
    if not isinstance(name, str) or not _NAME.match(name) or re.match(r"^.*-retry-\d+$", name):
        raise ConfigError(f"{where}: name must be a folder name (letters, digits, '.', '_', '-'), not ending in "
                          f"-retry-<n>; got {name!r}")
    _no_unknown_keys(table, TASK_KEYS, where)
    if "episodes" in table and seeded:
        raise ConfigError(f"{where}: episodes cannot be set per task when the suite has seeds (every task runs one "
                          "episode per seed); remove it")
    count = table.get("episodes", episodes)
    if count is None:
        raise ConfigError(f"{where}: how many episodes? set episodes = N at the top of the file (or in the task)")
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise ConfigError(f"{where}: episodes must be an integer >= 1, got {count!r}")
    env_config = table.get("env_config", {})
    if not isinstance(env_config, dict):
        raise ConfigError(f"{where}: env_config must be a table, e.g. env_config = {{ step_size = 0.2 }}")
    policy = table.get("local_policy")
    if policy is not None and policy not in LOCAL_POLICIES:
        raise ConfigError(f"{where}: local_policy must be one of {', '.join(LOCAL_POLICIES)}, got {policy!r}")
    choices = table.get("local_policy_choices")
    if choices is not None and (not isinstance(choices, list) or not all(isinstance(c, str) for c in choices)):
        raise ConfigError(f"{where}: local_policy_choices must be a list of strings")
    url = table.get("server_url")
    urls = tuple(url) if isinstance(url, list) else (url,) if url is not None else ()
    if (url is not None and not urls) or not all(isinstance(u, str) and u.startswith(("ws://", "wss://")) for u in urls):
        raise ConfigError(f"{where}: server_url must be ws://host:port or wss://host:port (or a list of them), got "
                          f"{url!r}")
    return Task(name, env, dict(env_config), count, cast("LocalPolicy | None", policy), tuple(choices) if choices is not None else None, urls)


def _no_unknown_keys(table: dict[str, Any], known: set[str], where: str) -> None:
    unknown = sorted(set(table) - known)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}; the keys are {', '.join(sorted(known))}")


__all__ = ["Suite", "Task", "load_suite", "parse_suite"]
