"""Where log lines go: everything to the run's ``logs/client.log``, warnings and errors to the console.

Only the launching process writes either. Spawned rollout processes forward their records home (through the same
queue as their results), so ``client.log`` has one writer and each line names its process, and console messages
go through the one handler that knows about the progress bar: a warning never lands on the bar's line.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from plugrl_env_client.outputs.progress import BAR_LINE

LOG_FORMAT = "%(asctime)s %(levelname)s [%(processName)s] %(name)s: %(message)s"
PACKAGE = "plugrl_env_client"


class ConsoleHandler(logging.StreamHandler):
    """stderr, after clearing the progress bar's line."""

    def emit(self, record: logging.LogRecord) -> None:
        with BAR_LINE.lock:
            BAR_LINE.clear(self.stream)
            super().emit(record)


class _Forward(logging.Handler):
    """Hands each record (made picklable: message formatted, traceback as text) to ``put``."""

    def __init__(self, put: Callable[[logging.LogRecord], Any]) -> None:
        super().__init__(logging.DEBUG)
        self._put = put

    def emit(self, record: logging.LogRecord) -> None:
        try:
            if record.exc_info:
                record.exc_text = logging.Formatter().formatException(record.exc_info)
            record.msg, record.args, record.exc_info = record.getMessage(), None, None
            self._put(record)
        except Exception:
            self.handleError(record)


_installed: list[logging.Handler] = []


def setup_logging(log_file: Path, console_level: int = logging.WARNING) -> None:
    """Everything (DEBUG and up for this package) to ``log_file``; warnings and errors to the console."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    file_handler = logging.FileHandler(log_file)
    file_handler.setFormatter(logging.Formatter(LOG_FORMAT))
    file_handler.setLevel(logging.DEBUG)
    console = ConsoleHandler()
    console.setFormatter(logging.Formatter("%(levelname)s: %(message)s"))
    console.setLevel(console_level)
    _install(file_handler, console)


def forward_logging(put: Callable[[logging.LogRecord], Any]) -> None:
    """In a spawned rollout process: send every record to the launching process instead of writing it here."""
    _install(_Forward(put))


def handle_forwarded(record: logging.LogRecord) -> None:
    """In the launching process: write a record a rollout process forwarded, through this process's handlers."""
    logging.getLogger(record.name).handle(record)


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
