"""docs/language-agents.md stays true: its commands run, its outputs and error messages are real, its code is on disk.

* Every command of the guide's ```bash blocks runs, in order and in one scratch folder, as a reader following the
  guide would, and ends with the exit code the guide says; an output the guide shows is the real one, and no run
  needs the server to resync. A JSON block marked ``<!-- a line of: <file> -->`` is a line of that file of the
  reader's runs (``wall_time_s`` aside, which no two runs share).
* Every message excerpt of the troubleshooting table comes out of a real run: one small broken env, or one command,
  per problem. An excerpt no run produces fails, and so does a run whose message the table lost.
* Code blocks marked as a file (``<!-- file: path -->``) are that file, blocks marked as an excerpt are consecutive
  lines of it, and the example env of the guide, docs/examples/riddle_env.py, behaves as the guide says.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
from doc_commands import (
    Command,
    DocShell,
    Result,
    bash_blocks,
    check_quoted_messages,
    code_block_problems,
    fenced_blocks,
    table_excerpts,
)
from file_modules import imported

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "language-agents.md"
EXAMPLES = ROOT / "docs" / "examples"
RIDDLE = EXAMPLES / "riddle_env.py"
OWN_EXAMPLES = ("docs/examples/riddle_env.py",)
"""The example files this guide owns; each is shown in full."""
TROUBLESHOOTING = "## 6. Troubleshooting"
MIN_EXCERPT = 15
"""Shorter excerpts would be found in almost any output."""
RESYNC_SIGNS = ("protocol violation", "reconnecting to")
"""What a run prints when the server had to resync it: none of the guide's runs may."""
LINE_OF = "a line of:"
"""The marker of a JSON block that shows a line of a file the guide's runs write."""

gem_installed = importlib.util.find_spec("gem") is not None
needs_gem = pytest.mark.skipif(not gem_installed, reason="the guide runs GEM-v1: needs the gem extra")


# ================================================================================================ the commands


