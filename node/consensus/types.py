"""The vocabulary of the consensus core: log entries, membership, messages and output batches.

Everything here is plain data. The core never does I/O; it hands the caller a `Ready` batch
and the caller carries it out in the order the field comments of `Ready` prescribe.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any


class EntryKind(IntEnum):
    NORMAL = 0  # a client command for the state machine
    MEMBERSHIP = 1  # data is an encoded `Membership`; takes effect as soon as it is in a log
    NOOP = 2  # appended by every new leader so it can commit entries of earlier terms


@dataclass(frozen=True, slots=True, init=False)
class Entry:
    """One log entry. `ts_ms` is the wall-clock time (ms since the Unix epoch) at which the
    leader of `term` appended it, or 0 where it is unknown (entries written before entries
    carried one). Leaders stamp `max(their clock, the previous entry's ts_ms)`, so along a log
    it never decreases, and every member stores the leader's stamp verbatim: the time of an
    index is a fact of the log, like its term."""

    index: int
    term: int
    kind: int = EntryKind.NORMAL
    data: bytes = b""
    ts_ms: int = 0

    def __init__(self, index: int, term: int, kind: int = EntryKind.NORMAL, data: bytes = b"",
                 ts_ms: int = 0) -> None:
        # Every entry a member appends, receives or reads back is built here. Filling the
        # slots through their descriptors costs about 60% of the object.__setattr__ call per
        # field that a frozen dataclass's generated __init__ makes (tests/consensus/
        # test_types.py checks it against that generated one).
        _set_index(self, index)
        _set_term(self, term)
        _set_kind(self, kind)
        _set_data(self, data)
        _set_ts_ms(self, ts_ms)


_set_index, _set_term, _set_kind, _set_data, _set_ts_ms = (
    Entry.__dict__[name].__set__ for name in ("index", "term", "kind", "data", "ts_ms")
)


@dataclass(frozen=True, slots=True)
class HardState:
    """What a member must have on disk before it says anything that depends on it."""

    term: int = 0
    vote: str | None = None


@dataclass(frozen=True, slots=True)
class Membership:
    """A cluster configuration.

    `outgoing` is None outside joint consensus. While joint (C_old,new), `outgoing` holds the
    old voters and `voters` the new ones: elections and commitment need a majority of each.
    Learners receive the log but are never counted. `addresses` maps members to their peer
    URLs and `clients` to their client URLs: the core only carries them along, so that whoever
    leads next can reach every member, and followers forward clients to the leader's URL as the
    committed log gives it, never as a peer's message claims it.
    """

    voters: frozenset[str]
    learners: frozenset[str] = frozenset()
    outgoing: frozenset[str] | None = None
    addresses: tuple[tuple[str, str], ...] = ()
    clients: tuple[tuple[str, str], ...] = ()

    @property
    def joint(self) -> bool:
        return self.outgoing is not None

    def members(self) -> frozenset[str]:
        """Everyone the leader replicates to."""
        return self.voters | self.learners | (self.outgoing or frozenset())

    def with_addresses(self, addresses: dict[str, str] | tuple[tuple[str, str], ...],
                       clients: dict[str, str] | tuple[tuple[str, str], ...] = ()
                       ) -> Membership:
        """This configuration carrying the peer (and client) URLs of its own members only."""
        members = self.members()

        def kept(urls):
            return tuple(sorted((n, url) for n, url in dict(urls).items() if n in members))
        return Membership(self.voters, self.learners, self.outgoing, kept(addresses),
                          kept(clients))

    def can_vote(self, name: str) -> bool:
        return name in self.voters or (self.outgoing is not None and name in self.outgoing)

    def encode(self) -> bytes:
        doc = {"voters": sorted(self.voters), "learners": sorted(self.learners)}
        if self.outgoing is not None:
            doc["outgoing"] = sorted(self.outgoing)
        if self.addresses:
            doc["addresses"] = dict(self.addresses)
        if self.clients:
            doc["clients"] = dict(self.clients)
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, raw: bytes) -> Membership:
        doc = json.loads(raw)
        outgoing = doc.get("outgoing")
        return cls(
            voters=frozenset(doc["voters"]),
            learners=frozenset(doc.get("learners", ())),
            outgoing=None if outgoing is None else frozenset(outgoing),
            addresses=tuple(sorted(doc.get("addresses", {}).items())),
            clients=tuple(sorted(doc.get("clients", {}).items())),
        )

    def describe(self) -> dict[str, Any]:
        """The `config` document of `/v1/status`."""
        return {
            "voters": sorted(self.voters),
            "learners": sorted(self.learners),
            "joint": None
            if self.outgoing is None
            else {"old": sorted(self.outgoing), "new": sorted(self.voters)},
        }


EMPTY_MEMBERSHIP = Membership(voters=frozenset())


@dataclass(frozen=True, slots=True)
class SnapshotMeta:
    """Where a snapshot sits in the log, and the configuration in force at that point.

    `ts_ms` is the time of the entry at `index` (0 if unknown), so a member whose log starts
    after a snapshot still knows the time of that index, and stamps what follows no earlier."""

    index: int
    term: int
    membership: Membership
    ts_ms: int = 0


@dataclass(slots=True)
class Snapshot:
    """A snapshot as the core sees it: metadata plus an opaque payload it never looks into.

    The core emits snapshot messages with `data=None`; the sending runtime attaches the payload
    (bytes, a file reference, an archive location) and the receiving runtime resolves it before
    stepping the message into its core.
    """

    meta: SnapshotMeta
    data: Any = None


class MessageType(IntEnum):
    VOTE = 0
    VOTE_RESP = 1
    PREVOTE = 2
    PREVOTE_RESP = 3
    APPEND = 4
    APPEND_RESP = 5
    HEARTBEAT = 6
    HEARTBEAT_RESP = 7
    SNAPSHOT = 8
    TIMEOUT_NOW = 9  # leadership transfer: campaign now, skipping PreVote and leases
    READ_INDEX = 10  # follower asks the leader for a safe read index
    READ_INDEX_RESP = 11


@dataclass(slots=True)
class Message:
    """One message between members. Which fields matter depends on `type`:

    - VOTE/PREVOTE: `index`/`log_term` describe the candidate's last entry; `force` marks a
      campaign started by leadership transfer, which voters must not ignore under their lease.
    - APPEND: `index`/`log_term` locate the entry before `entries`; `commit` is the leader's.
    - APPEND_RESP: `index` is the highest index now matching the leader; on `reject`,
      `hint_index`/`hint_term` let the leader skip a whole conflicting term at once.
    - HEARTBEAT/HEARTBEAT_RESP: `context` is a read-round number the follower echoes back.
    - SNAPSHOT: `snapshot` carries the metadata (and, attached by the runtime, the payload).
    - READ_INDEX/READ_INDEX_RESP: `context` identifies the read; the response's `index` is the
      commit index the reader must have applied before it answers; `reject` if none can be had.
    """

    type: MessageType
    to: str
    frm: str
    term: int
    log_term: int = 0
    index: int = 0
    entries: tuple[Entry, ...] | list[Entry] = ()
    commit: int = 0
    reject: bool = False
    hint_index: int = 0
    hint_term: int = 0
    snapshot: Snapshot | None = None
    context: Any = None
    force: bool = False


class Role(IntEnum):
    FOLLOWER = 0
    PRE_CANDIDATE = 1
    CANDIDATE = 2
    LEADER = 3

    @property
    def label(self) -> str:
        """The role as `/v1/status` names it (a pre-candidate is still a candidate there)."""
        return {0: "follower", 1: "candidate", 2: "candidate", 3: "leader"}[int(self)]


@dataclass(frozen=True, slots=True)
class ReadState:
    """A linearizable read may be answered once the state machine has applied `index`."""

    context: Any
    index: int


@dataclass(frozen=True, slots=True)
class PeerProgress:
    """What a leader knows of one member's log (consensus/progress.py)."""

    match: int
    next: int
    state: str  # "probe", "replicate" or "snapshot"


