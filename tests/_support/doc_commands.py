"""The commands of a Markdown file's ```bash blocks, and running them as a reader would, so tests keep docs true.

A doc stays true when its commands keep working. :func:`bash_blocks` finds every command of a Markdown file (with
the line it starts on), and :class:`DocShell` runs them in a scratch folder, changing only what a test must:

* the port ``8000`` becomes a free port of 127.0.0.1, the same one for every command of a shell; a server or a
  client that names no port (and so would use 8000) is given that one;
* client runs (``plugrl-run-env-client ...``, ``python -m plugrl_env_client ...``, and ``python some_file.py ...``,
  an env file run directly) get ``--output-dir <scratch>`` and ``--no-progress`` unless they set them, so their
  run folders land in the scratch folder and no progress bar is drawn; ``--help`` and ``--version`` runs do not;
* ``plugrl-run-policy-server`` (which a reader starts in a second terminal) is started in the background, waited
  for until its port accepts connections, and stopped with Ctrl-C (SIGINT) when its block is done;
* with a ``pip_target`` folder, ``pip install ...`` gets ``--target <folder> --no-deps`` on its command line, so it
  installs there and not into the running environment. On the command line, not as ``PIP_TARGET``: pip passes
  its environment on to the pip it runs to fill a build environment, and some versions (23.2, which
  ``python3 -m venv`` brings with Python 3.11) then refuse that install ("Cannot set --home and --prefix
  together");
* ``replace`` maps text of the doc to what it stands for here (``docs/examples`` -> a copy of that folder).

Conventions of the docs, which these helpers read:

* one command per line; a line that ends with ``\\`` continues on the next; lines that start with ``#`` are comments;
* a command that is meant to fail says so in a trailing comment: ``... # exits 1`` (the default is 0);
* ``cd`` and ``export`` lines carry over to the block's later commands and to later blocks, as in a terminal;
* a fenced block with the info string ``text output`` right after a ```bash block of one command is what that
  command prints on stdout.

Every process started here ends: foreground commands are killed (with their process group) after ``timeout_s``,
background ones when their block ends or the shell closes. Each command starts with SIGINT at its default action
(:func:`children.sigint_default`), so Ctrl-C stops a server even when the shell that started the tests ignores it
(``nohup pytest &``).
"""

from __future__ import annotations

import ast
import concurrent.futures as cf
import dataclasses
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO

from children import sigint_default

PORT_PLACEHOLDER = "8000"
"""The port the docs write; each shell runs them on a free one instead."""
CLIENT_PROGRAMS = ("plugrl-run-env-client",)
CLIENT_MODULES = ("plugrl_env_client", "plugrl_env_client.cli")
SERVER_PROGRAMS = ("plugrl-run-policy-server",)
PYTHONS = ("python", "python3")
PIPS = ("pip", "pip3")
NO_RUN_FLAGS = ("-h", "--help", "--version")
"""Flags that make a client print something and exit: such runs get no run folder flags."""
OUTPUT_INFO = "text output"
"""Info string of a fenced block that holds what the command of the ```bash block before it prints."""

_FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
_HTML_COMMENT = re.compile(r"^\s*<!--(?P<text>.*?)-->\s*$")
_EXITS = re.compile(r"\bexits?\s+(?:with\s+)?(?:code\s+)?(?P<code>\d+)\b")
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


# ================================================================================================ reading a doc


@dataclasses.dataclass(frozen=True)
class Fence:
    """One fenced code block of a Markdown file."""

    info: str
    """The info string after the opening fence (``bash``, ``python``, ``text output``)."""
    line: int
    """1-based line of the opening fence."""
    end_line: int
    """1-based line of the closing fence (the last line of the file when the block is never closed)."""
    body: str
    """The lines between the fences, each ending with a newline."""
    comment: str | None
    """The text of an HTML comment (``<!-- ... -->``) on the nearest non-blank line above the fence, stripped."""

    @property
    def language(self) -> str:
        return self.info.split()[0] if self.info.split() else ""


