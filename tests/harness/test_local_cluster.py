"""The harness against real ``flotilla node`` processes: the smallest stories each helper tells.

These double as smoke tests of the node through its contract (leader election, forwarding,
SIGKILL, SIGSTOP, SIGTERM, adding a learner, partitions). The fault-test suites build on the
same helpers; here each story is short. All skip, with the reason, where the node cannot run.
"""

from __future__ import annotations

import signal
import time

from tests.harness.kvclient import Workload, read_finals
from tests.harness.linearizability import check_final_state

FAST = {"election_timeout_ms": 500, "heartbeat_ms": 50}


def others(cluster, name):
    return [m for m in cluster.members if m != name]


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


def test_three_members_elect_one_leader_and_any_member_serves(local_cluster):
    cluster = local_cluster(3, **FAST)
    leader = cluster.wait_leader(20)
    follower = others(cluster, leader)[0]
    with cluster.client(follower) as c:
        put = c.put("greeting", b"hello")
        assert put.status == 200, put.body
        assert put.index is not None
    for name in cluster.members:
        with cluster.client(name) as c:
            got = c.get("greeting")
            assert (got.status, got.body) == (200, b"hello")
    status = cluster.status(leader)
    assert status["role"] == "leader" and sorted(status["config"]["voters"]) == cluster.members


def test_sigterm_is_a_clean_shutdown_and_restart_resumes(local_cluster):
    cluster = local_cluster(3, **FAST)
    leader = cluster.wait_leader(20)
    with cluster.client(leader) as c:
        assert c.put("k", b"v").status == 200
    assert cluster.nodes[leader].terminate(15) == 0  # hands leadership over first
    new_leader = cluster.wait_leader(20, among=others(cluster, leader))
    assert new_leader != leader
    assert f"leadership handed over to {new_leader}" in cluster.nodes[leader].log_tail(20)
    cluster.nodes[leader].restart()
    assert cluster.wait_leader(20) == new_leader
    with cluster.client(leader) as c:
        assert c.get("k", consistency="serializable").body == b"v"


def test_every_member_sigtermed_at_once_exits_cleanly_without_waiting_out_the_hand_over(
        local_cluster):
    """As `flotilla down` or a StatefulSet scaled to 0 stops them: the leader's hand-over
    target is stopping too. The leader gives a target up as soon as it stops answering, and
    then stops, instead of waiting out the 5 s the hand-over may take."""
    cluster = local_cluster(3, **FAST)
    leader = cluster.wait_leader(20)
    with cluster.client(leader) as c:
        assert c.put("k", b"v").status == 200
    for node in cluster.nodes.values():
        node.proc.send_signal(signal.SIGTERM)
    assert {name: node.wait(15) for name, node in cluster.nodes.items()} == dict.fromkeys(
        cluster.members, 0)
    said = [line for line in cluster.nodes[leader].log_tail(30).splitlines()
            if "leadership" in line or "stepped down" in line]
    assert len(said) == 1, said
    assert "stopped answering" in said[0] or "handed over to" in said[0], said
    cluster.start()
    cluster.wait_leader(20)
    with cluster.client(leader) as c:
        assert c.get("k").body == b"v"


def test_a_member_restarted_alone_serves_what_it_had_seen_committed(local_cluster):
    """A stopped member records its commit index, and applies that much again when it starts,
    before it hears from any leader: restarted without a quorum, its serializable reads show
    what it had seen committed (as etcd's do), where they used to show nothing at all."""
    cluster = local_cluster(3, **FAST)
    leader = cluster.wait_leader(20)
    with cluster.client(leader) as c:
        for i in range(20):
            assert c.put(f"k{i}", str(i).encode()).status == 200
    commit = cluster.status(leader)["commit_index"]
    wait_for(lambda: all(cluster.status(m)["applied_index"] >= commit for m in cluster.members),
             10, "every member to apply the writes")
    follower = others(cluster, leader)[0]
    for node in cluster.nodes.values():
        assert node.terminate(15) == 0
    cluster.nodes[follower].restart()
    cluster.nodes[follower].wait_serving(20)
    with cluster.client(follower) as c:
        status = wait_for(lambda: (s := cluster.status(follower))["applied_index"] >= 20 and s,
                          10, "the restarted member to apply what it had seen committed")
        assert status["leader"] is None, status
        for i in range(20):
            got = c.get(f"k{i}", consistency="serializable")
            assert (got.status, got.body) == (200, str(i).encode()), (i, got.status)
        assert c.get("k0").status == 503  # a linearizable read still needs a leader


def test_killed_leader_is_replaced_and_catches_up_after_restart(local_cluster):
    cluster = local_cluster(3, **FAST)
    old = cluster.wait_leader(20)
    cluster.nodes[old].kill()
    new = cluster.wait_leader(20, among=others(cluster, old))
    with cluster.client(new) as c:
        index = c.put("after-kill", b"1").index
    cluster.nodes[old].restart()
    cluster.wait_leader(20)
    wait_for(lambda: cluster.status(old).get("applied_index", 0) >= index, 20,
             f"{old} to apply index {index}")


def test_paused_leader_is_replaced_and_follows_after_resuming(local_cluster):
    cluster = local_cluster(3, **FAST)
    old = cluster.wait_leader(20)
    cluster.nodes[old].stop()
    new = cluster.wait_leader(20, among=others(cluster, old))
    assert new != old
    cluster.nodes[old].cont()
    assert cluster.wait_leader(20) == new


def test_learner_joins_through_add_member(local_cluster):
    cluster = local_cluster(3, **FAST)
    leader = cluster.wait_leader(20)
    with cluster.client(leader) as c:
        index = c.put("before-join", b"x").index
    node = cluster.add_member("n3", timeout=30)
    assert "n3" in cluster.status(leader)["config"]["learners"]
    wait_for(lambda: cluster.status("n3").get("applied_index", 0) >= index, 20,
             "the learner to catch up")
    with node.client() as c:
        assert c.get("before-join", consistency="serializable").body == b"x"


def test_history_stays_linearizable_across_a_leader_kill(local_cluster):
    cluster = local_cluster(3, **FAST)
    leader = cluster.wait_leader(20)
    keys = [f"key{i}" for i in range(4)]
    workload = Workload(lambda: cluster.urls, keys, clients=4, duration=30.0, timeout=2.0,
                        seed=7)
    with workload:  # leaving the block stops the clients
        time.sleep(2.0)
        cluster.nodes[leader].kill()
        time.sleep(1.5)
        cluster.nodes[leader].restart()
        cluster.wait_leader(20)
        time.sleep(1.0)
    print(workload.summary())
    assert workload.ok_count > 20, workload.summary() + "\n" + "\n".join(workload.errors[:5])
    finals = read_finals(cluster.urls, keys)
    result = check_final_state(workload.history, finals, timeout=60)
    assert result.ok, result.explain()


def test_isolated_leader_is_replaced_by_the_majority(local_cluster):
    cluster = local_cluster(3, proxied=True, **FAST)
    old = cluster.wait_leader(20)
    cluster.isolate(old)
    majority = others(cluster, old)
    new = cluster.wait_leader(20, among=majority)
    assert new != old
    with cluster.client(new) as c:
        assert c.put("during-partition", b"1").status == 200
    with cluster.client(old, timeout=3) as c:
        # The cut-off member cannot commit: it must not acknowledge a write.
        try:
            answer = c.put("on-the-minority", b"lost?")
        except (TimeoutError, OSError):
            answer = None
        assert answer is None or answer.status != 200
    cluster.heal()
    assert cluster.wait_leader(20) == new
