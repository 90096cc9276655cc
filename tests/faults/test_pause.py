"""SIGSTOP a member under load (a follower; the leader), then SIGCONT it: the cluster keeps or
resumes serving, the resumed member converges, and the history stays linearizable.

A paused leader is the classic stale-read trap: it wakes up still believing it leads, with
client requests queued in its sockets. A linearizable read it answers must reflect the writes
the new leader acknowledged meanwhile, which the fence probe checks directly.

The main clients spread over every member, the paused one included (each of their requests
to it waits out the 2 s timeout); the write probes avoid the paused member, as a client with a
health-checking load balancer would, and show whether the others keep serving.
"""

from __future__ import annotations

import threading
import time

from tests.faults.support import (
    ELECTION_S,
    FAST,
    UNAVAILABILITY_BOUND_S,
    acknowledged_writes_after,
    check_history,
    diagnostics,
    member_urls,
    others,
    probe,
    put_until_ok,
    unavailability,
    wait_caught_up,
    wait_for,
    workload,
    write_probes,
)

PAUSE_S = 3.0  # six election timeouts


def test_paused_follower_does_not_stop_the_cluster(local_cluster):
    cluster = local_cluster(3, **FAST)
    cluster.wait_leader(30)
    paused: set[str] = set()
    w = workload(cluster, seed=11)
    probes = write_probes(cluster, w, seed=11, urls=member_urls(cluster, exclude=paused))
    with w, probes:
        wait_for(lambda: w.ok_count >= 30, 20, "the workload to get going")
        leader = cluster.wait_leader(10)
        follower = others(cluster, leader)[0]
        paused.add(follower)
        paused_at = time.monotonic()
        cluster.nodes[follower].stop()
        time.sleep(PAUSE_S)
        # The majority kept its leader and kept acknowledging writes.
        kept = cluster.wait_leader(10, among=others(cluster, follower))
        acked = acknowledged_writes_after(w.history, paused_at)
        resumed_at = time.monotonic()
        cluster.nodes[follower].cont()
        paused.clear()
        target, applied = wait_caught_up(cluster, follower, timeout=30)
        wait_for(lambda: acknowledged_writes_after(w.history, resumed_at) >= 20, 20,
                 "writes after the follower resumed")
        time.sleep(1.0)
    longest = unavailability(w.history, paused_at, resumed_at)
    print(f"\nfollower {follower} paused {PAUSE_S}s: {kept} kept leading, {acked} writes "
          f"acknowledged meanwhile, longest gap between acknowledged writes "
          f"{(longest or 0) * 1000:.0f} ms; resumed, it applied {applied} >= leader commit "
          f"{target}")
    assert kept == leader, f"leadership moved from {leader} to {kept} while a follower paused"
    assert acked >= 20 and longest is not None and longest < UNAVAILABILITY_BOUND_S, (
        f"the cluster stopped acknowledging writes while {follower} was paused ({acked} "
        f"acknowledged; longest gap {longest}s)\n{diagnostics(w)}\n"
        f"probes: {diagnostics(probes)}")
    check_history(cluster, w)


def test_paused_leader_is_replaced_and_serves_no_stale_reads(local_cluster):
    cluster = local_cluster(3, **FAST)
    cluster.wait_leader(30)
    paused: set[str] = set()
    w = workload(cluster, seed=12)
    probes = write_probes(cluster, w, seed=12, urls=member_urls(cluster, exclude=paused))
    history = w.history
    stale_read: dict[str, object] = {}
    with w, probes:
        wait_for(lambda: w.ok_count >= 30, 20, "the workload to get going")
        put_until_ok(history, cluster, "fence-old", "fence", b"old")
        old = cluster.wait_leader(10)
        majority = others(cluster, old)
        paused.add(old)
        paused_at = time.monotonic()
        cluster.nodes[old].stop()
        new = cluster.wait_leader(20, among=majority)
        elected_after = time.monotonic() - paused_at
        assert new != old
        put_until_ok(history, cluster, "fence-new", "fence", b"new", among=majority)
        wait_for(lambda: acknowledged_writes_after(w.history, paused_at) >= 20, 20,
                 "writes to be acknowledged again while the leader is paused")

        # A linearizable read sent to the paused old leader: it sits in the socket until the
        # member resumes, then must not answer with the value the new leader overwrote.
        def read_on_old_leader() -> None:
            with cluster.client(old) as c:
                stale_read["resp"] = probe(history, c, "fence-reader", "get", "fence",
                                           timeout=10 * ELECTION_S + PAUSE_S)

        reader = threading.Thread(target=read_on_old_leader, daemon=True)
        reader.start()
        time.sleep(max(0.0, paused_at + PAUSE_S - time.monotonic()))
        resumed_at = time.monotonic()
        cluster.nodes[old].cont()
        paused.clear()
        reader.join(30)
        assert not reader.is_alive()
        cluster.wait_leader(20)  # agreed by all three, the resumed one included
        target, applied = wait_caught_up(cluster, old, timeout=30)
        time.sleep(1.0)
    gap = unavailability(w.history, paused_at, resumed_at)
    resp = stale_read.get("resp")
    answer = "no answer" if resp is None else f"{resp.status} {resp.body[:100]!r}"
    print(f"\nleader {old} paused, {new} took over ({elected_after * 1000:.0f} ms after the "
          f"pause): unavailability: {(gap or 0) * 1000:.0f} ms; "
          f"linearizable read of the fence on the resumed old leader: {answer}; it then "
          f"applied {applied} >= leader commit {target}")
    assert not (resp is not None and resp.status == 200 and resp.body == b"old"), (
        f"stale read: the paused old leader {old} answered a linearizable GET of 'fence' with "
        f"b'old' after {new} had acknowledged b'new'")
    assert gap is not None and gap < UNAVAILABILITY_BOUND_S, (
        f"writes stopped for {gap}s after the leader was paused\n{diagnostics(w)}")
    check_history(cluster, w)
