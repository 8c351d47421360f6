"""Running a suite: each task a client run of its own (:func:`~plugrl_env_client.app.run_client`) in a folder of
its own under the suite's folder, then one table of them all.

The suite's folder, ``<output-dir>/<exp-name>/``::

    suite.toml        the suite file the suite was started with
    suite.json        the table: a ``tasks`` list and the suite's means (rewritten when a task starts, when it
                      ends, and while it runs as its episodes land, every REFRESH_S seconds)
    suite.csv         the same table as CSV
    <task>/           each task's run folder (plugrl-report works on it alone)

Tasks run one after another in this process. With ``--launcher ray`` on a cluster (``--ray.address`` other than
``local``, which would start a private Ray instance per task) they run side by side: each task is a Ray driver in
a spawned process of its own, its processes actors on the shared cluster, and the cluster schedules them all.

A task is done when its run folder's ``summary.json`` says ``finished`` (or ``stopped by server``). ``--resume``
skips the tasks that are done; a task whose run folder holds a run that is not done (the suite was killed during
it, or it failed) is resumed in that folder (the client's ``--resume``: its whole episodes count, the rest run);
a folder that holds no run (it never got going) is left as it is and the task runs into a fresh folder,
``<task>-retry-<n>``. The table takes the newest done folder of each task.
"""

from __future__ import annotations

import csv
import dataclasses
import datetime as dt
import functools
import io
import json
import logging
import multiprocessing as mp
import multiprocessing.connection
import os
import pickle
import re
import secrets
import shutil
import signal
import sys
import time
import types
import typing
from collections.abc import Collection, Sequence
from pathlib import Path, PurePath
from typing import Any

from plugrl_env_client.app import check_config, run_client
from plugrl_env_client.config import ClientConfig
from plugrl_env_client.env_commands import parse_with, subcommand_name
from plugrl_env_client.envs.base_env import BaseEnvConfig
from plugrl_env_client.envs.discovery import EnvSources
from plugrl_env_client.envs.registry import get_spec
from plugrl_env_client.errors import ConfigError
from plugrl_env_client.launch.lifeline import Lifeline
from plugrl_env_client.outputs.progress import Periodic
from plugrl_env_client.outputs.run_dir import EpisodeLineCount, RunDir, write_json_atomic, write_text_atomic
from plugrl_env_client.rollout.signals import interrupt_handlers, shielded
from plugrl_env_client.suite.spec import NAME_MAX, Suite, Task, problem

logger = logging.getLogger(__name__)

DONE = ("finished", "stopped by server")
"""Statuses of a run folder whose task needs no new run."""
INTERRUPTED_CODES = {128 + signal.SIGINT, 128 + signal.SIGTERM, 128 + signal.SIGHUP}
COLUMNS = ("name", "env", "episodes", "mean_return", "success_rate", "mean_length", "status", "run")
REFRESH_S = 5.0
"""How often the table counts a running task's episodes from its run folder (and is rewritten when they changed)."""


@dataclasses.dataclass(frozen=True)
class EnvFlag:
    """One ``--env.FIELD [VALUE ...]`` of the suite's command line, for the tasks whose env config has FIELD."""

    field: str
    tokens: tuple[str, ...]


def split_env_flags(args: Sequence[str]) -> tuple[list[str], list[EnvFlag]]:
    """(the other arguments, the ``--env.*`` flags with their values): a flag's values are the arguments after
    it up to the next one starting with ``--``."""
    rest: list[str] = []
    flags: list[EnvFlag] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--env."):
            rest.append(arg)
            i += 1
            continue
        j = i + 1
        while j < len(args) and not args[j].startswith("--"):
            j += 1
        name = arg[len("--env."):].split("=", 1)[0].replace("-", "_")
        flags.append(EnvFlag(name, tuple(args[i:j])))
        i = j
    return rest, flags


ParsedEnvs = dict[tuple[str, tuple[str, ...]], tuple[BaseEnvConfig, "int | None"]]
"""(env id, its ``--env.*`` tokens) -> (its env config, ``--env.max-episode-steps``): the command line's flags
parsed once per env of a suite, not once per task."""


