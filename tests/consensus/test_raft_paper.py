"""The rules of Raft, one test each, checked against the consensus core.

Each test is named after a sentence of the Raft paper (Ongaro and Ousterhout, "In Search of an
Understandable Consensus Algorithm", Figure 2 and sections 5-7) or of Ongaro's dissertation
("Consensus: Bridging Theory and Practice"), and its docstring quotes it, in the manner of etcd's
raft_paper_test.go. The clusters live in `network.Network`: deterministic, with every message
and every disk write under the test's control.

Where a test turns PreVote or the CheckQuorum lease off, it says why: usually so that one rule
can be seen alone, without a lease that would (rightly) delay an election.
"""

from __future__ import annotations

import random

import pytest
from flotilla.node.consensus import (
    Entry,
    EntryKind,
    HardState,
    InvalidMembership,
    Membership,
    MembershipChangeInProgress,
    Message,
    PeerProgress,
    RaftCore,
    ReadState,
    RecoveredState,
    Role,
    Settings,
    Snapshot,
    SnapshotMeta,
    SoftState,
    TransferInProgress,
)

from .network import MT, Network, log_of, recovered

E = Settings().election_ticks  # the election timeout, in ticks
ABC = ["a", "b", "c"]
NOOP = EntryKind.NOOP
NORMAL = EntryKind.NORMAL


def voters(*names: str) -> frozenset[str]:
    return frozenset(names)


def sent_by(net: Network, name: str, *kinds: MT) -> list[Message]:
    return [m for m in net.sent if m.frm == name and m.type in kinds]


def position(events: list, predicate) -> int:
    return next(i for i, event in enumerate(events) if predicate(event))


# === Figure 2 and 5.1: terms ==================================================================


@pytest.mark.parametrize("role", [Role.FOLLOWER, Role.CANDIDATE, Role.LEADER])
def test_a_message_with_a_term_higher_than_current_term_sets_current_term_and_makes_a_follower(
    role,
):
    """Figure 2, rules for all servers: "If RPC request or response contains term T >
    currentTerm: set currentTerm = T, convert to follower (5.1)". The new term is persistent
    state, with no vote in it yet."""
    net = Network(ABC)
    if role is Role.LEADER:
        net.elect("a")
    elif role is Role.CANDIDATE:
        net.drop(lambda m: m.type is MT.VOTE)
        net.campaign("a")
    a = net["a"]
    assert (a.role, a.term) == (role, 0 if role is Role.FOLLOWER else 1)

    net.step(Message(MT.HEARTBEAT_RESP, to="a", frm="c", term=7))

    assert (a.role, a.term) == (Role.FOLLOWER, 7)
    assert a.disk.hard_state == HardState(7, None)


@pytest.mark.parametrize(
    "kind, reply",
    [(MT.APPEND, MT.APPEND_RESP), (MT.HEARTBEAT, MT.APPEND_RESP), (MT.PREVOTE, MT.PREVOTE_RESP)],
    ids=["append", "heartbeat", "prevote"],
)
def test_a_request_with_a_stale_term_number_is_rejected_and_the_reply_carries_the_current_term(
    kind, reply
):
    """5.1: "If a server receives a request with a stale term number, it rejects the request";
    Figure 2: "Reply false if term < currentTerm". The reply carries the receiver's term, which is
    how the stale sender learns that it is out of date."""
    net = Network(ABC, recovered={"b": recovered([1, 1, 3], 3, ABC)})
    b = net["b"]

    rd = net.step(Message(kind, to="b", frm="a", term=2, index=2, log_term=1,
                          entries=log_of([2], 3), commit=3))

    [answer] = rd.persisted_messages
    assert (answer.type, answer.to, answer.term) == (reply, "a", 3)
    if kind is MT.PREVOTE:
        assert answer.reject
    assert b.log_terms() == [1, 1, 3]  # the stale append changed nothing
    assert b.core.log.committed == 0
    assert b.core.leader is None
    assert b.term == 3


def test_a_vote_request_with_a_stale_term_is_never_granted():
    """Figure 2, RequestVote receiver: "Reply false if term < currentTerm (5.1)"."""
    net = Network(ABC, recovered={"b": recovered([1], 3, ABC)})

    net.step(Message(MT.VOTE, to="b", frm="a", term=2, index=5, log_term=2))

    assert not [m for m in net.sent if m.type is MT.VOTE_RESP and not m.reject]
    assert net["b"].core.vote is None
    assert net["b"].disk.hard_state == HardState(3, None)


def test_a_leader_that_discovers_its_term_is_out_of_date_reverts_to_follower():
    """5.1: "If a candidate or leader discovers that its term is out of date, it immediately
    reverts to follower state." A leader cut off while the others elected a new one learns the
    newer term from the first answer to its heartbeat."""
    net = Network(ABC)
    net.elect("a")
    net.isolate("a")
    for _ in range(3 * E):
        net.tick("b", "c")
        if len(net.leaders()) > 1:
            break
    [new] = [n for n in net.leaders() if n != "a"]
    a = net["a"]
    assert (a.role, a.term, net[new].term) == (Role.LEADER, 1, 2)  # it cannot know yet

    net.heal()
    net.tick("a")

    assert (a.role, a.term) == (Role.FOLLOWER, 2)
    assert [m.term for m in net.delivered if m.to == "a" and m.type is MT.APPEND_RESP][-1] == 2
    net.tick(new)
    assert a.core.leader == new


# === 5.2: leader election =======================================================================


def test_election_timeouts_are_chosen_randomly_between_n_and_2n_ticks():
    """5.2: "Raft uses randomized election timeouts to ensure that split votes are rare ...
    election timeouts are chosen randomly from a fixed interval"; here [n, 2n) ticks for an
    election timeout of n, drawn from the member's own seeded generator (never the global one)."""

    def ticks_until_campaign(seed: int) -> int:
        core = RaftCore("a", Settings(rng=random.Random(seed)), recovered([], 0, ABC))
        ticks = 0
        while core.role is Role.FOLLOWER:
            core.tick()
            ticks += 1
            assert ticks < 2 * E
        return ticks

    waits = [ticks_until_campaign(seed) for seed in range(40)]
    assert min(waits) >= E
    assert max(waits) < 2 * E
    assert len(set(waits)) >= 5
    assert waits == [ticks_until_campaign(seed) for seed in range(40)]  # the seed decides


def test_a_follower_that_receives_no_communication_for_an_election_timeout_begins_an_election():
    """5.2: "If a follower receives no communication over a period of time called the election
    timeout, then it assumes there is no viable leader and begins an election." With PreVote
    (dissertation 9.6) it first asks whether it could win, with the next term in the question
    but without changing its own term or anybody else's."""
    net = Network(ABC)
    a = net["a"]
    ticks = 0
    while a.role is Role.FOLLOWER:
        a.core.tick()
        ticks += 1
    assert E <= ticks < 2 * E

    rd = net.process("a")

    assert (a.role, a.term) == (Role.PRE_CANDIDATE, 0)
    assert rd.hard_state is None
    assert [(m.type, m.to, m.term, m.index, m.log_term) for m in rd.persisted_messages] == [
        (MT.PREVOTE, "b", 1, 0, 0),
        (MT.PREVOTE, "c", 1, 0, 0),
    ]
    net.deliver()
    assert (net["b"].term, net["c"].term) == (0, 0)
    net.stabilize()
    assert (a.role, a.term) == (Role.LEADER, 1)


