"""What a rollout process reports home: one small picklable message per kind, and the one way each is delivered.

A rollout reports to a :class:`~plugrl_env_client.rollout.interfaces.ResultSink`. In the launching process that is
the run's writer itself. Anywhere else (a spawned process, a Ray actor) it is a :class:`Reporter`, which turns
each call into a report and hands it to ``put`` (the launcher's queue, the actor's outbox); back home,
``report.deliver(writer)`` makes the very call on the writer. Both launchers deliver through it, so a report
means the same wherever it was made, and a new kind of report is one class here.

Log records travel the same way, as :class:`LogReport` (:class:`LogReporter` puts them), so a process's log lines
and its results arrive in the order they were made, through one pipe with one writer at its end.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

from plugrl_env_client.outputs.logs import ForwardHandler
from plugrl_env_client.records import EpisodeRecord, ProcessResult, ProcessStatus
from plugrl_env_client.rollout.interfaces import ResultSink
from plugrl_env_client.timing import Timing


@dataclasses.dataclass(frozen=True)
class EpisodeReport:
    """A finished episode."""

    record: EpisodeRecord

    def deliver(self, sink: ResultSink) -> None:
        sink.episode(self.record)


@dataclasses.dataclass(frozen=True)
class ProgressReport:
    """A process's latest timing and status."""

    process_id: int
    status: ProcessStatus
    timing: Timing

    def deliver(self, sink: ResultSink) -> None:
        sink.progress(self.process_id, self.status, self.timing)


@dataclasses.dataclass(frozen=True)
class ResultReport:
    """How a process ended (its last report)."""

    result: ProcessResult

    def deliver(self, sink: ResultSink) -> None:
        sink.result(self.result)


@dataclasses.dataclass(frozen=True)
class ArtifactReport:
    """A recorder file of a process: written whole, or appended to (one JSON line per report, so a process killed
    between two reports leaves whole lines)."""

    process_id: int
    relpath: str
    data: bytes
    append: bool = False

    def deliver(self, sink: ResultSink) -> None:
        files = sink.artifacts(self.process_id)
        (files.append_bytes if self.append else files.write_bytes)(self.relpath, self.data)


@dataclasses.dataclass(frozen=True)
class LogReport:
    """A log record of a process, made picklable by :class:`~plugrl_env_client.outputs.logs.ForwardHandler`."""

    record: logging.LogRecord

    def deliver(self, sink: ResultSink) -> None:
        """Written by this process's handlers, as if logged here (the record keeps its process's name)."""
        logging.getLogger(self.record.name).handle(self.record)


Report = EpisodeReport | ProgressReport | ResultReport | ArtifactReport | LogReport


class Reporter:
    """The :class:`~plugrl_env_client.rollout.interfaces.ResultSink` of a process away from the writer: each call
    is one report, handed to ``put`` (it may block: the report is on its way home when ``put`` returns)."""

    def __init__(self, put: Callable[[Report], Any]) -> None:
        self._put = put

    def episode(self, record: EpisodeRecord) -> None:
        self._put(EpisodeReport(record))

    def progress(self, process_id: int, status: ProcessStatus, timing: Timing) -> None:
        self._put(ProgressReport(process_id, status, timing))

    def result(self, result: ProcessResult) -> None:
        self._put(ResultReport(result))

    def artifacts(self, process_id: int) -> _ReportedFiles:
        return _ReportedFiles(self._put, process_id)


class _ReportedFiles:
    """A process's recorder files as reports (the recorder's sink interface, appending included)."""

    def __init__(self, put: Callable[[Report], Any], process_id: int) -> None:
        self._put, self._process_id = put, process_id

    def write_bytes(self, relpath: str, data: bytes) -> None:
        self._put(ArtifactReport(self._process_id, relpath, data))

    def append_bytes(self, relpath: str, data: bytes) -> None:
        self._put(ArtifactReport(self._process_id, relpath, data, append=True))


class LogReporter(ForwardHandler):
    """A process's log records as :class:`LogReport`, on the way home of its other reports (``queue.put``: the
    queue, or the outbox, its :class:`Reporter` puts to)."""

    def enqueue(self, record: Any) -> None:
        super().enqueue(LogReport(record))