def task_config(base: ClientConfig, task: Task, flags: Sequence[EnvFlag], seeds: tuple[int, ...], root: Path,
                folder: str, parsed: ParsedEnvs | None = None) -> tuple[str, ClientConfig]:
    """(env id, the client config of ``task``): the command line's flags, the ``--env.*`` ones its env config has,
    then the task's own fields, which win; the run goes to ``root/folder``. ``--num-episodes`` given on the
    command line replaces every task's episodes (with seeds: the first N seeds). The config is checked as a client
    run checks it before it starts; ``parsed`` keeps the parsed flags of each env for the next task of that env."""
    spec = get_spec(task.env)
    fields = {f.name for f in dataclasses.fields(spec.config_cls)}
    mine = tuple(t for f in flags if _applies(f, fields) for t in f.tokens)
    env, max_episode_steps = _parsed_env(spec.uid, mine, {} if parsed is None else parsed)
    runner = base.runner
    if max_episode_steps is not None:  # --env.max-episode-steps, for an env without that field
        runner = dataclasses.replace(runner, max_episode_steps=max_episode_steps)
    episodes = task.episodes if base.num_episodes is None else base.num_episodes
    if seeds:
        if episodes > len(seeds):
            raise ConfigError(f"--num-episodes {episodes}: the suite has {len(seeds)} seeds, one per episode; give "
                              f"at most {len(seeds)} (the first N seeds are used)")
        runner = dataclasses.replace(runner, start_seeds=seeds[:episodes], episode_split="static")
    config = dataclasses.replace(
        base, env=_with_fields(env, task), runner=runner, num_episodes=episodes, exp_name=folder,
        output_dir=root, local_policy=(task.local_policy or base.local_policy) if base.local_policy else None,
        local_policy_choices=task.local_policy_choices if task.local_policy_choices is not None
        else base.local_policy_choices,
        server_url=task.server_url or base.server_url,
    )
    try:
        check_config(config, spec.uid)
    except ConfigError as exc:
        raise ConfigError(f"{task.where}: {exc}") from None
    return spec.uid, config


def _parsed_env(uid: str, tokens: tuple[str, ...], parsed: ParsedEnvs) -> tuple[BaseEnvConfig, int | None]:
    """(a fresh copy of env ``uid``'s config with the flags ``tokens``, ``--env.max-episode-steps``): the parser
    is built and run once per env and flags (it costs a tenth of a second; a suite may have thousands of tasks)."""
    key = (uid, tokens)
    if key not in parsed:
        _, config = parse_with(ClientConfig, [subcommand_name(uid), *tokens], "plugrl-run-suite",
                               "The env flags of a suite's task.")
        parsed[key] = (config.env, config.runner.max_episode_steps)
    env, max_episode_steps = parsed[key]
    return dataclasses.replace(env), max_episode_steps


def _applies(flag: EnvFlag, fields: Collection[str]) -> bool:
    name = flag.field
    return name in fields or (name.startswith("no_") and name[3:] in fields) or name == "max_episode_steps"


_REFUSED = object()
"""What :func:`_as_field` answers for a value its field cannot take."""


def _with_fields(env: BaseEnvConfig, task: Task) -> BaseEnvConfig:
    """``env`` with the task's ``env_config``, each value checked against its field's type: a table or list for a
    text field (Gym-v1's ``kwargs``) is written as its JSON, a list for a tuple field becomes a tuple, an integer
    for a float field a float."""
    known = {f.name for f in dataclasses.fields(env)}
    hints = _field_types(typing.cast(type, type(env)))
    values = {}
    for name, value in task.env_config.items():
        if name not in known:
            raise problem(task.where, f"env {task.env} has no config field {name!r}",
                          f"its fields are {', '.join(sorted(known)) or '(none)'}")
        taken = _as_field(value, hints[name]) if name in hints else value
        if taken is _REFUSED:
            raise problem(task.where, f"env_config {name} = {value!r} is not {_type_name(hints[name])}",
                          f"give {name} a value of that type; plugrl-run-env-client {task.env.lower()} --help "
                          "describes the field")
        values[name] = taken
    return dataclasses.replace(env, **values)


