"""The admin API under load: two learners join (POST /v1/members), all five become voters
(PUT /v1/config, joint consensus; a second change issued meanwhile gets 409), then the current
leader is removed (DELETE /v1/members/{leader}). The final configuration is exactly the expected
voters and not joint, the history is linearizable and no acknowledged write is lost."""

from __future__ import annotations

import threading
import time

from tests.faults.support import (
    FAST,
    acknowledged_writes_after,
    check_history,
    diagnostics,
    wait_caught_up,
    wait_for,
    workload,
)
from tests.harness.kvclient import TRANSPORT_ERRORS, KVClient
from tests.harness.processes import NodeProcess


def config_of(cluster, name):
    config = cluster.status(name)["config"]
    return sorted(config["voters"]), sorted(config["learners"]), config["joint"]


def racing_config_changes(node: NodeProcess, voters: list[str], spammers: int = 2,
                          timeout: float = 30.0) -> list[tuple[str, int, str | None]]:
    """Send ``PUT /v1/config {voters}`` to ``node``, with its admin token, once from one
    thread while ``spammers`` threads send the very same request back to back until that one
    returns.

    Whichever request reaches the leader first starts the change (200 once C_new is committed);
    every identical request that arrives while it runs must get 409, and those after it 200
    (PUT is idempotent: the configuration is already exactly that). Sending the same target
    keeps the race harmless whatever the interleaving. Returns (who, status, error code) for
    every answer, in the order they arrived.
    """
    answers: list[tuple[str, int, str | None]] = []
    lock = threading.Lock()
    done = threading.Event()
    go = threading.Barrier(spammers + 1)

    def send(c: KVClient, who: str) -> None:
        try:
            resp = c.post_json("/v1/config", {"voters": voters}, method="PUT", timeout=timeout)
            answer = (who, resp.status, resp.error_code)
        except TRANSPORT_ERRORS as exc:
            answer = (who, 0, f"{type(exc).__name__}: {exc}")
        with lock:
            answers.append(answer)

    def change() -> None:
        with node.client(timeout=timeout) as c:
            go.wait()
            try:
                send(c, "change")
            finally:
                done.set()

    def spam(i: int) -> None:
        with node.client(timeout=timeout) as c:
            go.wait()
            while not done.is_set():
                send(c, f"spam{i}")

    threads = [threading.Thread(target=change, daemon=True)]
    threads += [threading.Thread(target=spam, args=(i,), daemon=True) for i in range(spammers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 5)
    assert not any(t.is_alive() for t in threads), "a config request hung"
    return answers


def test_learners_promoted_then_leader_removed_under_load(local_cluster):
    cluster = local_cluster(3, **FAST)
    cluster.wait_leader(30)
    w = workload(cluster, seed=31)
    with w:
        wait_for(lambda: w.ok_count >= 30, 20, "the workload to get going")
        for name in ("n3", "n4"):
            cluster.add_member(name, timeout=60)
        leader = cluster.wait_leader(20)
        assert config_of(cluster, leader) == (["n0", "n1", "n2"], ["n3", "n4"], None)
        for name in ("n3", "n4"):
            wait_caught_up(cluster, name, timeout=30)

        five = ["n0", "n1", "n2", "n3", "n4"]
        leader = cluster.wait_leader(20)
        promoted_at = time.monotonic()
        answers = racing_config_changes(cluster.nodes[leader], five)
        statuses = [status for _, status, _ in answers]
        print(f"\nconfig race on {leader}: {len(answers)} answers: "
              f"{statuses.count(200)} x 200, {statuses.count(409)} x 409, others: "
              f"{[a for a in answers if a[1] not in (200, 409)]}")
        assert all(s == 200 or (s, code) == (409, "change_in_progress")
                   for _, s, code in answers), f"unexpected answers: {answers}"
        assert statuses.count(409) >= 1, (
            f"no request got 409 while the change ran: {answers}")
        assert statuses.count(200) >= 1, f"no request completed the change: {answers}"
        assert config_of(cluster, leader) == (five, [], None)
        wait_for(lambda: acknowledged_writes_after(w.history, promoted_at) >= 10, 20,
                 "writes with five voters")

        # Remove the member that leads now, through joint consensus.
        leader = cluster.wait_leader(20)
        removed_at = time.monotonic()
        with cluster.client(leader, timeout=30) as c:
            resp = c.request("DELETE", f"/v1/members/{leader}")
        # Checked at the end, once the rest of the story has been checked too.
        delete_answer = f"{resp.status} {resp.body[:300]!r}"
        cluster.members.remove(leader)  # the workload stops sending to it
        expected = sorted(set(five) - {leader})
        new = cluster.wait_leader(20)
        assert new != leader
        wait_for(lambda: config_of(cluster, new) == (expected, [], None), 20,
                 f"the configuration to be exactly {expected}, not joint")
        wait_for(lambda: acknowledged_writes_after(w.history, removed_at) >= 20, 20,
                 "writes after the leader was removed")
        removed = cluster.nodes[leader]
        removed_status = cluster.status(leader)
        assert removed.terminate(15) == 0
        time.sleep(1.0)
    print(f"removed {leader} (DELETE answered {delete_answer}); {new} leads {expected}; the "
          f"removed member said role={removed_status.get('role')} "
          f"config={removed_status.get('config')}")
    check_history(cluster, w)
    for name in expected:
        assert config_of(cluster, name) == (expected, [], None), (
            f"{name} has config {cluster.status(name)['config']}\n{diagnostics(w)}")
    assert resp.status == 200, (
        f"DELETE /v1/members/{leader} sent to the leader {leader} answered {delete_answer}, "
        f"although the removal took effect (the configuration is now exactly {expected}): a "
        f"client told 503 would retry, and get 404")
