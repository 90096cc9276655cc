"""The thread a member's durable writes run on.

The runtime hands each batch's fsync (and the hard state's) to this one thread and goes on
serving the loop; the write's result comes back as a loop future. It is the hand-off
`asyncio.to_thread` makes, minus what a general thread pool needs and a single writer does not
(a context copy, a `concurrent.futures.Future` chained to the loop's, the pool's idle-worker
bookkeeping): at one write in flight per batch, that hand-off was a tenth of a leader's CPU.

Writes run one at a time, in the order they were handed over, which is what the executor
needs anyway (it waits for each before the next).
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable
from typing import Any

_STOP = object()


def _resolve(fut: asyncio.Future, result: Any, exc: BaseException | None) -> None:
    if fut.done():  # the waiter was cancelled (the member is stopping)
        return
    if exc is None:
        fut.set_result(result)
    else:
        fut.set_exception(exc)


class DiskThread:
    def __init__(self, name: str = "flotilla-disk") -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(*args)` on the disk thread, after every write handed over before it."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._jobs.put((loop, fut, fn, args))
        return await fut

    def stop(self) -> None:
        """No writes after those already handed over; the thread ends once they are done
        (a daemon: a write stuck in the kernel never holds the process up)."""
        self._jobs.put(_STOP)

    def _work(self) -> None:
        jobs = self._jobs
        while (job := jobs.get()) is not _STOP:
            loop, fut, fn, args = job
            try:
                result, exc = fn(*args), None
            except BaseException as caught:  # handed to the waiter, which decides
                result, exc = None, caught
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
                loop.call_soon_threadsafe(_resolve, fut, result, exc)
            del job, fut, result, exc