@functools.cache
def _field_types(cls: type) -> dict[str, Any]:
    """The type of each field of the config dataclass ``cls`` (none for a class whose annotations do not resolve:
    its values are then taken as they are)."""
    try:
        return typing.get_type_hints(cls)
    except Exception:  # an env file's annotation that names nothing importable
        return {}


def _as_field(value: Any, hint: Any) -> Any:
    """``value`` (from TOML) as a field of type ``hint`` holds it, or :data:`_REFUSED` when the field cannot hold
    it; a type this does not know takes the value as it is."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any or hint is object:
        return value
    if origin in (typing.Union, types.UnionType):
        for arm in args:
            taken = _as_field(value, arm)
            if taken is not _REFUSED:
                return taken
        return _REFUSED
    if origin is typing.Literal:
        return value if any(value == a and type(value) is type(a) for a in args) else _REFUSED
    if hint is type(None):
        return _REFUSED  # TOML has no null
    if hint is bool:
        return value if isinstance(value, bool) else _REFUSED
    if hint is int:
        return value if isinstance(value, int) and not isinstance(value, bool) else _REFUSED
    if hint is float:
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else _REFUSED
    if hint is str:
        return value if isinstance(value, str) else json.dumps(value) if isinstance(value, (dict, list)) else _REFUSED
    if isinstance(hint, type) and issubclass(hint, PurePath):
        return hint(value) if isinstance(value, str) else _REFUSED
    if origin in (tuple, list):
        if not isinstance(value, list):
            return _REFUSED
        if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
            items = [_as_field(v, a) for v, a in zip(value, args)] if len(args) == len(value) else [_REFUSED]
        else:
            items = [_as_field(v, args[0]) if args else v for v in value]
        return _REFUSED if any(i is _REFUSED for i in items) else origin(items)
    return value


def _type_name(hint: Any) -> str:
    """A field's type as an error says it: ``a float``, ``an int or None``, ``one of 'sync', 'async'``."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in args)
    if origin is typing.Literal:
        return f"one of {', '.join(repr(a) for a in args)}"
    if hint is type(None):
        return "None"
    name = getattr(hint, "__name__", None) or str(hint)
    return f"{'an' if name[:1] in 'aeiouAEIOU' else 'a'} {name}"


def default_suite_name(suite: Suite) -> str:
    return f"{suite.name}-{dt.datetime.now().strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(4)}"


def run_suite(suite: Suite, suite_file: Path, base: ClientConfig, flags: Sequence[EnvFlag], resume: bool,
              sources: EnvSources | None = None) -> int:
    """Run every task of ``suite`` not done yet, one after another; returns the exit code: 0 when every task is
    done, 1 when one failed, 128 + the signal's number when a task was interrupted (the suite stops there)."""
    if resume and base.exp_name is None:
        raise ConfigError("--resume continues a suite's folder: give its --exp-name (the folder under --output-dir "
                          "that holds suite.json)")
    if base.exp_name is not None and (base.exp_name in ("", ".", "..") or "/" in base.exp_name
                                      or os.sep in base.exp_name):
        raise ConfigError(f"--exp-name {base.exp_name!r} must be a folder name, without '/' and other than '.' or "
                          "'..': the suite goes to --output-dir/<exp-name>; to write somewhere else, set --output-dir")
    if base.exp_name is not None and len(base.exp_name.encode()) > NAME_MAX:
        raise ConfigError(f"--exp-name is {len(base.exp_name.encode())} bytes long; a folder name is at most "
                          f"{NAME_MAX} (give a shorter one)")
    # Absolute before any task's env runs: an env that changes the working folder does not move the suite.
    root = base.output_dir.absolute() / (base.exp_name or default_suite_name(suite))
    fields = {uid: {f.name for f in dataclasses.fields(get_spec(uid).config_cls)}
              for uid in {t.env for t in suite.tasks}}
    unused = [f for f in flags if not any(_applies(f, names) for names in fields.values())]
    if unused:
        raise ConfigError(f"--env.{unused[0].field.replace('_', '-')}: no task's env has that config field; check "
                          "the spelling, or set it in a task's env_config")
    # Every task's config is built (and so checked) before anything runs; each env's flags are parsed once.
    parsed: ParsedEnvs = {}
    plan = [(task, task_config(base, task, flags, suite.seeds, root, task.name, parsed)) for task in suite.tasks]
    _start_folder(root, suite_file, resume)
    rows = [_row(task, uid, None) for task, (uid, _) in plan]
    _write_table(root, suite, rows)
    if side_by_side(base):
        return _finish(root, suite, rows, _run_side_by_side(root, suite, plan, rows, sources))
    code = 0
    for i, (task, (uid, config)) in enumerate(plan):
        if _skipped_as_done(root, task, uid, rows, i):
            continue
        folder, resumed = _task_folder(root, task.name)
        print(f"\ntask {i + 1}/{len(plan)}: {task.name} ({uid}, {config.num_episodes} episodes) "
              f"{'resumed in' if resumed else '->'} {root / folder}")
        rows[i] = {**rows[i], "status": "running", "run": folder}
        _write_table(root, suite, rows)
        live = LiveTable(root, suite, rows)
        live.watch(i, root / folder, config.num_procs)
        refresh = Periodic(REFRESH_S, live.refresh, "plugrl-suite-table").start()
        try:
            result = run_client(dataclasses.replace(config, exp_name=folder, resume=resumed), uid, sources)
        finally:
            refresh.stop()
        rows[i] = _row(task, uid, root / folder)
        _write_table(root, suite, rows)
        if result in INTERRUPTED_CODES:
            print(f"suite interrupted during task {task.name}; continue it with --resume --exp-name {root.name}",
                  file=sys.stderr)
            return result
        if result != 0:
            code = 1
    return _finish(root, suite, rows, code)


