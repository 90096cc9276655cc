"""Every entry carries the time its leader appended it (`Entry.ts_ms`): the leader's injected
wall clock, but never earlier than the entry before, so times never decrease along the log
whatever the members' clocks say; followers and snapshots keep the leader's stamp as it is."""

from __future__ import annotations

import dataclasses

from flotilla.node.consensus import EntryKind, RaftCore, RecoveredState, Settings

from tests.consensus.network import Network

EPOCH = 1_800_000_000_000


def cluster(clocks: dict[str, int], **settings) -> Network:
    """A network whose members read their own clock from `clocks` (which the test moves).
    Tests that depose a leader by isolating it turn CheckQuorum off, so the others elect a new
    one at once instead of waiting out the old one's lease."""
    net = Network(list(clocks), **settings)
    for name, member in net.members.items():
        member.settings = dataclasses.replace(
            member.settings, wall_clock_ms=lambda name=name: clocks[name])
        member.core.settings = member.settings
    return net


def times(net: Network, name: str) -> list[int]:
    return [e.ts_ms for e in net.core(name).log.entries]


def assert_never_decreasing(net: Network) -> None:
    for name, member in net.members.items():
        member.core.log.check_invariants()  # includes: times never decrease along the log
        assert times(net, name) == sorted(times(net, name)), name


def test_a_new_leader_stamps_its_no_op_with_its_own_clock():
    clocks = {"a": EPOCH + 500, "b": EPOCH, "c": EPOCH - 700}
    net = cluster(clocks)
    net.elect("a")
    noop = net.core("a").log.entries[-1]
    assert noop.kind == EntryKind.NOOP and noop.ts_ms == EPOCH + 500


def test_proposals_and_batches_are_stamped_when_the_leader_appends_them():
    clocks = {"a": EPOCH, "b": EPOCH, "c": EPOCH}
    net = cluster(clocks)
    net.elect("a")
    clocks["a"] = EPOCH + 10
    one = net.propose("a", b"one")
    clocks["a"] = EPOCH + 25
    first = net.core("a").propose_many([b"two", b"three"])
    net.stabilize()
    log = net.core("a").log
    assert [log.ts(i) for i in (one, first, first + 1)] == [EPOCH + 10, EPOCH + 25, EPOCH + 25]


def test_both_entries_of_a_joint_membership_change_are_stamped():
    clocks = {"a": EPOCH, "b": EPOCH, "c": EPOCH}
    net = cluster(clocks)
    net.elect("a")
    clocks["a"] = EPOCH + 40
    joint = net.core("a").change_membership({"a", "b"})
    net.stabilize()  # C_old,new commits, and the leader appends C_new by itself
    log = net.core("a").log
    final = [e for e in log.entries if e.kind == EntryKind.MEMBERSHIP][-1]
    assert final.index > joint and not log.membership().joint
    assert log.ts(joint) == EPOCH + 40 and final.ts_ms == EPOCH + 40


def test_followers_keep_the_leaders_stamp_whatever_their_own_clock_says():
    clocks = {"a": EPOCH + 1_000, "b": EPOCH, "c": EPOCH + 99_000}
    net = cluster(clocks)
    net.elect("a")
    net.propose("a", b"x")
    assert times(net, "b") == times(net, "c") == times(net, "a") == [EPOCH + 1_000] * 2
    assert [e.ts_ms for e in net["b"].applied] == [EPOCH + 1_000] * 2


def test_a_leader_whose_clock_is_behind_stamps_the_time_of_the_last_entry():
    clocks = {"a": EPOCH + 5_000, "b": EPOCH, "c": EPOCH}
    net = cluster(clocks, check_quorum=False)
    net.elect("a")
    net.propose("a", b"from a")
    net.isolate("a")
    net.elect("b")  # its clock is 5 s behind a's
    assert net.core("b").log.entries[-1].ts_ms == EPOCH + 5_000
    net.propose("b", b"from b, still behind")
    clocks["b"] = EPOCH + 7_000
    net.propose("b", b"from b, ahead again")
    assert times(net, "b") == [EPOCH + 5_000] * 4 + [EPOCH + 7_000]
    net.heal()
    net.tick("a", "b", "c", times=3)
    assert times(net, "a") == times(net, "b") == times(net, "c")
    assert_never_decreasing(net)