def test_a_candidate_increments_its_term_votes_for_itself_and_requests_votes_of_every_voter():
    """5.2: "To begin an election, a follower increments its current term and transitions to
    candidate state. It then votes for itself and issues RequestVote RPCs in parallel to each of
    the other servers in the cluster." Its own vote is on disk before any request leaves; a
    learner has no vote and is not asked (dissertation 4.2.1)."""
    net = Network("abcde", learners=["l"])
    net.hold(lambda m: m.type is MT.VOTE)
    net.campaign("a")
    a = net["a"]
    assert (a.role, a.term) == (Role.CANDIDATE, 1)

    [rd] = [rd for rd in a.readies if rd.hard_state is not None]
    assert rd.hard_state == HardState(1, "a")
    assert rd.messages == ()
    assert sorted((m.type, m.to, m.term) for m in rd.persisted_messages) == [
        (MT.VOTE, n, 1) for n in "bcde"
    ]
    durable = position(a.events, lambda e: e == ("persist-hard-state", HardState(1, "a")))
    first_request = position(a.events, lambda e: e[0] == "send" and e[1].type is MT.VOTE)
    assert durable < first_request
    assert not [m for m in net.sent if m.to == "l" and m.type in (MT.PREVOTE, MT.VOTE)]

    net.release()
    net.stabilize()
    assert a.role is Role.LEADER


def test_a_candidate_wins_with_votes_from_a_majority_and_then_sends_heartbeats_to_all():
    """5.2: "A candidate wins an election if it receives votes from a majority of the servers in
    the full cluster for the same term ... It then sends heartbeat messages to all of the other
    servers to establish its authority." Flotilla's first heartbeat is an append carrying the new
    leader's no-op entry (dissertation 6.4), sent at once, not at the next tick."""
    net = Network("abcde")
    net.isolate("d", "e")
    net.campaign("a")
    a = net["a"]

    assert (a.role, a.term) == (Role.LEADER, 1)
    granted = sorted(m.frm for m in net.delivered if m.type is MT.VOTE_RESP and not m.reject)
    assert granted == ["b", "c"]
    [rd] = [rd for rd in a.readies if rd.soft_state and rd.soft_state.role is Role.LEADER]
    assert rd.entries == (Entry(1, 1, NOOP),)
    assert [(m.type, m.to, list(m.entries)) for m in rd.messages] == [
        (MT.APPEND, n, [Entry(1, 1, NOOP)]) for n in "bcde"
    ]


@pytest.mark.parametrize("pre_vote", [True, False])
def test_a_candidate_without_votes_from_a_majority_does_not_become_leader(pre_vote):
    """5.2: a candidate needs "votes from a majority of the servers in the full cluster"; two of
    five are not enough. With PreVote the failed attempt does not even raise its term."""
    net = Network("abcde", pre_vote=pre_vote)
    net.isolate("c", "d", "e")
    net.campaign("a")
    a = net["a"]

    if pre_vote:
        assert (a.role, a.term) == (Role.PRE_CANDIDATE, 0)
    else:
        assert (a.role, a.term) == (Role.CANDIDATE, 1)
    assert net.leaders() == []


@pytest.mark.parametrize("pre_vote", [True, False])
def test_a_candidate_that_hears_from_a_leader_of_its_term_returns_to_follower_state(pre_vote):
    """5.2: "If the leader's term (included in its RPC) is at least as large as the candidate's
    current term, then the candidate recognizes the leader as legitimate and returns to follower
    state." (Lease off: b must be electable while c campaigns.)"""
    net = Network(ABC, pre_vote=pre_vote, check_quorum=False)
    net.isolate("c")
    net.campaign("c")
    c = net["c"]
    assert c.role is (Role.PRE_CANDIDATE if pre_vote else Role.CANDIDATE)
    net.elect("b")
    assert net["b"].term == 1

    net.heal()
    net.tick("b")

    assert (c.role, c.term, c.core.leader) == (Role.FOLLOWER, 1, "b")
    if not pre_vote:
        assert c.disk.hard_state == HardState(1, "c")  # its own vote in term 1 stays recorded


def test_each_server_votes_for_at_most_one_candidate_in_a_term_first_come_first_served():
    """5.2: "Each server will vote for at most one candidate in a given term, on a
    first-come-first-served basis." votedFor is persistent state (Figure 2), so the rule holds
    across a restart."""
    net = Network(ABC)

    def ask(candidate: str) -> bool:
        rd = net.step(Message(MT.VOTE, to="a", frm=candidate, term=1))
        [answer] = rd.persisted_messages
        assert (answer.type, answer.to, answer.term) == (MT.VOTE_RESP, candidate, 1)
        return not answer.reject

    assert ask("b")
    assert net["a"].disk.hard_state == HardState(1, "b")
    assert not ask("c")
    assert ask("b")  # the same candidate asking again (a retransmission) gets the same answer

    net.restart("a")

    assert net["a"].core.vote == "b"
    assert not ask("c")
    assert ask("b")


def test_split_votes_time_out_and_a_new_election_begins_in_the_next_term():
    """5.2: when votes split, "each candidate will time out and start a new election by
    incrementing its term and initiating another round of RequestVote RPCs"; randomized
    timeouts make the next round unlikely to split. (PreVote off: this is the paper's split.)"""
    net = Network("abcd", pre_vote=False)
    net.drop(lambda m: m.type is MT.VOTE and (m.frm, m.to) in {("a", "d"), ("b", "c")})
    net.core("a").campaign()
    net.core("b").campaign()
    net.stabilize()

    assert [(net[n].role, net[n].term) for n in "ab"] == [(Role.CANDIDATE, 1)] * 2
    assert (net["c"].disk.hard_state, net["d"].disk.hard_state) == (
        HardState(1, "a"),
        HardState(1, "b"),
    )
    assert net.leaders() == []

    net.heal()
    for _ in range(4 * E):
        net.tick()
        if net.leaders():
            break

    [leader] = net.leaders()
    assert net[leader].term == 2
    assert sent_by(net, leader, MT.VOTE)[-1].term == 2
    assert all((net[n].term, net[n].core.leader) == (2, leader) for n in "abcd")


# === 5.3: log replication ======================================================================


def test_the_leader_appends_the_command_to_its_log_then_issues_appends_in_parallel():
    """5.3: "The leader appends the command to its log as a new entry, then issues AppendEntries
    RPCs in parallel to each of the other servers to replicate the entry." Each append names the
    entry before the new ones (prevLogIndex, prevLogTerm) and the leader's commit index."""
    net = Network(ABC)
    net.elect("a")
    a = net["a"]

    index = a.core.propose(b"x")
    rd = net.process("a")

    x = Entry(2, 1, NORMAL, b"x")
    assert index == 2
    assert rd.entries == (x,)
    assert [(m.type, m.to, m.index, m.log_term, list(m.entries), m.commit)
            for m in rd.messages] == [(MT.APPEND, n, 1, 1, [x], 1) for n in "bc"]
    net.stabilize()
    assert net["b"].disk.entries[-1] == net["c"].disk.entries[-1] == x


def test_an_entry_is_committed_once_stored_on_a_majority_and_then_applied_by_all_in_log_order():
    """5.3: "A log entry is committed once the leader that created the entry has replicated it
    on a majority of the servers ... Once a follower learns that a log entry is committed, it
    applies the entry to its local state machine (in log order)." Two of five never commit."""
    net = Network("abcde")
    net.elect("a")
    a = net["a"]
    net.isolate("d", "e")

    x = net.propose("a", b"x")

    assert a.core.log.committed == x == 2
    for name in "abc":
        assert [(e.index, e.data) for e in net[name].applied] == [(1, b""), (2, b"x")]
    for name in "de":
        assert [e.index for e in net[name].applied] == [1]

    net.heal()
    net.isolate("c", "d", "e")
    y = net.propose("a", b"y")

    assert net["b"].disk.entries[-1].index == y  # stored by a and b: two of five
    assert a.core.log.committed == x
    assert max(net[n].applied_index() for n in "abcde") == x

    net.heal()
    net.tick("a")

    for name in "abcde":
        assert [(e.index, e.data) for e in net[name].applied] == [(1, b""), (2, b"x"), (3, b"y")]