def _finish(root: Path, suite: Suite, rows: list[dict[str, Any]], code: int) -> int:
    """Write and print the table; the exit code (``code``, or 1 when a task is not done)."""
    if code in INTERRUPTED_CODES:
        _write_table(root, suite, rows)
        print(f"suite interrupted; continue it with --resume --exp-name {root.name}", file=sys.stderr)
        return code
    table = _write_table(root, suite, rows)
    print(f"\nsuite {suite.name}: {len(rows)} task{'' if len(rows) == 1 else 's'}\n{table}\n"
          f"suite: {root / 'suite.json'}")
    failed = [r["name"] for r in rows if r["status"] not in DONE]
    if failed:
        print(f"error: task(s) not done: {', '.join(failed)}; rerun them with --resume --exp-name {root.name}",
              file=sys.stderr)
        code = 1
    return code


def side_by_side(base: ClientConfig) -> bool:
    """Whether the tasks run side by side: Ray processes on a cluster (``local`` would start an instance per task)."""
    return base.launcher == "ray" and base.ray.address != "local"


def _run_side_by_side(root: Path, suite: Suite, plan: list[tuple[Task, tuple[str, ClientConfig]]],
                      rows: list[dict[str, Any]], sources: EnvSources | None) -> int:
    """Start every task that is not done as a spawned process of its own and wait for them all, writing the table
    as each ends; returns 1 when a task failed, 128 + the signal's number when interrupted (every task is told to
    stop, and each writes its outputs)."""
    ctx = mp.get_context("spawn")
    running: dict[int, tuple[int, Any]] = {}  # sentinel -> (task index, process)
    live = LiveTable(root, suite, rows)
    refreshed = time.monotonic()
    code = 0
    with interrupt_handlers():
        try:
            for i, (task, (uid, config)) in enumerate(plan):
                if _skipped_as_done(root, task, uid, rows, i):
                    continue
                folder, resumed = _task_folder(root, task.name)
                job = pickle.dumps((dataclasses.replace(config, exp_name=folder, progress=False, resume=resumed), uid))
                proc = ctx.Process(target=_task_main, args=(task.name, job, sources or EnvSources()),
                                   name=f"plugrl-suite-{task.name}")
                proc.start()
                running[proc.sentinel] = (i, proc)
                rows[i] = {**rows[i], "status": "running", "run": folder}
                live.watch(i, root / folder, config.num_procs)
                print(f"task {task.name} ({uid}, {config.num_episodes} episodes) started -> {root / folder}")
            _write_table(root, suite, rows)
            while running:
                for sentinel in mp.connection.wait(list(running), timeout=1.0):
                    i, proc = running.pop(int(sentinel))  # type: ignore[arg-type]
                    proc.join()
                    live.unwatch(i)
                    task, (uid, _) = plan[i]
                    rows[i] = _row(task, uid, root / rows[i]["run"])
                    _write_table(root, suite, rows)
                    print(f"task {task.name}: {rows[i]['status']} (exit code {proc.exitcode})")
                    if proc.exitcode != 0:
                        code = 1
                if time.monotonic() - refreshed >= REFRESH_S:
                    live.refresh()
                    refreshed = time.monotonic()
        except KeyboardInterrupt as exc:
            code = 128 + getattr(exc, "signum", signal.SIGINT)
            with shielded():
                for _, proc in running.values():
                    proc.terminate()  # SIGTERM: the task writes its outputs and ends
                for i, proc in running.values():
                    proc.join(timeout=120)
                    if proc.is_alive():
                        proc.kill()
                        proc.join(timeout=10)
                    task, (uid, _) = plan[i]
                    rows[i] = _row(task, uid, root / rows[i]["run"])
    return code


