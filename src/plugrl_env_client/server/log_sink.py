"""Where ``plugrl-run-policy-server`` writes its log lines: through a bounded queue, so that a slow sink never stops
serving.

The server logs from its event loop. Written there directly, a line to a stderr that nobody drains (a pipe under a
supervisor that reads it late, or never) blocks the loop in ``write`` once the pipe is full, and then no client is
served again. Here the loop only puts each record on a queue (a ``logging.handlers.QueueHandler``) and a thread of
its own writes them (a ``QueueListener``), so only that thread waits for the sink. The queue holds at most
:data:`LOG_QUEUE_LINES` records: when the sink falls that far behind, further records are dropped and counted, and
the next record that fits is preceded by one warning saying how many were lost; memory stays bounded whatever the
sink does.
"""

from __future__ import annotations

import logging
import logging.handlers
import queue
import sys
import threading
import time
from typing import IO, Any

from plugrl_env_client.redaction import RedactingFormatter

LOG_QUEUE_LINES = 1000
"""Records waiting for a slow sink beyond which new ones are dropped (and counted)."""
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
STOP_TIMEOUT_S = 2.0
"""How long stopping waits for the records still queued to be written (a sink that takes longer loses them)."""


class DroppingQueueHandler(logging.handlers.QueueHandler):
    """A ``QueueHandler`` that never waits: a record that finds the queue full is dropped and counted, and the next
    one that fits is preceded by a warning with the count."""

    def __init__(self, q: queue.Queue[Any]) -> None:
        super().__init__(q)
        self._queue = q
        self.dropped = 0
        """Records dropped so far (the queue was full)."""
        self._unreported = 0
        self._lock_drops = threading.Lock()

    def enqueue(self, record: logging.LogRecord) -> None:
        with self._lock_drops:
            if self._unreported:
                try:
                    self.queue.put_nowait(self._notice())
                except queue.Full:
                    self._drop()
                    return
                self._unreported = 0
            try:
                self.queue.put_nowait(record)
            except queue.Full:
                self._drop()

    def report_drops(self) -> None:
        """Queue the count of the drops not yet reported, waiting for room as long as it takes (the last records
        before the end may all have been dropped, with no later record to carry their count)."""
        with self._lock_drops:
            if self._unreported:
                self._queue.put(self._notice())
                self._unreported = 0

    def _notice(self) -> logging.LogRecord:
        return self.prepare(logging.LogRecord(
            __name__, logging.WARNING, __file__, 0, "%d log lines were dropped: the log sink (stderr) is not read "
            "as fast as the server writes (the server kept serving)", (self._unreported,), None))

    def _drop(self) -> None:
        self.dropped += 1
        self._unreported += 1


class ServerLog:
    """The server process's logging, from :meth:`start` to :meth:`stop`: the root logger's records go through a
    :class:`DroppingQueueHandler` to a thread that writes them to ``stream`` (default: stderr) as ``LOG_FORMAT``
    lines."""

    def __init__(self, stream: IO[str] | None = None, level: int = logging.INFO,
                 capacity: int = LOG_QUEUE_LINES) -> None:
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=capacity)
        self.handler = DroppingQueueHandler(self._queue)
        sink = logging.StreamHandler(sys.stderr if stream is None else stream)
        sink.setFormatter(RedactingFormatter(LOG_FORMAT))
        self._listener = logging.handlers.QueueListener(self._queue, sink)
        self._level = level
        self._stopper: threading.Thread | None = None

    def start(self) -> ServerLog:
        root = logging.getLogger()
        root.addHandler(self.handler)
        root.setLevel(self._level)
        self._listener.start()
        return self

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> bool:
        """Detach from the root logger and write what is queued, waiting at most ``timeout`` seconds for the sink;
        True when everything queued was written. Idempotent."""
        logging.getLogger().removeHandler(self.handler)
        if self._stopper is not None:
            return not self._stopper.is_alive()
        # QueueListener.stop waits for its thread without a bound (and its sentinel needs room in the queue): run
        # it in a daemon thread, so a sink that never drains costs this wait and no more.
        stopper = self._stopper = threading.Thread(target=self._stop_listener, name="plugrl-log-stop", daemon=True)
        stopper.start()
        stopper.join(timeout)
        return not stopper.is_alive()

    def _stop_listener(self) -> None:
        self.handler.report_drops()
        while True:
            try:
                self._listener.stop()
                return
            except queue.Full:  # the sentinel found no room: the sink is behind, wait for it to take some
                time.sleep(0.05)

    def __enter__(self) -> ServerLog:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
