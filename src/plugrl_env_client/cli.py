"""``plugrl-run-env-client <env-id> [flags]``: the client's command, on top of everything else.

The env subcommands, their ``--env.*`` flags and the steps before the parser exists are
:mod:`plugrl_env_client.env_commands`' (``plugrl-check-env`` shares them); this front adds the client's own
sections (:class:`~plugrl_env_client.config.ClientConfig`) and the ``--policy.*`` section of the embedded policy's
own options (every registered policy's fields, as ``plugrl-run-policy-server`` has them, built once the files of
``--env-path`` have registered their policies), and runs the client. An env file may end with
``if __name__ == "__main__": from plugrl_env_client.cli import main; main()`` and be run directly.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Sequence

from plugrl_env_client.cli_support import run_cli
from plugrl_env_client.config import ClientConfig
from plugrl_env_client.env_commands import CommandLine, parse_with, prepare, program_name
from plugrl_env_client.server.registry import options_class, options_from_flags


def command_class() -> type[ClientConfig]:
    """:class:`ClientConfig` with the ``--policy.*`` section (:func:`~plugrl_env_client.server.registry.options_class`)
    as its ``policy`` field, for the parser only: a parsed one becomes a plain ClientConfig whose
    ``local_policy_options`` hold the options of the policy --local-policy names."""
    section = options_class()
    cls = dataclasses.make_dataclass(
        "ClientConfig", [("policy", section, dataclasses.field(default_factory=section))], bases=(ClientConfig,))
    cls.__doc__ = ClientConfig.__doc__
    return cls


def parse(args: Sequence[str] | None = None) -> tuple[str, ClientConfig, CommandLine]:
    """Parse a client command line into (env id, config, what was imported for it)."""
    line = prepare(sys.argv[1:] if args is None else args)
    env_id, parsed = parse_with(
        command_class(), line.args, program_name("plugrl-run-env-client"),
        "Run batched envs against a PlugRL policy server (or an embedded one with --local-policy).",
    )
    values = {f.name: getattr(parsed, f.name) for f in dataclasses.fields(ClientConfig)}
    values["local_policy_options"] = options_from_flags(parsed.local_policy, parsed.policy)  # type: ignore[attr-defined]
    return env_id, line.with_absolute_paths(ClientConfig(**values)), line


def main(args: Sequence[str] | None = None) -> None:
    def body() -> int:
        from plugrl_env_client.app import run_client

        env_id, config, line = parse(args)
        return run_client(config, env_id, sources=line.sources)

    run_cli(body, args)