@pytest.mark.slow
@needs_gem
def test_every_command_of_the_guide_runs(tmp_path: Path) -> None:
    examples = tmp_path / "examples"  # a copy: running the example writes __pycache__ next to it
    shutil.copytree(EXAMPLES, examples, ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
    work = tmp_path / "work"
    blocks = bash_blocks(GUIDE)
    results: list[Result] = []
    # runs/ of the working folder, as for a reader (the client's default --output-dir), so the guide can read them
    with DocShell(work, work / "runs", replace={"docs/examples": str(examples)}) as shell:
        for block in blocks:
            results += shell.run_block(block)
    failures = [r.describe() for r in results if not r.ok]
    assert not failures, "\n\n".join(failures)
    assert {r.command for r in results} == {c for b in blocks for c in b.commands}
    resynced = [r.describe() for r in results if any(s in r.stdout + r.stderr for s in RESYNC_SIGNS)]
    assert not resynced, "runs the server had to resync:\n" + "\n\n".join(resynced)
    clients = [r.command.text for r in results if r.prepared.kind == "client"]
    runs = list((work / "runs").glob("*/summary.json"))
    assert len(runs) == len(clients) >= 10, (sorted(p.parent.name for p in runs), clients)
    shown = lines_shown(GUIDE)
    assert shown, f"{GUIDE.name} shows no line of a run's file ({LINE_OF!r} marker)"
    for where, rel, row in shown:
        path = work / rel
        assert path.exists(), f"{where}: the guide's runs wrote no {rel}"
        real = [json.loads(line) for line in path.read_text().splitlines()]
        assert isinstance(row.get("wall_time_s"), float), f"{where}: a line of episodes.jsonl has a wall_time_s"
        assert _without_time(row) in [_without_time(r) for r in real], (
            f"{where}: no line of {rel} is the one shown (wall_time_s aside); the file holds:\n"
            + "\n".join(json.dumps(r) for r in real))


def _without_time(row: dict) -> dict:
    return {k: v for k, v in row.items() if k != "wall_time_s"}


def lines_shown(guide: Path) -> list[tuple[str, str, dict]]:
    """(where, file, parsed JSON) of every block marked ``<!-- a line of: file -->``."""
    out = []
    for fence in fenced_blocks(guide):
        comment = fence.comment or ""
        if comment.startswith(LINE_OF):
            out.append((f"{guide.name}:{fence.line}", comment[len(LINE_OF):].strip(), json.loads(fence.body)))
    return out


def test_the_guide_shows_every_way_to_run_a_text_env() -> None:
    commands = [c for b in bash_blocks(GUIDE) for c in b.commands]
    ran = "\n".join(c.text for c in commands)
    for needed in ("plugrl-run-env-client guessnumber-v1", "--local-policy text", "--local-policy-choices",
                   "--local-policy-horizon 1", "plugrl-run-policy-server --port 8000 --policy.name text",
                   "--server-port 8000", "python docs/examples/riddle_env.py riddle-v1",
                   "plugrl-check-env riddle-v1 --env-path docs/examples/riddle_env.py", "--recorder.episode-freq 1",
                   "--runner.instruction off", "--runner.group-size 4", "--exp-name group-a", "--exp-name group-b",
                   "gem-v1 --env.env-id game:GuessTheNumber-v0-easy", "--env.env-kwargs",
                   "--env.max-concurrent 4 --env.rng-isolation reset", "SeedSequence(0, spawn_key=(0, 0, 0))"):
        assert needed in ran, needed
    # the two runs compared are the same command but for their names
    pair = [c.text for c in commands if "--exp-name group-" in c.text]
    assert len(pair) == 2 and pair[0].replace("group-a", "group-b") == pair[1]
    outputs = [c for c in commands if c.output is not None]
    assert len(outputs) >= 8
    assert not [c.text for c in commands if c.expected_exit != 0], "every command of this guide succeeds"


# ================================================================================================ the troubleshooting table

GUESS_SUBCLASS = '''\
import numpy as np

from plugrl_env_client.envs.guess_number.guess_number_env import GuessNumberConfig, GuessNumberEnv
from plugrl_env_client.utils.registration import register_env


@register_env("My-v1", config=GuessNumberConfig)
class MyEnv(GuessNumberEnv):
'''
"""GuessNumber-v1 under another id; each broken env below overrides one method of it."""

STEP_OVERRIDE = GUESS_SUBCLASS + '''\
    def step(self, actions):
        obs, reward, terminated, truncated, info = super().step(actions)
        {body}
        return obs, reward, terminated, truncated, info
'''

RUN = ("plugrl-run-env-client my-v1 --env-path my_env.py --num-envs 2 --num-episodes 2 --local-policy text "
       "--local-policy-choices '<answer>50</answer>' 'no idea'")
GEM_RUN = "plugrl-run-env-client gem-v1 --num-episodes 1 --local-policy text"

NO_GEM = '''\
"""Python as on a machine without gem-llm: importing gem fails the way it does when the package is missing."""
import sys


class _NoGem:
    def find_spec(self, name, path=None, target=None):
        if name == "gem" or name.startswith("gem."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, _NoGem())
'''


@dataclasses.dataclass(frozen=True)
class Trigger:
    """A run that makes the client (or server) print one troubleshooting message: ``files`` are written to its
    folder, ``commands`` run there; the last one ends with ``exit_code``. ``direct`` runs the commands in the
    foreground even when they start a server (one that is meant to stop at once)."""

    name: str
    commands: tuple[str, ...] = (RUN,)
    files: tuple[tuple[str, str], ...] = ()
    exit_code: int = 1
    env: tuple[tuple[str, str], ...] = ()
    direct: bool = False


def _step(body: str) -> tuple[tuple[str, str], ...]:
    return (("my_env.py", STEP_OVERRIDE.format(body=body)),)


TRIGGERS = (
    Trigger("unknown aggregation mode", files=_step('info["metrics_agg_mode"]["turns"] = "final"')),
    Trigger("aggregation mode that changes",
            files=_step('info["metrics_agg_mode"]["turns"] = "max" if self.turns.max() > 1 else "last"')),
    Trigger("text among the metrics", files=_step('info["metrics"]["reply"] = np.asarray(actions, dtype=str)')),
    Trigger("one instruction too many", files=(("my_env.py", GUESS_SUBCLASS + '''\
    def reset(self, *, seed=None, options=None):
        obs, info = super().reset(seed=seed, options=options)
        info["env_instruction"] = ["rules for env 0", "rules for env 1", "rules for nobody"]
        return obs, info
'''),)),
    Trigger("random policy for a text env",
            ("plugrl-run-env-client guessnumber-v1 --num-episodes 1 --local-policy random",)),
    Trigger("text policy for a numeric env", ("plugrl-run-env-client point-v1 --num-episodes 1 --local-policy text",)),
    Trigger("text policy server without choices", ("plugrl-run-policy-server --port 8000 --policy.name text",),
            exit_code=1, direct=True),
    Trigger("numeric server for a text env", (
        "plugrl-run-policy-server --port 8000",
        "plugrl-run-env-client guessnumber-v1 --num-episodes 1 --server-port 8000",
    )),
    Trigger("text server for a numeric env", (
        "plugrl-run-policy-server --port 8000 --policy.name text --policy.choices hello",
        "plugrl-run-env-client point-v1 --num-episodes 1 --server-port 8000",
    )),
    Trigger("group size that does not divide the envs",
            ("plugrl-run-env-client guessnumber-v1 --num-envs 6 --runner.group-size 4 --num-episodes 1 "
             "--local-policy text",)),
    Trigger("seed groups for an env without per-env seeds",
            ("plugrl-run-env-client riddle-v1 --env-path riddle_env.py --num-envs 2 --runner.group-size 2 "
             "--num-episodes 1 --local-policy text",),
            files=(("riddle_env.py", RIDDLE.read_text()),)),
    Trigger("env kwargs that are not JSON", (GEM_RUN + " --env.env-kwargs '{max_turns: 5}'",)),
    Trigger("env kwargs that are not an object", (GEM_RUN + " --env.env-kwargs '[5]'",)),
    Trigger("unknown GEM id", (GEM_RUN + " --env.env-id game:GuessTheNumber-v0-eazy",)),
    Trigger("gem not installed", (GEM_RUN,), files=(("nogem/sitecustomize.py", NO_GEM),),
            env=(("PYTHONPATH", "nogem"),)),
    Trigger("threads with RNG isolation", (GEM_RUN + " --env.max-concurrent 4",)),
    Trigger("threads and a lock", (GEM_RUN + " --env.max-concurrent 4 --env.rng-isolation off --env.use-thread-lock",)),
    Trigger("empty range", ("plugrl-run-env-client guessnumber-v1 --env.low 10 --env.high 1 --num-episodes 1 "
                            "--local-policy text",)),
)


def run_trigger(trigger: Trigger, folder: Path) -> tuple[list[Result], str]:
    """Run ``trigger`` in ``folder``; its results and everything it printed."""
    folder.mkdir(parents=True)
    for name, text in trigger.files:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    env = {k: str(folder / v) if k == "PYTHONPATH" else v for k, v in trigger.env}
    commands = [Command(Path(trigger.name), k + 1, text, trigger.exit_code if k == len(trigger.commands) - 1 else 0)
                for k, text in enumerate(trigger.commands)]
    with DocShell(folder, folder / "runs", timeout_s=120, env=env) as shell:
        results = []
        for command in commands:
            if trigger.direct:
                prepared = shell.prepare(command)
                done = subprocess.run(["bash", "-c", prepared.script], cwd=folder, env=shell.env, capture_output=True,
                                      text=True, timeout=120, stdin=subprocess.DEVNULL)
                results.append(Result(prepared, done.returncode, done.stdout, done.stderr))
            else:
                results.append(shell.run(command))
        results += shell.stop_background()
    return results, "\n".join(r.stdout + r.stderr for r in results)


@pytest.mark.slow
@needs_gem
def test_every_troubleshooting_message_is_real(tmp_path: Path) -> None:
    runs = {t.name: functools.partial(run_trigger, t, tmp_path / f"t{k:02d}") for k, t in enumerate(TRIGGERS)}
    check_quoted_messages(table_excerpts(GUIDE, TROUBLESHOOTING), runs, MIN_EXCERPT)


def test_the_troubleshooting_table_is_found() -> None:
    assert [e for _, e in table_excerpts(GUIDE, TROUBLESHOOTING)][0].startswith("info['metrics_agg_mode']")


# ================================================================================================ code on disk


def test_code_blocks_are_the_files_on_disk() -> None:
    shown, problems = code_block_problems(GUIDE, ROOT)
    assert not problems, "\n".join(problems)
    assert set(OWN_EXAMPLES) <= shown, f"example files the guide does not show in full: {set(OWN_EXAMPLES) - shown}"


# ================================================================================================ the example env


@pytest.fixture
def riddle(registry: None) -> Iterator[ModuleType]:
    """docs/examples/riddle_env.py imported as a module (its registration is undone by ``registry``)."""
    with imported(RIDDLE, "riddle_env_under_test") as module:
        yield module


def test_riddle_reads_the_last_answer_tag(riddle: ModuleType) -> None:
    assert riddle.parse_answer("It is <answer> A Clock </answer>.") == "a clock"
    assert riddle.parse_answer("<answer>towel</answer> no wait, <ANSWER>piano</Answer>") == "piano"
    assert riddle.parse_answer("<answer>two\nlines</answer>") == "two\nlines"
    assert riddle.parse_answer("a clock") is None
    assert riddle.parse_answer("<answer>clock") is None


def test_riddle_deals_each_riddle_once_then_retires_the_env(riddle: ModuleType) -> None:
    env = riddle.RiddleEnv(riddle.RiddleConfig(), num_envs=4)
    obs, info = env.reset(seed=0)
    first = list(info["env_instruction"])
    assert len(set(first)) == 4 and all(i.startswith(riddle.RULES) for i in first)
    assert not info["no_episode"].any() and obs.text.tolist() == ["You have 3 attempts."] * 4
    asked = {i[len(riddle.RULES):] for i in first}
    mask = np.array([True, True, True, False])  # three envs ask for the two riddles left
    obs, info = env.reset(options={"reset_mask": mask, "reset_indices": np.flatnonzero(mask)})
    np.testing.assert_array_equal(info["no_episode"], [False, False, True, False])
    asked |= {info["env_instruction"][i][len(riddle.RULES):] for i in (0, 1)}
    assert asked == {q for q, _ in riddle.RIDDLES}  # every riddle once
    assert info["env_instruction"][2] == "" and obs.text[2] == ""
    assert info["env_instruction"][3] == first[3]  # not reset: its riddle stays
    again = riddle.RiddleEnv(riddle.RiddleConfig(), num_envs=4).reset(seed=0)[1]["env_instruction"]
    assert list(again) == first  # the seed decides the deck
    other = riddle.RiddleEnv(riddle.RiddleConfig(), num_envs=4).reset(seed=1)[1]["env_instruction"]
    assert list(other) != first


def test_riddle_rewards_format_penalty_and_its_own_timeout(riddle: ModuleType) -> None:
    env = riddle.RiddleEnv(riddle.RiddleConfig(attempts=2, format_penalty=-0.25), num_envs=3)
    env.reset(seed=0)
    words = [riddle.RIDDLES[r][1] for r in env.riddle.tolist()]
    replies = np.array([f"I think it is <answer>a {words[0]}</answer>", "<answer>nothing</answer>", "no tags"])
    obs, reward, terminated, truncated, info = env.step(replies)
    np.testing.assert_allclose(reward, [1.0, 0.0, -0.25])
    np.testing.assert_array_equal(terminated, [True, False, False])
    assert not truncated.any() and reward.dtype == np.float32
    np.testing.assert_array_equal(info["action_is_valid"], [True, True, False])
    np.testing.assert_array_equal(info["metrics"]["format_errors"], [0, 0, 1])
    assert obs.text[0] == "Right!" and obs.text[1] == "'nothing' is not it. Attempts left: 1."
    assert set(info["metrics_agg_mode"]) == set(info["metrics"])
    assert set(info["metrics_agg_mode"].values()) <= {"sum", "mean", "min", "max", "first", "last"}
    obs, reward, terminated, truncated, info = env.step(np.array(["", "<answer>still nothing</answer>", "x"]))
    # env 0's episode is over (the client would have reset it); envs 1 and 2 used their last attempt
    np.testing.assert_array_equal(terminated[1:], [True, True])
    np.testing.assert_array_equal(truncated[1:], [True, True])
    np.testing.assert_array_equal(info["metrics"]["attempts"][1:], [2, 2])


def test_riddle_leaves_retired_rows_alone(riddle: ModuleType) -> None:
    env = riddle.RiddleEnv(riddle.RiddleConfig(), num_envs=2)
    env.reset(seed=0)
    env.deck.clear()  # nothing left to deal
    obs, info = env.reset(options={"reset_mask": np.array([False, True]), "reset_indices": np.array([1])})
    np.testing.assert_array_equal(info["no_episode"], [False, True])
    obs, reward, terminated, truncated, info = env.step(np.array(["<answer>x</answer>", ""]))
    assert obs.text[1] == "" and reward[1] == 0.0 and not terminated[1] and not truncated[1]
    assert not info["action_is_valid"][1] and info["metrics"]["format_errors"][1] == 0
    assert info["metrics"]["attempts"].tolist() == [1, 0]
