"""``plugrl-run-env-client <env-id> [flags]``: one subcommand per registered env, built when ``main()`` runs.

Building the parser at call time (not import time) is what lets an env file end with
``if __name__ == "__main__": from plugrl_env_client.cli import main; main()`` and be run directly: its envs are
registered by then, whatever was imported first.
"""

from __future__ import annotations

import dataclasses
import signal
import sys
from collections.abc import Sequence
from typing import Any

import tyro

from plugrl_env_client.config import ClientConfig
from plugrl_env_client.envs import discover_envs
from plugrl_env_client.envs.registry import get_spec, registered_ids
from plugrl_env_client.errors import ConfigError, PlugRLError


def _config_class(uid: str) -> type[ClientConfig]:
    """A ClientConfig subclass whose ``env`` field is the env's own config dataclass."""
    spec = get_spec(uid)
    cls = dataclasses.make_dataclass(
        f"{spec.env_cls.__name__}ClientConfig",
        [("env", spec.config_cls, dataclasses.field(default_factory=spec.config_cls))],
        bases=(ClientConfig,),
    )
    doc = spec.env_cls.__doc__ or sys.modules[spec.env_cls.__module__].__doc__ or f"Run {uid}."
    cls.__doc__ = doc.strip().splitlines()[0]
    cls.env_id = uid  # type: ignore[attr-defined]
    return cls


def build_subcommands() -> dict[str, type[ClientConfig]]:
    discover_envs()
    return {uid.lower(): _config_class(uid) for uid in registered_ids()}


def parse(args: Sequence[str] | None = None) -> tuple[str, ClientConfig]:
    """Parse a command line into (env id, config). An unknown env id is a ConfigError naming close matches."""
    subcommands = build_subcommands()
    args = _normalize_env_id(list(sys.argv[1:] if args is None else args), subcommands)
    config = tyro.extras.subcommand_cli_from_dict(
        subcommands,
        prog="plugrl-run-env-client",
        description="Run batched envs against a PlugRL policy server (or an embedded one with --local-policy).",
        args=args,
    )
    # Hand on a plain ClientConfig: the per-env subclass exists only in this process and cannot be pickled
    # for spawned rollout processes; the env config inside it is an ordinary importable dataclass.
    plain = ClientConfig(**{f.name: getattr(config, f.name) for f in dataclasses.fields(ClientConfig)})
    return type(config).env_id, plain  # type: ignore[attr-defined]


def _normalize_env_id(args: list[str], subcommands: dict[str, Any]) -> list[str]:
    """Accept an env id in any case (``Point-v1``); an id that matches nothing raises with suggestions."""
    position = next((i for i, a in enumerate(args) if not a.startswith("-")), None)
    if position is None or args[position] in subcommands:
        return args
    if position > 0:
        raise ConfigError(f"the env id comes first: plugrl-run-env-client <env-id> {' '.join(args[:position])} ...")
    spec = get_spec(args[position])  # case-insensitive; raises "Unknown env id ... Did you mean ..."
    return [*args[:position], spec.uid.lower(), *args[position + 1:]]


def main(args: Sequence[str] | None = None) -> None:
    from plugrl_env_client.app import run_client

    try:
        env_id, config = parse(args)
        code = run_client(config, env_id)
    except PlugRLError as exc:
        print(f"error: {exc}", file=sys.stderr)
        code = 1
    except KeyboardInterrupt as exc:  # before the run had anything to write
        print("interrupted", file=sys.stderr)
        code = 128 + getattr(exc, "signum", signal.SIGINT)
    sys.exit(code)


