"""A member that starts empty to be added must not vote as the voter whose disk it replaces.

If a voter loses its disk and restarts empty, the cluster may still count it as that voter.
With an empty log it would grant its vote to any candidate, one lacking a committed entry
included, and that entry would be lost (the dissertation's 4.2 assumes members keep their
state; a lost disk is a new member). `RaftCore.await_admission` fences such a member: it reads
the configuration as of the leader's commit index at first contact, and votes only if that
configuration does not count it as a voter, or once it has been removed and added back as a
learner."""

from __future__ import annotations

import random

from flotilla.node.consensus import Membership, RaftCore, Role, Settings
from flotilla.node.consensus.core import FENCED, UNDECIDED
from flotilla.node.consensus.types import MessageType as MT
from flotilla.node.consensus.types import RecoveredState

from tests.consensus.network import Member, Network
from tests.simulation.disk import Disk

ABC = ["a", "b", "c"]


def lose_disk(net: Network, name: str) -> Member:
    """`name` comes back with an empty disk, waiting to be added (as `existing` mode does)."""
    disk = Disk(RecoveredState(), snapshot_data=())
    settings = Settings(rng=random.Random(99))
    core = RaftCore(name, settings, disk.recovered())
    core.await_admission()
    return net.join(Member(name, core, disk, settings))


def test_an_empty_member_grants_no_vote_before_it_has_heard_from_a_leader():
    """The data-loss story: x commits on a and b while c is cut off; b loses its disk; a dies.
    c, which lacks x, asks the empty b for its vote. Granting it would elect c and lose x."""
    net = Network(ABC)
    net.elect("a")
    net.isolate("c")
    x = net.propose("a", b"x")
    net.stabilize()
    assert net["b"].core.log.committed >= x and net["c"].core.log.last_index() < x
    lose_disk(net, "b")
    since = len(net.sent)
    net.heal()
    net.isolate("a")
    for _ in range(40):
        net.tick("c")
        net.stabilize()
    assert net["c"].role is not Role.LEADER
    answers = [m for m in net.sent[since:] if m.frm == "b"
               and m.type in (MT.VOTE_RESP, MT.PREVOTE_RESP)]
    assert answers and all(m.reject for m in answers)
    # a comes back: it leads again and x is there for everyone.
    net.heal()
    for _ in range(40):
        net.tick("a", "c")
        net.stabilize()
        if net.leaders():
            break
    [leader] = net.leaders()
    assert leader != "c" or net["c"].core.log.last_index() >= x
    assert net[leader].core.log.last_index() >= x


def test_a_lost_disk_votes_again_only_after_it_is_removed_and_added_back():
    net = Network(ABC)
    net.elect("a")
    for i in range(3):
        net.propose("a", b"%d" % i)
    net.stabilize()
    b = lose_disk(net, "b")
    assert b.core.admission == (UNDECIDED, -1)
    net.propose("a", b"a write reaches b, which rejects it")
    net.stabilize()
    # The leader's commit at first contact is noted; the leader, which holds b's old match,
    # sends nothing below it, so b gets no log and stays undecided: no vote, no campaign.
    assert b.core.admission == (UNDECIDED, net["a"].core.log.committed - 1)
    assert b.core.log.last_index() == 0
    b.core.campaign()
    net.stabilize()
    assert b.role is Role.FOLLOWER

    # Removed, then added back as a learner: it reads the configuration it was a voter in
    # (fenced), then the one naming it a learner (admitted); promoted, it votes again.
    a = net["a"].core
    a.change_membership({"a", "c"})
    net.stabilize()
    a.change_membership({"a", "c"}, learners={"b"})
    net.stabilize()
    assert b.core.log.last_index() == a.log.last_index()
    assert b.core.admission is None
    a.change_membership({"a", "b", "c"})
    net.stabilize()
    assert b.core.membership == Membership(frozenset(ABC))
    since = len(net.sent)
    net.isolate("a")
    for _ in range(40):
        net.tick("b", "c")
        net.stabilize()
        if [n for n in net.leaders() if n != "a"]:
            break
    assert [n for n in net.leaders() if n != "a"]
    assert [m for m in net.sent[since:] if m.frm == "b" and not m.reject
            and m.type in (MT.VOTE_RESP, MT.PREVOTE_RESP, MT.VOTE, MT.PREVOTE)]


def test_a_new_member_is_admitted_by_the_configuration_that_added_it():
    net = Network(ABC, joining=["d"])
    net["d"].core.await_admission()
    net.elect("a")
    for i in range(5):
        net.propose("a", b"%d" % i)
    net.stabilize()
    a = net["a"].core
    a.change_membership(set(ABC), learners={"d"})
    net.stabilize()
    assert net["d"].core.admission is None
    a.change_membership({*ABC, "d"})
    net.stabilize()
    # With a and b gone, c and d elect a leader: d votes.
    since = len(net.sent)
    net.isolate("a", "b")
    for _ in range(60):
        net.tick("c", "d")
        net.stabilize()
    granted = [m for m in net.sent[since:] if m.frm == "d" and not m.reject
               and m.type in (MT.VOTE_RESP, MT.PREVOTE_RESP)]
    assert granted, "the admitted member d never granted a vote"


