"""A tiny deterministic network of consensus cores for the paper's unit tests.

Nothing here is random except the seeded `random.Random` each member gets in its `Settings`.
Messages travel through one FIFO queue and arrive only when a test asks (`deliver`,
`stabilize`); the test decides what is lost (`drop`, `isolate`, `cut`) and what waits
(`hold` / `release`). Each member carries out its `Ready` batches with the runtime's own
executor (node/executor.py), in the order the field comments of `Ready` prescribe:

1. `messages` go out at once;
2. the snapshot, the entries and the hard state are written to the member's `Disk` (entries
   become durable with its fsync);
3. only then do `persisted_messages` go out;
4. committed entries are applied, in order, to the member's `applied` list;
5. read states and failed reads are recorded;
6. `advance(ready)`.

A member whose disk is `slow` waits at its fsync until the test calls `flush`, so tests can
see what the core does while a write is still in flight. Every step is also written to the
member's `events`, so a test can check that something was durable before something was sent.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from flotilla.node.consensus import (
    Entry,
    EntryKind,
    HardState,
    Membership,
    Message,
    MessageType,
    RaftCore,
    ReadState,
    Ready,
    RecoveredState,
    Role,
    Settings,
    Snapshot,
    SnapshotMeta,
)
from flotilla.node.executor import Executor

from tests.simulation.disk import Disk
from tests.simulation.drive import Batch, HarnessHooks, offload_through

MT = MessageType
Filter = Callable[[Message], bool]


def log_of(terms: Iterable[int], first_index: int = 1) -> list[Entry]:
    """Entries numbered from `first_index` with the given terms (the paper's figures)."""
    return [
        Entry(first_index + i, term, EntryKind.NORMAL, f"{first_index + i}@{term}".encode())
        for i, term in enumerate(terms)
    ]


@dataclass
class Member(HarnessHooks):
    """One member: its core, its disk, its state machine and a record of what it did."""

    name: str
    core: RaftCore
    disk: Disk
    settings: Settings
    applied: list[Entry] = field(default_factory=list)  # the state machine: entries in order
    read_states: list[ReadState] = field(default_factory=list)
    failed_reads: list[Any] = field(default_factory=list)
    readies: list[Ready] = field(default_factory=list)  # every batch taken, in order
    events: list[tuple[str, Any]] = field(default_factory=list)
    slow_disk: bool = False
    pending: Batch | None = None  # taken, messages sent, fsync not done (slow disk)
    executor: Executor | None = None

    @property
    def role(self) -> Role:
        return self.core.role

    @property
    def term(self) -> int:
        return self.core.term

    def log_terms(self) -> list[int]:
        """Terms of the entries in the core's log, from its first index on."""
        return [e.term for e in self.core.log.entries]

    def applied_index(self) -> int:
        return self.applied[-1].index if self.applied else 0

    def start(self, send: Callable[[Member, Message], None]) -> None:
        """Build the executor over this member's core and disk (again after a restart)."""
        self.disk.observer = lambda event, what: self.events.append((event, what))
        self.executor = Executor(
            self.core, self.disk, lambda messages: [send(self, m) for m in messages], self,
            offload=offload_through(self.disk, slow=lambda: self.slow_disk))

    # --- what the executor calls (executor.BatchHooks) ---

    async def install_snapshot(self, snapshot: Snapshot) -> None:
        self.disk.snapshot_data = tuple(snapshot.data)
        self.applied = list(snapshot.data)

    def apply(self, entries) -> None:
        for entry in entries:
            assert entry.index == self.applied_index() + 1, (
                f"{self.name} applied {entry.index} after {self.applied_index()}: out of order"
            )
            self.applied.append(entry)
            self.events.append(("apply", entry))

    def reads(self, states, failed) -> None:
        self.read_states.extend(states)
        self.failed_reads.extend(failed)



# Settings every member gets unless a test overrides them; tests/consensus/conftest.py runs
# each test with the leader sending new commit indexes at once and lazily.
DEFAULT_SETTINGS: dict[str, Any] = {}


class Network:
    """N cores wired together by a deterministic, test-controlled message queue."""

    def __init__(
        self,
        voters: Iterable[str],
        *,
        learners: Iterable[str] = (),
        joining: Iterable[str] = (),
        recovered: dict[str, RecoveredState] | None = None,
        **settings: Any,
    ) -> None:
        """`voters` and `learners` form the initial configuration; members in `joining` start
        empty (no membership) like a member added to a running cluster. `recovered` replaces
        the bootstrap state of some members (e.g. the divergent logs of Figure 7); `settings`
        overrides `Settings` fields for everyone."""
        voters, learners, joining = list(voters), list(learners), list(joining)
        initial = Membership(voters=frozenset(voters), learners=frozenset(learners))
        self.members: dict[str, Member] = {}
        self.queue: list[Message] = []
        self.held: list[Message] = []
        self.sent: list[Message] = []
        self.delivered: list[Message] = []
        self.dropped: list[Message] = []
        self._drop_rules: list[Filter] = []
        self._hold_rules: list[Filter] = []
        recovered = recovered or {}
        for i, name in enumerate(voters + learners + joining):
            if name in recovered:
                state = recovered[name]
            elif name in joining:
                state = RecoveredState()
            else:
                state = RecoveredState(snapshot=SnapshotMeta(0, 0, initial))
            disk = Disk(state, snapshot_data=())
            settings_i = Settings(rng=random.Random(i), **{**DEFAULT_SETTINGS, **settings})
            core = RaftCore(name, settings_i, disk.recovered())
            self.members[name] = Member(name, core, disk, settings_i)
            self.members[name].start(self._send)

    def join(self, member: Member) -> Member:
        """Put `member` (built by the test: a lost disk, say) in its name's place."""
        self.members[member.name] = member
        member.start(self._send)
        return member

    # --- looking -----------------------------------------------------------------------

    def __getitem__(self, name: str) -> Member:
        return self.members[name]

    def core(self, name: str) -> RaftCore:
        return self.members[name].core

    def leaders(self) -> list[str]:
        return [n for n, m in self.members.items() if m.core.role is Role.LEADER]

    def sent_of(self, kind: MessageType, frm: str | None = None, to: str | None = None
                ) -> list[Message]:
        return [m for m in self.sent if m.type is kind and (frm is None or m.frm == frm)
                and (to is None or m.to == to)]

    # --- faults --------------------------------------------------------------------------

    def drop(self, rule: Filter) -> Filter:
        """Lose every message matching `rule` from now on (until `heal`)."""
        self._drop_rules.append(rule)
        return rule

    def isolate(self, *names: str) -> None:
        """Cut the named members off from everyone else (they still hear each other)."""
        group = set(names)
        self.drop(lambda m: (m.frm in group) != (m.to in group))

    def cut(self, a: str, b: str) -> None:
        self.drop(lambda m: {m.frm, m.to} == {a, b})

    def heal(self) -> None:
        self._drop_rules.clear()

    def hold(self, rule: Filter) -> Filter:
        """Park messages matching `rule` instead of delivering them, until `release`."""
        self._hold_rules.append(rule)
        return rule

    def release(self) -> None:
        self._hold_rules.clear()
        self.queue.extend(self.held)
        self.held.clear()

    def deliver_held(self, rule: Filter) -> list[Message]:
        """Deliver the parked messages matching `rule` now (the others stay parked)."""
        chosen = [m for m in self.held if rule(m)]
        self.held = [m for m in self.held if not rule(m)]
        for m in chosen:
            self.delivered.append(m)
            self.members[m.to].core.step(m)
        return chosen

    def clear_queue(self) -> None:
        """Everything in flight is lost (and what is parked too)."""
        self.dropped.extend(self.queue + self.held)
        self.queue.clear()
        self.held.clear()

    # --- carrying out Ready batches ----------------------------------------------------

    def process(self, name: str) -> Ready | None:
        """Take and carry out one Ready of `name`, if it has one and its disk is idle."""
        member = self.members[name]
        core = member.core
        if member.pending is not None or not core.has_ready():
            return None
        rd = core.ready()
        member.readies.append(rd)
        batch = Batch(member.executor.carry_out(rd))
        if not batch.run():
            member.pending = batch  # a slow disk: the fsync waits for `flush`
        return rd

    def flush(self, name: str) -> None:
        """The slow disk of `name` finishes its write: the rest of the pending Ready."""
        member = self.members[name]
        batch, member.pending = member.pending, None
        while batch is not None and not batch.write_done():
            pass  # the hard state, then the entries

    def process_all(self) -> bool:
        """Carry out one Ready of every member that has one; tell whether any did."""
        done = [self.process(name) for name in self.members]
        return any(rd is not None for rd in done)

    def _send(self, member: Member, m: Message) -> None:
        member.events.append(("send", m))
        if m.type is MT.SNAPSHOT and m.snapshot is not None and m.snapshot.data is None:
            # The runtime attaches the payload: the sender's durable snapshot at that index.
            meta = m.snapshot.meta
            assert member.disk.snapshot.index == meta.index, "snapshot sent before it is durable"
            m = Message(m.type, m.to, m.frm, m.term,
                        snapshot=Snapshot(meta, member.disk.snapshot_data))
        self.sent.append(m)
        self.queue.append(m)

    # --- delivering ----------------------------------------------------------------------

    def deliver(self, rule: Filter | None = None) -> list[Message]:
        """Deliver the messages in flight now (those matching `rule`, if given), in order.
        Messages sent while delivering wait for the next call."""
        batch, keep = [], []
        for m in self.queue:
            (batch if rule is None or rule(m) else keep).append(m)
        self.queue = keep
        done = []
        for m in batch:
            if any(r(m) for r in self._drop_rules) or m.to not in self.members:
                self._lose(m)
            elif any(r(m) for r in self._hold_rules):
                self.held.append(m)
            else:
                self.delivered.append(m)
                self.members[m.to].core.step(m)
                done.append(m)
        return done

    def _lose(self, m: Message) -> None:
        self.dropped.append(m)
        if m.type is MT.SNAPSHOT and m.frm in self.members:
            self.members[m.frm].core.report_snapshot(m.to, False)

    def step(self, m: Message) -> Ready | None:
        """Hand one hand-made message straight to its recipient and carry out the result."""
        self.members[m.to].core.step(m)
        return self.process(m.to)

    def stabilize(self, limit: int = 10_000) -> None:
        """Carry out batches and deliver messages until nothing is left to do."""
        for _ in range(limit):
            busy = self.process_all()
            if not self.queue and not busy:
                # Quiet: the runtime's commit notice fires (Settings.lazy_commit).
                lazy = [m.core for m in self.members.values() if m.core.commit_news]
                if not lazy:
                    return
                for core in lazy:
                    core.announce_commit()
                continue
            self.deliver()
        raise AssertionError("the network did not settle")

    # --- driving -------------------------------------------------------------------------

    def tick(self, *names: str, times: int = 1) -> None:
        """Tick the named members (everyone if none is named), settling after each tick."""
        for _ in range(times):
            for name in names or tuple(self.members):
                self.members[name].core.tick()
            self.stabilize()

    def campaign(self, name: str) -> None:
        self.members[name].core.campaign()
        self.stabilize()

    def elect(self, name: str) -> None:
        self.campaign(name)
        assert self.members[name].role is Role.LEADER, f"{name} did not win the election"

    def propose(self, name: str, data: bytes) -> int:
        index = self.members[name].core.propose(data)
        self.stabilize()
        return index

    def compact(self, name: str, index: int, keep: int = 0) -> SnapshotMeta:
        """`name` snapshots its state machine at `index` (durably) and compacts its log."""
        member = self.members[name]
        meta = member.core.compact(index, keep)
        member.disk.install(meta, tuple(member.applied[:index]))
        return meta

    def restart(self, name: str) -> RaftCore:
        """Crash `name` (losing a write in progress and its volatile state) and start it again
        from its disk."""
        member = self.members[name]
        if member.pending is not None:
            member.pending.abandon()
        member.pending = None
        member.disk.crash()
        member.core = RaftCore(name, member.settings, member.disk.recovered())
        member.start(self._send)
        member.applied = list(member.disk.snapshot_data)
        return member.core


def recovered(terms: Iterable[int], term: int, voters: Iterable[str], vote: str | None = None,
              learners: Iterable[str] = ()) -> RecoveredState:
    """A member restarting with a log whose entries have `terms` (from index 1) and a hard state
    of `term`/`vote`, in a cluster of `voters`."""
    membership = Membership(voters=frozenset(voters), learners=frozenset(learners))
    return RecoveredState(HardState(term, vote), SnapshotMeta(0, 0, membership), log_of(terms))
