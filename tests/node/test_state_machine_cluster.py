"""A user's state machine end to end, on real member processes: the `Counter` of
docs/state-machines.md (`flotilla.examples.counter:Counter`) under a leader kill, a learner that
catches up through a snapshot, and a restore from the archive on moto_server.

Every command adds a distinct power of two, so the total says exactly which commands were
applied: its bits must include every acknowledged one and nothing but acknowledged and
unknown-outcome ones (a command the client gave up on may or may not have been applied).
"""

from __future__ import annotations

import itertools
import shutil
import threading
import time
import uuid

import pytest

from flotilla.client import Client, FlotillaError
from tests.archive_node import conftest as archive_fixtures
from tests.archive_node.support import post_snapshot, wait_archived
from tests.faults.support import FAST, wait_caught_up
from tests.harness import fixtures as harness_fixtures
from tests.harness.polling import wait_for
from tests.harness.processes import LocalCluster

# Fixtures of the process and archive suites: members on loopback, and moto_server.
local_cluster = harness_fixtures.local_cluster
moto_s3 = archive_fixtures.moto_s3
node_aws_env = archive_fixtures.node_aws_env
s3_store = archive_fixtures.s3_store

COUNTER = "flotilla.examples.counter:Counter"
FLAGS = ["--state-machine", COUNTER, "--snapshot-policy", "entries=40"]


def bits(total: int) -> set[int]:
    return {i for i in range(total.bit_length()) if total >> i & 1}


class Adders:
    """Threads that each send `1 << id` commands (ids unique across threads) through their own
    `Client`, recording which ids were acknowledged and which have an unknown outcome."""

    def __init__(self, urls: list[str], threads: int = 4) -> None:
        self.urls = urls
        self.ids = itertools.count()
        self.lock = threading.Lock()
        self.acked: dict[int, int] = {}  # id -> the total the command's answer gave
        self.times: dict[int, float] = {}  # id -> when its answer arrived
        self.unknown: set[int] = set()
        self.errors: list[str] = []
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]

    def __enter__(self) -> Adders:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        for t in self.threads:
            t.join(30)

    def acked_since(self, moment: float) -> int:
        with self.lock:
            return sum(1 for t in self.times.values() if t > moment)

    def _run(self) -> None:
        with Client(self.urls, timeout=3.0) as client:
            while not self.stopping.is_set():
                with self.lock:
                    n = next(self.ids)
                try:
                    answer = client.command(str(1 << n).encode())
                except FlotillaError as exc:
                    with self.lock:
                        self.unknown.add(n)
                        self.errors.append(f"{n}: {exc}"[:200])
                    time.sleep(0.02)
                    continue
                with self.lock:
                    self.acked[n] = answer["total"]
                    self.times[n] = time.monotonic()


def totals(cluster: LocalCluster, names: list[str]) -> dict[str, int]:
    """Each member's total from its local state (a serializable query)."""
    out = {}
    for name in names:
        with Client(cluster.nodes[name].url, timeout=3.0, prefer_leader=False) as c:
            out[name] = c.query(None, consistency="serializable")
    return out


def converged(cluster: LocalCluster, names: list[str]) -> int:
    """The total once every member in `names` serves the same one as a linearizable query."""
    with Client([cluster.nodes[n].url for n in names], timeout=5.0) as c:
        linear = c.query(None)
    found = wait_for(lambda: (t := totals(cluster, names)) and len(set(t.values())) == 1
                     and t[names[0]] >= linear and t, 30, "every member to serve one total")
    return found[names[0]]


def check_total(total: int, adders: Adders) -> None:
    applied = bits(total)
    acked, unknown = set(adders.acked), adders.unknown
    assert acked <= applied, f"acknowledged commands lost: {sorted(acked - applied)[:20]}"
    assert applied <= acked | unknown, (
        f"commands applied that were never sent: {sorted(applied - acked - unknown)[:20]}")
    # Each answer's total already held its own command.
    assert all(t >> n & 1 for n, t in adders.acked.items())


