"""The server's held-back replies: never early, concurrent, in deadline order, and ended by close()."""

from __future__ import annotations

import asyncio
import threading
import time

from waiting import wait_until

from plugrl_env_client.server.delay import Delays


def run(coro):
    return asyncio.run(coro)


def test_a_delay_is_never_shorter_than_asked():
    delays = Delays()

    async def timed(seconds: float) -> float:
        start = time.perf_counter()
        await delays.sleep(seconds)
        return time.perf_counter() - start

    try:
        for seconds in (0.0003, 0.002, 0.011):
            assert run(timed(seconds)) >= seconds
        assert run(timed(0.0)) < 0.5 and run(timed(-1.0)) < 0.5, "nothing to wait for: no wait"
    finally:
        delays.close()


def test_delays_run_side_by_side_and_end_in_deadline_order():
    delays = Delays()
    ended: list[float] = []

    async def wait(seconds: float) -> None:
        await delays.sleep(seconds)
        ended.append(seconds)

    async def many() -> float:
        start = time.perf_counter()
        await asyncio.gather(wait(0.3), wait(0.1), wait(0.2), *(wait(0.25) for _ in range(40)))
        return time.perf_counter() - start

    try:
        took = run(many())
    finally:
        delays.close()
    assert ended[:2] == [0.1, 0.2] and ended[-1] == 0.3, ended
    assert took < 5.0, f"43 delays of at most 0.3 s took {took:.1f} s: they were served one after another"


def test_a_cancelled_waiter_does_not_disturb_the_others():
    delays = Delays()

    async def scene() -> str:
        doomed = asyncio.ensure_future(delays.sleep(0.05))
        await asyncio.sleep(0)
        doomed.cancel()
        await delays.sleep(0.1)  # the cancelled one's deadline passes meanwhile
        return "done"

    try:
        assert run(scene()) == "done"
    finally:
        delays.close()


def test_close_ends_the_pending_delays_and_the_thread():
    delays = Delays()
    loop = asyncio.new_event_loop()
    finished = threading.Event()

    async def long_wait() -> None:
        await delays.sleep(600)
        finished.set()

    runner = threading.Thread(target=lambda: loop.run_until_complete(long_wait()))
    runner.start()
    try:
        wait_until(lambda: delays._thread is not None, 30, "the delay's thread")  # the delay is registered
        delays.close()
        assert finished.wait(30), "a pending delay ended with close()"
        assert delays._thread is not None and not delays._thread.is_alive()
    finally:
        runner.join(30)
        loop.close()
    assert run(_after_close(delays)) == "no wait"


async def _after_close(delays: Delays) -> str:
    await delays.sleep(600)
    return "no wait"
