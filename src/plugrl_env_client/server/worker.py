"""The server's policy calls, off its event loop: one worker thread runs them, one at a time, in order.

A model's forward pass can take tens of milliseconds; run on the event loop it would stall every connection, their
pings included. :class:`PolicyWorker` takes every call of the policy that serves a client (a connection's start
and end, infer, feedback) on the loop and runs it in its own thread (a policy that says it is fast,
``off_loop`` False, is called on the loop instead); the caller awaits the result while the loop goes on serving the other
connections. One thread, so a policy is never called from two threads at once and needs no lock of its own.

A policy whose :attr:`~plugrl_env_client.server.policies.Policy.batches` is True answers the infers of every
connection waiting at one moment in one :meth:`~plugrl_env_client.server.policies.Policy.infer_batch` call: the
calls that came in while the previous one ran are taken together (a GPU server's batching across clients). With
``gather_s``, an infer that finds no call running waits for the others of its burst: requests that come in less
than ``gather_s`` apart join it (openpi's protocol sends one request per env, so a client's env group arrives as a
burst of requests a few microseconds apart), for at most ``gather_max_s`` (:data:`GATHER_MAX_S`) in all.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from plugrl_env_client.server.policies import InferCall, Policy

logger = logging.getLogger(__name__)

GATHER_MAX_S = 0.005
"""The longest an infer waits for the rest of its burst (with ``gather_s``)."""
CLOSE_TIMEOUT_S = 5.0
"""How long :meth:`PolicyWorker.close` waits for a policy call that is still running."""


class _Job:
    """One call: ``run()`` in the worker, its outcome set on the caller's future through its loop (None: nobody
    waits for it, errors are logged)."""

    __slots__ = ("fn", "args", "infer", "loop", "future")

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...], infer: InferCall | None,
                 loop: asyncio.AbstractEventLoop | None, future: asyncio.Future[Any] | None) -> None:
        self.fn, self.args, self.infer, self.loop, self.future = fn, args, infer, loop, future

    def settle(self, result: Any = None, error: BaseException | None = None) -> None:
        if self.loop is None or self.future is None:
            if error is not None:
                logger.error("internal error in the policy", exc_info=error)
            return
        try:
            self.loop.call_soon_threadsafe(_settle, self.future, result, error)
        except RuntimeError:  # the loop is closed: nobody waits any more
            pass


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():  # the waiting task was cancelled meanwhile
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class PolicyWorker:
    """Runs the calls of ``policy`` (the policy the server serves) in one daemon thread, started on first use."""

    def __init__(self, policy: Policy, gather_s: float = 0.0, gather_max_s: float = GATHER_MAX_S) -> None:
        self.policy = policy
        self.gather_s, self.gather_max_s = gather_s, gather_max_s
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._closed = False

    @property
    def pending(self) -> int:
        """Calls submitted and not started yet (approximate while the worker runs)."""
        return self._jobs.qsize()

    async def infer(self, policy: Policy, obs: dict[str, Any], env_indices: np.ndarray,
                    step_ids: np.ndarray) -> np.ndarray:
        """``policy.infer(obs, env_indices, step_ids)`` in the worker (``policy``: one connection's object)."""
        call = InferCall(policy, obs, env_indices, step_ids)
        return await self._submit(policy.infer, (obs, env_indices, step_ids), call)

    async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` in the worker, after every call submitted before it."""
        return await self._submit(fn, args, None)

    def post(self, fn: Callable[..., Any], *args: Any) -> None:
        """``fn(*args)`` in the worker, with nobody waiting for it (an error is logged)."""
        if self._inline:
            _run_one(_Job(fn, args, None, None, None))
            return
        self._put(_Job(fn, args, None, None, None))

    @property
    def _inline(self) -> bool:
        """The policy's calls run on the caller's loop, in order, with no thread (a fast policy: ``off_loop``
        False and no batching)."""
        return not self.policy.off_loop and not self.policy.batches

    async def _submit(self, fn: Callable[..., Any], args: tuple[Any, ...], infer: InferCall | None) -> Any:
        if self._inline:
            try:
                return fn(*args)
            except BaseException as exc:  # as from the worker: SystemExit or KeyboardInterrupt fail this call
                raise _as_error(exc) from None
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._put(_Job(fn, args, infer, loop, future))
        return await future

    def _put(self, job: _Job) -> None:
        with self._lock:
            if self._closed:
                raise RuntimeError("the policy worker is closed")
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name="plugrl-policy-worker", daemon=True)
                self._thread.start()
            self._jobs.put(job)

    def close(self) -> None:
        """Stop after the calls already submitted (waiting at most :data:`CLOSE_TIMEOUT_S` for them)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            thread = self._thread
        self._jobs.put(None)
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=CLOSE_TIMEOUT_S)
            if thread.is_alive():
                logger.warning("a policy call still runs %.0f s after the server stopped; leaving it behind",
                               CLOSE_TIMEOUT_S)

    def _serve(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            jobs = [job]
            gather = self.gather_s if job.infer is not None and self.policy.batches else 0.0
            until = time.monotonic() + self.gather_max_s
            while True:  # everything submitted while the last call ran (or in the burst), to batch its infers
                try:
                    wait = min(gather, until - time.monotonic())
                    more = self._jobs.get(timeout=wait) if wait > 0 else self._jobs.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    self._jobs.put(None)  # stop once these are done
                    break
                jobs.append(more)
            self._run(jobs)

    def _run(self, jobs: list[_Job]) -> None:
        """Run ``jobs`` in order; with a batching policy, each run of consecutive infers in one call."""
        batch: list[_Job] = []
        for job in jobs:
            if job.infer is not None and self.policy.batches:
                batch.append(job)
                continue
            self._run_batch(batch)
            batch = []
            _run_one(job)
        self._run_batch(batch)

    def _run_batch(self, batch: list[_Job]) -> None:
        if not batch:
            return
        try:
            replies = self.policy.infer_batch([job.infer for job in batch if job.infer is not None])
            if len(replies) != len(batch):
                raise RuntimeError(f"{type(self.policy).__name__}.infer_batch answered {len(replies)} of "
                                   f"{len(batch)} infers; it must answer each, in order")
        except BaseException as exc:  # every connection of the batch learns of it; the worker goes on
            for job in batch:
                job.settle(error=_as_error(exc))
            return
        for job, reply in zip(batch, replies):
            job.settle(reply)


def _run_one(job: _Job) -> None:
    try:
        result = job.fn(*job.args)
    except BaseException as exc:  # the caller learns of it; the worker goes on
        job.settle(error=_as_error(exc))
        return
    job.settle(result)


def _as_error(exc: BaseException) -> Exception:
    """``exc`` as an error its caller can handle: a policy that raises ``SystemExit`` or ``KeyboardInterrupt``
    (no signal reaches this thread) fails its call, it does not end the server."""
    if isinstance(exc, Exception):
        return exc
    error = RuntimeError(f"the policy raised {type(exc).__name__}: {exc}")
    error.__cause__ = exc
    return error