def fenced_blocks(path: Path) -> list[Fence]:
    """Every fenced code block of the Markdown file ``path``, in order."""
    lines = Path(path).read_text().splitlines()
    blocks: list[Fence] = []
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        fence, indent = opening["fence"], len(opening["indent"])
        body: list[str] = []
        j = i + 1
        while j < len(lines):
            closing = _FENCE.match(lines[j])
            if closing is not None and closing["fence"][0] == fence[0] and len(closing["fence"]) >= len(fence) \
                    and not closing["info"].strip():
                break
            line = lines[j]
            body.append(line[min(indent, len(line) - len(line.lstrip(" "))):])
            j += 1
        end_line = j + 1 if j < len(lines) else len(lines)
        blocks.append(Fence(opening["info"].strip(), i + 1, end_line, "".join(f"{b}\n" for b in body),
                            _comment_above(lines, i)))
        i = j + 1
    return blocks


def fence_marker(fence: Fence) -> tuple[str, str]:
    """The ``<!-- kind: path -->`` comment above a fence as (kind, path): ``file`` (the block is that whole file)
    or ``excerpt`` (consecutive lines of it); ("", "") without one."""
    kind, _, path = (fence.comment or "").partition(":")
    return kind.strip(), path.strip()


def code_block_problems(guide: Path, root: Path) -> tuple[set[str], list[str]]:
    """The files ``guide`` shows in full, and what is wrong with its code blocks: a ``file`` block that is not the
    file on disk, an ``excerpt`` that is not consecutive lines of its file, Python that does not parse, JSON that
    does not load."""
    shown: set[str] = set()
    problems: list[str] = []
    for fence in fenced_blocks(guide):
        kind, rel = fence_marker(fence)
        where = f"{guide.name}:{fence.line}"
        if kind == "file":
            shown.add(rel)
            if fence.body != (root / rel).read_text():
                problems.append(f"{where}: the block differs from {rel}")
        elif kind == "excerpt":
            lines, block = (root / rel).read_text().splitlines(), fence.body.splitlines()
            if not any(lines[i:i + len(block)] == block for i in range(len(lines) - len(block) + 1)):
                problems.append(f"{where}: the block is not consecutive lines of {rel}")
        elif fence.language == "python":
            try:
                ast.parse(textwrap.dedent(fence.body))
            except SyntaxError as exc:
                problems.append(f"{where}: {exc}")
        elif fence.language == "json":
            try:
                json.loads(fence.body)
            except ValueError as exc:
                problems.append(f"{where}: {exc}")
    return shown, problems


def _comment_above(lines: Sequence[str], index: int) -> str | None:
    for k in range(index - 1, -1, -1):
        if lines[k].strip():
            found = _HTML_COMMENT.match(lines[k])
            return found["text"].strip() if found else None
    return None


@dataclasses.dataclass(frozen=True)
class Command:
    """One command of a ```bash block, as written (continuation lines joined)."""

    path: Path
    line: int
    """1-based line of the command's first line in the Markdown file."""
    text: str
    expected_exit: int = 0
    """The exit code the doc says the command ends with (a trailing ``# exits N``), 0 by default."""
    output: str | None = None
    """What the doc shows the command printing (a ``text output`` block after its bash block), if anything."""

    @property
    def where(self) -> str:
        return f"{self.path.name}:{self.line}"

    def __str__(self) -> str:
        return f"{self.where}: {self.text}"


@dataclasses.dataclass(frozen=True)
class Block:
    """A ```bash block and its commands."""

    path: Path
    line: int
    commands: tuple[Command, ...]


def bash_blocks(path: Path) -> list[Block]:
    """The ```bash (or ```sh, ```shell, ```console) blocks of the Markdown file ``path`` with their commands."""
    path = Path(path)
    fences = fenced_blocks(path)
    blocks = []
    for k, fence in enumerate(fences):
        if fence.language not in ("bash", "sh", "shell", "console"):
            continue
        commands = _commands_of(path, fence)
        after = fences[k + 1] if k + 1 < len(fences) else None
        if after is not None and after.info == OUTPUT_INFO and len(commands) == 1 and _only_blank_between(
                path, fence.end_line, after.line):
            commands = [dataclasses.replace(commands[0], output=after.body)]
        blocks.append(Block(path, fence.line, tuple(commands)))
    return blocks