class LiveTable:
    """The table's running tasks counted from their run folders: :meth:`refresh` sets each one's ``episodes`` to
    the whole episode lines its run has written (the rule the run counts them by) and rewrites the table when one
    changed. Each count reads only what the run appended since the last (:class:`EpisodeLineCount`)."""

    def __init__(self, root: Path, suite: Suite, rows: list[dict[str, Any]]) -> None:
        self.root, self.suite, self.rows = root, suite, rows
        self._counts: dict[int, EpisodeLineCount] = {}

    def watch(self, i: int, folder: Path, num_procs: int) -> None:
        self._counts[i] = EpisodeLineCount(RunDir(folder), num_procs)

    def unwatch(self, i: int) -> None:
        self._counts.pop(i, None)

    def refresh(self) -> None:
        changed = False
        for i, lines in list(self._counts.items()):
            count = lines.count()
            if count != self.rows[i]["episodes"]:
                self.rows[i] = {**self.rows[i], "episodes": count}
                changed = True
        if changed:
            try:
                _write_table(self.root, self.suite, self.rows)
            except OSError as exc:  # the task's own outputs matter more; the table is written again at its end
                logger.warning("could not refresh %s: %s", self.root / "suite.json", exc)


def _task_main(name: str, job: bytes, sources: EnvSources) -> None:
    """A task side by side with others: a client run in a spawned process, which ends with the suite's process.
    The job is unpickled once the env files are imported (its env config may be a class of one of them)."""
    with interrupt_handlers():
        Lifeline(f"task {name}").start()
        sources.load()
        config, uid = pickle.loads(job)
        code = run_client(config, uid, sources)
    sys.exit(code)


def _start_folder(root: Path, suite_file: Path, resume: bool) -> None:
    if resume:
        if not (root / "suite.json").exists():
            raise ConfigError(f"--resume: {root} holds no suite (no suite.json); leave out --resume to start one "
                              "there")
        return
    if root.exists():
        raise ConfigError(f"{root} already exists; continue the suite there with --resume, or pick another "
                          "--exp-name")
    root.mkdir(parents=True)
    shutil.copyfile(suite_file, root / "suite.toml")


def _folders(root: Path, name: str) -> list[Path]:
    """The run folders of task ``name``: its own, then its retries in order."""
    retries = []
    for path in root.glob(f"{name}-retry-*"):
        match = re.fullmatch(re.escape(name) + r"-retry-(\d+)", path.name)
        if match and path.is_dir():
            retries.append((int(match.group(1)), path))
    own = [root / name] if (root / name).is_dir() else []
    return own + [p for _, p in sorted(retries)]


def _skipped_as_done(root: Path, task: Task, uid: str, rows: list[dict[str, Any]], i: int) -> bool:
    """Whether the task is done already (a resumed suite): then its row is its done folder's, and it says so."""
    done = _done_folder(root, task.name)
    if done is None:
        return False
    print(f"task {task.name}: done in {done.name}, skipped")
    rows[i] = _row(task, uid, done)
    return True


