"""The command line's config tree of a client run: every field is a flag, each section owned by what it configures.

The sections are the dataclasses of the modules that read them, so a flag is declared once, next to its use, and
reaches it without being copied field by field:

* ``runner`` (``--runner.*``): :class:`~plugrl_env_client.launch.process.RunnerConfig`, the rollout loop's :class:`~plugrl_env_client.rollout.settings.LoopConfig`
  plus what the launcher reads (processes, pipeline groups, episode split);
* ``connection`` (flags without a prefix: ``--connect-timeout``, ``--max-reconnects``, ...): the session's
  :class:`~plugrl_env_client.connection_flags.ConnectionConfig` (the protocol takes its plain values);
* ``recorder`` (``--recorder.*``): :class:`~plugrl_env_client.outputs.recording.config.RecorderConfig`;
* ``ray`` (``--ray.*``): :class:`~plugrl_env_client.launch.config.RayConfig` (Ray itself is imported only by a
  run with ``--launcher ray``);
* ``env`` (``--env.*``): the env's own config dataclass, set per env by the CLI;
* ``local_policy_options`` (``--policy.*``): the own options of the policy ``--local-policy`` names, by field
  name; the client's command line (:mod:`plugrl_env_client.cli`) adds their flags from the registered policies.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import tyro

from plugrl_env_client.connection_flags import ConnectionConfig, OpenpiConfig
from plugrl_env_client.envs.base_env import BaseEnvConfig
from plugrl_env_client.errors import ConfigError
from plugrl_env_client.launch.config import RayConfig
from plugrl_env_client.launch.launchers import LAUNCHERS
from plugrl_env_client.launch.process import RunnerConfig
from plugrl_env_client.outputs.recording.config import RecorderConfig
from plugrl_env_client.outputs.tracking import TrackingKind
from plugrl_env_client.rollout.settings import LoopConfig
from plugrl_env_client.server.registry import get_spec, optional_name_choice

if TYPE_CHECKING:
    LauncherName = str
else:  # the launchers' names, as choices the command line lists and checks
    LauncherName = Literal[tuple(LAUNCHERS)]


@dataclasses.dataclass
class ClientConfig:
    num_envs: int = 1
    """Env copies stepped together by each process."""
    num_procs: int = 1
    """Processes, each with its own env batch and server connection."""
    num_episodes: Annotated[int | None, tyro.conf.arg(
        help_behavior_hint="(default: until the server ends the run)")] = None
    """Episodes to collect in total over all processes."""
    exp_name: Annotated[str | None, tyro.conf.arg(
        help_behavior_hint="(default: <env-id>-nenv<N>-<YYYYmmdd-HHMMSS>-<8 hex>)")] = None
    """Run folder name."""
    output_dir: Path = Path("runs")
    """Folder that holds the run folders."""
    resume: bool = False
    """Continue the stopped run --output-dir/--exp-name where it stopped (its episode lines count once, and it still
    ends at --num-episodes or after its --runner.start-seeds); the flags that decide its episodes must be its
    client_config.json's, and a finished run is left as it is."""
    server_host: str = "127.0.0.1"
    """Host of the policy server to connect to."""
    server_port: int = 8000
    """Port of the policy server to connect to."""
    server_url: Annotated[tuple[str, ...], tyro.conf.arg(
        help_behavior_hint="(default: ws://<server-host>:<server-port>)")] = ()
    """ws://host:port or wss://host:port; overrides --server-host/--server-port. Several (one replica per GPU):
    the processes and pipeline groups take them in turn, and with --protocol openpi each group spreads its
    connections over all of them."""
    local_policy: Annotated[str | None, tyro.conf.arg(
        constructor_factory=optional_name_choice, help_behavior_hint="(default: none: connect to the server URL)")] = None
    """Start the reference policy server in this process (matched to the env's action space) and use it; text is
    for envs whose single_action_space is a gymnasium Text space; ars learns a linear policy (Augmented Random
    Search) from the episodes' returns, for envs with a float Box action space and state arrays. A policy of your
    own (registered with @register_policy) is found in a file given as --env-path. Its own options are the
    --policy.<field> flags."""
    local_policy_choices: Annotated[tuple[str, ...], tyro.conf.arg(
        help_behavior_hint="(default: short strings made up from the Text space's characters)")] = ()
    """Strings --local-policy text answers with, one picked per env and step, e.g. --local-policy-choices
    "<answer>3</answer>" "hello" (the same as --policy.choices; a policy without that option ignores it)."""
    local_policy_horizon: Annotated[int | None, tyro.conf.arg(
        help_behavior_hint="(default: the policy's own: 1 for ars, 4 for the others)")] = None
    """Action horizon of the embedded policy (with --local-policy)."""
    transport: Literal["websockets", "picows"] = "websockets"
    """The WebSocket library of the embedded server (--local-policy): websockets, or picows (extra fast). The
    client always runs on the rollout's own thread (websockets' handshake, its own frames)."""
    progress: bool = True
    """Show progress (a bar on a terminal, periodic lines otherwise)."""
    env_path: Annotated[tuple[str, ...], tyro.conf.UseAppendAction] = ()
    """An env file (*_env.py) or a folder searched for them, imported before the env id is looked up (repeatable;
    also $PLUGRL_ENV_PATH, os.pathsep-separated)."""
    launcher: LauncherName = "local"
    """Where the processes run: local processes, or Ray actors on a cluster (extra ray)."""
    tracking: TrackingKind = "none"
    """Live tracking: tensorboard writes each episode's return, length and success, the env steps per second, the
    infer round-trip time and the reconnects to runs/<exp>/tensorboard/ as the run goes (extra tensorboard; watch
    with tensorboard --logdir runs)."""
    connection: Annotated[ConnectionConfig, tyro.conf.OmitArgPrefixes] = dataclasses.field(
        default_factory=ConnectionConfig)
    openpi: OpenpiConfig = dataclasses.field(default_factory=OpenpiConfig)
    runner: RunnerConfig = dataclasses.field(default_factory=RunnerConfig)
    recorder: RecorderConfig = dataclasses.field(default_factory=RecorderConfig)
    ray: RayConfig = dataclasses.field(default_factory=RayConfig)
    env: BaseEnvConfig = dataclasses.field(default_factory=BaseEnvConfig)
    local_policy_options: Annotated[dict[str, Any], tyro.conf.Suppress] = dataclasses.field(default_factory=dict)
    """The --local-policy policy's own options by field name (its --policy.<field> flags)."""

    def __post_init__(self) -> None:
        if isinstance(self.server_url, str):  # one URL given in code, as before several could be
            self.server_url = (self.server_url,)
        elif self.server_url is None:
            self.server_url = ()

    def resolved_urls(self) -> tuple[str, ...]:
        """The policy servers' URLs: --server-url, else the one of --server-host and --server-port."""
        return tuple(self.server_url) or (f"ws://{self.server_host}:{self.server_port}",)

    def embedded_options(self) -> dict[str, Any]:
        """The own options the embedded policy is built with: :attr:`local_policy_options`, and
        --local-policy-choices as the ``choices`` of a policy that has that option (the client's shorter spelling
        of --policy.choices; giving both is an error)."""
        options = dict(self.local_policy_options)
        if not self.local_policy_choices or self.local_policy is None:
            return options
        config = get_spec(self.local_policy).config
        if config is None or "choices" not in {f.name for f in dataclasses.fields(config)}:
            return options
        if options.get("choices"):
            raise ConfigError("--local-policy-choices and --policy.choices say the same; give one of them")
        return {**options, "choices": tuple(self.local_policy_choices)}

    def resolved_url(self) -> str:
        """The first policy server's URL."""
        return self.resolved_urls()[0]


__all__ = ["ClientConfig", "ConnectionConfig", "LoopConfig", "RayConfig", "RecorderConfig", "RunnerConfig"]