@pytest.mark.parametrize(
    "prev_index, prev_term, hint",
    [
        (5, 3, (4, 3)),  # the follower has no entry at 5
        (4, 2, (1, 1)),  # its entry at 4 has another term: the hint skips all of term 3
    ],
)
def test_a_follower_refuses_new_entries_if_it_lacks_the_entry_that_precedes_them(
    prev_index, prev_term, hint
):
    """5.3: "If the follower does not find an entry in its log with the same index and term,
    then it refuses the new entries." The refusal carries a hint, the last index at or before
    the leader's whose term is no newer than the leader's, for fast backtracking."""
    net = Network(ABC, recovered={"b": recovered([1, 3, 3, 3], 3, ABC)})
    b = net["b"]

    rd = net.step(Message(MT.APPEND, to="b", frm="a", term=3, index=prev_index,
                          log_term=prev_term, entries=log_of([3], prev_index + 1),
                          commit=prev_index + 1))

    [answer] = rd.persisted_messages
    assert (answer.type, answer.reject, answer.index, answer.term) == (
        MT.APPEND_RESP, True, prev_index, 3)
    assert (answer.hint_index, answer.hint_term) == hint
    assert b.log_terms() == [1, 3, 3, 3]
    assert b.core.log.committed == 0


def test_fast_backtracking_needs_one_round_trip_per_conflicting_term_not_one_per_entry():
    """5.3: "the follower can include the term of the conflicting entry and the first index it
    stores for that term. With this information, the leader can decrement nextIndex to bypass
    all of the conflicting entries in that term; one AppendEntries RPC will be required for each
    term with conflicting entries, rather than one RPC per entry." Here 50 entries of a term the
    leader never had cost one rejected append."""
    net = Network(ABC, recovered={
        "a": recovered([1] + [3] * 50, 3, ABC),
        "b": recovered([1] + [2] * 50, 3, ABC),
        "c": recovered([1] + [3] * 50, 3, ABC),
    })
    net.elect("a")

    rejections = [m for m in net.delivered if m.type is MT.APPEND_RESP and m.frm == "b"
                  and m.reject]
    appends = [(m.index, m.log_term) for m in net.delivered if m.type is MT.APPEND
               and m.to == "b"]
    assert len(rejections) == 1
    assert appends[:2] == [(51, 3), (1, 1)]
    assert net["b"].log_terms() == net["a"].log_terms() == [1] + [3] * 50 + [4]


def test_a_leader_keeps_at_most_max_inflight_appends_unacknowledged_per_follower():
    """Flow control (etcd's Inflights): once a follower's place in the log is known, appends are
    pipelined without waiting for answers, but at most `max_inflight` at a time, so a slow
    follower is not buried under messages. Its answers open the window again."""
    net = Network(ABC, max_inflight=2)
    net.elect("a")
    net.hold(lambda m: m.type is MT.APPEND_RESP and m.frm == "b")
    since = len(net.sent)

    for i in range(5):
        net["a"].core.propose(b"%d" % i)
        net.stabilize()

    appends = [m for m in net.sent[since:] if m.type is MT.APPEND and m.to == "b"]
    assert len(appends) == 2
    assert net["b"].core.log.last_index() == 2
    assert net["c"].core.log.last_index() == 6
    assert net["a"].core.log.committed == 6  # a and c are a majority meanwhile

    net.release()
    net.stabilize()
    assert net["b"].core.log.entries == net["a"].core.log.entries


FIGURE_7 = {
    "leader": [1, 1, 1, 4, 4, 5, 5, 6, 6, 6],
    "a": [1, 1, 1, 4, 4, 5, 5, 6, 6],
    "b": [1, 1, 1, 4],
    "c": [1, 1, 1, 4, 4, 5, 5, 6, 6, 6, 6],
    "d": [1, 1, 1, 4, 4, 5, 5, 6, 6, 6, 7, 7],
    "e": [1, 1, 1, 4, 4, 4, 4],
    "f": [1, 1, 1, 2, 2, 2, 3, 3, 3, 3, 3],
}


def test_the_leader_forces_the_divergent_follower_logs_of_figure_7_to_duplicate_its_own():
    """5.3 and Figure 7: "the leader handles inconsistencies by forcing the followers' logs to
    duplicate its own. This means that conflicting entries in follower logs will be overwritten
    with entries from the leader's log." Followers a-f start with the figure's logs; the leader
    (elected in term 8 by itself, a, b, e and f) has the top one. Missing entries (a, b),
    extra uncommitted ones (c, d) and both (e, f) all end as the leader's log, on disk too, with
    at most one rejected append per follower."""
    names = list(FIGURE_7)
    net = Network(names, recovered={n: recovered(t, 7, names) for n, t in FIGURE_7.items()})

    net.elect("leader")

    expected = [*FIGURE_7["leader"], 8]  # the no-op of term 8 at index 11
    for name in names:
        member = net[name]
        assert (member.log_terms(), member.disk.terms()) == (expected, expected), name
        assert member.core.log.committed == 11, name
    granted = sorted(m.frm for m in net.delivered if m.type is MT.VOTE_RESP and not m.reject)
    assert granted == ["a", "b", "e", "f"]
    rejections = {n: sum(1 for m in net.delivered if m.type is MT.APPEND_RESP and m.frm == n
                         and m.reject) for n in names if n != "leader"}
    assert rejections == {"a": 1, "b": 1, "c": 0, "d": 0, "e": 1, "f": 1}


def test_if_an_existing_entry_conflicts_with_a_new_one_delete_it_and_all_that_follow_it():
    """Figure 2, AppendEntries receiver rule 3: "If an existing entry conflicts with a new one
    (same index but different terms), delete the existing entry and all that follow it"."""
    net = Network(ABC, recovered={"b": recovered([1, 1, 2, 2, 2], 2, ABC)})
    b = net["b"]

    net.step(Message(MT.APPEND, to="b", frm="a", term=3, index=2, log_term=1,
                     entries=log_of([3], 3)))

    assert b.log_terms() == b.disk.terms() == [1, 1, 3]


def test_an_append_of_entries_already_in_the_log_deletes_nothing():
    """Figure 2, AppendEntries receiver rule 4: "Append any new entries not already in the log".
    A delayed or duplicated append that agrees with the log must not cut off what follows it,
    and acknowledges only what it covered."""
    net = Network(ABC, recovered={"b": recovered([1, 1, 1, 1], 1, ABC)})
    b = net["b"]

    rd = net.step(Message(MT.APPEND, to="b", frm="a", term=1, index=1, log_term=1,
                          entries=log_of([1], 2)))

    assert b.log_terms() == b.disk.terms() == [1, 1, 1, 1]
    assert rd.entries == ()
    [answer] = rd.persisted_messages
    assert (answer.type, answer.reject, answer.index) == (MT.APPEND_RESP, False, 2)


def test_a_follower_sets_commit_index_to_min_of_leader_commit_and_index_of_last_new_entry():
    """Figure 2, AppendEntries receiver rule 5: "If leaderCommit > commitIndex, set commitIndex =
    min(leaderCommit, index of last new entry)". The follower's entries past the append may not
    be the leader's, so the leader's commit index does not vouch for them."""
    net = Network(ABC, recovered={"b": recovered([1, 1, 1], 1, ABC)})
    b = net["b"]

    rd = net.step(Message(MT.APPEND, to="b", frm="a", term=1, index=1, log_term=1,
                          entries=log_of([1], 2), commit=3))
    assert b.core.log.committed == 2
    assert [e.index for e in rd.committed_entries] == [1, 2]

    net.step(Message(MT.APPEND, to="b", frm="a", term=1, index=2, log_term=1, commit=3))
    assert b.core.log.committed == 2

    rd = net.step(Message(MT.APPEND, to="b", frm="a", term=1, index=2, log_term=1,
                          entries=log_of([1], 3), commit=3))
    assert b.core.log.committed == 3
    assert [e.index for e in rd.committed_entries] == [3]