def commands(path: Path) -> Iterator[Command]:
    """Every command of the ```bash blocks of the Markdown file ``path``, in order."""
    for block in bash_blocks(path):
        yield from block.commands


def _only_blank_between(path: Path, end_line: int, next_line: int) -> bool:
    lines = path.read_text().splitlines()
    return all(not line.strip() for line in lines[end_line:next_line - 1])


def _commands_of(path: Path, fence: Fence) -> list[Command]:
    out: list[Command] = []
    pending: list[str] = []
    start = 0
    for offset, raw in enumerate(fence.body.splitlines()):
        line_number = fence.line + 1 + offset
        line = raw.rstrip()
        if not pending:
            if line.startswith("$ "):  # a prompt, as ```console blocks write it
                line = line[2:]
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            start = line_number
        if line.endswith("\\"):
            pending.append(line[:-1].rstrip())
            continue
        pending.append(line)
        text = " ".join(part.strip() for part in pending)
        pending = []
        comment = text[_scan(text).comment:]
        exits = _EXITS.search(comment)
        out.append(Command(path, start, text, int(exits["code"]) if exits else 0))
    if pending:
        raise ValueError(f"{path.name}:{start}: the command's last line ends with a backslash")
    return out


# ================================================================================================ parsing a command


@dataclasses.dataclass(frozen=True)
class _Scan:
    segments: list[tuple[int, int]]
    """(start, end) of each simple command, between ``&&``, ``||``, ``;``, ``|`` and ``&``."""
    comment: int
    """Where the trailing comment starts (the text's length when there is none)."""


def _scan(text: str) -> _Scan:
    """Split a command line into simple commands, outside quotes and parentheses, the way bash would."""
    segments: list[tuple[int, int]] = []
    quote = ""
    depth = 0
    start = i = 0
    while i < len(text):
        c = text[i]
        if quote:
            if c == "\\" and quote == '"':
                i += 2
                continue
            if c == quote:
                quote = ""
            i += 1
            continue
        if c == "\\":
            i += 2
            continue
        if c in "'\"":
            quote = c
        elif c == "(":
            depth += 1
        elif c == ")":
            depth = max(depth - 1, 0)
        elif c == "#" and (i == 0 or text[i - 1].isspace()) and depth == 0:
            segments.append((start, i))
            return _Scan([s for s in segments if text[s[0]:s[1]].strip()], i)
        elif depth == 0 and c in "&|;":
            redirect = c == "&" and ((i > 0 and text[i - 1] in "<>") or text[i + 1:i + 2] == ">")
            if not redirect:
                segments.append((start, i))
                i += 2 if text[i:i + 2] in ("&&", "||") else 1
                start = i
                continue
        i += 1
    segments.append((start, len(text)))
    return _Scan([s for s in segments if text[s[0]:s[1]].strip()], len(text))


def _words(segment: str) -> list[str]:
    """The words of a simple command after its leading ``NAME=value`` assignments (empty if none or unparsable)."""
    try:
        words = shlex.split(segment)
    except ValueError:
        return []
    while words and _ASSIGNMENT.match(words[0]):
        words.pop(0)
    return words


def _kind(segment: str) -> str:
    """``client``, ``server``, ``pip`` (``pip install``), ``state`` (cd, export, assignments alone) or ``other``."""
    words = _words(segment)
    if not words:
        return "state"
    program, args = os.path.basename(words[0]), words[1:]
    if program in ("cd", "export"):
        return "state"
    if program in PIPS and args[:1] == ["install"] or program in PYTHONS and args[:3] == ["-m", "pip", "install"]:
        return "pip"
    if any(a in NO_RUN_FLAGS for a in args):
        return "other"
    if program in SERVER_PROGRAMS:
        return "server"
    if program in CLIENT_PROGRAMS:
        return "client"
    if program in PYTHONS and args:
        if args[0].endswith(".py") or (args[0] == "-m" and len(args) > 1 and args[1] in CLIENT_MODULES):
            return "client"
    return "other"


