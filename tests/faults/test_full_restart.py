"""SIGTERM every member under load, then start them all again with the same flags: every
acknowledged write is still there, a leader is elected, and new writes work."""

from __future__ import annotations

import time

from tests.faults.support import (
    FAST,
    acknowledged_writes_after,
    check_history,
    diagnostics,
    put_until_ok,
    wait_for,
    workload,
)


def test_every_member_stopped_and_restarted_keeps_its_state(local_cluster):
    cluster = local_cluster(3, **FAST)
    cluster.wait_leader(30)
    w = workload(cluster, seed=51)
    with w:
        wait_for(lambda: w.ok_count >= 100, 20, "the workload to get going")
        # The leader first, so that the hand-over on SIGTERM happens under load too.
        leader = cluster.wait_leader(10)
        order = [leader, *(m for m in cluster.members if m != leader)]
        codes, took = {}, {}
        for name in order:
            started = time.monotonic()
            codes[name] = cluster.nodes[name].terminate(20)
            took[name] = round(time.monotonic() - started, 2)
        down_at = time.monotonic()
        acked_before = acknowledged_writes_after(w.history, 0.0)
        time.sleep(0.5)  # clients meet refused connections meanwhile
        cluster.start()
        new = cluster.wait_leader(30)
        restarted_at = time.monotonic()
        wait_for(lambda: acknowledged_writes_after(w.history, restarted_at) >= 30, 30,
                 "writes to be acknowledged after the restart")
        put_until_ok(w.history, cluster, "after-restart", "after-restart", b"1")
        time.sleep(0.5)
    print(f"\nstopped {order} (exit codes {codes}, seconds from SIGTERM to exit {took}) after "
          f"{acked_before} acknowledged writes; "
          f"restarted, {new} leads; {acknowledged_writes_after(w.history, down_at)} writes "
          f"acknowledged after the restart")
    assert codes == dict.fromkeys(order, 0), f"SIGTERM must be a clean shutdown (exit 0): {codes}"
    with cluster.client(new) as c:
        got = c.get("after-restart")
        assert (got.status, got.body) == (200, b"1"), diagnostics(w)
    check_history(cluster, w)
