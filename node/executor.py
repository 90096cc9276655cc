"""Carrying out one `Ready` batch of the consensus core: the steps of its contract (send,
persist, apply, advance) in the order the fields of `Ready` prescribe; committed entries are
applied before the fsync is awaited, so their callers are answered while the disk works.

One implementation serves every way a member runs. The member's runtime (runtime.py) awaits
the disk in a worker thread; the simulator and the paper tests (tests/simulation,
tests/consensus/network.py) run the very same coroutine over an in-memory disk whose write
completes when their schedule says, so thousands of random schedules check these ordering rules
too, not a copy of them.

What a batch needs is handed in: the core, the storage (`LogStorage`), `send` for messages,
`offload` to run a blocking storage call (the runtime passes `asyncio.to_thread`), and the
`BatchHooks` that own the state machine and the callers waiting on it. The executor itself
keeps no state between batches.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from flotilla.node.consensus import Entry, Message, RaftCore, ReadState, Ready, Snapshot, SoftState
from flotilla.node.storage import LogStorage

Offload = Callable[..., Awaitable[Any]]


class BatchHooks(Protocol):
    """The member's side of a batch: its state machine, its waiting callers, its metrics."""

    async def install_snapshot(self, snapshot: Snapshot) -> None:
        """Replace the machine's state with the snapshot's. Its file is durable already (it was
        stored before the message carrying it was stepped); the log moves after this."""
        ...

    def persisted(self, entries: tuple[Entry, ...], append_s: float, sync_s: float) -> None:
        """`entries` are durable: appending took `append_s`, the fsync `sync_s` seconds."""
        ...

    def soft_state_changed(self, soft: SoftState) -> None: ...

    def apply(self, entries: tuple[Entry, ...]) -> None:
        """Apply committed entries in order and answer the clients that proposed them."""
        ...

    def reads(self, states: tuple[ReadState, ...], failed: tuple[Any, ...]) -> None:
        """Read indexes confirmed (answer once applied that far), and reads that failed."""
        ...

    async def before_advance(self, rd: Ready) -> None:
        """Anything else that must be durable before the core is told the batch is done."""
        ...


class Executor:
    def __init__(self, core: RaftCore, storage: LogStorage,
                 send: Callable[[list[Message]], None], hooks: BatchHooks, *,
                 offload: Offload, clock: Callable[[], float] = time.perf_counter) -> None:
        self.core = core
        self.storage = storage
        self.send = send
        self.hooks = hooks
        self.offload = offload
        self.clock = clock

    async def carry_out(self, rd: Ready) -> None:
        """Carry out `rd`; the caller takes the next batch only after this returns."""
        storage, hooks = self.storage, self.hooks
        # 1. A leader's messages go out before its own write: followers persist in parallel.
        if rd.messages:
            self.send(rd.messages)
        # 2. The snapshot, restored and durable before anything after it.
        if rd.snapshot is not None:
            await hooks.install_snapshot(rd.snapshot)
            await self.offload(storage.install_snapshot, rd.snapshot.meta)
        # 3. Apply what is committed before waiting on the disk, as etcd's server does: a
        #    committed entry is durable on a quorum already, whether or not this member's own
        #    copy is synced yet, so its callers are answered while the disk works, not after.
        if rd.committed_entries:
            hooks.apply(rd.committed_entries)
        # 4. The entries and the hard state, one fsync for all the entries (group commit). The
        #    hard state is durable on return; appends only after `sync`. Every durable write
        #    goes through `offload`: the loop never waits on the disk. The commit index is
        #    only noted: storage records it with a hard state or when asked (`save_commit`),
        #    never beyond what is durable, and hands it back at the next start.
        storage.note_commit(self.core.commit_index)
        if rd.entries:
            appending = self.clock()
            storage.append(rd.entries)
        if rd.hard_state is not None:  # a new term or vote: rare, and never on the loop
            await self.offload(storage.save_hard_state, rd.hard_state)
        if rd.entries:
            syncing = self.clock()
            await self.offload(storage.sync)
            done = self.clock()
            hooks.persisted(rd.entries, done - appending, done - syncing)
        # 5. Only now the messages that promise what was just written (votes, acknowledgements).
        if rd.persisted_messages:
            self.send(rd.persisted_messages)
        if rd.soft_state is not None:
            hooks.soft_state_changed(rd.soft_state)
        # 6. Answer reads, and tell the core the batch is done.
        if rd.read_states or rd.failed_reads:
            hooks.reads(rd.read_states, rd.failed_reads)
        await hooks.before_advance(rd)
        self.core.advance(rd)