@dataclasses.dataclass(frozen=True)
class Prepared:
    """A command as it runs: the script given to bash, and what kind of command it is."""

    command: Command
    script: str
    kind: str
    """``client``, ``server`` (run in the background), ``pip``, ``state`` (cd/export: carried over) or ``other``."""
    port: int | None = None
    """For a server: the port it listens on."""


# ================================================================================================ running


@dataclasses.dataclass
class Result:
    """How one command ended."""

    prepared: Prepared
    returncode: int | None
    """None when the command was killed after its timeout (or a server never came up)."""
    stdout: str
    stderr: str
    note: str = ""

    @property
    def command(self) -> Command:
        return self.prepared.command

    @property
    def ok(self) -> bool:
        """It ended with the exit code the doc says (and printed what the doc shows, if it shows anything)."""
        return self.returncode == self.command.expected_exit and self.output_matches

    @property
    def output_matches(self) -> bool:
        shown = self.command.output
        return shown is None or self.stdout.rstrip() == shown.rstrip()

    def describe(self, tail: int = 3000) -> str:
        """A report for a failed assertion: where, what ran, how it ended, and the end of what it printed."""
        lines = [f"{self.command.where}: {self.command.text}", f"  ran: {self.prepared.script.splitlines()[-1]}",
                 f"  exit code {self.returncode}, expected {self.command.expected_exit}" + (
                     f" ({self.note})" if self.note else "")]
        if not self.output_matches:
            lines.append("  the doc shows a different output:\n--- doc\n" + (self.command.output or "")
                         + "--- real\n" + self.stdout)
        lines.append("  stdout: " + self.stdout[-tail:])
        lines.append("  stderr: " + self.stderr[-tail:])
        return "\n".join(lines)


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclasses.dataclass
class _Background:
    prepared: Prepared
    process: subprocess.Popen[bytes]
    out: IO[bytes]
    err: IO[bytes]


