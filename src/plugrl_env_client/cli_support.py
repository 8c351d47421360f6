"""How every ``plugrl-*`` command ends: the same messages and exit codes, whichever command it is.

* 0 when the command did its job (``--help`` and ``--version`` included);
* 1 on an error the user can fix (a :class:`~plugrl_env_client.errors.PlugRLError`): one line on stderr,
  ``error: <what was wrong and what to do>``, and no traceback;
* 2 on a command line the parser refuses (tyro prints why and the usage);
* 128 + the signal's number when interrupted before the command had anything to write (130 for Ctrl-C);
* a closed pipe (``--help | head``, ``plugrl-run-env-client ... | head -1``) ends quietly, and the command
  goes on to its end and exits with its own code: a run's exit code follows the run, never the terminal;
* a thread left running (an env's simulator worker nobody stops) does not keep a finished command alive: the
  interpreter waits :data:`EXIT_GRACE_S` for the threads still running when it ends, then one warning names them and
  the process ends with the command's code (:func:`end_despite_threads`).

The commands' own modules use it (the client's ``cli.py``, ``server/cli.py``, ``report/cli.py``, ``check/cli.py``),
so none of them imports another command's front. So do their parsers, for what every ``--help`` shares:

* :data:`HELP_RULES`, the tyro registry every command parses with: a field's help is its docstring joined into
  paragraphs. tyro 1.0 joins a docstring's lines only where the next line starts with a letter, and it looks at the
  lines before taking their indentation off, so every continuation line of an indented field docstring (all of
  them, in a dataclass) would start a new line of the help, mid-sentence;
* :func:`with_version_flag`, which lists ``--version`` among a command's options (:func:`exit_code` answers it
  before any parser runs, so it works on every command line, and the parsed field is never read).
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import logging
import os
import re
import signal
import sys
import threading
import time
import types
import typing
from collections.abc import Callable, Sequence
from typing import Annotated, Any, NoReturn, TextIO, TypeVar

import tyro
from tyro.constructors import (
    ConstructorRegistry,
    PrimitiveConstructorSpec,
    PrimitiveTypeInfo,
    StructConstructorSpec,
    StructFieldSpec,
    StructTypeInfo,
)

from plugrl_env_client.errors import PlugRLError
from plugrl_env_client.redaction import redact_text
from plugrl_env_client.version import __version__

logger = logging.getLogger(__name__)

EXIT_GRACE_S = 2.0
"""How long a process that is ending waits for the non-daemon threads still running before it ends without them."""

C = TypeVar("C")

VERSION_FLAG = "--version"
VERSION_HELP = "Print the version of plugrl-env-client and exit."


def exit_code(body: Callable[[], int], args: Sequence[str] | None = None) -> int:
    """Run a command's ``body`` (which returns its exit code) and return the exit code the command ends with."""
    if "--version" in (sys.argv[1:] if args is None else args):
        print(f"plugrl-env-client {__version__}")
        return 0
    streams = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _guarded(sys.stdout), _guarded(sys.stderr)
    try:
        try:
            code = body()
        except PlugRLError as exc:
            print(f"error: {redact_text(str(exc))}", file=sys.stderr)
            code = 1
        except KeyboardInterrupt as exc:  # before the command had anything to write
            print("interrupted", file=sys.stderr)
            code = 128 + getattr(exc, "signum", signal.SIGINT)
        except SystemExit as exc:  # tyro after --help or a usage error
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        sys.stdout.flush()
    except BrokenPipeError:
        # A write that went around the guards (to a stream saved before the command started): the reader went away,
        # silence the interpreter's own flush at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        code = 0
    finally:
        sys.stdout, sys.stderr = streams
    return code


def _guarded(stream: TextIO | None) -> Any:
    return None if stream is None else _ClosedPipeGuard(stream)


