"""Where log lines go: everything to the run's ``logs/client.log``, warnings and errors to the console.

Only the launching process writes either. Rollout processes elsewhere (spawned, Ray actors) forward their records
home with a :class:`ForwardHandler` (a ``logging.handlers.QueueHandler``, on the way their results take), so
``client.log`` has one writer and each line names its process, and console messages go through the one handler that
knows about the progress bar: a warning never lands on the bar's line.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import logging.handlers
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from plugrl_env_client.outputs.progress import BAR_LINE
from plugrl_env_client.redaction import RedactingFormatter

LOG_FORMAT = "%(asctime)s %(levelname)s [%(processName)s] %(name)s: %(message)s"
PACKAGE = "plugrl_env_client"


class ConsoleHandler(logging.StreamHandler):
    """stderr, after clearing the progress bar's line."""

    def emit(self, record: logging.LogRecord) -> None:
        with BAR_LINE.lock:
            BAR_LINE.clear(self.stream)
            super().emit(record)


class RunLogHandler(logging.FileHandler):
    """``logs/client.log``: a record it cannot write (a full or read-only disk) ends its writing, silently.

    ``logging``'s own way, a ``--- Logging error ---`` block with a traceback on stderr for every record, would
    bury the one message that says what happened under hundreds; the run's writer names the folder's failure, and
    :attr:`failure` says why the log stops short.
    """

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.failure: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if self.failure is None:
            super().emit(record)

    def handleError(self, record: logging.LogRecord) -> None:  # logging's name
        exc = sys.exc_info()[1]
        if not isinstance(exc, OSError):
            super().handleError(record)  # a record that cannot be formatted: logging's usual report
            return
        self.stop(f"{exc.strerror or exc}")

    def stop(self, why: str) -> None:
        """Write nothing more (the space the log would take is needed elsewhere), and remember why."""
        if self.failure is None:
            self.failure = why
            with contextlib.suppress(OSError, ValueError):
                self.close()


class ForwardHandler(logging.handlers.QueueHandler):
    """In a rollout process away from the launcher: every record goes home through ``queue.put``, to be written
    there by the launcher's handlers as one of its own (named after this process).

    A record crosses pickled, so its message is formatted here (its arguments need not pickle) and its traceback kept
    as text beside it, where the launcher's formatters put tracebacks. ``put``, not the base class's
    ``put_nowait``: the launchers' queues (a ``multiprocessing.SimpleQueue``, an actor's outbox) have ``put``, and a
    line is on its way when the call returns.
    """

    def __init__(self, queue: Any) -> None:
        super().__init__(queue)
        self.setLevel(logging.DEBUG)
        self._put = queue.put

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        record = copy.copy(record)  # the caller's record stays as it was for any other handler
        if record.exc_info:
            record.exc_text = _TRACEBACKS.formatException(record.exc_info)
        record.msg, record.args, record.exc_info = record.getMessage(), None, None
        return record

    def enqueue(self, record: Any) -> None:
        self._put(record)


_TRACEBACKS = logging.Formatter()
_installed: list[logging.Handler] = []


def setup_logging(log_file: Path, console_level: int = logging.WARNING) -> None:
    """Everything (DEBUG and up for this package) to ``log_file``; warnings and errors to the console."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    file_handler = RunLogHandler(log_file)
    file_handler.setFormatter(RedactingFormatter(LOG_FORMAT))
    file_handler.setLevel(logging.DEBUG)
    console = ConsoleHandler()
    console.setFormatter(RedactingFormatter("%(levelname)s: %(message)s"))
    console.setLevel(console_level)
    _install(file_handler, console)


def run_log() -> RunLogHandler | None:
    """The run's log file handler, when :func:`setup_logging` installed one."""
    return next((h for h in _installed if isinstance(h, RunLogHandler)), None)


def stop_file_logging(why: str) -> None:
    """Write no more to the run's log file (its folder can take no more)."""
    handler = run_log()
    if handler is not None:
        handler.stop(why)


def forward_logging(handler: ForwardHandler) -> None:
    """In a rollout process away from the launcher: every record goes home through ``handler`` instead of being
    written here."""
    _install(handler)


@contextlib.contextmanager
def logging_restored() -> Iterator[None]:
    """Run a block that may set logging up for a run of its own (a run started by ``plugrl-check-env``, or from
    another program) and give the caller's logging back afterwards: its handlers stay open and in place, and what
    the block installed is closed."""
    root, package = logging.getLogger(), logging.getLogger(PACKAGE)
    handlers, levels, installed = list(root.handlers), (root.level, package.level), list(_installed)
    _installed.clear()  # the block's setup must not close the caller's handlers
    try:
        yield
    finally:
        for handler in list(root.handlers):
            if handler not in handlers:
                root.removeHandler(handler)
                handler.close()
        for handler in handlers:
            if handler not in root.handlers:
                root.addHandler(handler)
        _installed[:] = installed
        root.setLevel(levels[0])
        package.setLevel(levels[1])


def _install(*handlers: logging.Handler) -> None:
    root = logging.getLogger()
    for old in _installed:
        root.removeHandler(old)
        old.close()
    _installed[:] = handlers
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(logging.INFO)
    logging.getLogger(PACKAGE).setLevel(logging.DEBUG)