def test_a_member_that_recorded_its_commit_index_applies_that_far_at_start_before_any_leader():
    """Figure 2 keeps commitIndex volatile, "initialized to 0 ... increases monotonically". A
    member that records it (etcd's HardState.Commit; here `RecoveredState.commit`, which
    storage never records beyond its durable log) applies up to it again as soon as it starts,
    before it hears from a leader: those entries were committed. A recorded index beyond the
    log is not trusted past the log's end."""
    state = recovered([1, 1, 2, 2, 2], 2, ABC)
    state.commit = 4
    core = RaftCore("a", Settings(rng=random.Random(1)), state)
    assert (core.commit_index, core.role, core.leader) == (4, Role.FOLLOWER, None)
    assert [e.index for e in core.ready().committed_entries] == [1, 2, 3, 4]

    state = recovered([1, 1], 1, ABC)
    state.commit = 9
    assert RaftCore("a", Settings(rng=random.Random(1)), state).commit_index == 2


# === 5.4: safety ===============================================================================


@pytest.mark.parametrize("kind", [MT.VOTE, MT.PREVOTE], ids=["vote", "prevote"])
@pytest.mark.parametrize(
    "last_index, last_term, granted",
    [
        (5, 1, False),  # longer, but its last term is older
        (2, 2, False),  # same last term, shorter
        (3, 2, True),  # the same log
        (4, 2, True),  # same last term, longer
        (1, 3, True),  # a newer last term, though shorter
    ],
    ids=["older-term-longer", "same-term-shorter", "same-log", "same-term-longer",
         "newer-term-shorter"],
)
def test_the_voter_denies_its_vote_if_its_own_log_is_more_up_to_date_than_the_candidates(
    kind, last_index, last_term, granted
):
    """5.4.1: "The voter denies its vote if its own log is more up-to-date than that of the
    candidate ... If the logs have last entries with different terms, then the log with the later
    term is more up-to-date. If the logs end with the same term, then whichever log is longer is
    more up-to-date." A PreVote is answered by the same rule (dissertation 9.6)."""
    net = Network(ABC, recovered={"b": recovered([1, 1, 2], 2, ABC)})

    rd = net.step(Message(kind, to="b", frm="c", term=3, index=last_index, log_term=last_term))

    [answer] = rd.persisted_messages
    assert answer.type is (MT.VOTE_RESP if kind is MT.VOTE else MT.PREVOTE_RESP)
    assert answer.reject is not granted
    if kind is MT.VOTE:
        assert net["b"].disk.hard_state == HardState(3, "c" if granted else None)
    else:
        assert net["b"].disk.hard_state == HardState(2, None)  # a PreVote changes nothing


def figure_8(**settings) -> Network:
    """Figure 8 after (b): S1 led term 2 and got index 2 to S2; S5 led term 3 with the votes of
    S3 and S4 and wrote a different index 2. Everyone has heard of term 3. (PreVote and the lease
    off: the figure is about the paper's algorithm; entries go one per append so that S3 can
    hold index 2 without index 3.)"""
    names = ["s1", "s2", "s3", "s4", "s5"]
    return Network(names, pre_vote=False, check_quorum=False, max_entries_per_message=1,
                   recovered={
                       "s1": recovered([1, 2], 3, names),
                       "s2": recovered([1, 2], 3, names),
                       "s3": recovered([1], 3, names, vote="s5"),
                       "s4": recovered([1], 3, names, vote="s5"),
                       "s5": recovered([1, 3], 3, names, vote="s5"),
                   }, **settings)


def test_raft_never_commits_entries_from_previous_terms_by_counting_replicas():
    """5.4.2 and Figure 8 (c), (d): "a leader cannot immediately conclude that an entry from a
    previous term is committed once it is stored on a majority of servers." S1, leader of term 4,
    gets its term-2 entry at index 2 onto S1, S2 and S3 - a majority - and still must not commit
    it, because S5 can then be elected and overwrite it."""
    net = figure_8()
    net.isolate("s4", "s5")
    s3 = net["s3"]
    net.drop(lambda m: m.type is MT.APPEND and m.to == "s3" and s3.core.log.last_index() >= 2
             and any(e.index == 3 for e in m.entries))
    net.elect("s1")  # (c)
    s1 = net["s1"]
    assert s1.term == 4

    holders = [n for n in net.members if n != "s5" and net[n].disk.terms()[1:2] == [2]]
    assert holders == ["s1", "s2", "s3"]
    assert s1.core.log.committed == 0
    assert s1.applied == []

    net.heal()
    net.isolate("s1")  # (d): S1 crashes
    net.campaign("s5")  # term 4: S2 and S3 have already voted for S1
    assert net["s5"].role is Role.CANDIDATE
    net.campaign("s5")  # term 5: S3 and S4 vote for S5

    assert (net["s5"].role, net["s5"].term) == (Role.LEADER, 5)
    for name in ["s2", "s3", "s4", "s5"]:
        assert net[name].log_terms() == [1, 3, 5], name
    assert [(e.index, e.term) for e in net["s5"].applied] == [(1, 1), (2, 3), (3, 5)]


def test_entries_from_previous_terms_are_committed_indirectly_by_an_entry_of_the_current_term():
    """5.4.2 and Figure 8 (e): "Only log entries from the leader's current term are committed by
    counting replicas; once an entry from the current term has been committed in this way, then
    all prior entries are committed indirectly because of the Log Matching Property." Once S1's
    no-op of term 4 is on a majority, index 2 commits with it, and S5 can no longer be elected."""
    net = figure_8()
    net.isolate("s4", "s5")
    net.elect("s1")
    s1 = net["s1"]

    assert s1.core.log.committed == 3
    batches = [[(e.index, e.term) for e in rd.committed_entries] for rd in s1.readies
               if rd.committed_entries]
    assert batches[0] == [(1, 1), (2, 2), (3, 4)]  # index 2 never committed on its own

    net.heal()
    net.isolate("s1")
    net.campaign("s5")
    net.campaign("s5")
    assert net["s5"].role is Role.CANDIDATE
    refusals = {m.frm for m in net.delivered if m.type is MT.VOTE_RESP and m.to == "s5"
                and m.reject and m.term == 5}
    assert refusals == {"s2", "s3"}


def test_a_leader_counts_its_own_copy_of_an_entry_only_once_its_write_is_durable():
    """5.3: an entry is committed once "replicated ... on a majority of the servers", and the
    leader is one of them only once the entry is on its disk (it learns that through
    advance()). With one follower's copy and the leader's write still in flight, nothing commits
    in a cluster of three; the leader's finished write completes the majority."""
    net = Network(ABC)
    net.elect("a")
    a = net["a"]
    a.slow_disk = True
    net.hold(lambda m: "c" in (m.to, m.frm))

    x = a.core.propose(b"x")
    net.stabilize()

    assert net["b"].disk.entries[-1].index == x
    assert a.pending is not None and a.disk.entries[-1].index == x - 1
    assert a.core.log.committed == x - 1

    a.slow_disk = False
    net.flush("a")

    assert a.core.log.committed == x
    net.stabilize()
    assert a.applied_index() == net["b"].applied_index() == x


def test_an_entry_stored_by_two_followers_commits_while_the_leaders_own_write_is_in_flight():
    """The leader's appends do not wait for its own disk (dissertation 10.2.1: "the leader
    writes the entry to its disk in parallel" with replicating), so two followers' copies are a
    majority of three by themselves. The entry commits before the leader's write finishes and is
    applied only after it."""
    net = Network(ABC)
    net.elect("a")
    a = net["a"]
    a.slow_disk = True

    x = a.core.propose(b"x")
    net.stabilize()

    assert a.disk.entries[-1].index == x - 1
    assert a.core.log.committed == x
    assert a.applied_index() == x - 1

    a.slow_disk = False
    net.flush("a")
    net.stabilize()
    assert a.applied_index() == x


