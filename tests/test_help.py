"""Every ``--help`` reads well: each flag described by its field's docstring, no reST, no empty default, no line
broken mid-sentence, ``--version`` listed.

The helps are those of every command (``plugrl-run-env-client``, ``plugrl-check-env``, ``plugrl-run-policy-server``,
``plugrl-report``) and of every built-in env's subcommand of the two commands that take an env id, printed by one
child process (its registry holds the built-in envs only) on an 80-column terminal.

"Broken mid-sentence" is defined on the help as printed. tyro wraps a help text at the width of its column: it
moves a word to the next line only when it does not fit on the line it would end. So between two lines of one
help text, the break is a wrap when the first word of the second line (with the space before it) would have made
the first line too long; any other break is forced, and forced breaks are allowed only where the help text asks
for one: before a list item (``* ``, ``- ``, ``1. ``). A docstring's own line breaks, had they reached the help,
are such forced breaks (:func:`test_tyro_alone_breaks_indented_docstrings_where_their_lines_break` shows that
tyro alone lets them through, and that this check sees them).
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import importlib
import inspect
import io
import json
import os
import re
import subprocess
import sys
import textwrap
import typing
from collections.abc import Iterator
from typing import Annotated

import pytest
import tyro

from plugrl_env_client.check.cli import CheckArgs
from plugrl_env_client.cli_support import HELP_RULES, joined_help
from plugrl_env_client.config import ClientConfig
from plugrl_env_client.report.cli import ReportArgs
from plugrl_env_client.server.cli import ServerArgs

WIDTH = 80
LIST_ITEM = re.compile(r"^(?:[*\u2022-]|\d+[.)])\s")
ITEM = re.compile(r"^(.*?)(?:( {2,})(\S.*))?$")
"""An item's first line: its flags (``--a INT``, ``--b, --no-b``), a subcommand (``• name``) or a positional
argument (``RUN_DIR``), then its help text after two spaces or more when it starts on the same line."""
HINT = re.compile(r"\s*\((?:default: |repeatable|required|fixed)[^()]*(?:\([^()]*\)[^()]*)*\)$")
"""The behaviour hint tyro appends to a help text: ``(default: x)``, ``(repeatable)``, ``(required ...)``."""

HELPS_SCRIPT = r"""
import contextlib, io, json, os, sys
os.environ["COLUMNS"] = sys.argv[1]
from plugrl_env_client import cli, env_commands
from plugrl_env_client.check import cli as check_cli
from plugrl_env_client.envs.discovery import discover_envs
from plugrl_env_client.envs.registry import get_spec, registered_ids
from plugrl_env_client.report import cli as report_cli
from plugrl_env_client.server import cli as server_cli

discover_envs()
ids = [uid for uid in registered_ids() if get_spec(uid).module.startswith("plugrl_env_client.envs.")]
commands = {"plugrl-run-env-client": cli.main, "plugrl-check-env": check_cli.main,
            "plugrl-run-policy-server": server_cli.main, "plugrl-report": report_cli.main}
runs = [(name, []) for name in commands]
runs += [(name, [env_commands.subcommand_name(uid)]) for name in ("plugrl-run-env-client", "plugrl-check-env") for uid in ids]
configs = {uid: f"{get_spec(uid).config_cls.__module__}:{get_spec(uid).config_cls.__qualname__}" for uid in ids}
out = {"ids": ids, "configs": configs, "helps": {}}
for name, args in runs:
    buf = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")  # tyro draws its boxes for a UTF-8 stdout only
    sys.argv[0] = name
    with contextlib.redirect_stdout(buf):
        try:
            code = commands[name]([*args, "--help"])
        except SystemExit as exc:
            code = exc.code
    assert code in (0, None), (name, args, code)
    buf.flush()
    out["helps"][" ".join([name, *args])] = buf.buffer.getvalue().decode()
print(json.dumps(out))
"""


@dataclasses.dataclass
class Entry:
    """One item of a help panel: an option (its flags) or a subcommand, with its help text's lines."""

    head: str
    column: int = 0
    """Where the help text's lines start in the panel."""
    lines: list[str] = dataclasses.field(default_factory=list)
    """The help text's lines, ``""`` for a blank one."""
    plain: bool = False
    """A line of text in the panel, not an item (a description line, ``(required)``)."""

    @property
    def flags(self) -> list[str]:
        return [item.split(" ")[0] for item in re.split(r", (?=-)", self.head) if item.startswith("-")]

    @property
    def text(self) -> str:
        """The help text without tyro's behaviour hint, as one paragraph."""
        return HINT.sub("", " ".join(line for line in self.lines if line)).strip()