def test_a_new_member_is_never_taken_for_a_lost_disk_on_its_way_to_admission():
    """The first append a new member hears follows the entry that added it, whatever the
    leader had committed then, so it never judges by a configuration from before it was added
    (here the first one, which it cannot even see): never fenced, not even for a moment."""
    net = Network(ABC, joining=["d"], max_entries_per_message=1)
    d = net["d"].core
    d.await_admission()
    seen = []
    review = d._review_admission

    def watched() -> None:
        review()
        seen.append(d.admission)

    d._review_admission = watched
    net.elect("a")
    for i in range(5):
        net.propose("a", b"%d" % i)
    a = net["a"].core
    added = a.change_membership(set(ABC), learners={"d"})
    net.stabilize()
    assert d.log.last_index() == a.log.last_index()
    assert d.admission is None
    assert seen and all(state is None or state[0] == UNDECIDED for state in seen), seen
    assert added > 1 and d.log.membership_at(added - 1).voters == frozenset()


def test_a_new_member_that_first_hears_a_snapshot_judges_by_its_configuration():
    net = Network(ABC, joining=["d"])
    net["d"].core.await_admission()
    net.elect("a")
    net.isolate("d")
    a = net["a"].core
    a.change_membership(set(ABC), learners={"d"})
    for i in range(5):
        net.propose("a", b"%d" % i)
    net.stabilize()
    net.compact("a", net["a"].applied_index())
    net.heal()
    for _ in range(3):  # heartbeats unpause the probe that was lost while d was cut off
        net.tick("a")
        net.stabilize()
    d = net["d"].core
    assert d.log.first_index() > 1  # it was sent the snapshot
    assert d.admission is None


def test_the_admission_state_survives_a_restart():
    net = Network(ABC)
    net.elect("a")
    b = lose_disk(net, "b")
    net.propose("a", b"x")
    net.stabilize()
    saved = b.core.admission
    assert saved is not None and saved[0] == UNDECIDED
    core = net.restart("b")
    assert core.admission is None  # a restart forgets it: the caller persists and restores it
    core.await_admission(saved)
    core.campaign()
    net.stabilize()
    assert net["b"].role is Role.FOLLOWER


def test_a_lost_disk_is_fenced_even_when_the_first_configuration_never_reaches_it():
    """The first configuration lives in the bootstrap snapshot at index 0, which no leader ever
    sends: a lost disk that learns the log from entry 1 (from a leader that does not remember
    what it had sent, here one that restarted) finds no configuration at all in it. That is
    not "absent, so new": it must stay out of elections. The data-loss story: y is on a and b
    only; b loses its disk; a restarts, leads again and has sent b only the first entry when
    it dies. Admitted, b would elect c, which lacks y."""
    net = Network(ABC, max_entries_per_message=1)
    net.elect("a")
    net.propose("a", b"w")
    net.isolate("c")
    y = net.propose("a", b"y")
    assert net["b"].core.log.committed >= y and net["c"].core.log.last_index() < y
    b = lose_disk(net, "b")
    net.restart("a")
    net.tick("c", times=30)  # cut off, c forgets its leader (and stays a follower: PreVote)
    net.heal()
    net.drop(lambda m: m.frm == "a" and m.to == "c" and m.type is not MT.VOTE
             and m.type is not MT.PREVOTE)  # c votes for a but hears nothing more from it
    to_b = net.hold(lambda m: m.frm == "a" and m.to == "b" and m.type is MT.APPEND)
    net.elect("a")
    while b.core.log.last_index() < 1:  # a backs off to the start of its log, entry 1
        assert net.deliver_held(to_b), "a sent b nothing more"
        net.stabilize()
    assert b.core.log.last_index() < y
    assert b.core.admission is not None

    net.heal()
    net.release()
    net.clear_queue()
    net.isolate("a")  # a dies
    since = len(net.sent)
    for _ in range(40):
        net.tick("b", "c")
        net.stabilize()
    assert net["c"].role is not Role.LEADER
    answers = [m for m in net.sent[since:] if m.frm == "b"
               and m.type in (MT.VOTE_RESP, MT.PREVOTE_RESP)]
    assert answers and all(m.reject for m in answers)

    # a comes back and leads; b reads the whole log, finds no configuration naming it, and
    # is fenced for good: a lost voter of the first configuration.
    net.heal()
    net.tick("a", "b", "c", times=40)
    [leader] = net.leaders()
    assert net[leader].core.log.last_index() >= y
    assert b.core.log.last_index() == net[leader].core.log.last_index()
    assert b.core.admission == (FENCED, 0)
