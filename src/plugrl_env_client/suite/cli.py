"""``plugrl-run-suite SUITE.toml [client flags]``: run every task of a suite file and write one table.

The flags are the client's (``plugrl-run-env-client <env-id> --help``) without an env id, for every task, plus
``--resume``. ``--env.FIELD VALUE`` applies to every task whose env config has FIELD (a task's ``env_config``
wins over it); a flag no task's env has is refused. ``--exp-name`` names the suite's folder, under which each task
is a run folder of its own.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import tyro

from plugrl_env_client.cli_support import cli, run_cli
from plugrl_env_client.config import ClientConfig
from plugrl_env_client.env_commands import prepare
from plugrl_env_client.envs.base_env import BaseEnvConfig

PROG = "plugrl-run-suite"


@dataclasses.dataclass
class SuiteCommand(ClientConfig):
    """Run every task of a suite file (TOML), each in a run folder of its own under --output-dir/<exp-name>, and
    write one table: suite.json, suite.csv and the terminal's. Tasks run one after another, or side by side with
    --launcher ray on a running cluster. --env.FIELD VALUE applies to every task whose env has FIELD."""

    num_episodes: Annotated[int | None, tyro.conf.arg(help_behavior_hint="(default: the file's)")] = None
    """Episodes per task, instead of the suite file's (with seeds: the first N seeds)."""
    exp_name: Annotated[str | None, tyro.conf.arg(
        help_behavior_hint="(default: <suite name>-<YYYYmmdd-HHMMSS>-<8 hex>)")] = None
    """The suite's folder name (its tasks' run folders go inside it)."""
    suite_file: Annotated[Path, tyro.conf.Positional, tyro.conf.arg(metavar="SUITE.toml")] = dataclasses.field(
        kw_only=True)
    """The suite file: its tasks, episodes and optional seeds (docs/evaluation.md)."""
    resume: bool = False
    """Continue the suite in --exp-name's folder: tasks already done are skipped, and a task that was stopped
    (killed, interrupted, failed) runs again."""
    env: tyro.conf.Suppress[BaseEnvConfig] = dataclasses.field(default_factory=BaseEnvConfig)


OWN_FIELDS = {"suite_file", "resume", "env", "version"}
"""The command's own fields: not handed on to the tasks' client configs."""


def parse(args: Sequence[str]) -> tuple[SuiteCommand, ClientConfig, list]:
    """(the command, the client config every task starts from, the ``--env.*`` flags)."""
    from plugrl_env_client.suite.runner import split_env_flags

    rest, flags = split_env_flags(list(args))
    line = prepare(rest)  # imports --env-path's env files
    command = line.with_absolute_paths(cli(SuiteCommand, line.args, PROG))
    command = dataclasses.replace(command, suite_file=line.absolute(command.suite_file))
    base = ClientConfig(**{f.name: getattr(command, f.name) for f in dataclasses.fields(ClientConfig)
                           if f.name not in OWN_FIELDS})
    return command, base, flags


def main(args: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if args is None else args)

    def body() -> int:
        from plugrl_env_client.envs.discovery import EnvSources
        from plugrl_env_client.suite.runner import run_suite
        from plugrl_env_client.suite.spec import load_suite

        command, base, flags = parse(argv)
        suite = load_suite(command.suite_file)
        return run_suite(suite, command.suite_file, base, flags, command.resume,
                         EnvSources(tuple(base.env_path), ()))

    run_cli(body, argv)


if __name__ == "__main__":
    main()