class _ClosedPipeGuard:
    """A text stream that, once its reader has gone (a closed pipe: ``| head``), sends what follows to /dev/null
    instead of raising ``BrokenPipeError``: the command still writes its outputs and ends with its own exit code.
    Everything else is the wrapped stream's."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return int(self._stream.write(text))
        except BrokenPipeError:
            self._silence()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._silence()

    def _silence(self) -> None:
        """Point the stream's file descriptor at /dev/null: what is still buffered, and the interpreter's own flush
        at exit, go nowhere."""
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, self._stream.fileno())
        finally:
            os.close(devnull)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def run_cli(body: Callable[[], int], args: Sequence[str] | None = None) -> NoReturn:
    """Run a command's ``body`` and exit with the code :func:`exit_code` gives, whatever threads it left running."""
    before = set(threading.enumerate())
    code = exit_code(body, args)
    end_despite_threads(code, [t for t in lingering_threads() if t not in before])
    sys.exit(code)


def lingering_threads() -> list[threading.Thread]:
    """The non-daemon threads still running besides the main thread: the ones the interpreter waits for at exit."""
    main = threading.main_thread()
    return [t for t in threading.enumerate() if t is not main and not t.daemon and t.is_alive()]


def end_despite_threads(code: int, threads: Sequence[threading.Thread] | None = None,
                        grace_s: float = EXIT_GRACE_S) -> None:
    """Make sure this process ends with ``code`` once its main thread has, even if ``threads`` (default: every
    :func:`lingering_threads`) never end. Call it when the outputs are written, just before exiting.

    Without threads left, nothing changes. Otherwise a daemon watchdog waits for the main thread to end (the
    interpreter ends it, and then waits for its non-daemon threads, before its ``atexit`` functions run), gives the
    threads ``grace_s`` more, and if some are still running warns once, naming them, flushes the log and the standard
    streams and ends the process with ``code`` (``os._exit``: nothing else is left to write). A process whose main
    thread goes on (a test calling a command's ``main()``) is left alone for as long as it does.
    """
    threads = lingering_threads() if threads is None else [t for t in threads if t.is_alive()]
    if not threads:
        return
    threading.Thread(target=_end_after_main, args=(code, threads, grace_s), name="plugrl-exit-watchdog",
                     daemon=True).start()


def _end_after_main(code: int, threads: Sequence[threading.Thread], grace_s: float) -> None:
    threading.main_thread().join()  # the interpreter is ending: it waits for the non-daemon threads now
    deadline = time.monotonic() + grace_s
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    left = [t for t in threads if t.is_alive()]
    if not left:
        return
    logger.warning("threads still running at exit: %s; the outputs are written, so the process ends without them "
                   "(a thread an env starts should be a daemon thread, or end in the env's close())",
                   ", ".join(repr(t.name) for t in left))
    gc.collect()  # what the run no longer holds lets go of its resources now (multiprocessing's semaphores, files)
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed or broken: nothing more can reach it
            pass
    os._exit(code)


# ---------------------------------------------------------------------------------------------------- help


HELP_RULES = ConstructorRegistry()
"""The registry every command's parser is given (``tyro.cli(..., registry=HELP_RULES)``): dataclasses are built as
tyro builds them, with each field's help text passed through :func:`joined_help`."""

_LIST_ITEM = re.compile(r"^(?:[*\u2022-]|\d+[.)])\s")
_inside_rule = threading.local()


@HELP_RULES.struct_rule
def _dataclass_with_joined_help(info: StructTypeInfo) -> StructConstructorSpec | None:
    """tyro's own spec of a dataclass (asked for again, with this rule standing aside), its help texts joined."""
    if getattr(_inside_rule, "active", False) or not dataclasses.is_dataclass(info.type):
        return None
    _inside_rule.active = True
    try:
        spec = ConstructorRegistry.get_struct_spec(info)
    finally:
        _inside_rule.active = False
    if not isinstance(spec, StructConstructorSpec):
        return None
    return dataclasses.replace(spec, fields=tuple(_with_joined_help(f) for f in spec.fields))


def _with_joined_help(field: StructFieldSpec) -> StructFieldSpec:
    helptext = field.helptext
    if helptext is None:
        return field
    if callable(helptext):  # tyro reads docstrings lazily, when a help text is shown: so does this
        return dataclasses.replace(field, helptext=functools.partial(_join_lazily, helptext))
    return dataclasses.replace(field, helptext=joined_help(helptext))