@dataclasses.dataclass
class Panel:
    title: str
    width: int
    description: list[str]
    entries: list[Entry]


def panels(help_text: str) -> list[Panel]:
    """The boxes of a tyro help (``╭─ title ─╮ ... ╰─╯``), read line by line."""
    out: list[Panel] = []
    panel: Panel | None = None
    for line in help_text.splitlines():
        if line.startswith("╭"):
            panel = Panel(line.strip("╭─╮ "), len(line) - 4, [], [])
            out.append(panel)
            continue
        if panel is None or not line.startswith("│"):
            panel = None if line.startswith("╰") else panel
            continue
        content = line[2:-2]
        if set(content.strip()) <= {"─"} and content.strip():  # the rule under a panel's description
            panel.description, panel.entries = [e.head for e in panel.entries], []
            continue
        stripped = content.rstrip().lstrip()
        indent = len(content) - len(content.lstrip())
        if _starts_item(stripped, indent):
            head, _, help_text = ITEM.match(stripped).groups()  # type: ignore[union-attr]
            entry = Entry(head.removeprefix("• "))
            if help_text:
                entry.column = indent + len(stripped) - len(help_text)
                entry.lines.append(help_text)
            panel.entries.append(entry)
        elif panel.entries and not panel.entries[-1].plain and (indent > 0 or not stripped):
            entry = panel.entries[-1]
            if stripped and not entry.column:
                entry.column = indent
            entry.lines.append(stripped)
        else:  # a description line (before the rule), or "(required)" above the subcommands
            panel.entries.append(Entry(stripped, plain=True))
    return out


def _starts_item(stripped: str, indent: int) -> bool:
    if stripped.startswith("• "):
        return True
    return indent == 0 and (stripped.startswith("-") or re.match(r"[A-Z_]+ {2,}\S", stripped) is not None)


def forced_breaks(lines: list[str], width: int) -> list[tuple[str, str]]:
    """Pairs of consecutive lines of one help text whose break is not a wrap (see the module docstring): the next
    line's first word would have fitted on the line before, with the space before it. (tyro also splits a word
    that does not fit at its commas, and goes on with the rest on the same line when it fits: so a break after such
    a split is also a break where the next word, with a space, would not have fitted.)"""
    out = []
    for a, b in zip(lines, lines[1:]):
        if not a or not b or LIST_ITEM.match(b):
            continue
        if len(a) + 1 + len(b.split(" ")[0]) <= width:
            out.append((a, b))
    return out


# ---------------------------------------------------------------------------------------------- what is expected


def field_docstrings(cls: type) -> dict[str, str]:
    """Field name -> docstring (the string right under the field), read from the source of ``cls`` and its bases
    with Python's parser: not tyro's reading of it, which is what is under test."""
    out: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        try:
            source = textwrap.dedent(inspect.getsource(klass))
        except (OSError, TypeError):
            continue  # made at run time (the CLI's per-env classes): their fields are their bases'
        body = ast.parse(source).body[0]
        assert isinstance(body, ast.ClassDef)
        for stmt, after in zip(body.body, body.body[1:]):
            if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and isinstance(after, ast.Expr)
                    and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str)):
                out[stmt.target.id] = inspect.cleandoc(after.value.value)
    return out


def flag_docstrings(cls: type, prefix: str = "") -> Iterator[tuple[str, str | None]]:
    """(flag, its field's docstring or None) of every field of the dataclass ``cls`` and of its sections."""
    hints = typing.get_type_hints(cls, include_extras=True)
    docs = field_docstrings(cls)
    for field in dataclasses.fields(cls):
        hint, markers = hints[field.name], ()
        if typing.get_origin(hint) is Annotated:
            hint, *markers = typing.get_args(hint)
        name = prefix + field.name.replace("_", "-")
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            yield from flag_docstrings(hint, prefix if tyro.conf.OmitArgPrefixes in markers else name + ".")
        else:
            yield "--" + name, docs.get(field.name)


def expected_docstrings(command: str) -> dict[str, str | None]:
    """Flag -> docstring of every field of ``command`` (``plugrl-run-env-client point-v1``)."""
    name, *env = command.split(" ")
    base = {"plugrl-run-env-client": ClientConfig, "plugrl-check-env": CheckArgs,
            "plugrl-run-policy-server": ServerArgs, "plugrl-report": ReportArgs}[name]
    flags = dict(flag_docstrings(base))
    if env:
        flags = {k: v for k, v in flags.items() if not k.startswith("--env.")}
        module, _, qualname = HELPS["configs"][HELPS["ids_by_name"][env[0]]].partition(":")
        flags.update(flag_docstrings(getattr(importlib.import_module(module), qualname), "env."))
    return flags


