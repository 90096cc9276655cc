"""The Raft consensus core: a deterministic object with no I/O.

Inputs are method calls (`tick`, `step`, `propose`, `change_membership`, `read_index`,
`transfer_leadership`, `compact`, `report_snapshot`); outputs accumulate until the caller takes
them as one `Ready` batch, carries it out in the order `Ready` documents, and calls `advance`.
Time is the number of `tick()` calls; randomness is the `random.Random` in `Settings`. The one
wall-clock reading the core needs, the time a leader stamps on each entry it appends, comes
from the `wall_clock_ms` callable in `Settings` too (the runtime passes the real clock, the
simulator one per member that it drives and skews).

What it implements, with the section of Ongaro's dissertation (or the Raft paper) it follows:
elections with randomized timeouts (3.4), PreVote and CheckQuorum (9.6), log replication with
fast conflict backtracking (3.5), the commitment rule (3.6.2), learners (4.2.1), joint consensus
(4.3, with the newest membership in the log in force), leadership transfer (3.10), ReadIndex
(6.4), snapshot installation and compaction (5), and a no-op entry on election (6.4).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import quorum
from .membership import change_in_flight
from .progress import Progress, ProgressState
from .raftlog import RaftLog
from .types import (
    CoreStatus,
    Entry,
    EntryKind,
    HardState,
    Membership,
    Message,
    MessageType,
    PeerProgress,
    ReadState,
    Ready,
    RecoveredState,
    Role,
    Snapshot,
    SnapshotMeta,
    SoftState,
)

MT = MessageType


class ProposalError(Exception):
    """A request the core cannot take now; the message says why and what to do."""


class NotLeader(ProposalError):
    def __init__(self, leader: str | None) -> None:
        self.leader = leader
        hint = f"the leader is {leader}" if leader else "no leader is known yet; retry shortly"
        super().__init__(f"this member is not the leader: {hint}")


class TransferInProgress(ProposalError):
    def __init__(self, target: str) -> None:
        self.target = target
        super().__init__(f"leadership is being transferred to {target}; retry shortly")


class MembershipChangeInProgress(ProposalError):
    def __init__(self, index: int) -> None:
        self.index = index
        super().__init__(
            f"a membership change (log index {index}) has not finished yet; "
            "wait until it is committed and not joint, then retry"
        )


class InvalidMembership(ProposalError, ValueError):
    pass


# Admission states of a member that started empty (see Core.await_admission).
UNDECIDED = "undecided"
FENCED = "fenced"


def no_wall_clock() -> int:
    """The default clock: every entry is stamped with the previous entry's time (0 = unknown)."""
    return 0


@dataclass(frozen=True)
class Settings:
    """Tunables of one member. Ticks are the caller's unit of time (the node uses one tick per
    `--heartbeat-ms`). `wall_clock_ms` returns the wall-clock time in milliseconds since the
    Unix epoch; a leader reads it once per append and stamps `max(it, the last entry's time)`,
    so a clock that is behind, or steps back, never makes the log's times decrease."""

    rng: random.Random = field(default_factory=lambda: random.Random(0))
    wall_clock_ms: Callable[[], int] = no_wall_clock
    election_ticks: int = 10  # election timeout; each member picks [n, 2n) at random
    heartbeat_ticks: int = 1
    max_inflight: int = 256  # unacknowledged appends per follower (flow control)
    max_entries_per_message: int = 4096
    max_bytes_per_message: int = 1 << 20
    max_apply_batch: int = 8192  # committed entries handed out per Ready
    pre_vote: bool = True
    check_quorum: bool = True
    # When a leader's commit index moves and no entries are waiting for a follower, etcd's
    # raft sends it an empty append at once just to carry the new index. Lazily, the leader
    # leaves that to the next append (a writer's next command usually follows within a
    # millisecond), to `announce_commit()` (the runtime calls it a few milliseconds later when
    # `commit_news` is still set) or to the next tick's heartbeat. It halves the peer messages
    # of a lone writer; followers learn a commit a little later, and nothing else changes.
    lazy_commit: bool = False


@dataclass(slots=True)
class _PendingRead:
    context: Any
    index: int
    round: int
    requester: str