@dataclass(frozen=True, slots=True)
class CoreStatus:
    """The core's facts, copied out at one moment: what `/v1/status`, the admin API and the
    archiver read, so that nothing outside the core reaches into its log or progress."""

    name: str
    term: int
    vote: str | None
    role: Role
    leader: str | None
    commit_index: int
    applied_index: int
    first_index: int
    last_index: int
    snapshot: SnapshotMeta
    membership: Membership
    membership_index: int  # where `membership` sits in the log
    admission: tuple[str, int] | None
    progress: dict[str, PeerProgress]  # empty unless this member leads
    acks_beyond_sent: int


@dataclass(frozen=True, slots=True)
class SoftState:
    """Volatile facts the runtime reports but never persists."""

    leader: str | None
    role: Role
    term: int


@dataclass(frozen=True, slots=True)
class Ready:
    """One batch of work for the caller. Carry it out in exactly this order:

    1. `snapshot`: restore the state machine from it and make it durable (the log before it is
       discarded). Then `entries`: append them durably; an entry whose index is already stored
       replaces it and everything after it. Then `hard_state`: write it atomically. One fsync
       may cover all three (group commit), but all three must be durable before step 3.
    2. `messages` may be sent at once, even while step 1 is in progress (they are a leader's
       appends and heartbeats, whose safety does not rest on the leader's own disk). A batch
       whose `hard_state` changed has none: no message may speak for an undurable term.
    3. `persisted_messages` may be sent only after step 1 is durable (votes, acknowledgements).
    4. `committed_entries`: apply them in order, once step 1's snapshot is restored. They
       need not wait for step 1's entries and hard state to be durable (some may be in
       `entries`): a committed entry is durable on a quorum already. etcd's server, too,
       applies while its WAL syncs.
    5. `read_states`: answer each once the applied index reaches its `index`; the reads in
       `failed_reads` cannot be served by this member now (no leader, leadership lost): retry.
    6. Call `advance(ready)` on the core: that is how it learns that step 1 is durable and
       step 4 is done.
    `soft_state` is informational and may be looked at any time.
    """

    hard_state: HardState | None = None
    snapshot: Snapshot | None = None
    entries: tuple[Entry, ...] = ()
    messages: tuple[Message, ...] = ()
    persisted_messages: tuple[Message, ...] = ()
    committed_entries: tuple[Entry, ...] = ()
    read_states: tuple[ReadState, ...] = ()
    failed_reads: tuple[Any, ...] = ()
    soft_state: SoftState | None = None

    def __bool__(self) -> bool:
        return bool(
            self.hard_state is not None
            or self.snapshot is not None
            or self.entries
            or self.messages
            or self.persisted_messages
            or self.committed_entries
            or self.read_states
            or self.failed_reads
            or self.soft_state is not None
        )


@dataclass(slots=True)
class RecoveredState:
    """What storage hands the core at start: the durable facts, nothing else.

    `snapshot.index` is 0 for a member that has never taken or installed one; a member
    bootstrapping a new cluster starts from an empty log and a zero snapshot whose membership is
    the initial configuration, while a member joining an existing cluster starts with an empty
    membership and learns it from the leader.

    `commit` is the commit index the member recorded (0 when none): entries up to it are known
    committed, so the member applies them at start without waiting to hear from a leader (etcd
    restores its HardState's commit likewise). Storage never records it beyond its durable log.
    """

    hard_state: HardState = field(default_factory=HardState)
    snapshot: SnapshotMeta = field(
        default_factory=lambda: SnapshotMeta(index=0, term=0, membership=EMPTY_MEMBERSHIP)
    )
    entries: list[Entry] = field(default_factory=list)
    commit: int = 0