@pytest.mark.timeout(180)
def test_counter_survives_a_leader_kill_and_every_member_converges(local_cluster):
    cluster = local_cluster(3, extra_args=FLAGS, **FAST)
    cluster.wait_leader(30)
    urls = [n.url for n in cluster.nodes.values()]
    adders = Adders(urls)
    with adders:
        wait_for(lambda: len(adders.acked) >= 60, 30, "commands to be acknowledged")
        old = cluster.wait_leader(10)
        killed_at = time.monotonic()
        cluster.nodes[old].kill()
        survivors = [m for m in cluster.members if m != old]
        cluster.wait_leader(20, among=survivors)
        wait_for(lambda: adders.acked_since(killed_at) >= 60, 30,
                 "commands to be acknowledged again after the kill")
        cluster.nodes[old].restart()
        wait_for(lambda: adders.acked_since(killed_at) >= 120, 30,
                 "more commands after the restart")
    wait_caught_up(cluster, old, timeout=30)
    total = converged(cluster, list(cluster.members))
    check_total(total, adders)
    print(f"\n{len(adders.acked)} commands acknowledged, {len(adders.unknown)} with an unknown "
          f"outcome ({len(bits(total)) - len(adders.acked)} of them applied); leader {old} "
          "killed and restarted")
    assert len(adders.acked) >= 180
    # Snapshots were taken (by a forked child: the Counter cannot freeze) while it ran.
    assert cluster.status(cluster.wait_leader())["snapshot"]["index"] > 0


@pytest.mark.timeout(120)
def test_a_learner_of_a_counter_cluster_catches_up_through_a_snapshot(local_cluster):
    cluster = local_cluster(3, extra_args=FLAGS, **FAST)
    leader = cluster.wait_leader(30)
    with Client(cluster.nodes[leader].url, timeout=5.0) as c:
        for n in range(100):
            c.command(str(1 << n).encode())
    leader = cluster.wait_leader()
    assert cluster.status(leader)["first_index"] > 1, "the log was never compacted"
    cluster.add_member("n3")
    wait_caught_up(cluster, "n3", timeout=30)
    with cluster.nodes["n3"].client() as c:
        metrics = c.request("GET", "/metrics").body.decode()
    installed = [line for line in metrics.splitlines()
                 if line.startswith("flotilla_snapshots_installed_total")]
    assert any(not line.endswith(" 0") and not line.endswith(" 0.0") for line in installed), \
        installed
    assert converged(cluster, [*cluster.members]) == (1 << 100) - 1


@pytest.mark.timeout(180)
def test_a_counter_cluster_is_restored_from_its_archive(local_cluster, s3_store):
    old = local_cluster(3, extra_args=[*FLAGS, *s3_store.archive_flags()], env=s3_store.env,
                        **FAST)
    leader = old.wait_leader(30)
    with Client([n.url for n in old.nodes.values()], timeout=5.0) as c:
        for n in range(30):
            c.command(str(1 << n).encode())
        snap = post_snapshot(old.nodes[old.wait_leader()])
        for n in range(30, 50):
            c.command(str(1 << n).encode())
        total = c.query(None)
    assert total == (1 << 50) - 1
    leader = old.wait_leader()
    archived = wait_archived(old, leader, old.status(leader)["commit_index"])
    assert archived["error"] is None and archived["last_snapshot_index"] >= snap["index"]
    for node in old.nodes.values():
        node.kill()
        shutil.rmtree(node.data_dir)

    restore = ["--restore-from", s3_store.url, *s3_store.endpoint_flags()]
    # A member of the key-value machine refuses the Counter's archive, naming both.
    kv = local_cluster(1, cluster_id=f"kv-{uuid.uuid4().hex[:8]}", env=s3_store.env,
                       extra_args=restore, **FAST)
    assert kv.nodes["n0"].wait(60) == 3
    said = kv.nodes["n0"].log_tail(5)
    assert "is a snapshot of the 'counter' state machine, but this member runs kv" in said, said

    new = local_cluster(3, cluster_id=f"restored-{uuid.uuid4().hex[:8]}", env=s3_store.env,
                        extra_args=[*FLAGS, *restore], **FAST)
    new.wait_leader(60)
    assert converged(new, list(new.members)) == total
    with Client([n.url for n in new.nodes.values()], timeout=5.0) as c:
        assert c.command(str(1 << 50).encode()) == {"total": (1 << 51) - 1}
        with pytest.raises(FlotillaError) as refused:
            c.get("k")
        assert refused.value.status == 409 and refused.value.code == "not_kv"
