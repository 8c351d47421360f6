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
    pipeline: int = 1
    """Split each process's envs into this many groups, each with its own env object and connection, and step one
    group while the others wait for their actions (1: every env in lockstep)."""
    episode_split: Literal["static", "shared"] = "static"
    """With --num-episodes and several processes: static gives each process a fixed share (shares differ by at most
    one), so the episodes depend only on the seed; shared lets whichever process finishes first take the next one."""
    instruction: Literal["prepend", "off"] = "prepend"
    """Put the env's info['env_instruction'] in front of the first observation text of each episode, or not."""
    align_chunks: int = 0
    """When some envs' chunks end, also end the chunks with at most this many steps left, so envs ask for actions
    together (fewer round trips when episodes end at different steps; 0: never)."""
    group_size: int = 1
    """Consecutive envs form groups of this size that start every episode from the same seed and are reset together
    once all of them are done (GRPO-style); num_envs must be a multiple of it."""


@dataclasses.dataclass
class RecorderConfig:
    """What is recorded of the episodes, besides episodes.jsonl (names as PlugRL's client has them)."""

    episode_freq: int = 0
    """Record every K-th episode of each process, counted as episodes start (0: record nothing)."""
    thread0_only: bool = False
    """Record in process 0 only."""
    record_video: bool = False
    """An MP4 of each recorded episode's images (extra video)."""
    video_fps: int = 30
    record_full_rollout: bool = False
    """Every step's observation, action and reward of each recorded episode, as NPZ."""
    record_obs_stats: bool = False
    """Per-key statistics (min, max, mean, std) of each recorded episode's observations, as JSON lines."""
    record_episode_metrics: bool = False
    """Each recorded episode's return, length, success and metrics, as JSON lines."""
    metric_window: int = 100
    """Episodes the summaries' windowed means (mean_return, mean_success_rate) are taken over."""


@dataclasses.dataclass
class RayConfig:
    """Where and how --launcher ray places the processes (extra ray)."""

    address: str = "auto"
    """auto (a running cluster), ray://host:port, or local (start a private instance on this machine)."""
    num_cpus_per_proc: float = 1.0
    num_gpus_per_proc: float = 0.0
    resources: str = "{}"
    """Custom resources each process needs, as a JSON object, e.g. '{"sim": 1}'."""
    placement: Literal["spread", "pack"] = "spread"
    """spread: processes on as many nodes as possible; pack: on as few as possible."""
    max_restarts: int = 3
    """How often Ray restarts a process whose actor died (killed, node lost) before the run goes on without it."""


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
    local_policy: Literal["random", "zero", "text", "ars"] | None = None
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
    launcher: Literal["local", "ray"] = "local"
    """Where the processes run: local processes, or Ray actors on a cluster (extra ray)."""
    transport: Literal["websockets", "picows"] = "websockets"
    """The WebSocket implementation: websockets, or picows (extra fast; the same bytes, faster for large frames)."""
    runner: RunnerConfig = dataclasses.field(default_factory=RunnerConfig)
    recorder: RecorderConfig = dataclasses.field(default_factory=RecorderConfig)
    ray: RayConfig = dataclasses.field(default_factory=RayConfig)
    env: BaseEnvConfig = dataclasses.field(default_factory=BaseEnvConfig)

    def resolved_url(self) -> str:
        return self.server_url or f"ws://{self.server_host}:{self.server_port}"