def test_a_leader_never_sends_entries_of_a_term_that_is_not_yet_on_its_own_disk():
    """Figure 2: currentTerm is persistent state, "updated on stable storage before responding
    to RPCs", and Log Matching needs an (index, term) pair to name a single entry. A leader that
    wins at once (the only voter, as in a one-replica cluster catching up a learner) must not let
    entries of its new term out before that term is durable: after a crash it would win the same
    term again and could write another entry at the same index and term."""
    net = Network(["a"], learners=["l"])
    a = net["a"]
    a.slow_disk = True
    a.core.campaign()
    a.core.propose(b"x")
    net.process("a")
    net.stabilize()  # whatever the contract lets out now reaches the learner; a's write waits

    net.restart("a")  # the write is lost
    a.slow_disk = False
    net.elect("a")
    net.propose("a", b"y")
    net.tick("a")

    assert a.term == 1
    assert [e.data for e in net["l"].applied] == [e.data for e in a.applied]


# === 6 and dissertation chapter 4: membership changes =========================================


def membership_entries(net: Network, name: str) -> list[tuple[int, Membership]]:
    return [(e.index, Membership.decode(e.data)) for e in net[name].core.log.entries
            if e.kind == EntryKind.MEMBERSHIP]


def test_a_change_of_voters_goes_through_joint_consensus_then_to_the_new_configuration():
    """6 / dissertation 4.3: "the cluster first switches to a transitional configuration we call
    joint consensus; once the joint consensus has been committed, the system then transitions to
    the new configuration." The leader appends C_new by itself once C_old,new commits."""
    net = Network(ABC, joining=["d"])
    net.elect("a")

    joint = net["a"].core.change_membership({"a", "b", "c", "d"})
    net.stabilize()

    old, new = voters(*"abc"), voters(*"abcd")
    assert membership_entries(net, "a") == [
        (joint, Membership(new, outgoing=old)),
        (joint + 1, Membership(new)),
    ]
    for name in "abcd":
        assert net[name].core.membership == Membership(new), name
        assert net[name].core.log.committed == joint + 1, name
    assert net["d"].core.log.entries == net["a"].core.log.entries


@pytest.mark.parametrize("cut_off", [("b", "c"), ("d", "e")])
def test_in_joint_consensus_commitment_requires_majorities_of_both_configurations(cut_off):
    """Dissertation 4.3: in joint consensus, "agreement (for elections and entry commitment)
    requires separate majorities from both the old and new configurations." Moving {a,b,c} to
    {a,d,e}: with b and c cut off, C_old,new reaches a majority of the new voters only; with d
    and e cut off, of the old voters only. Either way it stays uncommitted."""
    net = Network(ABC, joining=["d", "e"])
    net.elect("a")
    a = net["a"]
    net.drop(lambda m: m.to in cut_off or m.frm in cut_off)

    joint = a.core.change_membership({"a", "d", "e"})
    net.stabilize()

    holders = [n for n in "abcde" if net[n].disk.entries and net[n].disk.entries[-1].index == joint]
    assert holders == sorted(set("abcde") - set(cut_off))
    assert a.core.membership == Membership(voters(*"ade"), outgoing=voters(*"abc"))
    assert a.core.log.committed == joint - 1

    net.heal()
    net.tick("a")

    assert a.core.log.committed == joint + 1
    assert a.core.membership == Membership(voters(*"ade"))
    assert a.role is Role.LEADER


def joint_cluster() -> Network:
    """Five members whose logs hold C_old,new = {a,b,c} -> {c,d,e}, as after a leader crashed."""
    names = list("abcde")
    joint = Membership(voters(*"cde"), outgoing=voters(*"abc"))
    entry = Entry(1, 1, EntryKind.MEMBERSHIP, joint.encode())
    return Network(names, recovered={
        n: RecoveredState(HardState(1, None), SnapshotMeta(0, 0, Membership(voters(*"abc"))),
                          [entry])
        for n in names
    })


@pytest.mark.parametrize("reachable, wins", [("ab", False), ("de", False), ("ad", True)])
def test_in_joint_consensus_a_candidate_needs_majorities_of_both_configurations(reachable, wins):
    """Dissertation 4.3: while joint, elections too need "separate majorities from both the old
    and new configurations". c belongs to both {a,b,c} and {c,d,e}: a and b make a majority of
    the old only, d and e of the new only, a and d of each."""
    net = joint_cluster()
    net.isolate(*(n for n in "abde" if n not in reachable))

    net.campaign("c")

    c = net["c"]
    assert {m.to for m in sent_by(net, "c", MT.PREVOTE)} == set("abde")
    if wins:
        assert (c.role, c.term) == (Role.LEADER, 2)
    else:
        assert (c.role, c.term) == (Role.PRE_CANDIDATE, 1)
        assert net.leaders() == []


def test_a_new_membership_change_is_refused_until_the_previous_one_has_finished():
    """Dissertation 4.1: a leader must not start a configuration change "until the previous
    change's entry has committed", and with joint consensus the change lasts until C_new has.
    The leader refuses with MembershipChangeInProgress, naming the entry to wait for."""
    net = Network(ABC, joining=["d"])
    net.elect("a")
    a = net["a"].core
    net.hold(lambda m: m.type is MT.APPEND_RESP)

    joint = a.change_membership({"a", "b", "c", "d"})
    net.stabilize()
    with pytest.raises(MembershipChangeInProgress) as refused:
        a.change_membership({"a", "b"})
    assert refused.value.index == joint
    with pytest.raises(MembershipChangeInProgress):
        a.change_membership({"a", "b", "c", "d"}, learners={"e"})

    net.release()
    net.hold(lambda m: m.type is MT.APPEND_RESP and m.index > joint)
    net.stabilize()
    assert a.log.committed == joint
    assert a.membership == Membership(voters(*"abcd"))  # C_new is in force, not yet committed
    with pytest.raises(MembershipChangeInProgress) as refused:
        a.change_membership({"a", "b"})
    assert refused.value.index == joint + 1

    net.release()
    net.stabilize()
    assert a.change_membership({"a", "b", "c"}) == joint + 2


def test_a_leader_not_in_the_new_configuration_steps_down_once_c_new_is_committed():
    """Dissertation 4.2.2: "the leader ... steps down (returns to follower state) once the C_new
    entry is committed"; until then it manages a cluster that does not include itself. Flotilla
    hands over at once with TimeoutNow (3.10) to an up-to-date voter of C_new, and the member it
    leaves behind never campaigns."""
    net = Network(ABC, joining=["d"])
    net.elect("a")
    a = net["a"]
    joint = a.core.change_membership({"b", "c", "d"})
    net.hold(lambda m: m.type is MT.APPEND_RESP and m.to == "a" and m.index > joint)
    net.stabilize()

    assert a.core.membership == Membership(voters(*"bcd"))
    assert a.core.log.committed == joint
    net.tick("a", times=2 * E)
    assert (a.role, a.term) == (Role.LEADER, 1)  # still leading a cluster without itself

    net.release()
    net.stabilize()

    assert a.role is Role.FOLLOWER
    [handover] = net.sent_of(MT.TIMEOUT_NOW, frm="a")
    [stepped_down] = [rd for rd in a.readies if handover in rd.messages]
    assert stepped_down.soft_state == SoftState(None, Role.FOLLOWER, 1)  # by itself, in term 1
    successor = net[handover.to]
    assert handover.to in "bcd"
    assert (successor.role, successor.term) == (Role.LEADER, 2)
    assert all(net[n].core.leader == handover.to for n in "bcd")
    since = len(net.sent)
    net.tick(times=3 * E)
    assert not [m for m in net.sent[since:] if m.frm == "a"]
    assert net.leaders() == [handover.to]


