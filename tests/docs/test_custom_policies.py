"""docs/custom-policies.md stays true: its example is the file on disk, its code parses, and every message of its
troubleshooting table comes out of a real run of plugrl-run-policy-server or, for --local-policy, of
plugrl-run-env-client."""

from __future__ import annotations

import concurrent.futures as cf
import os
import subprocess
import sys
from pathlib import Path

import pytest
from doc_commands import code_block_problems, table_excerpts

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "custom-policies.md"
EXAMPLE = "docs/examples/constant_policy.py"
SERVER = [sys.executable, "-c", "from plugrl_env_client.server.cli import main; main()"]
CLIENT = [sys.executable, "-m", "plugrl_env_client"]


def test_code_blocks_are_the_files_on_disk_and_parse() -> None:
    shown, problems = code_block_problems(GUIDE, ROOT)
    assert not problems, "\n".join(problems)
    assert EXAMPLE in shown


def _run(args: list[str], cwd: Path) -> tuple[int, str]:
    command = [*CLIENT, *args] if args[0] == "point-v1" else [*SERVER, *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=cwd,
                          env={**os.environ, "COLUMNS": "300"})
    return done.returncode, done.stdout + done.stderr


@pytest.mark.slow
def test_troubleshooting_messages_are_real(tmp_path: Path) -> None:
    (tmp_path / "empty_policy.py").write_text("VALUE = 1\n")
    (tmp_path / "my_policy.py").write_text("import os\n\nimport my_model_lib\n\nfrom plugrl_env_client.server "
                                            "import register_policy\n")
    (tmp_path / "clash_policy.py").write_text(
        "from plugrl_env_client.server import register_policy\n"
        "from plugrl_env_client.server.policies import ZeroPolicy\n\n\n"
        "@register_policy('random')\nclass Mine(ZeroPolicy):\n    pass\n")
    example = str(ROOT / EXAMPLE)
    runs = {  # what each run is meant to trigger -> (its arguments, its exit code)
        "unknown name": (["--policy.name", "constant"], 2),
        "no such file": (["--policy-path", "nope.py"], 1),
        "registers nothing": (["--policy-path", "empty_policy.py"], 1),
        "fails to import": (["--policy-path", "my_policy.py"], 1),
        "fails to import (client)": (["point-v1", "--env-path", "my_policy.py", "--local-policy", "my"], 2),
        "flag of another policy (client)": (["point-v1", "--env-path", example, "--local-policy", "random",
                                             "--policy.value", "0.3"], 1),
        "flag of another policy": (["--policy-path", example, "--policy.value", "0.3"], 1),
        "name clash": (["--policy-path", "clash_policy.py"], 1),
    }
    with cf.ThreadPoolExecutor(max_workers=3) as pool:
        done = dict(zip(runs, pool.map(lambda args: _run(args, tmp_path), [a for a, _ in runs.values()])))
    wrong = {name: done[name] for name, (_, code) in runs.items() if done[name][0] != code}
    assert not wrong, wrong
    printed = {name: text for name, (_, text) in done.items()}
    excerpts = table_excerpts(GUIDE, "## 5. Troubleshooting")
    never = [excerpt for _, excerpt in excerpts if not any(excerpt in text for text in printed.values())]
    assert not never, f"the table quotes messages no run printed: {never}\n{printed}"
    unquoted = [name for name, text in printed.items() if not any(e in text for _, e in excerpts)]
    assert not unquoted, f"the table quotes nothing these runs print: {unquoted}"