class DocShell:
    """A terminal session for a doc's commands: one working folder, one port for ``8000``, ``cd`` and ``export``
    carried over, servers in the background.

    ``cwd`` is where commands run, ``runs`` where client runs write their run folders. ``env`` is added to the
    environment of every command (``PLUGRL_ENV_PATH`` and ``PLUGRL_API_KEY`` of the calling process are not passed
    on, and the running Python's ``bin`` folder comes first on ``PATH``, so ``python`` and the ``plugrl-*``
    commands are this installation's). ``pip_target``, when given, is where ``pip install`` commands install
    (without dependencies); putting it on the import path of the commands that use what they installed is the
    caller's part.
    """

    def __init__(self, cwd: Path, runs: Path, *, replace: Mapping[str, str] | None = None,
                 env: Mapping[str, str] | None = None, timeout_s: float = 120.0, port: int | None = None,
                 server_start_timeout_s: float = 60.0, pip_target: Path | None = None) -> None:
        self.cwd, self.runs = Path(cwd), Path(runs)
        self.pip_target = pip_target
        self.replace = dict(replace or {})
        self.port = port if port is not None else free_port()
        self.timeout_s = timeout_s
        self.server_start_timeout_s = server_start_timeout_s
        self.prelude: list[str] = []
        self.env = {k: v for k, v in os.environ.items() if k not in ("PLUGRL_ENV_PATH", "PLUGRL_API_KEY")}
        self.env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + self.env.get("PATH", "")
        self.env.update(env or {})
        self._background: list[_Background] = []
        self.cwd.mkdir(parents=True, exist_ok=True)

    # ---------------------------------------------------------------------------------------- preparing

    def prepare(self, command: Command) -> Prepared:
        """The script that runs ``command`` here: replacements, the port, and run folder flags for clients."""
        text = command.text
        for old, new in self.replace.items():
            text = text.replace(old, new)
        text = re.sub(rf"(?<!\d){PORT_PLACEHOLDER}(?!\d)", str(self.port), text)
        scan = _scan(text)
        kinds = [_kind(text[a:b]) for a, b in scan.segments]
        if "server" in kinds and len(kinds) > 1:
            raise ValueError(f"{command.where}: start plugrl-run-policy-server on a line of its own")
        for (a, b), kind in reversed(list(zip(scan.segments, kinds))):
            segment = text[a:b].rstrip()
            end = a + len(segment)
            if kind == "client":
                text = text[:end] + _client_flags(_words(segment), self.runs, self.port) + text[end:]
            elif kind == "pip" and self.pip_target is not None:
                text = text[:end] + f" --target {shlex.quote(str(self.pip_target))} --no-deps" + text[end:]
            elif kind == "server" and _server_port(_words(segment)) is None:
                text = text[:end] + f" --port {self.port}" + text[end:]
        kind = kinds[0] if len(kinds) == 1 else ("state" if kinds and all(k == "state" for k in kinds) else "other")
        port = None
        if kind == "server":
            first = _scan(text).segments[0]
            port = _server_port(_words(text[first[0]:first[1]]))
        return Prepared(command, "\n".join([*self.prelude, text]), kind, port)

    # ---------------------------------------------------------------------------------------- running

    def run(self, command: Command, env: Mapping[str, str] | None = None) -> Result:
        """Run ``command`` to its end, or start it in the background when it is a policy server."""
        prepared = self.prepare(command)
        if prepared.kind == "server":
            return self._start(prepared, env)
        result = self._run_foreground(prepared, env)
        if prepared.kind == "state" and result.returncode == 0:
            self.prelude.append(prepared.script.splitlines()[-1])
        return result

    def run_block(self, block: Block, env: Mapping[str, str] | None = None) -> list[Result]:
        """Every command of ``block`` in order, then its background servers stopped (their results come last)."""
        results = [self.run(command, env) for command in block.commands]
        return results + self.stop_background()

    def stop_background(self) -> list[Result]:
        """Stop every background server with SIGINT (SIGKILL if it does not end); how each ended."""
        results = []
        for bg in self._background:
            note = ""
            if bg.process.poll() is None:
                _signal_group(bg.process, signal.SIGINT)
                try:
                    bg.process.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    _signal_group(bg.process, signal.SIGKILL)
                    bg.process.wait()
                    note = "did not end on SIGINT; killed"
            else:
                note = "ended before its block did"
            results.append(Result(bg.prepared, bg.process.returncode if not note else None, _read(bg.out),
                                  _read(bg.err), note))
        self._background.clear()
        return results

    def close(self) -> None:
        self.stop_background()

    def __enter__(self) -> DocShell:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------------------------------- helpers

    def _environment(self, env: Mapping[str, str] | None) -> dict[str, str]:
        return {**self.env, **(env or {})}

    def _run_foreground(self, prepared: Prepared, env: Mapping[str, str] | None) -> Result:
        process = subprocess.Popen(sigint_default(["bash", "-c", prepared.script]), cwd=self.cwd,
                                   env=self._environment(env),
                                   stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   start_new_session=True)
        try:
            out, err = process.communicate(timeout=self.timeout_s)
            return Result(prepared, process.returncode, out.decode(errors="replace"), err.decode(errors="replace"))
        except subprocess.TimeoutExpired:
            _signal_group(process, signal.SIGKILL)
            out, err = process.communicate()
            return Result(prepared, None, out.decode(errors="replace"), err.decode(errors="replace"),
                          f"killed after {self.timeout_s:g} s")

    def _start(self, prepared: Prepared, env: Mapping[str, str] | None) -> Result:
        out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
        process = subprocess.Popen(sigint_default(["bash", "-c", prepared.script]), cwd=self.cwd,
                                   env=self._environment(env),
                                   stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True)
        bg = _Background(prepared, process, out, err)
        self._background.append(bg)
        assert prepared.port is not None
        deadline = time.monotonic() + self.server_start_timeout_s
        while time.monotonic() < deadline:
            if process.poll() is not None:
                self._background.remove(bg)
                return Result(prepared, None, _read(out), _read(err), f"ended with {process.returncode} at start")
            if _accepts(prepared.port):
                return Result(prepared, 0, "", "", "started in the background")
            time.sleep(0.05)
        self._background.remove(bg)
        _signal_group(process, signal.SIGKILL)
        process.wait()
        return Result(prepared, None, _read(out), _read(err),
                      f"no connection on port {prepared.port} within {self.server_start_timeout_s:g} s")


