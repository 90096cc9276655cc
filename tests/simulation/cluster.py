"""A deterministic discrete-event simulation of a Flotilla cluster around the pure Raft core.

Everything random comes from one `random.Random(seed)`, so a run is replayed exactly from its
seed. Each member carries out its batches with the runtime's own executor (node/executor.py)
over an in-memory disk whose fsyncs complete when the schedule says (tests/simulation/drive.py),
so the ordering rules checked here are the ones members run. The simulation plays the rest of
the runtime (the network, the state machine, snapshots) and adds an adversarial world: a
network that loses, duplicates, delays and reorders messages and cuts links one way or both;
crashes that keep exactly what was made durable; restarts; membership changes; leadership
transfers; clients that write and read.

`SafetyChecker` checks the Raft safety properties after every event; a violation raises
`SafetyViolation` with the seed and the recent trace.
"""

from __future__ import annotations

import bisect
import heapq
import random
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from flotilla.node.consensus import (
    Entry,
    EntryKind,
    Membership,
    Message,
    MessageType,
    ProposalError,
    RaftCore,
    Ready,
    RecoveredState,
    Role,
    Settings,
    Snapshot,
    SnapshotMeta,
)
from flotilla.node.consensus.raftlog import RaftLog
from flotilla.node.executor import Executor

from .disk import Disk
from .drive import Batch, HarnessHooks, offload_through

TICK = 10  # time units per tick; messages take a few units, so many can cross within a tick
# Each member's wall clock reads EPOCH_MS + now + its skew (one time unit is a millisecond). The
# skew is drawn again at every start, so a restarted member's clock may have stepped back, and
# members disagree by up to 2 * MAX_SKEW_MS: many election timeouts.
EPOCH_MS = 1_800_000_000_000
MAX_SKEW_MS = 3_000


class SafetyViolation(AssertionError):
    pass


#: What `RaftLog.check_invariants` reads (tests/simulation/test_log_check.py keeps this list
#: in step with its code).
LOG_CHECK_FIELDS = ("offset", "offset_ts", "snapshot", "applied", "committed", "stable",
                    "entries")


def log_check_state(log: RaftLog) -> tuple[Any, ...]:
    """Everything `log.check_invariants()` depends on, copied: entries and snapshot metadata
    are frozen, so two equal states give the same verdict."""
    return (log.offset, log.offset_ts, log.snapshot, log.applied, log.committed, log.stable,
            log.entries.copy())


# --- the state machine the simulated members run ------------------------------------------


def encode_write(client: int, seq: int, key: str, value: str) -> bytes:
    return f"{client}:{seq}:{key}={value}".encode()


def decode_write(data: bytes) -> tuple[int, int, str, str]:
    client, seq, rest = data.decode().split(":", 2)
    key, value = rest.split("=", 1)
    return int(client), int(seq), key, value


@dataclass
class KVState:
    """A tiny key-value machine: enough to check that reads see the right values."""

    applied: int = 0
    data: dict[str, tuple[str, int]] = field(default_factory=dict)

    def apply(self, entry: Entry) -> None:
        if entry.index != self.applied + 1:
            raise SafetyViolation(f"applied {entry.index} after {self.applied}: not in order")
        self.applied = entry.index
        if entry.kind == EntryKind.NORMAL:
            _, _, key, value = decode_write(entry.data)
            self.data[key] = (value, entry.index)

    def copy(self) -> KVState:
        return KVState(self.applied, dict(self.data))


# --- one simulated member --------------------------------------------------------------------