def test_learners_receive_the_log_but_are_not_counted_for_majorities_and_never_campaign():
    """Dissertation 4.2.1: new servers join "as non-voting members. The leader replicates log
    entries to them, but they are not yet counted towards majorities for the purpose of
    elections or commitment." With voters {a,b} and learner l, a and l together are no majority."""
    net = Network(["a", "b"], learners=["l"])
    net.elect("a")
    a, learner = net["a"], net["l"]
    net.isolate("b")

    x = net.propose("a", b"x")

    assert learner.disk.entries[-1].index == x
    assert a.core.log.committed == x - 1

    net.isolate("l")
    net.tick("l", times=5 * E)
    learner.core.campaign()
    net.stabilize()
    assert not sent_by(net, "l", MT.PREVOTE, MT.VOTE)
    assert (learner.role, learner.term) == (Role.FOLLOWER, 1)
    with pytest.raises(InvalidMembership):
        a.core.transfer_leadership("l")

    net.heal()
    net.tick("a")
    assert a.core.log.committed == x
    assert learner.applied_index() == x


def test_a_server_uses_the_newest_configuration_in_its_log_committed_or_not_and_falls_back():
    """Dissertation 4.1: "a server always uses the latest configuration in its log, regardless of
    whether the entry is committed", and since such an entry can be removed when leadership
    changes, "a server must be prepared to fall back to the previous configuration in its log."
    (Lease off, so that c can be elected at once after a is gone.)"""
    names = list("abcde")
    net = Network(names, check_quorum=False)
    net.elect("a")
    b = net["b"].core
    net.isolate("a", "b")

    joint = net["a"].core.change_membership({"a", "b", "c", "d"})
    net.stabilize()

    assert b.membership == Membership(voters(*"abcd"), outgoing=voters(*names))
    assert b.log.committed < joint

    net.heal()
    net.isolate("a")
    net.elect("c")

    assert net["c"].term == 2
    assert b.log.entries[joint - 1] == Entry(joint, 2, NOOP)
    assert b.membership == Membership(voters(*names))


@pytest.mark.parametrize("pre_vote", [True, False])
def test_a_removed_server_cannot_disrupt_the_cluster(pre_vote):
    """Dissertation 4.2.3: "removed servers (those not in C_new) can disrupt the cluster. These
    servers will not receive heartbeats, so they will time out and start new elections." Under
    the CheckQuorum lease, "if a server receives a RequestVote request within the minimum
    election timeout of hearing from a current leader, it does not update its term or grant its
    vote" (and with PreVote the removed server does not even raise its own term)."""
    net = Network(ABC, pre_vote=pre_vote)
    net.elect("a")
    net.core("a").change_membership({"a", "b"})
    net.stabilize()
    c = net["c"]
    assert net["a"].core.membership == Membership(voters("a", "b"))
    assert c.core.membership.can_vote("c")  # it never heard of C_new

    net.tick(times=6 * E)

    assert sent_by(net, "c", MT.PREVOTE, MT.VOTE)  # it did try
    assert net.leaders() == ["a"]
    assert (net["a"].term, net["b"].term) == (1, 1)
    assert not [m for m in net.sent if m.to == "c" and m.type in (MT.PREVOTE_RESP, MT.VOTE_RESP)]
    assert (c.term == 1) is pre_vote


# === 7: log compaction ========================================================================


def test_compaction_records_the_snapshot_and_keeps_a_trailing_window_of_entries():
    """7 / dissertation 5.1: a snapshot replaces the committed log up to its index ("the last
    included index and term" are kept for the consistency check). compact(8, keep=3) records
    the snapshot at 8 and keeps entries 6.. so that a slightly slow follower can still be sent
    entries instead of a whole snapshot."""
    net = Network(ABC)
    net.elect("a")
    a = net["a"].core
    for i in range(9):
        a.propose(b"%d" % i)
    net.stabilize()
    assert a.log.last_index() == 10

    meta = net.compact("a", 8, keep=3)

    assert meta == SnapshotMeta(8, 1, Membership(voters(*ABC)))
    assert (a.log.first_index(), a.log.last_index()) == (6, 10)
    assert (a.log.term(4), a.log.term(5), a.log.term(6)) == (None, 1, 1)  # 5 is the base
    assert a.status().snapshot == SnapshotMeta(8, 1, Membership(voters(*ABC)))

    net.compact("a", 10)

    assert (a.log.first_index(), a.log.term(10), a.log.term(9)) == (11, 1, None)


@pytest.mark.parametrize("keep, snapshot_sent", [(4, False), (3, True)])
def test_a_follower_needing_entries_the_leader_discarded_is_sent_a_snapshot(keep, snapshot_sent):
    """7: "the leader must occasionally send snapshots to followers that lag behind. This happens
    when the leader has already discarded the next log entry that it needs to send to a
    follower." c holds up to index 1; with entries 2.. kept it gets them, from 3.. it gets the
    snapshot."""
    net = Network(ABC)
    net.elect("a")
    net.isolate("c")
    for i in range(4):
        net.propose("a", b"%d" % i)
    net.compact("a", 5, keep=keep)

    net.heal()
    net.tick("a")

    assert bool(net.sent_of(MT.SNAPSHOT, to="c")) is snapshot_sent
    assert net["c"].applied == net["a"].applied
    assert net["c"].core.log.last_index() == 5


def test_a_follower_installs_the_snapshot_then_receives_the_entries_after_it():
    """7: "the follower discards its entire log; it is all superseded by the snapshot", takes
    the configuration recorded in it, and then continues with the entries after it as usual.
    Meanwhile the leader sends that follower nothing else (progress state SNAPSHOT)."""
    net = Network(ABC, joining=["d"])
    net.elect("a")
    a = net["a"]
    net.isolate("c", "d")
    a.core.change_membership(set(ABC), learners={"d"})
    for i in range(3):
        a.core.propose(b"%d" % i)
    net.stabilize()
    s = a.applied_index()
    meta = net.compact("a", s)
    a.core.propose(b"tail 1")
    a.core.propose(b"tail 2")
    net.stabilize()
    c = net["c"]
    assert c.core.membership == Membership(voters(*ABC))

    net.heal()
    net.isolate("d")
    net.hold(lambda m: m.type is MT.SNAPSHOT)
    net.tick("a")  # c rejects the append after its last entry; the leader probes back to 1

    [snapshot] = net.held
    assert snapshot.to == "c" and snapshot.snapshot.meta == meta
    assert a.core.status().progress["c"].state == "snapshot"
    since = len(net.sent)
    net.tick("a", times=3)
    assert {m.type for m in net.sent[since:] if m.to == "c"} == {MT.HEARTBEAT}

    net.hold(lambda m: m.type is MT.APPEND and m.to == "c")
    net.deliver_held(lambda m: m.type is MT.SNAPSHOT)
    net.stabilize()

    [install] = [rd for rd in c.readies if rd.snapshot is not None]
    assert install.snapshot.meta == meta
    assert (c.core.log.first_index(), c.core.log.last_index()) == (s + 1, s)
    assert (c.core.log.committed, c.core.log.applied) == (s, s)
    assert c.applied == a.applied[:s]
    assert (c.disk.snapshot, c.disk.entries) == (meta, [])
    assert c.core.membership == Membership(voters(*ABC), learners=voters("d"))
    progress = a.core.status().progress["c"]
    assert (progress.state, progress.match) == ("replicate", s)

    net.release()
    net.stabilize()

    assert c.core.log.entries == a.core.log.entries
    assert [e.data for e in c.core.log.entries] == [b"tail 1", b"tail 2"]
    assert c.applied == a.applied

    net.restart("c")  # what it made durable is a snapshot plus the tail

    assert (c.core.log.first_index(), c.core.log.last_index()) == (s + 1, s + 2)
    assert c.core.membership == Membership(voters(*ABC), learners=voters("d"))


