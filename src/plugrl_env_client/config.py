"""Command-line configuration of a client run. Every field is a flag; ``env`` becomes ``--env.*``."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated, Literal

import tyro

from plugrl_env_client.envs.base_env import BaseEnvConfig


@dataclasses.dataclass
class RunnerConfig:
    seed: int | None = 0
    """Seed of the first reset of every env (process p gets seed + p * num_envs); later resets continue the env's RNG."""
    max_episode_steps: int | None = None
    """Time limit in env steps (marks truncated). Default: the env's registered max_episode_steps."""
    replan_steps: int | None = None
    """Use at most this many steps of each action chunk before asking again. Default: the whole chunk."""
    non_finite_actions: Literal["error", "clip"] = "error"
    """What to do with NaN/inf actions for a float action space: stop with an error, or clip into the bounds."""
    non_finite_rewards: Literal["error", "zero"] = "error"
    """What to do with NaN/inf rewards from the env: stop with an error naming the env rows, or replace them by 0."""
    non_finite_observations: Literal["error", "allow"] = "error"
    """NaN/inf in the env's float states: stop with an error naming the key and rows, or send them as they are."""
    pass_proc_id: bool = False
    """Pass process_id and total_processes to the env's constructor."""
    use_env_lock: bool = False
    """Build envs one process at a time (for simulators whose setup is not safe to run concurrently)."""
    start_method: Literal["spawn", "forkserver", "fork"] = "spawn"
    """How --num-procs processes are started."""


@dataclasses.dataclass
class ClientConfig:
    num_envs: int = 1
    """Env copies stepped together by each process."""
    num_procs: int = 1
    """Processes, each with its own env batch and server connection."""
    num_episodes: int | None = None
    """Episodes to collect in total over all processes. Default: until the server ends the run."""
    exp_name: str | None = None
    """Run folder name. Default: <env-id>-nenv<N>-<YYYYmmdd-HHMMSS>-<8 hex>."""
    output_dir: Path = Path("runs")
    """Folder that holds the run folders."""
    server_host: str = "127.0.0.1"
    server_port: int = 8000
    server_url: str | None = None
    """ws://host:port or wss://host:port; overrides --server-host/--server-port."""
    api_key: str | None = None
    """Sent as 'Authorization: Api-Key <key>'. Default: $PLUGRL_API_KEY if set."""
    local_policy: Literal["random", "zero", "text"] | None = None
    """Start the reference policy server in this process (matched to the env's action space) and use it; text is
    for envs whose single_action_space is a gymnasium Text space."""
    local_policy_choices: tuple[str, ...] = ()
    """Strings --local-policy text answers with, one picked per env and step (default: short strings made up from
    the Text space's characters), e.g. --local-policy-choices "<answer>3</answer>" "hello"."""
    local_policy_horizon: int = 4
    """Action horizon of the embedded policy (with --local-policy)."""
    reconnect_on_server_stop: bool = False
    """After the server ends a run, wait for its next run instead of exiting."""
    max_reconnects: int | None = None
    """Give up after this many reconnects. Default: keep reconnecting while the server comes back."""
    connect_timeout: float | None = None
    """Seconds to wait for the first connection. Default: wait until a server is up."""
    reconnect_timeout: float | None = None
    """Seconds to wait for the server to come back after a lost connection. Default: wait until it does."""
    reuse_feedback_obs: bool = True
    """When the server offers reuse-feedback-obs, do not upload an observation the server already holds."""
    progress: bool = True
    """Show progress (a bar on a terminal, periodic lines otherwise)."""
    env_path: Annotated[tuple[str, ...], tyro.conf.UseAppendAction] = ()
    """An env file (*_env.py) or a folder searched for them, imported before the env id is looked up (repeatable;
    also $PLUGRL_ENV_PATH, os.pathsep-separated)."""
    runner: RunnerConfig = dataclasses.field(default_factory=RunnerConfig)
    env: BaseEnvConfig = dataclasses.field(default_factory=BaseEnvConfig)

    def resolved_url(self) -> str:
        return self.server_url or f"ws://{self.server_host}:{self.server_port}"
