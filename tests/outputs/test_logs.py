"""Log routing: the console handler never writes onto the progress bar's line; forwarded records keep their
process name and traceback."""

from __future__ import annotations

import io
import logging
import pickle
import sys
from typing import Any

from plugrl_env_client.outputs.logs import LOG_FORMAT, ConsoleHandler, ForwardHandler
from plugrl_env_client.outputs.progress import BAR_LINE


def test_a_warning_clears_the_bar_line_first() -> None:
    stream = io.StringIO()
    BAR_LINE.draw(stream, "[#####---] 5/8 episodes")
    handler = ConsoleHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s: %(message)s"))
    handler.emit(logging.LogRecord("x", logging.WARNING, __file__, 1, "reconnecting", None, None))
    text = stream.getvalue()
    bar_end = text.index("episodes") + len("episodes")
    # after the bar: a carriage return and blanks over it, then the message on a clean line
    assert text[bar_end:].startswith("\r" + " " * len("[#####---] 5/8 episodes") + "\rWARNING: reconnecting\n")
    assert BAR_LINE.width == 0, "the bar is redrawn on its next tick, not under the message"


class _ListQueue:
    """A queue with ``put`` only, as the launchers' queues are (``put_nowait`` would fail here)."""

    def __init__(self) -> None:
        self.items: list[Any] = []

    def put(self, item: Any) -> None:
        self.items.append(item)


def _crash_record() -> logging.LogRecord:
    try:
        raise ValueError("boom")
    except ValueError:
        return logging.LogRecord("plugrl_env_client.x", logging.ERROR, __file__, 1, "env %s crashed", ("P-v1",),
                                 sys.exc_info())


def test_forwarded_records_pickle_with_their_message_and_traceback() -> None:
    queue = _ListQueue()
    forward = ForwardHandler(queue)
    record = _crash_record()
    record.processName = "proc_001"
    forward.handle(record)
    back = pickle.loads(pickle.dumps(queue.items[0]))
    assert back.getMessage() == "env P-v1 crashed" and back.processName == "proc_001"
    assert "ValueError: boom" in back.exc_text and back.exc_info is None
    formatted = logging.Formatter("[%(processName)s] %(message)s").format(back)
    assert formatted.startswith("[proc_001] env P-v1 crashed") and "ValueError: boom" in formatted
    assert record.args == ("P-v1",) and record.exc_info is not None, "the caller's record is left as it was"


def test_a_forwarded_record_is_written_as_the_same_record_logged_here(tmp_path) -> None:
    """The launching process's file handler writes a forwarded record exactly as it writes the record itself (the
    process's name, the message, then the traceback)."""
    queue = _ListQueue()
    record = _crash_record()
    record.processName = "proc_002"
    ForwardHandler(queue).handle(record)
    formatter = logging.Formatter(LOG_FORMAT)
    direct = formatter.format(_copy(record))
    forwarded = formatter.format(pickle.loads(pickle.dumps(queue.items[0])))
    assert forwarded == direct
    assert "[proc_002] plugrl_env_client.x: env P-v1 crashed\nTraceback" in forwarded


def _copy(record: logging.LogRecord) -> logging.LogRecord:
    return logging.makeLogRecord(record.__dict__)


def test_logging_restored_gives_the_callers_logging_back(tmp_path):
    """A run started inside another (plugrl-check-env's rollout rule) logs to its own file; afterwards the outer run
    logs to its file again, and warnings are printed once."""
    import logging

    from plugrl_env_client.outputs.logs import logging_restored, setup_logging

    root = logging.getLogger()
    before = list(root.handlers)
    try:
        setup_logging(tmp_path / "a.log")
        outer = [h for h in root.handlers if h not in before]
        with logging_restored():
            setup_logging(tmp_path / "b.log")
            logging.getLogger("plugrl_env_client.test").warning("inner line")
        logging.getLogger("plugrl_env_client.test").warning("outer line")
        assert [h for h in root.handlers if h not in before] == outer
        assert "outer line" in (tmp_path / "a.log").read_text()
        assert "inner line" in (tmp_path / "b.log").read_text()
        assert "outer line" not in (tmp_path / "b.log").read_text()
    finally:
        for handler in [h for h in root.handlers if h not in before]:
            root.removeHandler(handler)
            handler.close()


def test_a_log_file_the_disk_cannot_take_stops_quietly_and_says_why(capsys):
    """A full disk used to print a ``--- Logging error ---`` block with a traceback for every record; the handler
    now stops at the first failed write and remembers why (/dev/full fails every write with ENOSPC)."""
    from pathlib import Path

    from plugrl_env_client.outputs.logs import RunLogHandler

    if not Path("/dev/full").exists():
        import pytest

        pytest.skip("no /dev/full here")
    handler = RunLogHandler(Path("/dev/full"))
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    logger = logging.getLogger("plugrl_env_client.test.full_log")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        for i in range(50):
            logger.warning("record %d", i)
    finally:
        logger.removeHandler(handler)
        logger.propagate = True
        handler.close()
    assert handler.failure == "No space left on device"
    assert "Logging error" not in capsys.readouterr().err


def test_a_record_that_cannot_be_formatted_is_still_reported_by_logging(tmp_path, capsys):
    """Only a failed write of the file stops the log; a bad record is logging's usual report, and the log goes on."""
    from plugrl_env_client.outputs.logs import RunLogHandler

    handler = RunLogHandler(tmp_path / "client.log")
    logger = logging.getLogger("plugrl_env_client.test.bad_record")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.warning("two %s %s", "args")  # one argument short
        logger.warning("after it")
    finally:
        logger.removeHandler(handler)
        logger.propagate = True
        handler.close()
    assert handler.failure is None and "Logging error" in capsys.readouterr().err
    assert "after it" in (tmp_path / "client.log").read_text()