def test_the_entries_a_new_leader_overwrites_do_not_hold_its_times_back():
    """An uncommitted suffix of a deposed leader is replaced, times and all: the new entries
    are stamped against the entry before them in the new leader's log."""
    clocks = {"a": EPOCH + 9_000, "b": EPOCH, "c": EPOCH}
    net = cluster(clocks, check_quorum=False)
    net.elect("a")
    net.isolate("a")
    clocks["a"] = EPOCH + 50_000
    net.core("a").propose(b"lost")  # never leaves a
    net.stabilize()
    assert times(net, "a") == [EPOCH + 9_000, EPOCH + 50_000]
    clocks["b"] = EPOCH + 10
    net.elect("b")
    net.propose("b", b"kept")
    net.heal()
    net.tick("a", "b", "c", times=3)
    assert times(net, "a") == times(net, "b") == [EPOCH + 9_000, EPOCH + 9_000, EPOCH + 9_000]
    assert [e.data for e in net.core("a").log.entries] == [b"", b"", b"kept"]
    assert_never_decreasing(net)


def test_a_clock_that_steps_back_never_makes_times_decrease():
    clocks = {"a": EPOCH + 100, "b": EPOCH, "c": EPOCH}
    net = cluster(clocks)
    net.elect("a")
    clocks["a"] = EPOCH - 60_000  # NTP stepped the clock back a minute
    net.propose("a", b"x")
    net.core("a").propose_many([b"y", b"z"])
    net.stabilize()
    assert times(net, "a") == [EPOCH + 100] * 4
    assert_never_decreasing(net)


def test_a_snapshot_carries_the_time_of_its_index():
    clocks = {"a": EPOCH, "b": EPOCH, "c": EPOCH}
    net = cluster(clocks)
    net.elect("a")
    for n in range(5):
        clocks["a"] = EPOCH + 10 * n
        net.propose("a", f"{n}".encode())
    log = net.core("a").log
    meta = net.compact("a", 4)
    assert meta.ts_ms == EPOCH + 20 and log.offset_ts == EPOCH + 20
    assert net["a"].disk.snapshot.ts_ms == EPOCH + 20


def test_a_member_whose_log_starts_after_a_snapshot_still_stamps_no_earlier():
    """After compacting its whole log and restarting, a member knows the time of the last
    index only from its snapshot; elected with a slow clock, it must stamp no earlier."""
    clocks = {"a": EPOCH + 3_000, "b": EPOCH, "c": EPOCH}
    net = cluster(clocks, check_quorum=False)
    net.elect("a")
    net.propose("a", b"x")
    net.stabilize()
    last = net.core("b").log.last_index()
    net.compact("b", last)
    core = net.restart("b")
    assert core.log.entries == [] and core.log.last_ts() == EPOCH + 3_000
    net.isolate("a")
    net.elect("b")
    assert net.core("b").log.entries[-1].ts_ms == EPOCH + 3_000


def test_a_follower_that_installs_a_snapshot_learns_the_time_of_its_index():
    clocks = {"a": EPOCH + 2_000, "b": EPOCH, "c": EPOCH}
    net = cluster(clocks)
    net.elect("a")
    net.isolate("c")
    for n in range(3):
        net.propose("a", f"{n}".encode())
    last = net.core("a").log.last_index()
    net.compact("a", last)  # c can only catch up by the snapshot now
    net.heal()
    net.tick("a", times=2)
    c = net.core("c").log
    assert c.snapshot.index == last and c.snapshot.ts_ms == EPOCH + 2_000
    assert c.last_ts() == EPOCH + 2_000


def test_without_a_clock_entries_carry_time_zero_meaning_unknown():
    net = Network(["a", "b", "c"])
    net.elect("a")
    net.propose("a", b"x")
    assert times(net, "b") == [0, 0]


def test_recovered_entries_keep_their_times():
    clocks = {"a": EPOCH + 77, "b": EPOCH, "c": EPOCH}
    net = cluster(clocks)
    net.elect("a")
    net.propose("a", b"x")
    recovered = net["b"].disk.recovered()
    core = RaftCore("b", Settings(), RecoveredState(recovered.hard_state, recovered.snapshot,
                                                    recovered.entries))
    assert [e.ts_ms for e in core.log.entries] == [EPOCH + 77] * 2