# ---------------------------------------------------------------------------------------------- the helps


def _helps() -> dict:
    done = subprocess.run([sys.executable, "-c", HELPS_SCRIPT, str(WIDTH)], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PLUGRL_ENV_PATH": ""})
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    out["ids_by_name"] = {uid.lower(): uid for uid in out["ids"]}
    return out


HELPS: dict = {}


@pytest.fixture(scope="module")
def helps() -> dict[str, str]:
    if not HELPS:
        HELPS.update(_helps())
    return HELPS["helps"]


@pytest.mark.slow
def test_every_command_and_env_subcommand_is_covered(helps: dict[str, str]) -> None:
    assert {"Point-v1", "Gym-v1", "MuJoCo-v1", "GEM-v1", "GuessNumber-v1", "Dummy-v1", "Probe-v1"} <= set(HELPS["ids"])
    for name in ("plugrl-run-env-client", "plugrl-check-env"):
        assert {f"{name} {uid.lower()}" for uid in HELPS["ids"]} <= set(helps)
    assert {"plugrl-run-policy-server", "plugrl-report"} <= set(helps)


@pytest.mark.slow
def test_every_flag_is_described_by_its_docstring(helps: dict[str, str]) -> None:
    problems = []
    for command, text in helps.items():
        if command in ("plugrl-run-env-client", "plugrl-check-env"):
            continue  # the lists of envs: no flags but --help
        expected = expected_docstrings(command)
        listed = set()
        for panel in panels(text):
            for entry in panel.entries:
                if not entry.flags:
                    continue
                listed.update(entry.flags)
                if not entry.text:
                    problems.append(f"{command}: {entry.head} has no description")
                    continue
                docs = {expected[f] for f in entry.flags if expected.get(f)}
                if docs and all("".join(entry.text.split()) != "".join(d.split()) for d in docs):
                    problems.append(f"{command}: {entry.head}: help {entry.text!r} is not its docstring {docs}")
        undocumented = sorted(f for f, doc in expected.items() if doc is None and f in listed)
        if undocumented:
            problems.append(f"{command}: fields without a docstring: {undocumented}")
        if "--version" not in listed:
            problems.append(f"{command}: --version is not listed")
    assert not problems, "\n".join(problems)


def test_no_help_breaks_a_line_mid_sentence(helps: dict[str, str]) -> None:
    problems = []
    for command, text in helps.items():
        for panel in panels(text):
            for entry in panel.entries:
                problems += [f"{command} [{panel.title}] {entry.head}: {a!r} / {b!r}"
                             for a, b in forced_breaks(entry.lines, panel.width - entry.column)]
            problems += [f"{command} [{panel.title}] description: {a!r} / {b!r}"
                         for a, b in forced_breaks(panel.description, panel.width)]
        description = text.split("\n\n", 1)[1].split("╭", 1)[0]  # between the usage and the first panel
        problems += [f"{command} description line {line!r} does not end a sentence"
                     for line in description.strip().splitlines() if line and not line.endswith(".")]
    assert not problems, "\n".join(problems)


def test_no_rest_markup_and_no_empty_default(helps: dict[str, str]) -> None:
    for command, text in helps.items():
        assert "``" not in text and ":class:" not in text and ":func:" not in text, command
        assert "(default: )" not in text, command


def test_a_flag_shows_its_default_once(helps: dict[str, str]) -> None:
    """A flag whose default tyro cannot show (the policy's own horizon, an environment variable, fresh entropy)
    says it in tyro's "(default: ...)" hint instead, never once in its text and once more as None."""
    for command, text in helps.items():
        for entry in [e for p in panels(text) for e in p.entries if e.flags]:
            whole = " ".join(line for line in entry.lines if line)
            assert len(re.findall(r"\(default: |Default: ", whole)) <= 1, (command, entry.head, whole)
            assert "(default: None)" not in whole and "['None']" not in whole, (command, entry.head, whole)
    horizon = _entry(helps["plugrl-run-policy-server"], "--policy.action-horizon")
    assert " ".join(horizon.lines).endswith("(default: 4; ars: 1)")
    key = _entry(helps["plugrl-run-policy-server"], "--api-key")
    assert " ".join(key.lines).endswith("(default: $PLUGRL_SERVER_API_KEY if set)")
    client_key = _entry(helps["plugrl-run-env-client point-v1"], "--api-key")
    assert " ".join(client_key.lines).endswith("(default: $PLUGRL_API_KEY if set)")


def test_optional_values_show_the_value_they_take(helps: dict[str, str]) -> None:
    """``int | None`` reads ``INT`` (the help says "(default: None)"), an optional choice lists its choices."""
    for command, text in helps.items():
        assert "{None}" not in text and "{None," not in text, command
    client = helps["plugrl-run-env-client point-v1"]
    assert _entry(client, "--num-episodes").head == "--num-episodes INT"
    assert _entry(client, "--connect-timeout").head == "--connect-timeout FLOAT"
    assert _entry(client, "--local-policy").head == "--local-policy {random,zero,text,ars}"


def _entry(help_text: str, flag: str) -> Entry:
    (entry,) = [e for p in panels(help_text) for e in p.entries if flag in e.flags]
    return entry


@pytest.mark.parametrize("command, args, words", [
    ("plugrl-run-env-client", ["point-v1", "--local-policy", "foo"],
     "Expected one of random, zero, text, ars, None."),
    ("plugrl-run-policy-server", ["--transport", "foo"], "Expected one of websockets, picows."),
])
def test_a_wrong_choice_lists_the_choices_in_plain_words(command, args, words) -> None:
    done = subprocess.run([command, *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 2
    assert words in done.stderr + done.stdout and "('" not in done.stderr + done.stdout


def test_optional_values_still_take_none_and_a_value() -> None:
    from plugrl_env_client.cli_support import cli
    from plugrl_env_client.config import ClientConfig

    parsed = cli(ClientConfig, ["--num-episodes", "None", "--local-policy", "None", "--local-policy-horizon", "3"],
                 "plugrl-run-env-client")
    assert parsed.num_episodes is None and parsed.local_policy is None and parsed.local_policy_horizon == 3
    parsed = cli(ClientConfig, ["--num-episodes", "7", "--local-policy", "ars"], "plugrl-run-env-client")
    assert parsed.num_episodes == 7 and parsed.local_policy == "ars"


def test_the_list_of_envs_shows_each_env_in_plain_words(helps: dict[str, str]) -> None:
    entries = {e.head.split(" ")[0]: e for p in panels(helps["plugrl-run-env-client"]) for e in p.entries}
    for uid in HELPS["ids"]:
        entry = entries[uid.lower()]
        assert entry.text.endswith("."), (uid, entry.text)
    assert entries["gem-v1"].text.startswith("Any GEM env")
    assert "--version" in helps["plugrl-run-env-client"]


# ---------------------------------------------------------------------------------------------- the checks themselves


@dataclasses.dataclass
class _Indented:
    """A section."""

    flag: int = 0
    """A help text written the way every field docstring of the package is: long enough to go on for a second
    line, which is indented like the first, and a third one, to show where the docstring's line breaks land."""


def _help_of(cls: type, registry: tyro.constructors.ConstructorRegistry | None,
             monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("COLUMNS", str(WIDTH))
    buf = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")  # tyro draws its boxes for a UTF-8 stdout only
    with contextlib.redirect_stdout(buf), pytest.raises(SystemExit):
        tyro.cli(cls, args=["--help"], registry=registry)
    buf.flush()
    return buf.buffer.getvalue().decode()


def test_tyro_alone_breaks_indented_docstrings_where_their_lines_break(monkeypatch: pytest.MonkeyPatch) -> None:
    (entry,) = [e for p in panels(_help_of(_Indented, None, monkeypatch)) for e in p.entries if e.flags
                and e.flags[0] == "--flag"]
    assert forced_breaks(entry.lines, WIDTH - 4 - entry.column), "tyro joined the lines by itself: this check is moot"
    (entry,) = [e for p in panels(_help_of(_Indented, HELP_RULES, monkeypatch)) for e in p.entries if e.flags
                and e.flags[0] == "--flag"]
    assert forced_breaks(entry.lines, WIDTH - 4 - entry.column) == []
    assert "".join(entry.text.split()) == "".join(field_docstrings(_Indented)["flag"].split())


def test_forced_breaks_tells_a_wrap_from_a_break() -> None:
    assert forced_breaks(["a b c", "d"], 5) == [], "'a b c d' is 7 wide: a wrap"
    assert forced_breaks(["a b", "c"], 5) == [("a b", "c")], "'a b c' fits in 5: forced"
    assert forced_breaks(["a b", "* c"], 5) == [], "a list item"
    assert forced_breaks(["(a,", "b)"], 5) == [], "'(a, b)' is 6 wide: a wrap (or the word (a,b) split at its comma)"
    assert forced_breaks(["x", "", "y"], 10) == [], "paragraphs"


def test_joined_help_joins_lines_and_keeps_paragraphs_and_list_items() -> None:
    text = "One line\n    and its continuation.\n\n  A second paragraph:\n  * an item\n    going on\n  - another"
    assert joined_help(text) == "One line and its continuation.\n\nA second paragraph:\n* an item going on\n- another"
    assert joined_help("  single  ") == "single"