@pytest.mark.parametrize("outcome", ["reported", "lost"])
def test_a_leader_sends_a_follower_nothing_else_until_its_snapshot_is_reported_or_acknowledged(
    outcome,
):
    """A follower's snapshot transfer is the runtime's business: the leader keeps its progress in
    state SNAPSHOT until the runtime reports the transfer (report_snapshot) or the follower
    acknowledges an index at or after the snapshot's. A lost transfer is reported as failed; the
    leader probes again and, the entries being gone, sends the snapshot again."""
    net = Network(ABC)
    net.elect("a")
    a = net["a"].core
    net.isolate("c")
    for i in range(3):
        net.propose("a", b"%d" % i)
    meta = net.compact("a", 4)
    net.heal()
    if outcome == "reported":
        net.hold(lambda m: m.type is MT.SNAPSHOT)
    else:
        net.drop(lambda m: m.type is MT.SNAPSHOT)

    def progress() -> PeerProgress:
        return a.status().progress["c"]

    if outcome == "reported":
        net.tick("a")
        assert progress().state == "snapshot"
        a.report_snapshot("c", True)
        assert progress() == PeerProgress(match=1, next=meta.index + 1, state="probe")
        net.release()
        net.stabilize()
    else:
        net.tick("a")  # the snapshot is lost and the runtime reports the failure
        assert progress() == PeerProgress(match=1, next=2, state="probe")
        net.heal()
        net.tick("a")

    assert len(net.sent_of(MT.SNAPSHOT, to="c")) == (1 if outcome == "reported" else 2)
    assert progress().state == "replicate"
    assert progress().match == 4
    assert net["c"].disk.snapshot == meta
    assert net["c"].applied == net["a"].applied


def test_a_follower_that_already_has_the_snapshots_last_entry_keeps_its_log_and_commits():
    """Dissertation 5.1: "If instead the follower receives a snapshot that describes a prefix of
    its log (due to retransmission or by mistake), then ... entries following the snapshot are
    still valid and must be retained." Flotilla's core keeps its log and just moves its commit
    index to the snapshot's."""
    net = Network(ABC, recovered={"b": recovered([1] * 5, 1, ABC)})
    b = net["b"]
    net.step(Message(MT.APPEND, to="b", frm="a", term=1, index=5, log_term=1, commit=2))
    assert b.core.log.committed == 2
    meta = SnapshotMeta(4, 1, Membership(voters(*ABC)))

    rd = net.step(Message(MT.SNAPSHOT, to="b", frm="a", term=1,
                          snapshot=Snapshot(meta, tuple(log_of([1] * 4)))))

    assert rd.snapshot is None
    assert (b.core.log.first_index(), b.core.log.last_index()) == (1, 5)
    assert b.core.log.committed == 4
    assert [e.index for e in rd.committed_entries] == [3, 4]
    [answer] = rd.persisted_messages
    assert (answer.type, answer.reject, answer.index) == (MT.APPEND_RESP, False, 4)


# === Dissertation 3.10: leadership transfer ===================================================


def test_leadership_transfer_catches_the_target_up_then_sends_it_timeout_now():
    """Dissertation 3.10: "The prior leader sends its log entries to the target server ... Once
    the target server has caught up, the prior leader sends it a TimeoutNow request, causing it
    to start an election immediately", and during the transfer "the prior leader stops accepting
    new client requests." The target's election skips PreVote and is not refused under the
    others' leases."""
    net = Network(ABC)
    net.elect("a")
    a = net["a"]
    net.isolate("c")
    for i in range(3):
        net.propose("a", b"%d" % i)
    last = a.core.log.last_index()

    a.core.transfer_leadership("c")
    net.stabilize()

    with pytest.raises(TransferInProgress):
        a.core.propose(b"refused")
    assert not net.sent_of(MT.TIMEOUT_NOW)

    net.heal()
    net.tick("a")

    [timeout_now] = net.sent_of(MT.TIMEOUT_NOW)
    assert timeout_now.to == "c"
    caught_up = position(net.delivered, lambda m: m.type is MT.APPEND_RESP and m.frm == "c"
                         and m.index == last)
    assert caught_up < position(net.delivered, lambda m: m.type is MT.TIMEOUT_NOW)
    c = net["c"]
    assert (c.role, c.term) == (Role.LEADER, 2)
    assert not sent_by(net, "c", MT.PREVOTE)
    assert (a.role, a.core.leader) == (Role.FOLLOWER, "c")


def test_a_leadership_transfer_that_does_not_complete_within_an_election_timeout_is_aborted():
    """Dissertation 3.10: "If the transfer does not complete within an election timeout, the
    prior leader aborts the transfer and resumes accepting client requests." """
    net = Network(ABC)
    net.elect("a")
    a = net["a"].core
    net.isolate("c")
    net.propose("a", b"c lacks this")

    a.transfer_leadership("c")
    net.tick("a", times=E - 1)
    with pytest.raises(TransferInProgress):
        a.propose(b"x")
    net.tick("a")

    index = net.propose("a", b"x")
    assert (a.role, a.term, a.log.committed) == (Role.LEADER, 1, index)
    assert not net.sent_of(MT.TIMEOUT_NOW)


# === Dissertation 6.4: ReadIndex ==============================================================


def test_a_new_leader_serves_reads_only_after_an_entry_of_its_own_term_is_committed():
    """Dissertation 6.4: "If the leader has not yet marked an entry from its current term
    committed, it waits until it has done so. The Leader Completeness Property guarantees that a
    leader has all committed entries, but at the start of its term, it may not know which those
    are." The no-op appended on election is that entry."""
    net = Network(ABC)
    net.hold(lambda m: m.type is MT.APPEND_RESP)
    net.elect("a")
    a = net["a"]

    a.core.read_index("r1")
    net.stabilize()
    assert a.core.log.committed == 0
    assert a.read_states == []

    net.release()
    net.stabilize()
    assert a.read_states == [ReadState("r1", 1)]


def test_a_read_is_served_only_after_a_majority_acknowledges_a_heartbeat_sent_after_it():
    """Dissertation 6.4: the leader saves its commit index as the read index, then "sends a new
    round of heartbeats and waits for their acknowledgments from a majority of the cluster.
    Once these acknowledgments are received, the leader knows that there could not have existed
    a leader for a greater term at the moment it sent the heartbeats." Acknowledgements of an
    earlier round prove nothing about the read."""
    net = Network("abcde")
    net.elect("a")
    a = net["a"]
    x = net.propose("a", b"x")
    net.hold(lambda m: m.type is MT.HEARTBEAT_RESP)
    net.tick("a")
    [old_round] = {m.context for m in net.held}

    a.core.read_index("r")
    rd = net.process("a")
    beats = [m for m in rd.messages if m.type is MT.HEARTBEAT]
    assert sorted(m.to for m in beats) == list("bcde")
    [new_round] = {m.context for m in beats}
    assert new_round > old_round
    net.stabilize()

    net.deliver_held(lambda m: m.context == old_round)
    net.stabilize()
    assert a.read_states == []
    net.deliver_held(lambda m: m.frm == "b")
    net.stabilize()
    assert a.read_states == []  # a and b: two of five
    net.deliver_held(lambda m: m.frm == "c")
    net.stabilize()
    assert a.read_states == [ReadState("r", x)]


def test_a_followers_read_is_forwarded_to_the_leader_which_returns_the_read_index():
    """Dissertation 6.4: "the follower issues a request to the leader to learn the current
    readIndex (the leader executes steps 1-3 above)"; the follower answers once it has applied
    that far."""
    net = Network(ABC)
    net.elect("a")
    x = net.propose("a", b"x")
    b = net["b"]

    b.core.read_index("rb")
    rd = net.process("b")

    assert [(m.type, m.to, m.context) for m in rd.persisted_messages] == [
        (MT.READ_INDEX, "a", "rb")
    ]
    net.stabilize()
    assert b.read_states == [ReadState("rb", x)]
    assert net["a"].read_states == []
    [answer] = net.sent_of(MT.READ_INDEX_RESP)
    assert (answer.to, answer.index, answer.reject) == ("b", x, False)


