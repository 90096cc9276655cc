"""A running member's snapshots: the machine written into the member's snapshot store without
stopping applies, through the documented paths of `snapshots.py`.

`StoreTarget` is the seam between the two: the machine (in a forked child, a writer thread or
the caller) writes its payload into a `SnapshotWriter` of the store and seals it there; the
member then publishes the file (rename into place, drop older snapshots) on its side.
`snapshot_into_store` drives one job from the member's event loop: it waits on the job's
descriptor, never on a clock, and polls it on the loop's thread, the one that applies (as the
overlay method needs to release its frozen state).

Which method: `overlay` for a machine that implements `freeze()` (the built-in key-value
machine does: no second process), else `auto` (a forked child; `sync` where fork is missing).
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

from flotilla.node.consensus import SnapshotMeta
from flotilla.node.storage import SnapshotStore
from flotilla.node.storage.snapshots import SnapshotWriter

from .protocol import StateMachine, SupportsFreeze
from .snapshots import SnapshotJob, SnapshotResult, start_snapshot


class StoreTarget:
    """A `SnapshotTarget` over a snapshot file being written by the store."""

    def __init__(self, writer: SnapshotWriter) -> None:
        self.writer = writer

    def writable(self) -> bool:
        return True

    def write(self, data: bytes) -> int:
        return self.writer.write(data)

    def flush(self) -> None:
        self.writer.flush()

    def seal(self) -> dict[str, Any]:
        return self.writer.seal()

    def discard(self) -> None:
        self.writer.abort()

    def publish(self) -> Path:
        return self.writer.publish()


def method_for(machine: StateMachine) -> str:
    """`overlay` for a machine that can freeze itself, else `auto` (fork, or sync)."""
    return "overlay" if isinstance(machine, SupportsFreeze) else "auto"


async def wait_job(job: SnapshotJob) -> SnapshotResult:
    """The job's result, waiting on its descriptor; it is polled on the calling (applying)
    thread. Cancelled, it cancels the job (the target is discarded)."""
    loop = asyncio.get_running_loop()
    done = asyncio.Event()
    fd = job.fileno()
    loop.add_reader(fd, done.set)
    try:
        while True:
            result = job.poll()  # may close fd: nothing else runs before remove_reader
            if result is not None:
                return result
            done.clear()
            await done.wait()
    except BaseException:
        job.cancel()
        raise
    finally:
        with contextlib.suppress(OSError, ValueError):
            loop.remove_reader(fd)


async def snapshot_into_store(store: SnapshotStore, meta: SnapshotMeta,
                              machine: StateMachine) -> Path:
    """Write `machine` as it is now (its state at `meta.index`) into `store` as a snapshot
    file, while the caller's loop goes on applying, and publish it; returns its path. The
    moment is captured before this returns to the loop for the first time."""
    writer = store.begin(meta, machine.kind)
    target = StoreTarget(writer)
    try:
        job = start_snapshot(machine, target, method=method_for(machine))
    except BaseException:
        writer.abort()
        raise
    await wait_job(job)
    try:
        return await asyncio.to_thread(target.publish)
    except BaseException:
        writer.abort()
        raise