def _done_folder(root: Path, name: str) -> Path | None:
    """The newest of the task's run folders whose run is done."""
    done = [p for p in _folders(root, name) if _summary(p).get("status") in DONE]
    return done[-1] if done else None


def _task_folder(root: Path, name: str) -> tuple[str, bool]:
    """Where the task's run goes, and whether it resumes the run there: the newest of its folders when that holds a
    run (``client_config.json``), resumed; else its own folder when there is none yet; else the next free retry
    folder (``<name>-retry-<n>``), beside a folder that holds no run to continue."""
    folders = _folders(root, name)
    if not folders:
        return name, False
    if RunDir(folders[-1]).client_config.exists():
        return folders[-1].name, True
    last = max((int(p.name.rsplit("-", 1)[1]) for p in folders if p.name != name), default=0)
    return f"{name}-retry-{last + 1}", False


def _summary(folder: Path) -> dict[str, Any]:
    try:
        data = json.loads(RunDir(folder).summary.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _row(task: Task, uid: str, folder: Path | None) -> dict[str, Any]:
    """A task's line of the table, from its run folder's summary (``pending`` before it ran)."""
    summary = _summary(folder) if folder is not None else {}
    exact = summary.get("all_episodes") or {}
    return {
        "name": task.name,
        "env": uid,
        "episodes": summary.get("completed_episodes", 0),
        "mean_return": exact.get("mean_return"),
        "success_rate": exact.get("mean_success_rate") if summary.get("has_success_rule") else None,
        "mean_length": exact.get("mean_length"),
        "status": summary.get("status", "pending" if folder is None else "failed"),
        "run": folder.name if folder is not None else None,
        "env_config": task.env_config,
    }


def suite_means(rows: Sequence[dict[str, Any]]) -> dict[str, float | None]:
    """The suite's means: of the tasks' mean returns, success rates (tasks with a success rule only) and mean
    lengths, each task counting once; null where no task has a value."""
    out: dict[str, float | None] = {}
    for key in ("mean_return", "success_rate", "mean_length"):
        values = [r[key] for r in rows if r[key] is not None]
        out[key] = sum(values) / len(values) if values else None
    return out


def _write_table(root: Path, suite: Suite, rows: list[dict[str, Any]]) -> str:
    """Write suite.json and suite.csv; returns the table as text."""
    means = suite_means(rows)
    write_json_atomic(root / "suite.json", {
        "name": suite.name, "seeds": list(suite.seeds) or None, "tasks": rows,
        "tasks_done": sum(r["status"] in DONE for r in rows), **means,
    })
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(COLUMNS)
    for row in rows:
        writer.writerow(["" if row[c] is None else row[c] for c in COLUMNS])
    writer.writerow(["mean", "", sum(r["episodes"] for r in rows),
                     *("" if means[k] is None else means[k] for k in ("mean_return", "success_rate", "mean_length")),
                     "", ""])
    write_text_atomic(root / "suite.csv", out.getvalue())
    return format_table(rows, means)


def format_table(rows: Sequence[dict[str, Any]], means: dict[str, float | None]) -> str:
    """The table the terminal shows: one line per task and the suite's means ("n/a" where undefined)."""
    def num(value: float | None, digits: int) -> str:
        return "n/a" if value is None else f"{value:.{digits}f}"

    lines = [("task", "env", "episodes", "mean return", "success", "mean length", "status")]
    for r in rows:
        lines.append((r["name"], r["env"], str(r["episodes"]), num(r["mean_return"], 3), num(r["success_rate"], 3),
                      num(r["mean_length"], 1), r["status"]))
    lines.append(("mean", "", str(sum(r["episodes"] for r in rows)), num(means["mean_return"], 3),
                  num(means["success_rate"], 3), num(means["mean_length"], 1), ""))
    widths = [max(len(line[c]) for line in lines) for c in range(len(lines[0]))]
    right = {2, 3, 4, 5}
    return "\n".join("  " + "  ".join(cell.rjust(w) if c in right else cell.ljust(w)
                                      for c, (cell, w) in enumerate(zip(line, widths))).rstrip() for line in lines)


__all__ = ["EnvFlag", "format_table", "run_suite", "split_env_flags", "suite_means", "task_config"]
