"""A reply held back for a given time, to within a tenth of a millisecond, on the server's event loop.

``--policy.latency-ms`` stands in for a model's inference time, and benchmarks set it to one batch step of the env
to see whether pipelining hides it. asyncio's own timers wake on the selector's millisecond ticks, so
``asyncio.sleep`` overshoots by up to a millisecond, which would overstate a latency of one batch step. :class:`Delays` keeps every pending deadline in one thread, which waits on a condition with the
clock's own precision and settles each waiter through its loop (``call_soon_threadsafe``); the waiter is an
``await`` like any other, so one connection's delay never holds up another's.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import threading
import time


class Delays:
    """Precise ``await``-able delays for any number of waiters, served by one daemon thread started on first use."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._due: list[tuple[float, int, asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._order = itertools.count()  # ties on a deadline: first come, first served
        self._thread: threading.Thread | None = None
        self._closed = False

    async def sleep(self, seconds: float) -> None:
        """Return ``seconds`` from now (at once for 0 or less, or once :meth:`close` was called)."""
        if seconds <= 0:
            return
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        with self._cond:
            if self._closed:
                return
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name="plugrl-policy-server-delays", daemon=True)
                self._thread.start()
            heapq.heappush(self._due, (time.perf_counter() + seconds, next(self._order), loop, done))
            self._cond.notify()
        await done

    def close(self) -> None:
        """End the thread; delays still pending end now."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def _serve(self) -> None:
        with self._cond:
            while True:
                if self._closed:
                    for _, _, loop, done in self._due:
                        _settle_soon(loop, done)
                    self._due.clear()
                    return
                if not self._due:
                    self._cond.wait()
                    continue
                left = self._due[0][0] - time.perf_counter()
                if left > 0:
                    self._cond.wait(left)
                    continue
                _, _, loop, done = heapq.heappop(self._due)
                _settle_soon(loop, done)


def _settle_soon(loop: asyncio.AbstractEventLoop, done: asyncio.Future[None]) -> None:
    try:
        loop.call_soon_threadsafe(_settle, done)
    except RuntimeError:  # the loop is closed: nobody waits any more
        pass


def _settle(done: asyncio.Future[None]) -> None:
    if not done.done():  # the waiting task may have been cancelled meanwhile
        done.set_result(None)
