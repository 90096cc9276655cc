"""Cut the leader off from the majority through the fault proxies, under load.

The old leader must stop acknowledging writes and linearizable reads (they fail, time out or
answer 503, never succeed with stale data), the majority elects a new leader that serves, and
after healing everything converges with a linearizable history and no lost write.
"""

from __future__ import annotations

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


def test_isolated_leader_serves_nothing_stale_and_rejoins(local_cluster):
    cluster = local_cluster(3, proxied=True, **FAST)
    cluster.wait_leader(30)
    cut: set[str] = set()
    w = workload(cluster, seed=21)
    probes = write_probes(cluster, w, seed=21, urls=member_urls(cluster, exclude=cut))
    history = w.history
    with w, probes:
        wait_for(lambda: w.ok_count >= 30, 20, "the workload to get going")
        put_until_ok(history, cluster, "fence-old", "fence", b"old")
        # Whoever leads right now (leadership may have moved since the start) is cut off.
        old = cluster.wait_leader(10)
        majority = others(cluster, old)
        isolated_at = time.monotonic()
        cut.add(old)
        cluster.isolate(old)
        # Right away, while it may still believe it leads: only the checker judges this one (a
        # read of b'old' is fine before the majority overwrites it).
        with cluster.client(old) as c:
            early = probe(history, c, "early-minority-read", "get", "fence",
                          timeout=4 * ELECTION_S)
        new = cluster.wait_leader(20, among=majority)
        assert new != old
        put_until_ok(history, cluster, "fence-new", "fence", b"new", among=majority)
        wait_for(lambda: acknowledged_writes_after(history, isolated_at) >= 20, 20,
                 "writes to be acknowledged again by the majority")

        # The old leader, cut off, is asked directly: a linearizable read must not return the
        # overwritten value, and a write must not be acknowledged.
        minority = []
        with cluster.client(old) as c:
            for i in range(2):
                read = probe(history, c, f"minority-read.{i}", "get", "fence",
                             timeout=4 * ELECTION_S)
                write = probe(history, c, f"minority-write.{i}", "put", "fence",
                              f"minority-{i}".encode(), timeout=4 * ELECTION_S)
                minority.append((read, write))
                time.sleep(ELECTION_S / 2)
        minority_status = cluster.status(old)
        healed_at = time.monotonic()
        cluster.heal()
        cut.clear()
        assert cluster.wait_leader(30) in cluster.members
        agreed_after_heal = time.monotonic() - healed_at
        target, applied = wait_caught_up(cluster, old, timeout=30)
        wait_for(lambda: acknowledged_writes_after(history, healed_at) >= 20, 20,
                 "writes after healing")
        time.sleep(1.0)

    def show(resp):
        return "no answer" if resp is None else f"{resp.status} {resp.body[:80]!r}"

    gap = unavailability(history, isolated_at, healed_at)
    print(f"\nleader {old} isolated, {new} took over: unavailability: "
          f"{(gap or 0) * 1000:.0f} ms; after healing, all three agreed on a leader in "
          f"{agreed_after_heal * 1000:.0f} ms; the isolated member said "
          f"role={minority_status.get('role')} term={minority_status.get('term')}; read on "
          f"it right after the cut: {show(early)}; later probes on "
          f"it (read, write): {[(show(r), show(p)) for r, p in minority]}; after healing it "
          f"applied {applied} >= leader commit {target}")
    for read, write in minority:
        assert not (read is not None and read.status == 200), (
            f"the isolated old leader {old} answered a linearizable read: {show(read)}, "
            f"necessarily stale: the majority's leader {new} had acknowledged b'new' before")
        assert not (write is not None and write.status == 200), (
            f"the isolated old leader {old} acknowledged a write: {show(write)}")
    assert gap is not None and gap < UNAVAILABILITY_BOUND_S, (
        f"writes stopped for {gap}s after the leader was cut off\n{diagnostics(w)}")
    check_history(cluster, w)