class SimNode(HarnessHooks):
    def __init__(self, name: str, disk: Disk, sim: Simulation) -> None:
        self.name = name
        self.disk = disk
        self.sim = sim
        self.alive = False
        self.incarnation = 0
        self.core: RaftCore | None = None
        self.sm = KVState()
        self.batch: Batch | None = None  # the Ready being carried out (its fsync in flight)
        self.executor: Executor | None = None
        self.ready_scheduled = False
        self.notice_scheduled = False
        self.pending_reads: dict[Any, tuple[int, int]] = {}  # ctx -> (read index, started)
        self.clock_skew = 0

    def wall_clock_ms(self) -> int:
        """This member's clock, as the runtime injects it into the core."""
        return EPOCH_MS + self.sim.now + self.clock_skew

    def start(self) -> None:
        self.incarnation += 1
        self.alive = True
        d = self.disk
        recovered = d.recovered()
        rng = self.sim.rng
        self.clock_skew = rng.randint(-MAX_SKEW_MS, MAX_SKEW_MS)
        per_message = rng.choice([1, 4, 16, 256])
        # One entry per message makes old-term commits observable; give it a wide window so a
        # long backlog still drains within the healing bound.
        window = 64 if per_message == 1 else rng.choice([2, 8, 64])
        settings = Settings(
            rng=random.Random(rng.random()),
            election_ticks=self.sim.election_ticks,
            heartbeat_ticks=self.sim.heartbeat_ticks,
            max_inflight=window,
            max_entries_per_message=per_message,
            wall_clock_ms=self.wall_clock_ms,
            # Half the starts announce each new commit index at once (etcd's raft), half
            # lazily, as members do: the runtime's short notice timer is the `notice` event.
            lazy_commit=rng.random() < 0.5,
        )
        self.core = RaftCore(self.name, settings, recovered)
        d.observer = self._persisted
        self.executor = Executor(self.core, d, self._send, self,
                                 offload=offload_through(d, slow=lambda: True))
        self.sm = d.snapshot_data.copy()
        self.batch = None
        self.ready_scheduled = False
        self.notice_scheduled = False
        self.pending_reads = {}

    def crash(self) -> None:
        self.alive = False
        self.core = None
        if self.batch is not None:
            self.batch.abandon()
        self.batch = None
        self.disk.crash()

    # --- what the runtime's executor calls (executor.BatchHooks) -------------------------

    def _send(self, messages) -> None:
        for m in messages:
            self.sim.send(self, m)

    def _persisted(self, event: str, what: Any) -> None:
        if event == "persist-entries":
            self.sim.checker.on_persisted(self)

    async def install_snapshot(self, snapshot: Snapshot) -> None:
        data = snapshot.data
        self.disk.snapshot_data = data.copy()
        self.sim.checker.on_snapshot(self, snapshot.meta)
        self.sm = data.copy()
        self.sim.stats["installs"] += 1
        self.sim.log(f"{self.name} installed snapshot {snapshot.meta.index}")

    def apply(self, entries) -> None:
        for entry in entries:
            self.sm.apply(entry)
            self.sim.checker.on_apply(self, entry)
            self.sim.on_applied(self, entry)

    def reads(self, states, failed) -> None:
        for rs in states:
            if rs.context in self.pending_reads:  # a duplicated answer is ignored
                self.pending_reads[rs.context] = (rs.index, self.pending_reads[rs.context][1])
        for ctx in failed:
            self.sim.reads_failed += 1
            self.pending_reads.pop(ctx, None)
            self.sim.checker.read_started.pop(ctx, None)



# --- the world -----------------------------------------------------------------------------


@dataclass
class Faults:
    loss: float = 0.0
    duplicate: float = 0.0
    min_delay: int = 1
    max_delay: int = 8
    blocked: set[tuple[str, str]] = field(default_factory=set)  # (src, dst) pairs cut

    def clear(self) -> None:
        self.loss = self.duplicate = 0.0
        self.min_delay, self.max_delay = 1, 8
        self.blocked = set()


@dataclass
class ClientWrite:
    client: int
    seq: int
    key: str
    value: str
    data: bytes
    node: str | None = None
    index: int = 0
    term: int = 0
    incarnation: int = 0  # a crash drops the client's connection, even if the term repeats
    deadline: int = 0
    acked: bool = False