class RaftCore:
    def __init__(self, name: str, settings: Settings, recovered: RecoveredState) -> None:
        self.name = name
        self.settings = settings
        self.rng = settings.rng
        self.log = RaftLog(recovered.snapshot, recovered.entries)
        # What this member recorded as committed is committed: applied again from the start.
        self.log.commit_to(min(recovered.commit, self.log.last_index()))
        self.term = recovered.hard_state.term
        self.vote = recovered.hard_state.vote
        self.role = Role.FOLLOWER
        self.leader: str | None = None
        # See `await_admission`: None, or (UNDECIDED, the index whose configuration decides;
        # -1 until the first append or snapshot from a leader says it) or (FENCED, 0).
        self.admission: tuple[str, int] | None = None
        self.progress: dict[str, Progress] = {}
        self.votes: dict[str, bool] = {}
        self.election_elapsed = 0
        self.heartbeat_elapsed = 0
        self.randomized_timeout = 0
        self.ticks = 0  # ticks since the core was made: what `Progress.heard_at` counts in
        self.transfer_target: str | None = None
        self._reads: list[_PendingRead] = []  # leader: confirmed by a heartbeat round
        self._reads_waiting: list[tuple[Any, str]] = []  # leader: until its no-op commits
        self._read_round = 0
        self._read_round_wanted = False
        self._broadcast_wanted = False
        self.commit_news = False  # lazy_commit: a commit index some follower has not been sent
        self.acks_beyond_sent = 0  # acknowledgements of more than was sent (hostile or broken)
        self._msgs: list[Message] = []
        self._persisted_msgs: list[Message] = []
        self._read_states: list[ReadState] = []
        self._failed_reads: list[Any] = []
        self._last_hard_state = recovered.hard_state
        self._last_soft_state = SoftState(None, Role.FOLLOWER, self.term)
        self._awaiting_advance: Ready | None = None
        self._reset_election_timer()

    # === public inputs =======================================================================

    @property
    def membership(self) -> Membership:
        return self.log.membership()

    @property
    def commit_index(self) -> int:
        return self.log.committed

    @property
    def snapshot_index(self) -> int:
        """The index the log is compacted to (covered by a snapshot)."""
        return self.log.snapshot.index

    def tick(self) -> None:
        self.ticks += 1
        if self.role is Role.LEADER:
            self._tick_leader()
            return
        self.election_elapsed += 1
        if self.election_elapsed >= self.randomized_timeout and self._promotable():
            self.election_elapsed = 0
            self._campaign(pre=self.settings.pre_vote, force=False)

    def knows_leader(self) -> bool:
        """Whether this member counts a leader now (etcd's `has_leader`), judged by time: a
        follower (or learner) that heard from its leader within an election timeout, or a
        leader that heard from a quorum of voters within one. With PreVote a follower keeps
        the name of a leader that died until it campaigns, up to two election timeouts later,
        and a leader cut off from its quorum steps down at its next CheckQuorum; this answers
        within one election timeout in both cases."""
        timeout = self.settings.election_ticks
        if self.role is not Role.LEADER:
            return self.leader is not None and self.election_elapsed < timeout
        now = self.ticks
        heard = {name for name, pr in self.progress.items()
                 if name == self.name or now - pr.heard_at < timeout}
        return quorum.has_quorum(self.membership, heard)

    def campaign(self) -> None:
        """Start an election now (tests and operator tooling; normally ticks do this)."""
        if self._promotable() and self.role is not Role.LEADER:
            self._campaign(pre=self.settings.pre_vote, force=False)

    def propose(self, data: bytes) -> int:
        """Append a client command; returns its log index. It is committed once it shows up in
        `committed_entries` (at that index, with this term)."""
        self._check_can_propose()
        log = self.log
        index = log.last_index() + 1
        log.append([Entry(index, self.term, EntryKind.NORMAL, data, self._stamp())])
        self._broadcast_wanted = True
        return index

    def propose_many(self, commands: list[bytes]) -> int:
        """Append several commands at once; returns the index of the first."""
        self._check_can_propose()
        first = self.log.last_index() + 1
        term = self.term
        normal = EntryKind.NORMAL
        ts = self._stamp()
        self.log.append([Entry(first + i, term, normal, d, ts) for i, d in enumerate(commands)])
        self._broadcast_wanted = True
        return first

    def change_membership(
        self,
        voters: set[str] | frozenset[str],
        learners: set[str] | frozenset[str] = frozenset(),
        addresses: dict[str, str] | None = None,
        clients: dict[str, str] | None = None,
    ) -> int:
        """Propose the configuration with exactly these voters and learners.

        A change of voters goes through joint consensus: first C_old,new, and once that commits
        the leader appends C_new by itself. A change of learners only is a single step. At most
        one change is in flight: the previous one must be committed and not joint.
        `addresses` (member -> peer URL) are merged into the ones the configuration carries.
        """
        self._check_can_propose()
        voters, learners = frozenset(voters), frozenset(learners) - frozenset(voters)
        if not voters:
            raise InvalidMembership("a configuration needs at least one voter")
        current = self.settled_membership()
        if voters == current.voters and learners == current.learners:
            raise InvalidMembership("the configuration is already exactly that")
        merged = dict(current.addresses)
        merged.update(addresses or {})
        merged_clients = dict(current.clients)
        merged_clients.update(clients or {})
        outgoing = None if voters == current.voters else current.voters
        target = Membership(voters=voters, learners=learners, outgoing=outgoing)
        return self._append_membership(target.with_addresses(merged, merged_clients))

    def publish_client_urls(self, urls: dict[str, str]) -> int | None:
        """Leader: record members' client URLs in the configuration (one membership entry that
        changes no voter), so followers forward clients to the URL the log gives. None when
        the configuration already says so; MembershipChangeInProgress while a change runs (the
        runtime tries again once it is committed)."""
        self._check_can_propose()
        current = self.membership
        clients = dict(current.clients)
        members = current.members() | {self.name}
        wanted = {n: u for n, u in urls.items() if n in members}
        if all(clients.get(n) == u for n, u in wanted.items()):
            return None
        self.settled_membership()
        clients.update(wanted)
        return self._append_membership(current.with_addresses(current.addresses, clients))

    def read_index(self, context: Any) -> None:
        """Ask for a linearizable read. A `ReadState(context, index)` comes out in a later
        Ready: once the state machine has applied `index`, answering from it is linearizable.
        If this member cannot get one (no leader, lost leadership), `context` comes out in
        `Ready.failed_reads` instead, and the caller should retry."""
        if self.role is Role.LEADER:
            self._leader_read(context, self.name)
        elif self.leader is not None:
            self._send(
                Message(MT.READ_INDEX, to=self.leader, frm=self.name, term=self.term,
                        context=context)
            )
        else:
            self._failed_reads.append(context)

    def transfer_leadership(self, target: str) -> None:
        """Hand leadership to `target` (a voter): bring it up to date, then tell it to campaign
        at once. Proposals are refused meanwhile; the attempt is abandoned after an election
        timeout."""
        if self.role is not Role.LEADER:
            raise NotLeader(self.leader)
        if target == self.name:
            return
        if not self.membership.can_vote(target) or target not in self.progress:
            raise InvalidMembership(f"{target} is not a voter and cannot become the leader")
        if self.transfer_target == target:
            return
        self.transfer_target = target
        self.election_elapsed = 0
        pr = self.progress[target]
        if pr.match == self.log.last_index():
            self._send_timeout_now(target)
        else:
            self._send_append(target)

    def compact(self, index: int, keep_entries: int = 0) -> SnapshotMeta:
        """The caller has made a snapshot of the state machine at `index` (<= applied) durable.
        Returns its metadata; entries up to `index - keep_entries` are forgotten, and followers
        that need them are sent this snapshot instead."""
        meta = self.snapshot_meta(index)
        self.log.compact(meta, keep_from=index - keep_entries + 1)
        return meta

    def snapshot_meta(self, index: int) -> SnapshotMeta:
        """What a snapshot of the state machine at `index` records: the entry's term and time,
        and the configuration in force there. ValueError when the log no longer holds it."""
        term = self.log.term(index)
        if term is None:
            raise ValueError(f"cannot snapshot at {index}: that entry is not in the log")
        return SnapshotMeta(index=index, term=term, membership=self.log.membership_at(index),
                            ts_ms=self.log.ts(index))

    def report_snapshot(self, peer: str, ok: bool) -> None:
        """The runtime finished (or gave up) sending a snapshot to `peer`."""
        pr = self.progress.get(peer)
        if self.role is not Role.LEADER or pr is None or pr.state is not ProgressState.SNAPSHOT:
            return
        if not ok:
            pr.pending_snapshot = 0
        pr.become_probe()
        pr.probe_sent = True  # wait for the follower's answer or the next heartbeat

    def report_unreachable(self, peer: str) -> None:
        """Sending to `peer` failed: stop pipelining to it until it answers again."""
        pr = self.progress.get(peer)
        if self.role is Role.LEADER and pr is not None and pr.state is ProgressState.REPLICATE:
            pr.become_probe()

    # === stepping messages ===================================================================

    def step(self, m: Message) -> None:
        if m.term > self.term:
            if m.type in (MT.VOTE, MT.PREVOTE) and not m.force and self._in_lease():
                # CheckQuorum lease: we heard from a leader within the election timeout, so a
                # candidate (perhaps a removed or partitioned member) must not disrupt it.
                return
            if m.type is MT.PREVOTE or (m.type is MT.PREVOTE_RESP and not m.reject):
                pass  # a PreVote never changes anybody's term
            elif m.type in (MT.APPEND, MT.HEARTBEAT, MT.SNAPSHOT):
                self._become_follower(m.term, m.frm)
            else:
                self._become_follower(m.term, None)
        elif m.term < self.term:
            if m.type in (MT.APPEND, MT.HEARTBEAT):
                # A leader of an older term (it was cut off): tell it our term so it steps down.
                self._send(Message(MT.APPEND_RESP, to=m.frm, frm=self.name, term=self.term))
            elif m.type is MT.PREVOTE:
                self._send(Message(MT.PREVOTE_RESP, to=m.frm, frm=self.name, term=self.term,
                                   reject=True))
            return

        handler = self._HANDLERS.get(m.type)
        if handler is not None:
            handler(self, m)

    def _on_vote(self, m: Message) -> None:
        pre = m.type is MT.PREVOTE
        can_vote = self.admission is None and (
            self.vote == m.frm
            or (self.vote is None and self.leader is None)
            or (pre and m.term > self.term)
        )
        resp_type = MT.PREVOTE_RESP if pre else MT.VOTE_RESP
        if can_vote and self.log.is_up_to_date(m.index, m.log_term):
            self._send(Message(resp_type, to=m.frm, frm=self.name, term=m.term))
            if not pre:
                self.vote = m.frm
                self.election_elapsed = 0
        else:
            self._send(Message(resp_type, to=m.frm, frm=self.name, term=self.term, reject=True))

    def _on_vote_resp(self, m: Message) -> None:
        if m.type is MT.PREVOTE_RESP and self.role is not Role.PRE_CANDIDATE:
            return
        if m.type is MT.VOTE_RESP and self.role is not Role.CANDIDATE:
            return
        self.votes.setdefault(m.frm, not m.reject)
        result = quorum.vote_result(self.membership, self.votes)
        if result is quorum.VoteResult.WON:
            if self.role is Role.PRE_CANDIDATE:
                self._campaign(pre=False, force=False)
            else:
                self._become_leader()
        elif result is quorum.VoteResult.LOST:
            self._become_follower(self.term, None)

    def _on_append(self, m: Message) -> None:
        if self.role is Role.LEADER:
            return  # impossible by election safety; ignored rather than trusted
        self._follow(m.frm)
        log = self.log
        if m.index < log.committed:
            self._send(Message(MT.APPEND_RESP, to=m.frm, frm=self.name, term=self.term,
                               index=log.committed))
            return
        admission = self.admission  # None for every member that votes: one test per append
        if admission is not None and admission[1] < 0:
            # First contact: judge by the configuration as of the leader's commit index, or of
            # the entry this append follows if later. A leader starts sending to a member just
            # after the entry that added it, so every configuration that names it is there.
            self.admission = (UNDECIDED, max(m.commit, m.index))
        last_new = log.maybe_append(m.index, m.log_term, m.commit, m.entries)
        if last_new is not None:
            if admission is not None:
                self._review_admission()
            self._send(Message(MT.APPEND_RESP, to=m.frm, frm=self.name, term=self.term,
                               index=last_new))
            return
        hint_index, hint_term = log.conflict_hint(m.index, m.log_term)
        self._send(Message(MT.APPEND_RESP, to=m.frm, frm=self.name, term=self.term,
                           index=m.index, reject=True, hint_index=hint_index,
                           hint_term=hint_term))

    def _on_heartbeat(self, m: Message) -> None:
        if self.role is Role.LEADER:
            return
        self._follow(m.frm)
        # The leader sends min(our match, its commit), so this never commits an entry we hold
        # but the leader does not.
        self.log.commit_to(min(m.commit, self.log.last_index()))
        self._send(Message(MT.HEARTBEAT_RESP, to=m.frm, frm=self.name, term=self.term,
                           context=m.context))

    def _on_snapshot(self, m: Message) -> None:
        if self.role is Role.LEADER or m.snapshot is None:
            return
        self._follow(m.frm)
        meta = m.snapshot.meta
        log = self.log
        if meta.index <= log.committed:
            index = log.committed
        elif log.match_term(meta.index, meta.term):
            log.commit_to(meta.index)  # we already hold it: just move the commit forward
            index = meta.index
        else:
            log.restore(m.snapshot)
            index = meta.index
        if self.admission == (UNDECIDED, -1):
            self.admission = (UNDECIDED, meta.index)
        self._review_admission()
        self._send(Message(MT.APPEND_RESP, to=m.frm, frm=self.name, term=self.term, index=index))

    def _on_timeout_now(self, m: Message) -> None:
        if self._promotable():
            self._campaign(pre=False, force=True)

    def _on_read_index(self, m: Message) -> None:
        if self.role is Role.LEADER:
            self._leader_read(m.context, m.frm)
        else:
            self._send(Message(MT.READ_INDEX_RESP, to=m.frm, frm=self.name, term=self.term,
                               context=m.context, reject=True))

    def _on_read_index_resp(self, m: Message) -> None:
        if m.reject:
            self._failed_reads.append(m.context)
        else:
            self._read_states.append(ReadState(m.context, m.index))

    def _on_append_resp(self, m: Message) -> None:
        pr = self.progress.get(m.frm)
        if self.role is not Role.LEADER or pr is None:
            return
        pr.recent_active = True
        if m.reject:
            hint = m.hint_index
            if m.hint_term > 0:
                hint, _ = self.log.conflict_hint(m.hint_index, m.hint_term)
            if pr.maybe_decrease(m.index, hint):
                if pr.state is ProgressState.REPLICATE:
                    pr.become_probe()
                self._send_append(m.frm)
            return
        if m.index > pr.sent_max:
            # More than we ever sent it: a broken or hostile peer. Believing even part of it
            # could count entries still on their way (or lost) as stored, so it is ignored;
            # the follower's next real answer moves replication on.
            self.acks_beyond_sent += 1  # the runtime reports it (a metric)
            return
        if not pr.maybe_update(m.index):
            return
        if pr.state is ProgressState.PROBE:
            pr.become_replicate()
        elif pr.state is ProgressState.SNAPSHOT and pr.match >= pr.pending_snapshot:
            pr.become_probe()
            pr.become_replicate()
        if self._maybe_commit():
            self._commit_moved()
            # The commit may have ended this leadership or removed the member (C_new).
            if self.role is not Role.LEADER or self.progress.get(m.frm) is not pr:
                return
        if not self._broadcast_wanted and pr.match < self.log.last_index():
            self._send_append(m.frm)
        if m.frm == self.transfer_target and pr.match == self.log.last_index():
            self._send_timeout_now(m.frm)

    def _on_heartbeat_resp(self, m: Message) -> None:
        pr = self.progress.get(m.frm)
        if self.role is not Role.LEADER or pr is None:
            return
        pr.recent_active = True
        pr.heard_at = self.ticks  # heartbeats go out every tick: no cost per write
        pr.probe_sent = False
        if pr.state is ProgressState.REPLICATE and len(pr.inflight) >= pr.max_inflight:
            # The follower is alive but the window is full: appends were probably lost. Free a
            # slot so the next append either lands or is rejected and sends us back to probing.
            pr.inflight.popleft()
        if isinstance(m.context, int) and m.context > pr.read_ack:
            pr.read_ack = m.context
            self._release_reads()
        if pr.match < self.log.last_index():
            self._send_append(m.frm)

    _HANDLERS = {
        MT.VOTE: _on_vote,
        MT.PREVOTE: _on_vote,
        MT.VOTE_RESP: _on_vote_resp,
        MT.PREVOTE_RESP: _on_vote_resp,
        MT.APPEND: _on_append,
        MT.APPEND_RESP: _on_append_resp,
        MT.HEARTBEAT: _on_heartbeat,
        MT.HEARTBEAT_RESP: _on_heartbeat_resp,
        MT.SNAPSHOT: _on_snapshot,
        MT.TIMEOUT_NOW: _on_timeout_now,
        MT.READ_INDEX: _on_read_index,
        MT.READ_INDEX_RESP: _on_read_index_resp,
    }

    # === output ==============================================================================

    def has_ready(self) -> bool:
        log = self.log
        return bool(
            self._msgs
            or self._persisted_msgs
            or self._read_states
            or self._failed_reads
            or self._broadcast_wanted
            or self._read_round_wanted
            or log.pending_snapshot is not None
            or log.unsent <= log.last_index()
            or log.handed < log.committed
            or HardState(self.term, self.vote) != self._last_hard_state
            or self._soft_state() != self._last_soft_state
        )

    def ready(self) -> Ready:
        """Take the accumulated outputs. `advance(ready)` must follow before the next call."""
        if self._awaiting_advance is not None:
            raise RuntimeError("ready() called again before advance() of the previous batch")
        if self._broadcast_wanted:
            self._broadcast_wanted = False
            self._broadcast_append()
        if self._read_round_wanted:
            self._read_round_wanted = False
            self._read_round += 1
            self._broadcast_heartbeat()
        log = self.log
        hard = HardState(self.term, self.vote)
        hard_changed = hard != self._last_hard_state
        soft = self._soft_state()
        messages, persisted = self._msgs, self._persisted_msgs
        if hard_changed and messages:
            # Nothing may speak for a term before that term is durable: a leader that crashed
            # before persisting it could win the same term again and reuse (index, term) pairs
            # a follower already holds (a single voter wins before anyone hears from it).
            messages, persisted = [], messages + persisted
        rd = Ready(
            hard_state=hard if hard_changed else None,
            snapshot=log.pending_snapshot,
            entries=log.unsent_entries(),
            messages=tuple(messages),
            persisted_messages=tuple(persisted),
            committed_entries=log.committed_to_hand(self.settings.max_apply_batch),
            read_states=tuple(self._read_states),
            failed_reads=tuple(self._failed_reads),
            soft_state=soft if soft != self._last_soft_state else None,
        )
        log.pending_snapshot = None
        self._msgs = []
        self._persisted_msgs = []
        self._read_states = []
        self._failed_reads = []
        self._last_hard_state = hard
        self._last_soft_state = soft
        self._awaiting_advance = rd
        return rd

    def advance(self, rd: Ready) -> None:
        """The caller has carried out `rd`: persisted it and applied its committed entries."""
        if rd is not self._awaiting_advance:
            raise RuntimeError("advance() must be given the batch the last ready() returned")
        self._awaiting_advance = None
        log = self.log
        if rd.entries:
            last = rd.entries[-1]
            log.stable_to(last.index, last.term)
        if rd.committed_entries:
            # max(): a snapshot installed since that batch was handed out may be newer.
            log.applied = max(log.applied, rd.committed_entries[-1].index)
        if self.role is Role.LEADER and rd.entries:
            pr = self.progress.get(self.name)
            if pr is not None and pr.maybe_update(log.stable) and self._maybe_commit():
                self._commit_moved()

    def status(self) -> CoreStatus:
        """The core's facts at this moment (for `/v1/status`, the admin API, the archiver and
        tests): a copy, never a view of the core's own structures."""
        log = self.log
        leading = self.role is Role.LEADER
        return CoreStatus(
            name=self.name,
            term=self.term,
            vote=self.vote,
            role=self.role,
            leader=self.leader,
            commit_index=log.committed,
            applied_index=log.applied,
            first_index=log.first_index(),
            last_index=log.last_index(),
            snapshot=log.snapshot,
            membership=self.membership,
            membership_index=log.membership_index(),
            admission=self.admission,
            progress={name: PeerProgress(pr.match, pr.next, pr.state.name.lower())
                      for name, pr in self.progress.items()} if leading else {},
            acks_beyond_sent=self.acks_beyond_sent,
        )

    def term_at(self, index: int) -> int | None:
        """The term of entry `index` in this member's log; None when the log does not hold it
        (compacted, or beyond its end)."""
        return self.log.term(index)

    # === roles ===============================================================================

    def _become_follower(self, term: int, leader: str | None) -> None:
        if self.role is Role.LEADER:
            self._fail_pending_reads()
        if term > self.term:
            self.term = term
            self.vote = None
        self.role = Role.FOLLOWER
        self.leader = leader
        self.votes = {}
        self.progress = {}
        self.transfer_target = None
        self.election_elapsed = 0
        self._broadcast_wanted = False
        self._read_round_wanted = False
        self._reset_election_timer()

    def _follow(self, leader: str) -> None:
        if self.role is not Role.FOLLOWER:
            self._become_follower(self.term, leader)
        self.leader = leader
        self.election_elapsed = 0

    def _campaign(self, pre: bool, force: bool) -> None:
        if pre:
            self.role = Role.PRE_CANDIDATE
            term = self.term + 1
            kind = MT.PREVOTE
        else:
            self.term += 1
            self.vote = self.name
            self.role = Role.CANDIDATE
            term = self.term
            kind = MT.VOTE
        self.leader = None
        self.votes = {self.name: True}
        self._reset_election_timer()
        result = quorum.vote_result(self.membership, self.votes)
        if result is quorum.VoteResult.WON:
            if pre:
                self._campaign(pre=False, force=force)
            else:
                self._become_leader()
            return
        m = self.membership
        last_index, last_term = self.log.last_index(), self.log.last_term()
        for peer in sorted(m.voters | (m.outgoing or frozenset())):
            if peer != self.name:
                self._send(Message(kind, to=peer, frm=self.name, term=term, index=last_index,
                                   log_term=last_term, force=force))

    def _become_leader(self) -> None:
        self.role = Role.LEADER
        self.leader = self.name
        self.votes = {}
        self.transfer_target = None
        self.election_elapsed = 0
        self.heartbeat_elapsed = 0
        self.progress = {}
        self._reset_progress()
        # The no-op lets this leader commit entries of earlier terms (which it may not count)
        # and tells it which commit index is safe for reads.
        index = self.log.last_index() + 1
        self.log.append([Entry(index, self.term, EntryKind.NOOP, b"", self._stamp())])
        self._broadcast_wanted = True

    def _reset_progress(self) -> None:
        next_index = self.log.last_index() + 1
        old = self.progress
        self.progress = {}
        for name in sorted(self.membership.members() | {self.name}):
            pr = old.get(name) if self.role is Role.LEADER else None
            if pr is None:
                pr = Progress(next_index, self.settings.max_inflight)
                if name == self.name:
                    pr.match = self.log.stable
                    pr.next = self.log.last_index() + 1
                    pr.state = ProgressState.REPLICATE
                pr.recent_active = True
                pr.heard_at = self.ticks  # a quorum just elected this leader
            self.progress[name] = pr

    # --- admission of a member that starts empty ---------------------------------------------

    def await_admission(self, state: tuple[str, int] | None = (UNDECIDED, -1)) -> None:
        """Neither vote nor campaign until this member is known to be new to the cluster.

        For a member that starts with an empty log and waits to be added (the caller's
        `existing` mode). If its disk was lost, the cluster may still count it as the voter it
        was, and with an empty log it would vote for any candidate, one that lacks entries the
        lost disk held included: a committed write could be lost. A genuinely new member is
        only ever added as a learner, so the configuration at first contact tells the two
        apart: a learner (or absent) is new and is admitted; a voter came back without its
        disk and stays fenced until it has been removed and added back, which it sees as a
        configuration naming it a learner only. (A fenced voter that never is stays out of
        elections for good: a liveness cost, never a safety one.)

        "At first contact" is the later of the leader's commit index and the entry its first
        append follows: every configuration that adds this member lies at or before it (see
        `_on_append`). When no configuration at all covers that index, it is the first one,
        which lives only in the leader's bootstrap snapshot at index 0 and is never sent: then
        this member, which a leader replicates to yet no later configuration names, is one of
        the first voters, and is fenced too.

        `state` restores what `admission` held before a restart (the caller persists it).
        """
        self.admission = state

    def _review_admission(self) -> None:
        if self.admission is None:
            return
        state, judge_at = self.admission
        log = self.log
        if state == UNDECIDED:
            if judge_at < 0 or log.last_index() < judge_at:
                return  # the log has not reached the configuration to judge by yet
            judged = log.membership_at(max(judge_at, log.offset))
            if judged.voters and not judged.can_vote(self.name):
                self.admission = None
                return
            # A voter there, or no configuration known there (the first one: see above).
            self.admission = (FENCED, 0)
        newest = log.membership()
        if self.name in newest.learners and not newest.can_vote(self.name):
            self.admission = None  # removed and added back since: new to the cluster

    def _promotable(self) -> bool:
        """Whether this member may start an election.

        A voter of its newest configuration may; so may a voter of the configuration as of its
        commit index, even if a newer, uncommitted one leaves it out: otherwise a leader that
        appended C_new without itself and then lost leadership could deadlock the cluster (the
        new voters need its vote while joint, it refuses them for their shorter logs, and it
        never campaigns). Votes are still counted under the newest configuration, and once a
        configuration without this member commits, it stops campaigning for good.
        """
        log = self.log
        if log.pending_snapshot is not None or self.admission is not None:
            return False
        return (log.membership().can_vote(self.name)
                or log.membership_at(log.committed).can_vote(self.name))

    def _in_lease(self) -> bool:
        return (
            self.settings.check_quorum
            and self.leader is not None
            and self.election_elapsed < self.settings.election_ticks
        )

    def _reset_election_timer(self) -> None:
        n = self.settings.election_ticks
        self.randomized_timeout = self.rng.randint(n, 2 * n - 1)

    def _tick_leader(self) -> None:
        if self.commit_news:
            self.announce_commit()
        self.heartbeat_elapsed += 1
        self.election_elapsed += 1
        if self.election_elapsed >= self.settings.election_ticks:
            self.election_elapsed = 0
            if self.settings.check_quorum:
                active = {n for n, pr in self.progress.items() if pr.recent_active}
                active.add(self.name)
                if not quorum.has_quorum(self.membership, active):
                    self._become_follower(self.term, None)
                    return
                for name, pr in self.progress.items():
                    if name != self.name:
                        pr.recent_active = False
            self.transfer_target = None  # a transfer that has not finished by now is abandoned
        if self.heartbeat_elapsed >= self.settings.heartbeat_ticks:
            self.heartbeat_elapsed = 0
            self._broadcast_heartbeat()

    # === replication (leader) ================================================================

    def _check_can_propose(self) -> None:
        if self.role is not Role.LEADER:
            raise NotLeader(self.leader)
        if self.transfer_target is not None:
            raise TransferInProgress(self.transfer_target)

    def _stamp(self) -> int:
        """The time of an entry this leader appends now: its clock, but never before the
        entry ahead of it (a previous leader's clock may have been ahead of ours)."""
        now = self.settings.wall_clock_ms()
        last = self.log.last_ts()
        return now if now > last else last

    def match_index(self, name: str) -> int | None:
        """How far `name`'s log is known to match this leader's; None when this member does
        not lead or does not replicate to `name`."""
        pr = self.progress.get(name) if self.role is Role.LEADER else None
        return pr.match if pr is not None else None

    def membership_settled(self) -> bool:
        """Whether no membership change is in flight (consensus/membership.py)."""
        return not change_in_flight(self.membership.joint, self.log.membership_index(),
                                    self.log.committed)

    def settled_membership(self) -> Membership:
        """The configuration, when a new one may be appended: the previous change committed
        and not joint. Else MembershipChangeInProgress (at most one change is in flight)."""
        current = self.membership
        pending = self.log.membership_index()
        if change_in_flight(current.joint, pending, self.log.committed):
            raise MembershipChangeInProgress(pending)
        return current

    def _append_membership(self, target: Membership) -> int:
        index = self.log.last_index() + 1
        self.log.append([Entry(index, self.term, EntryKind.MEMBERSHIP, target.encode(),
                               self._stamp())])
        self._reset_progress()
        self._broadcast_wanted = True
        return index

    def _maybe_commit(self) -> bool:
        """Advance the commit index to what a quorum holds, counting only entries of this term
        (Raft paper 5.4.2: an old-term entry is committed only indirectly)."""
        log = self.log
        progress = self.progress
        index = quorum.committed_index(
            self.membership, lambda n: progress[n].match if n in progress else 0
        )
        if index <= log.committed or log.term(index) != self.term:
            return False
        log.commit_to(index)
        self._after_commit()
        return True

    def _after_commit(self) -> None:
        log = self.log
        if log.committed >= log.membership_index():
            current = self.membership
            if current.joint:
                # C_old,new is committed: move on to C_new (dissertation 4.3).
                target = Membership(voters=current.voters, learners=current.learners)
                self._append_membership(target.with_addresses(current.addresses, current.clients))
            elif not current.can_vote(self.name):
                # C_new is committed and does not include this leader: hand over and step down.
                self._broadcast_append()
                best = max(
                    (n for n in current.voters if n in self.progress),
                    key=lambda n: (self.progress[n].match, n),
                    default=None,
                )
                if best is not None and self.progress[best].match == log.last_index():
                    self._send_timeout_now(best)
                self._become_follower(self.term, None)
                return
        if self._reads_waiting and log.term(log.committed) == self.term:
            waiting, self._reads_waiting = self._reads_waiting, []
            for context, requester in waiting:
                self._leader_read(context, requester)

    def _commit_moved(self) -> None:
        if self.settings.lazy_commit:
            self.commit_news = True
        else:
            self._broadcast_wanted = True

    def announce_commit(self) -> None:
        """Lazy commit: send the commit index to every follower that has not been sent it yet
        (one whose window is full, or that is being probed, hears it with its next append)."""
        self.commit_news = False
        if self.role is not Role.LEADER:
            return
        committed = self.log.committed
        for name, pr in self.progress.items():
            if name != self.name and pr.commit_sent < committed:
                self._send_append(name)

    def _broadcast_append(self) -> None:
        for name in self.progress:
            if name != self.name:
                self._send_append(name)

    def _broadcast_heartbeat(self) -> None:
        commit = self.log.committed
        for name, pr in self.progress.items():
            if name != self.name:
                sent = min(pr.match, commit)
                if sent > pr.commit_sent:
                    pr.commit_sent = sent
                self._send(Message(MT.HEARTBEAT, to=name, frm=self.name, term=self.term,
                                   commit=sent, context=self._read_round))

    def _send_append(self, to: str) -> None:
        pr = self.progress[to]
        if pr.is_paused():
            return
        log = self.log
        prev_index = pr.next - 1
        prev_term = log.term(prev_index)
        if prev_term is None:
            self._send_snapshot(to, pr)
            return
        entries: list[Entry] = []
        if pr.next <= log.last_index():
            entries = log.slice(pr.next, self.settings.max_entries_per_message,
                                self.settings.max_bytes_per_message)
        self._send(Message(MT.APPEND, to=to, frm=self.name, term=self.term, index=prev_index,
                           log_term=prev_term, entries=entries, commit=log.committed))
        pr.commit_sent = log.committed
        pr.sent(entries[-1].index if entries else prev_index)

    def _send_snapshot(self, to: str, pr: Progress) -> None:
        meta = self.log.snapshot
        self._send(Message(MT.SNAPSHOT, to=to, frm=self.name, term=self.term,
                           snapshot=Snapshot(meta)))
        pr.become_snapshot(meta.index)

    def _send_timeout_now(self, to: str) -> None:
        self._send(Message(MT.TIMEOUT_NOW, to=to, frm=self.name, term=self.term))

    # === reads (leader) ======================================================================

    def _leader_read(self, context: Any, requester: str) -> None:
        log = self.log
        if log.term(log.committed) != self.term:
            self._reads_waiting.append((context, requester))  # until this term's no-op commits
            return
        m = self.membership
        if m.voters == {self.name} and not m.joint:
            self._deliver_read(context, log.committed, requester)
            return
        self._reads.append(_PendingRead(context, log.committed, self._read_round + 1, requester))
        self._read_round_wanted = True

    def _release_reads(self) -> None:
        progress = self.progress
        me = self.name
        confirmed = quorum.committed_index(
            self.membership,
            lambda n: (1 << 62) if n == me else (progress[n].read_ack if n in progress else 0),
        )
        reads = self._reads
        done = 0
        while done < len(reads) and reads[done].round <= confirmed:
            r = reads[done]
            self._deliver_read(r.context, r.index, r.requester)
            done += 1
        if done:
            del reads[:done]

    def _deliver_read(self, context: Any, index: int, requester: str) -> None:
        if requester == self.name:
            self._read_states.append(ReadState(context, index))
        else:
            self._send(Message(MT.READ_INDEX_RESP, to=requester, frm=self.name, term=self.term,
                               context=context, index=index))

    def _fail_pending_reads(self) -> None:
        pending = [(r.context, r.requester) for r in self._reads] + self._reads_waiting
        self._reads = []
        self._reads_waiting = []
        for context, requester in pending:
            if requester == self.name:
                self._failed_reads.append(context)
            else:
                self._send(Message(MT.READ_INDEX_RESP, to=requester, frm=self.name,
                                   term=self.term, context=context, reject=True))

    # === plumbing ============================================================================

    def _send(self, m: Message) -> None:
        # A leader's messages never rest on its own disk; everyone else's may (a vote, an
        # acknowledgement), so they wait for the batch to be durable.
        if self.role is Role.LEADER:
            self._msgs.append(m)
        else:
            self._persisted_msgs.append(m)

    def _soft_state(self) -> SoftState:
        return SoftState(self.leader, self.role, self.term)