def _client_flags(words: list[str], runs: Path, port: int) -> str:
    """What a client run gets: a run folder in ``runs``, no progress bar, and the shell's port when it would use
    the default one (8000) of a server."""
    flags = ""
    if not _has_flag(words, "--output-dir"):
        flags += f" --output-dir {shlex.quote(str(runs))}"
    if not _has_flag(words, "--progress", "--no-progress"):
        flags += " --no-progress"
    if not _has_flag(words, "--server-port", "--server-url", "--local-policy"):
        flags += f" --server-port {port}"
    return flags


def _has_flag(words: list[str], *flags: str) -> bool:
    return any(w in flags or w.split("=", 1)[0] in flags for w in words)


def _server_port(words: list[str]) -> int | None:
    """The port a ``plugrl-run-policy-server`` command names (None: it names none, and would use 8000)."""
    for k, w in enumerate(words):
        if w == "--port" and k + 1 < len(words) and words[k + 1].isdigit():
            return int(words[k + 1])
        if w.startswith("--port=") and w[7:].isdigit():
            return int(w[7:])
    return None


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def _signal_group(process: subprocess.Popen[bytes], signum: int) -> None:
    try:
        os.killpg(process.pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _read(f: IO[bytes]) -> str:
    f.seek(0)
    text = f.read().decode(errors="replace")
    f.close()
    return text


# ================================================================================================ tables


def table_excerpts(path: Path, heading: str) -> list[tuple[int, str]]:
    """(line, excerpt) of every code span in the first column of the table under ``heading`` (a troubleshooting
    table quotes error messages there)."""
    lines = path.read_text().splitlines()
    start = lines.index(heading)
    rows = [(k + 1, line) for k, line in enumerate(lines) if k > start and line.startswith("|")]
    out = []
    for number, row in rows[2:]:  # after the header and its separator
        first = table_cells(row)[0]
        out += [(number, span) for span in code_spans(first)]
    return out


def check_quoted_messages(excerpts: list[tuple[int, str]], runs: Mapping[str, Callable[[], tuple[list[Result], str]]],
                          min_excerpt: int = 15) -> None:
    """A troubleshooting table against the runs meant to trigger its rows (each returns its results and everything
    it printed; four run at a time): every run ends as expected, every quoted excerpt is printed by some run, and
    every run prints some excerpt."""
    assert len(excerpts) >= len(runs)
    short = [e for _, e in excerpts if len(e) < min_excerpt]
    assert not short, f"excerpts too short to mean anything: {short}"
    with cf.ThreadPoolExecutor(max_workers=4) as pool:
        futures = {name: pool.submit(run) for name, run in runs.items()}
        done = {name: f.result() for name, f in futures.items()}
    failed = [r.describe() for results, _ in done.values() for r in results if not r.ok]
    assert not failed, "\n\n".join(failed)
    printed = {name: text for name, (_, text) in done.items()}
    never = [f"line {line}: {excerpt!r}" for line, excerpt in excerpts
             if not any(excerpt in text for text in printed.values())]
    assert not never, "the troubleshooting table quotes messages no run printed:\n" + "\n".join(never)
    unquoted = [name for name, text in printed.items() if not any(e in text for _, e in excerpts)]
    assert not unquoted, f"the table quotes nothing these runs print: {unquoted}"


def table_cells(row: str) -> list[str]:
    """The cells of a table row, split at the pipes outside code spans."""
    cells, current, i = [], "", 1 if row.startswith("|") else 0
    while i < len(row):
        ticks = re.match(r"`+", row[i:])
        if ticks:
            end = row.find(ticks.group(), i + len(ticks.group()))
            end = len(row) if end < 0 else end + len(ticks.group())
            current += row[i:end]
            i = end
            continue
        if row[i] == "|":
            cells.append(current.strip())
            current = ""
        else:
            current += row[i]
        i += 1
    if current.strip():
        cells.append(current.strip())
    return cells


def code_spans(text: str) -> list[str]:
    spans = []
    for m in re.finditer(r"(`+)(.+?)\1", text):
        content = m.group(2)
        if content.startswith(" ") and content.endswith(" ") and content.strip():
            content = content[1:-1]
        spans.append(content)
    return spans