class Simulation:
    def __init__(
        self,
        seed: int,
        voters: list[str],
        election_ticks: int = 10,
        heartbeat_ticks: int = 1,
        trace_len: int = 200,
    ) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.election_ticks = election_ticks
        self.heartbeat_ticks = heartbeat_ticks
        self.now = 0
        self.events: list[tuple[int, int, str, Any]] = []
        self.seq = 0
        self.faults = Faults()
        self.nodes: dict[str, SimNode] = {}
        self.trace: deque[str] = deque(maxlen=trace_len)
        self.checker = SafetyChecker(self)
        self.writes: list[ClientWrite] = []
        self.write_seq = 0
        self.read_seq = 0
        self.reads_done = 0
        self.reads_failed = 0
        self.stats = {"delivered": 0, "dropped": 0, "duplicated": 0, "crashes": 0,
                      "snapshots": 0, "installs": 0, "transfers": 0, "membership": 0}
        initial = Membership(voters=frozenset(voters))
        for name in voters:
            disk = Disk(RecoveredState(snapshot=SnapshotMeta(0, 0, initial)), KVState())
            self.add_node(name, disk)

    # --- plumbing ----------------------------------------------------------------------

    def schedule(self, delay: int, kind: str, payload: Any) -> None:
        self.seq += 1
        heapq.heappush(self.events, (self.now + delay, self.seq, kind, payload))

    def log(self, text: str) -> None:
        self.trace.append(f"t={self.now} {text}")

    def add_node(self, name: str, disk: Disk) -> SimNode:
        node = SimNode(name, disk, self)
        self.nodes[name] = node
        node.start()
        self.schedule(self.rng.randrange(TICK), "tick", (name, node.incarnation))
        return node

    def alive(self) -> list[SimNode]:
        return [n for n in self.nodes.values() if n.alive]

    def leader(self) -> SimNode | None:
        best = None
        for n in self.alive():
            if n.core.role is Role.LEADER and (best is None or n.core.term > best.core.term):
                best = n
        return best

    def run_until(self, until: int) -> None:
        while self.events and self.events[0][0] <= until:
            at, _, kind, payload = heapq.heappop(self.events)
            self.now = at
            getattr(self, "_ev_" + kind)(payload)
            self.checker.after_event()
        self.now = until

    def kick(self, node: SimNode) -> None:
        """Something was given to the core: carry out its Ready soon."""
        if node.alive and not node.ready_scheduled and node.batch is None:
            node.ready_scheduled = True
            self.schedule(self.rng.randrange(3), "ready", (node.name, node.incarnation))

    def _current(self, payload: tuple[str, int]) -> SimNode | None:
        name, incarnation = payload
        node = self.nodes.get(name)
        if node is None or not node.alive or node.incarnation != incarnation:
            return None
        return node

    # --- events --------------------------------------------------------------------------

    def _ev_tick(self, payload: tuple[str, int]) -> None:
        node = self._current(payload)
        if node is None:
            return
        node.core.tick()
        self.kick(node)
        self.schedule(TICK, "tick", payload)

    def _ev_ready(self, payload: tuple[str, int]) -> None:
        node = self._current(payload)
        if node is None:
            return
        node.ready_scheduled = False
        core = node.core
        if node.batch is not None or not core.has_ready():
            return
        rd = core.ready()
        self.checker.on_ready(node, rd)
        node.batch = Batch(node.executor.carry_out(rd))
        self._batch_went_on(node, node.batch.run(), payload)

    def _ev_persisted(self, payload: tuple[str, int]) -> None:
        node = self._current(payload)
        if node is None or node.batch is None:
            return
        self._batch_went_on(node, node.batch.write_done(), payload)

    def _batch_went_on(self, node: SimNode, finished: bool, payload: tuple[str, int]) -> None:
        if not finished:
            # The fsync completes a little later; the core keeps taking messages meanwhile.
            self.schedule(self.rng.randrange(4), "persisted", payload)
            return
        node.batch = None
        self.serve_reads(node)
        self.kick(node)
        if node.core.commit_news and not node.notice_scheduled:
            node.notice_scheduled = True
            self.schedule(self.rng.randrange(1, TICK // 2), "notice", payload)

    def _ev_notice(self, payload: tuple[str, int]) -> None:
        node = self._current(payload)
        if node is None:
            return
        node.notice_scheduled = False
        if node.core.commit_news:
            node.core.announce_commit()
            self.kick(node)

    def _ev_deliver(self, m: Message) -> None:
        node = self.nodes.get(m.to)
        if node is None or not node.alive:
            self._dropped(m)
            return
        self.stats["delivered"] += 1
        if m.type is MessageType.SNAPSHOT:
            self.schedule(self.rng.randrange(1, 4), "snapshot_done", (m.frm, m.to, True))
        node.core.step(m)
        self.kick(node)

    def _ev_snapshot_done(self, payload: tuple[str, str, bool]) -> None:
        frm, to, ok = payload
        node = self.nodes.get(frm)
        if node is not None and node.alive:
            node.core.report_snapshot(to, ok)
            self.kick(node)

    def _ev_restart(self, name: str) -> None:
        node = self.nodes[name]
        if not node.alive:
            node.start()
            self.log(f"{name} restarted (term {node.core.term}, last {node.core.log.last_index()})")
            self.schedule(self.rng.randrange(TICK), "tick", (name, node.incarnation))

    def send(self, node: SimNode, m: Message) -> None:
        if m.type is MessageType.SNAPSHOT:
            # The runtime attaches the payload: the member's durable snapshot at that index. A
            # snapshot this member installed but has not yet made durable cannot be sent yet.
            if node.disk.snapshot.index != m.snapshot.meta.index:
                self._dropped(m)
                return
            m = Message(m.type, m.to, m.frm, m.term,
                        snapshot=Snapshot(m.snapshot.meta, node.disk.snapshot_data.copy()))
        f = self.faults
        if (m.frm, m.to) in f.blocked or self.rng.random() < f.loss:
            self._dropped(m)
            return
        self.schedule(self.rng.randint(f.min_delay, f.max_delay), "deliver", m)
        if self.rng.random() < f.duplicate:
            self.stats["duplicated"] += 1
            self.schedule(self.rng.randint(f.min_delay, f.max_delay * 3), "deliver", m)

    def _dropped(self, m: Message) -> None:
        self.stats["dropped"] += 1
        if m.type is MessageType.SNAPSHOT:
            self.schedule(self.rng.randrange(1, 4), "snapshot_done", (m.frm, m.to, False))

    # --- actions a schedule takes ----------------------------------------------------------

    def crash(self, name: str, downtime: int) -> None:
        node = self.nodes[name]
        if node.alive:
            node.crash()
            self.checker.on_crash(node)
            self.stats["crashes"] += 1
            self.log(f"{name} crashed")
            self.schedule(downtime, "restart", name)

    def propose_write(self, client: int, key: str) -> None:
        self.write_seq += 1
        value = f"v{self.write_seq}"
        w = ClientWrite(client, self.write_seq, key, value,
                        encode_write(client, self.write_seq, key, value))
        self.writes.append(w)
        self.submit(w)

    def submit(self, w: ClientWrite) -> None:
        """Hand a write to a member that believes it leads (clients retry elsewhere)."""
        leader = self.leader()
        w.node = None
        w.deadline = self.now + 3 * self.election_ticks * TICK
        if leader is None:
            return
        try:
            w.index = leader.core.propose(w.data)
        except ProposalError:
            return
        w.node, w.term, w.incarnation = leader.name, leader.core.term, leader.incarnation
        self.kick(leader)

    def retry_writes(self) -> None:
        """A client waits while the member that took its write still leads that term, and
        tries again (perhaps applying twice, which the log check allows) once it does not."""
        for w in self.writes:
            if w.acked or self.now < w.deadline:
                continue
            node = self.nodes.get(w.node) if w.node else None
            if (node and node.alive and node.incarnation == w.incarnation
                    and node.core.role is Role.LEADER and node.core.term == w.term):
                continue
            self.submit(w)

    def on_applied(self, node: SimNode, entry: Entry) -> None:
        if entry.kind != EntryKind.NORMAL:
            return
        _, seq, _, _ = decode_write(entry.data)
        w = self.writes[seq - 1]
        if (not w.acked and w.node == node.name and w.incarnation == node.incarnation
                and w.index == entry.index):
            w.acked = True  # the member that took it saw it commit and answered the client
            self.checker.on_ack(w)

    def start_read(self, node: SimNode, key: str) -> None:
        if not node.alive:
            return
        self.read_seq += 1
        ctx = ("read", self.read_seq, key)
        self.checker.read_started[ctx] = self.checker.max_acked_index
        node.pending_reads[ctx] = (-1, self.now)
        node.core.read_index(ctx)
        self.kick(node)

    def serve_reads(self, node: SimNode) -> None:
        for ctx, (index, _) in list(node.pending_reads.items()):
            if index >= 0 and node.sm.applied >= index:
                del node.pending_reads[ctx]
                self.checker.on_read(node, ctx, index)
                self.reads_done += 1

    def transfer(self, target: str) -> None:
        leader = self.leader()
        if leader is None:
            return
        try:
            leader.core.transfer_leadership(target)
        except ProposalError:
            return
        self.stats["transfers"] += 1
        self.log(f"transfer {leader.name} -> {target}")
        self.kick(leader)

    def change_membership(self, voters: set[str], learners: set[str]) -> bool:
        leader = self.leader()
        if leader is None:
            return False
        try:
            leader.core.change_membership(voters, learners)
        except ProposalError:
            return False
        self.stats["membership"] += 1
        self.log(f"membership -> voters {sorted(voters)} learners {sorted(learners)}")
        self.kick(leader)
        return True

    def take_snapshot(self, node: SimNode, keep: int) -> None:
        core = node.core
        index = node.sm.applied
        if not node.alive or node.batch is not None or index <= core.log.snapshot.index:
            return
        meta = core.compact(index, keep)
        self.checker.on_snapshot(node, meta)
        node.disk.install(meta, node.sm.copy())
        self.stats["snapshots"] += 1
        self.log(f"{node.name} snapshot at {index} (keep {keep})")


# --- the safety properties ---------------------------------------------------------------


class SafetyChecker:
    """Raft's safety properties, checked as the simulation runs.

    - Election Safety: at most one leader per term.
    - Log Matching: an (index, term) pair names one entry, and the same previous term, in every
      log; so logs that agree on an entry agree on everything before it. The entry includes
      its time: every member stores the leader's stamp as it is.
    - Time: along every member's log, entries' times never decrease (RaftLog.check_invariants),
      however skewed the leaders' clocks; a leader stamps its own clock unless that is behind
      the entry before; and a snapshot carries the time of the entry at its index.
    - Leader Completeness: a new leader's log holds every entry committed so far.
    - State Machine Safety: no two members apply different entries at one index.
    - Durability of commitment: when a leader commits an index, that entry is on the disks of a
      majority of its voters, and of its old voters too while the configuration is joint.
    - Committed entries are never lost: the committed prefix only grows.
    - Linearizable reads: a ReadIndex read sees every write acknowledged before it started, and
      exactly the value the committed log gives at the state it was answered from.
    """

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.leaders: dict[int, str] = {}
        self.entries: dict[tuple[int, int], tuple[int, bytes, int | None]] = {}
        self.committed: dict[int, Entry] = {}
        self.commit_index = 0
        self.max_acked_index = 0
        self.read_started: dict[Any, int] = {}
        self.leader_commit: dict[tuple[str, int], int] = {}
        self.reads_checked = 0
        # name -> (the log last checked, its state then): see _check_log
        self._logs_checked: dict[str, tuple[RaftLog, tuple[Any, ...]]] = {}
        self.key_history: dict[str, list[tuple[int, str]]] = {}
        # Each member's entries of the batch it is persisting: (index, term) -> what it holds.
        self.unpersisted: dict[str, list[tuple[tuple[int, int], tuple[Any, ...]]]] = {}

    def _record_committed(self, entry: Entry) -> None:
        self.committed[entry.index] = entry
        self.commit_index = entry.index
        if entry.kind == EntryKind.NORMAL:
            _, _, key, value = decode_write(entry.data)
            self.key_history.setdefault(key, []).append((entry.index, value))

    def fail(self, what: str) -> None:
        trace = "\n".join(self.sim.trace)
        raise SafetyViolation(f"seed {self.sim.seed}: {what}\n--- recent events ---\n{trace}")

    def on_ready(self, node: SimNode, rd: Ready) -> None:
        core = node.core
        if rd.soft_state is not None and rd.soft_state.role is Role.LEADER:
            term = rd.soft_state.term
            other = self.leaders.setdefault(term, node.name)
            if other != node.name:
                self.fail(f"two leaders in term {term}: {other} and {node.name}")
            self.sim.log(f"{node.name} leads term {term}")
            self._check_leader_complete(node)
        # Log matching is about the entries that exist: those on a disk. An entry in a batch
        # that a crash cuts short never existed (a sole voter that crashed before its term was
        # durable may lead that term again, and append other entries there), so entries are
        # checked against each other once persisted (`on_persisted`), and dropped on a crash.
        pending = self.unpersisted[node.name] = []
        for entry in rd.entries:
            prev = core.log.term(entry.index - 1)
            key = (entry.index, entry.term)
            value = (entry.kind, entry.data, entry.ts_ms, prev)
            pending.append((key, value))
            seen = self.entries.get(key)
            if (seen is None and entry.term == core.term and core.role is Role.LEADER
                    and not self._stamped_by(node, entry)):
                self.fail(f"{node.name} stamped entry {key} {entry.ts_ms} ms: its clock reads "
                          f"{node.wall_clock_ms()} and the entry before is at "
                          f"{core.log.ts(entry.index - 1)}")

    def on_persisted(self, node: SimNode) -> None:
        for key, value in self.unpersisted.pop(node.name, ()):
            seen = self.entries.setdefault(key, value)
            if seen != value:
                self.fail(f"log matching: {node.name} holds a different entry {key} "
                          f"({value[:3]} where another log holds {seen[:3]})")

    def on_crash(self, node: SimNode) -> None:
        self.unpersisted.pop(node.name, None)

    @staticmethod
    def _stamped_by(node: SimNode, entry: Entry) -> bool:
        """Whether `entry`, new in this leader's Ready, carries the time it should have: its
        clock when it was appended (at or before now), unless the entry before is later."""
        before = node.core.log.ts(entry.index - 1)
        if before is None:  # compacted meanwhile (the stamp was checked against it then)
            return True
        return entry.ts_ms == before or before < entry.ts_ms <= node.wall_clock_ms()

    def on_snapshot(self, node: SimNode, meta: SnapshotMeta) -> None:
        entry = self.committed.get(meta.index)
        if entry is not None and entry.ts_ms != meta.ts_ms:
            self.fail(f"{node.name}'s snapshot at {meta.index} says {meta.ts_ms} ms, the "
                      f"committed entry there is stamped {entry.ts_ms} ms")

    def _check_leader_complete(self, node: SimNode) -> None:
        log = node.core.log
        for index in range(log.offset + 1, self.commit_index + 1):
            if log.term(index) != self.committed[index].term:
                self.fail(f"leader completeness: {node.name} leads term {node.core.term} "
                          f"without committed entry {index}")
        if 0 < log.offset <= self.commit_index and log.offset_term != self.committed[
                log.offset].term:
            self.fail(f"leader completeness: {node.name}'s log base {log.offset} differs")

    def on_apply(self, node: SimNode, entry: Entry) -> None:
        seen = self.committed.get(entry.index)
        if seen is None:
            if entry.index != self.commit_index + 1:
                self.fail(f"{node.name} applied {entry.index} past the known committed prefix "
                          f"{self.commit_index}")
            self._record_committed(entry)
        elif seen != entry:
            self.fail(f"state machine safety: {node.name} applied {entry} at {entry.index}, "
                      f"another member applied {seen}")

    def on_ack(self, w: ClientWrite) -> None:
        self.max_acked_index = max(self.max_acked_index, w.index)

    def on_read(self, node: SimNode, ctx: Any, index: int) -> None:
        started_after = self.read_started.pop(ctx)
        if index < started_after:
            self.fail(f"stale read {ctx} on {node.name}: read index {index} but a write at "
                      f"{started_after} was acknowledged before the read began")
        key = ctx[2]
        got = node.sm.data.get(key)
        applied = node.sm.applied
        if applied > self.commit_index:
            self.fail(f"{node.name} applied {applied}, beyond the committed prefix")
        history = self.key_history.get(key, [])
        pos = bisect.bisect_right(history, (applied, "\uffff"))
        expected = (history[pos - 1][1], history[pos - 1][0]) if pos else None
        if got != expected:
            self.fail(f"read {ctx} on {node.name} at applied {node.sm.applied} returned {got}, "
                      f"the committed log gives {expected}")
        self.reads_checked += 1

    def _check_log(self, name: str, log: RaftLog) -> None:
        """`log.check_invariants()`, skipped when the log is the one last checked for `name`
        and nothing in it changed since (most events leave most members' logs as they were;
        checking every log in full after every event was most of the simulation's time)."""
        state = log_check_state(log)
        last = self._logs_checked.get(name)
        if last is not None and last[0] is log and last[1] == state:
            return
        log.check_invariants()
        self._logs_checked[name] = (log, state)

    def after_event(self) -> None:
        for node in self.sim.nodes.values():
            if not node.alive:
                continue
            core = node.core
            self._check_log(node.name, core.log)
            if core.role is not Role.LEADER:
                continue
            committed = core.log.committed
            # Only what a leader commits by counting acknowledgements is checked against its
            # configuration; the commit index it inherited was checked when it was counted.
            seen = self.leader_commit.setdefault((node.name, core.term), committed)
            if committed > seen:
                self.leader_commit[(node.name, core.term)] = committed
                self._check_commit_durable(node, committed)
            # Everything a leader has committed must agree with what anyone has applied.
            for index in range(max(self.commit_index, core.log.offset) + 1, committed + 1):
                self._record_committed(core.log.entries[index - core.log.offset - 1])
            if committed <= self.commit_index and committed > core.log.offset:
                entry = core.log.entries[committed - core.log.offset - 1]
                if self.committed[committed] != entry:
                    self.fail(f"{node.name} committed {entry}, but {self.committed[committed]} "
                              f"was committed at {committed}")

    def _check_commit_durable(self, node: SimNode, index: int) -> None:
        term = node.core.log.term(index)
        if term is None:
            return
        membership = node.core.membership
        groups = [membership.voters]
        if membership.outgoing is not None:
            groups.append(membership.outgoing)
        for group in groups:
            holders = [n for n in group if n in self.sim.nodes
                       and self.sim.nodes[n].disk.holds(index, term)]
            if len(holders) <= len(group) // 2:
                self.fail(f"{node.name} committed {index} (term {term}) but only {holders} of "
                          f"{sorted(group)} hold it durably")
