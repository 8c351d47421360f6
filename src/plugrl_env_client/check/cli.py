"""``plugrl-check-env <env-id> [--num-envs N] [--env.*] [--env-path ...]``: the env contract as a checklist.

Exit code 0 when every rule passed (warnings allowed), 1 when any failed or the env cannot be found.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Sequence
from typing import Annotated

import tyro

from plugrl_env_client.check.checklist import check_registered_env
from plugrl_env_client.check.harness import DEFAULT_STEPS
from plugrl_env_client.cli_support import run_cli
from plugrl_env_client.env_commands import parse_with, prepare, program_name
from plugrl_env_client.envs.base_env import BaseEnvConfig


@dataclasses.dataclass
class CheckArgs:
    num_envs: int = 2
    """Env copies in the batch under test."""
    seed: int = 0
    """Seed of the resets the rules make."""
    steps: int = DEFAULT_STEPS
    """Steps the rules run the env for."""
    rollout: bool = True
    """End with a short real rollout against the embedded policy offered for the env's action space (random, or text
    for a Text space)."""
    details: bool = False
    """Show the env's tracebacks under the rules that caught them."""
    env_path: Annotated[tuple[str, ...], tyro.conf.UseAppendAction] = ()
    """An env file (*_env.py) or a folder searched for them (repeatable; also $PLUGRL_ENV_PATH)."""
    env: BaseEnvConfig = dataclasses.field(default_factory=BaseEnvConfig)


def main(args: Sequence[str] | None = None) -> None:
    def body() -> int:
        line = prepare(sys.argv[1:] if args is None else args)
        env_id, parsed = parse_with(CheckArgs, line.args, program_name("plugrl-check-env"),
                                    "Check an env against the batched env contract, rule by rule.")
        report = check_registered_env(env_id, num_envs=parsed.num_envs, config=parsed.env, rollout=parsed.rollout,
                                      seed=parsed.seed, steps=parsed.steps)
        report.print(sys.stdout, details=parsed.details)
        return 0 if report.ok else 1

    run_cli(body, args)


if __name__ == "__main__":
    main()
