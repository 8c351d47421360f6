"""Every flag of the commands stays as users type it: the flag names (and what each takes) that ``--help`` lists.

Flag names are the public surface of the commands: scripts, docs and other people's launch files spell them. These
tests read them off ``--help`` of the installed commands and compare them with the list below, so a change in how
the config tree is put together (a section moved, a dataclass shared with the module it configures) cannot rename,
drop or retype one unnoticed. A flag that is added on purpose is added here.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

CLIENT_FLAGS = {
    "-h": "", "--help": "",
    "--num-envs": "INT", "--num-procs": "INT", "--num-episodes": "INT", "--exp-name": "STR",
    "--output-dir": "PATH", "--resume": "", "--no-resume": "", "--server-host": "STR", "--server-port": "INT", "--server-url": "[STR [STR ...]]",
    "--api-key": "STR", "--local-policy": "{random,zero,text,ars}", "--local-policy-choices": "[STR [STR ...]]",
    "--local-policy-horizon": "INT",
    "--reconnect-on-server-stop": "", "--no-reconnect-on-server-stop": "",
    "--max-reconnects": "INT", "--connect-timeout": "FLOAT", "--reconnect-timeout": "FLOAT",
    "--infer-timeout": "FLOAT",
    "--reuse-feedback-obs": "", "--no-reuse-feedback-obs": "", "--progress": "", "--no-progress": "",
    "--env-path": "STR", "--launcher": "{local,ray}", "--transport": "{websockets,picows}",
    "--image-codec": "{none,jpeg,qoi}", "--image-quality": "INT", "--protocol": "{plugrl,openpi}",
    "--openpi.preset": "{none,libero,droid,aloha}", "--openpi.key": "[STR [STR ...]]", "--openpi.image-size": "INT",
    "--openpi.connections": "INT",
    "--runner.seed": "INT", "--runner.max-episode-steps": "INT",
    "--env.max-episode-steps": "INT",  # PlugRL's spelling of the one above (accepted before it was listed)
    "--runner.replan-steps": "INT",
    "--runner.non-finite-actions": "{error,clip}", "--runner.non-finite-rewards": "{error,zero}",
    "--runner.non-finite-observations": "{error,allow}", "--runner.check-partial-reset": "{on,off}",
    "--runner.pass-proc-id": "", "--runner.no-pass-proc-id": "",
    "--runner.use-env-lock": "", "--runner.no-use-env-lock": "",
    "--runner.start-method": "{spawn,forkserver,fork}", "--runner.pipeline": "INT|{auto}",
    "--runner.episode-split": "{static,shared}", "--runner.instruction": "{prepend,off}",
    "--runner.align-chunks": "INT", "--runner.group-size": "INT", "--runner.start-seeds": "[INT [INT ...]]",
    "--recorder.episode-freq": "INT", "--recorder.thread0-only": "", "--recorder.no-thread0-only": "",
    "--recorder.record-video": "", "--recorder.no-record-video": "", "--recorder.video-fps": "FLOAT",
    "--recorder.record-full-rollout": "", "--recorder.no-record-full-rollout": "",
    "--recorder.record-obs-stats": "", "--recorder.no-record-obs-stats": "",
    "--recorder.record-episode-metrics": "", "--recorder.no-record-episode-metrics": "",
    "--recorder.metric-window": "INT",
    "--ray.address": "STR", "--ray.num-cpus-per-proc": "FLOAT", "--ray.num-gpus-per-proc": "FLOAT",
    "--ray.resources": "STR", "--ray.placement": "{spread,pack}", "--ray.max-restarts": "INT",
    "--env.step-size": "FLOAT", "--env.goal-radius": "FLOAT",
    "--version": "",  # answered before parsing by every command; listed since its help shows it
    "--tracking": "{none,tensorboard}",
    # the embedded policy's own options (--local-policy), as plugrl-run-policy-server has them
    "--policy.choices": "[STR [STR ...]]", "--policy.directions": "INT", "--policy.top-directions": "INT",
    "--policy.step-size": "FLOAT", "--policy.noise": "FLOAT", "--policy.save": "PATH", "--policy.load": "PATH",
    "--policy.eval": "", "--policy.no-eval": "",
}
"""``plugrl-run-env-client point-v1 --help``: the client's flags and Point-v1's ``--env.*`` ones."""

SERVER_FLAGS = {
    "-h": "", "--help": "", "--host": "STR", "--port": "INT", "--max-episodes": "INT", "--api-key": "STR",
    "--reuse-feedback-obs": "", "--no-reuse-feedback-obs": "", "--transport": "{websockets,picows}",
    "--image-codecs": "", "--no-image-codecs": "", "--max-image-pixels": "INT", "--protocol": "{plugrl,openpi}",
    "--openpi.preset": "{none,libero,droid,aloha}", "--openpi.key": "[STR [STR ...]]",
    "--policy.name": "{random,zero,text,ars}", "--policy.action-dim": "INT", "--policy.action-horizon": "INT",
    "--policy.dtype": "STR", "--policy.low": "FLOAT", "--policy.high": "FLOAT", "--policy.seed": "INT",
    "--policy.choices": "[STR [STR ...]]", "--policy.latency-ms": "FLOAT",
    "--policy.directions": "INT", "--policy.top-directions": "INT", "--policy.step-size": "FLOAT",
    "--policy.noise": "FLOAT", "--policy.save": "PATH", "--policy.load": "PATH", "--policy.eval": "",
    "--policy.no-eval": "", "--version": "",
    "--policy-path": "STR",  # a file registering a policy of one's own, imported before the parser is built
}
"""``plugrl-run-policy-server --help``."""

REPORT_FLAGS = {"-h": "", "--help": "", "--window": "K", "--open": "", "--no-open": "", "--version": ""}
"""``plugrl-report --help`` (besides its positional RUN_DIR)."""

_FLAG_CELL = re.compile(r"(?:^|│) (-{1,2}[\w.\-]+(?:[^│]*?))(?: {2}|│|$)", re.M)
"""A flag where a help line's cell starts: ``│ --a, --no-a``, ``│ --name METAVAR   help`` or, for a flag with an
alias, ``│ --alias METAVAR, --name METAVAR``; flags that help texts mention mid-sentence are indented and never
match."""


def listed_flags(help_text: str) -> dict[str, str]:
    """Flag -> its metavar ("" for a flag that takes no value) of every option a tyro ``--help`` lists."""
    flags: dict[str, str] = {}
    for match in _FLAG_CELL.finditer(help_text):
        for item in re.split(r", (?=-)", match.group(1).strip()):
            flag, _, metavar = item.partition(" ")
            flags[flag] = metavar.strip()
    return flags


def help_of(*command: str) -> str:
    """What ``command --help`` prints, on a terminal wide enough that no flag and metavar is wrapped."""
    script = ("import sys; from importlib.metadata import entry_points; "
              f"sys.argv[0] = {command[0]!r}; "
              f"entry_points(group='console_scripts')[{command[0]!r}].load()()")
    done = subprocess.run([sys.executable, "-c", script, *command[1:], "--help"], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "COLUMNS": "300"})
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.slow
@pytest.mark.parametrize("command,expected", [
    (("plugrl-run-env-client", "point-v1"), CLIENT_FLAGS),
    (("plugrl-run-policy-server",), SERVER_FLAGS),
    (("plugrl-report",), REPORT_FLAGS),
], ids=["client", "server", "report"])
def test_help_lists_every_flag_under_its_name(command: tuple[str, ...], expected: dict[str, str]) -> None:
    flags = listed_flags(help_of(*command))
    assert set(flags) - set(expected) == set(), "flags --help lists that nobody decided on"
    assert set(expected) - set(flags) == set(), "flags that users type and --help no longer lists"
    assert flags == expected


def test_flags_are_read_from_the_start_of_help_cells_only() -> None:
    text = ("│ --a INT                help that mentions --not-a-flag │\n"
            "│       wrapped text with --neither                       │\n"
            "│ --b, --no-b  help of b                                 ││ --c.d {x,y}       c │\n"
            "│ --e.f {None}|INT, --g.f {None}|INT                     │\n"
            "│ --h [STR [STR ...]]                                    │\n")
    assert listed_flags(text) == {"--a": "INT", "--b": "", "--no-b": "", "--c.d": "{x,y}", "--e.f": "{None}|INT",
                                  "--g.f": "{None}|INT", "--h": "[STR [STR ...]]"}
