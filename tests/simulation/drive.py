"""Running the member runtime's batch executor (node/executor.py) without an event loop.

`Executor.carry_out` is a coroutine whose only suspension point is `offload`, the hand-off of a
blocking storage call (the runtime passes `asyncio.to_thread`). The harnesses pass
`offload_through(disk, ...)`, which runs the call in place, except that an fsync may wait for
the harness to say the disk finished (`DiskWrite`). `Batch` steps the coroutine by hand, so a
deterministic schedule decides when each write completes, and a crash abandons a batch
mid-way, exactly where a real member could die.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Generator
from typing import Any

from tests.simulation.disk import Disk


class DiskWrite:
    """An fsync in flight: whoever awaits it waits until `done` is set."""

    def __init__(self) -> None:
        self.done = False

    def __await__(self) -> Generator[DiskWrite, None, None]:
        while not self.done:
            yield self


def offload_through(disk: Disk, slow: Callable[[], bool]):
    """The executor's `offload`: storage calls run at once, except that the writes a member
    waits on (`disk.sync`, `disk.save_hard_state`) wait for the harness to complete them (a
    `DiskWrite`) while `slow()` says so."""
    waited = (disk.sync, disk.save_hard_state)

    async def offload(fn: Callable[..., Any], *args: Any) -> Any:
        if fn in waited and slow():
            await DiskWrite()
        return fn(*args)

    return offload


class Batch:
    """One Ready being carried out, stepped by hand."""

    def __init__(self, coro: Coroutine[Any, Any, None]) -> None:
        self.coro = coro
        self.waiting: DiskWrite | None = None

    def run(self) -> bool:
        """Run until the batch waits for its disk write (False) or is done (True)."""
        try:
            self.waiting = self.coro.send(None)
        except StopIteration:
            self.waiting = None
            return True
        return False

    def write_done(self) -> bool:
        """The disk finished the write the batch waits for: go on (True once done)."""
        assert self.waiting is not None, "the batch is not waiting for its disk"
        self.waiting.done = True
        return self.run()

    def abandon(self) -> None:
        """The member crashed: the rest of the batch never happens."""
        self.coro.close()


class HarnessHooks:
    """The executor's hooks (executor.BatchHooks) a harness has no use for: metrics, the soft
    state, anything else to make durable before `advance`. Harnesses inherit these."""

    def persisted(self, entries: Any, append_s: float, sync_s: float) -> None:
        pass

    def soft_state_changed(self, soft: Any) -> None:
        pass

    async def before_advance(self, rd: Any) -> None:
        pass