def _join_lazily(helptext: Callable[[], str | None]) -> str | None:
    text = helptext()
    return None if text is None else joined_help(text)


class Choices(tuple[str, ...]):
    """A flag's choices, shown in tyro's "invalid choice" error as a plain list (``random, zero, text``) rather
    than a Python tuple."""

    def __str__(self) -> str:
        return ", ".join(self)


@HELP_RULES.primitive_rule
def _readable_choices_and_optionals(info: PrimitiveTypeInfo) -> PrimitiveConstructorSpec | None:
    """tyro's own spec of a flag's type (asked for again, with this rule standing aside), made readable:

    * its choices, in the order the type lists them, as :class:`Choices`;
    * for an optional value (``int | None``), the metavar of the value alone (``INT``, not ``{None}|INT``): the help
      says "(default: None)", and ``None`` is still accepted.
    """
    if getattr(_inside_rule, "primitive", False):
        return None
    _inside_rule.primitive = True
    try:
        spec = ConstructorRegistry.get_primitive_spec(info)
    finally:
        _inside_rule.primitive = False
    if not isinstance(spec, PrimitiveConstructorSpec):
        return None
    members = typing.get_args(info.type) if info.type_origin in (typing.Union, types.UnionType) else ()
    optional = type(None) in members and len(members) > 1
    changes: dict[str, Any] = {}
    if spec.choices is not None:
        listed = [str(v) for m in (members or (info.type,)) for v in _literal_values(m)]
        changes["choices"] = Choices([c for c in listed if c in spec.choices]
                                     + [c for c in spec.choices if c not in listed])
    if optional and isinstance(spec.metavar, str):
        if spec.metavar.startswith("{None}|"):  # int | None: {None}|INT
            changes["metavar"] = spec.metavar.removeprefix("{None}|")
        elif spec.metavar.startswith("{None,"):  # Literal[...] | None: {None,a,b}
            changes["metavar"] = "{" + spec.metavar.removeprefix("{None,")
    return dataclasses.replace(spec, **changes) if changes else None


def _literal_values(tp: Any) -> tuple[Any, ...]:
    if tp is type(None):
        return (None,)
    return typing.get_args(tp) if typing.get_origin(tp) is typing.Literal else ()


def joined_help(text: str) -> str:
    """A docstring as help: its lines joined with single spaces into paragraphs (a blank line ends one), a line that
    starts a list item (``* ``, ``- ``, ``1. ``) kept on a line of its own."""
    paragraphs = []
    for paragraph in re.split(r"\n\s*\n", text.strip()):
        lines: list[str] = []
        for line in (raw.strip() for raw in paragraph.splitlines()):
            if not line:
                continue
            if lines and not _LIST_ITEM.match(line):
                lines[-1] += " " + line
            else:
                lines.append(line)
        if lines:
            paragraphs.append("\n".join(lines))
    return "\n\n".join(paragraphs)


def with_version_flag(cls: type[C]) -> type[C]:
    """The dataclass ``cls`` with one more field, ``version``, so that ``--help`` lists ``--version`` with the other
    options (tyro has no option that is not a field). :func:`exit_code` answers ``--version`` before parsing, so
    the field's value is never read; instances are ``cls`` instances like any other."""
    flag = Annotated[bool, tyro.conf.FlagCreatePairsOff, tyro.conf.arg(help=VERSION_HELP, help_behavior_hint="")]
    made = dataclasses.make_dataclass(cls.__name__, [("version", flag, dataclasses.field(default=False))],
                                      bases=(cls,))
    made.__doc__ = cls.__doc__
    return made


def cli(cls: type[C], args: Sequence[str] | None, prog: str, **kwargs: Any) -> C:
    """``tyro.cli`` of a command: ``cls``'s fields and ``--version`` as its options, help by :data:`HELP_RULES`."""
    return tyro.cli(with_version_flag(cls), args=args, prog=prog, registry=HELP_RULES, **kwargs)