def test_reads_pending_on_a_leader_that_loses_leadership_fail_and_must_be_retried():
    """A read the deposed leader has not confirmed can never be confirmed by it: it comes out in
    Ready.failed_reads, a follower's forwarded read is refused, and a member that knows no
    leader fails a read at once, so the caller retries elsewhere instead of waiting forever."""
    net = Network(ABC)
    net.elect("a")
    a, b = net["a"], net["b"]
    net.hold(lambda m: m.type is MT.HEARTBEAT_RESP)
    a.core.read_index("ra")
    b.core.read_index("rb")
    net.stabilize()
    assert a.read_states == b.read_states == []

    net.step(Message(MT.APPEND_RESP, to="a", frm="c", term=5))
    net.stabilize()

    assert a.role is Role.FOLLOWER
    assert a.failed_reads == ["ra"]
    assert b.failed_reads == ["rb"]
    a.core.read_index("again")
    net.process("a")
    assert a.failed_reads == ["ra", "again"]


# === Dissertation 9.6 (and 6.2): PreVote and CheckQuorum ======================================


def test_a_leader_that_cannot_reach_a_majority_for_an_election_timeout_steps_down():
    """Dissertation 6.2: "a leader ... steps down if an election timeout elapses without a
    successful round of heartbeats to a majority of its cluster" (CheckQuorum). Hearing from two
    of four followers is enough to keep leading; from one, the leader steps down, keeping its
    term. Activity is checked once per election timeout, so that takes one to two timeouts."""
    net = Network("abcde")
    net.elect("a")
    a = net["a"]
    net.cut("a", "b")
    net.cut("a", "c")

    net.tick("a", times=10 * E)
    assert (a.role, a.term) == (Role.LEADER, 1)

    net.cut("a", "d")
    for ticks in range(1, 2 * E + 1):  # noqa: B007 - the loop variable is the result
        net.tick("a")
        if a.role is not Role.LEADER:
            break
    assert (a.role, a.term, a.core.leader) == (Role.FOLLOWER, 1, None)
    assert E <= ticks <= 2 * E


def test_a_member_counts_no_leader_once_it_has_heard_from_none_for_an_election_timeout():
    """etcd's `has_leader`, judged by time (`RaftCore.knows_leader`, exported as
    flotilla_server_has_leader). A follower counts its leader while it hears from it, and none
    once an election timeout passes without a word, although with PreVote it keeps the
    leader's name until it campaigns, up to two timeouts later. A leader counts itself while a
    quorum answers its heartbeats, and none once an election timeout passes without a quorum,
    before CheckQuorum (looked at once per timeout) steps it down."""
    net = Network(ABC)
    net.elect("a")
    net.tick(times=3)
    assert all(net.core(n).knows_leader() for n in ABC)
    # The follower whose own timeout is the longer keeps the leader's name the longest.
    b = max((net.core(n) for n in "bc"), key=lambda core: core.randomized_timeout)
    assert b.randomized_timeout > E, "this seed no longer gives a timeout above the minimum"
    a = net.core("a")

    net.isolate("a")
    net.tick("a", b.name, times=E - 1)
    assert a.knows_leader() and b.knows_leader()

    net.tick("a", b.name)
    assert (a.role, a.leader) == (Role.LEADER, "a") and not a.knows_leader()
    assert (b.role, b.leader) == (Role.FOLLOWER, "a") and not b.knows_leader()

    net.heal()
    net.tick("a", b.name)
    assert a.knows_leader() and b.knows_leader()


def test_with_prevote_a_partitioned_server_does_not_increase_its_term_and_rejoins_quietly():
    """Dissertation 9.6: "a candidate would first ask other servers whether its log was
    up-to-date enough to get their vote. Only if the candidate believed it could get votes from
    a majority of the cluster would it increment its term and start a normal election." A member
    cut off for ten election timeouts keeps its term, and when it is back it simply follows."""
    net = Network(ABC)
    net.elect("a")
    c = net["c"]
    net.isolate("c")

    net.tick(times=10 * E)

    assert (c.term, c.disk.hard_state.term) == (1, 1)
    assert len(sent_by(net, "c", MT.PREVOTE)) >= 2 * 5  # it kept asking, two at a time
    assert not sent_by(net, "c", MT.VOTE)

    net.heal()
    net.tick(times=2)

    assert net.leaders() == ["a"] and net["a"].term == 1
    assert (c.role, c.core.leader) == (Role.FOLLOWER, "a")


def test_without_prevote_a_rejoining_partitioned_server_deposes_a_healthy_leader():
    """Dissertation 9.6, the problem PreVote solves: "the server's term number will increase
    each time it times out ... When the partition heals, [its] higher term will cause the
    leader to step down." The reply to the leader's first heartbeat carries that term."""
    net = Network(ABC, pre_vote=False)
    net.elect("a")
    c = net["c"]
    net.isolate("c")
    net.tick(times=10 * E)
    assert c.term > 2

    net.heal()
    net.tick("a")

    assert (net["a"].role, net["a"].term) == (Role.FOLLOWER, c.term)


# === The Ready contract: what waits for the disk ===============================================


def test_votes_and_acknowledgements_wait_for_the_disk_but_a_leaders_appends_do_not():
    """types.Ready: a vote and a follower's acknowledgement promise something about the sender's
    disk, so they are persisted_messages, sent only once the batch is durable; a leader's appends
    rest on nobody's disk but the receivers', so they are messages, sent at once."""
    net = Network(ABC)
    net.elect("a")
    [vote_batch] = [rd for rd in net["b"].readies if rd.hard_state == HardState(1, "a")]
    assert [m.type for m in vote_batch.persisted_messages] == [MT.VOTE_RESP]
    assert vote_batch.messages == ()

    x = net["a"].core.propose(b"x")
    net.stabilize()

    [leader_batch] = [rd for rd in net["a"].readies if rd.entries and rd.entries[-1].index == x]
    assert [m.type for m in leader_batch.messages] == [MT.APPEND, MT.APPEND]
    assert leader_batch.persisted_messages == ()
    b = net["b"]
    [ack_batch] = [rd for rd in b.readies if rd.entries and rd.entries[-1].index == x]
    assert [(m.type, m.index) for m in ack_batch.persisted_messages] == [(MT.APPEND_RESP, x)]
    assert ack_batch.messages == ()
    durable = position(b.events, lambda e: e[0] == "persist-entries" and e[1][-1].index == x)
    acked = position(b.events, lambda e: e[0] == "send" and e[1].type is MT.APPEND_RESP
                     and e[1].index == x)
    assert durable < acked


def test_a_follower_whose_write_is_not_durable_has_acknowledged_nothing():
    """Until its batch is durable a follower has promised nothing: its acknowledgement is not
    sent, so the leader cannot count it; and a vote lost in a crash before the write was never
    given, so the member may vote again in that term."""
    net = Network(ABC)
    net.elect("a")
    b = net["b"]
    net.isolate("c")
    b.slow_disk = True

    x = net.propose("a", b"x")

    assert b.core.log.last_index() == x and b.disk.entries[-1].index == x - 1
    assert not [m for m in sent_by(net, "b", MT.APPEND_RESP) if m.index == x]
    assert net["a"].core.log.committed == x - 1
    b.slow_disk = False
    net.flush("b")
    net.stabilize()
    assert net["a"].core.log.committed == x

    fresh = Network(ABC)
    voter = fresh["b"]
    voter.slow_disk = True
    fresh.step(Message(MT.VOTE, to="b", frm="a", term=1))
    assert voter.pending is not None and voter.readies[-1].hard_state == HardState(1, "a")
    assert not fresh.sent
    fresh.restart("b")
    voter.slow_disk = False
    rd = fresh.step(Message(MT.VOTE, to="b", frm="c", term=1))
    [answer] = rd.persisted_messages
    assert (answer.type, answer.reject) == (MT.VOTE_RESP, False)
    assert voter.disk.hard_state == HardState(1, "c")
