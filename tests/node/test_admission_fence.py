"""The admission fence of a member that starts empty, seen from outside: `/v1/status` and the
member's own log tell the truth about it.

Real processes of a local cluster (`flotilla up`, then `existing` mode for every restart, as
the operator's pods). Two stories:

* A voter's disk is lost. The lost member is the leader, so its successor, which never sent
  it anything, sends it the log from its first entry: a log in which no configuration names
  it, since the first configuration travels in no entry. It must be fenced (say so once, in a
  warning), neither lead nor help elect anyone, and be admitted only once it has been removed
  and added back as a learner; then it votes again.
* An ordinary scale-up: the new member waits to be added as a learner and is admitted,
  without ever claiming that its disk was lost.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import time
from pathlib import Path

from flotilla import local, scaling
from flotilla.client import FlotillaError
from tests.harness.cli import CLEANUP_TIMEOUT_S

FAST = {"election_timeout_ms": 500, "heartbeat_ms": 50}
LOST_DISK = "its disk was lost"
WAITING = "waiting to be added as a learner"
ADMITTED = "admitted:"


def this_run(cluster: local.LocalCluster, name: str) -> str:
    """The member's log since its latest start."""
    text = Path(cluster.member(name).log_file).read_text(errors="replace")
    return text.rpartition("--- flotilla: start at")[2]


def wait_logged(cluster: local.LocalCluster, name: str, text: str, timeout: float = 10) -> str:
    """The member's log once it holds `text` (the line follows the state by a moment: the
    state is made durable first)."""
    deadline = time.monotonic() + timeout
    while text not in (log := this_run(cluster, name)):
        assert time.monotonic() < deadline, f"{name} never logged {text!r}:\n{log}"
        time.sleep(0.05)
    return log


def wait_admission(cluster: local.LocalCluster, name: str, wanted: str | None,
                   timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        doc = cluster.member_status(name)
        if doc is not None and doc.get("admission", "missing") == wanted:
            return doc
        assert time.monotonic() < deadline, (
            f"{name} never showed admission {wanted!r}: {doc}\n{cluster.log_tail(name, 30)}")
        time.sleep(0.1)


def leaders_among(cluster: local.LocalCluster, names) -> list[str]:
    return [n for n in names if (cluster.member_status(n) or {}).get("role") == "leader"]


def retry(action, timeout: float = 30):
    """An admin call that may meet a configuration change still settling (409/422/503)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return action()
        except FlotillaError as exc:
            if time.monotonic() > deadline or exc.code not in (
                    "change_in_progress", "not_caught_up", "unavailable", "not_a_learner"):
                raise
            time.sleep(0.2)


def test_a_lost_voter_is_fenced_until_it_is_removed_and_added_back(tmp_path: Path):
    cluster, leader = local.up(tmp_path / "c", 3, **FAST)
    try:
        with cluster.client(timeout=10) as c:
            for i in range(5):
                c.put(f"before/{i}", b"kept")
        lost = leader
        cluster.kill(lost)
        shutil.rmtree(cluster.member(lost).data_dir)
        cluster.start([lost])  # empty, and `existing`: the cluster has served

        doc = wait_admission(cluster, lost, "fenced")
        assert doc["role"] != "leader"
        assert doc["last_index"] >= 5  # it read the log from its start, and is fenced all the same
        log = wait_logged(cluster, lost, LOST_DISK)
        assert log.count(LOST_DISK) == 1, log
        assert ADMITTED not in log, log

        # It helps elect no one: with the leader gone, the one other member cannot win.
        [current] = leaders_among(cluster, cluster.names)
        other = next(n for n in cluster.names if n not in (lost, current))
        cluster.kill(current)
        time.sleep(10 * FAST["election_timeout_ms"] / 1000)
        assert leaders_among(cluster, [lost, other]) == []
        assert cluster.member_status(lost)["admission"] == "fenced"
        cluster.restart(current)
        cluster.wait_ready(30)

        member = cluster.member(lost)
        with cluster.client(timeout=30) as c:
            retry(lambda: c.remove_member(lost))
            retry(lambda: c.add_member(lost, member.peer_url, member.client_url))
            wait_admission(cluster, lost, None)
            log = wait_logged(cluster, lost, ADMITTED)
            assert log.count(LOST_DISK) == 1, log
            assert log.count(ADMITTED) == 1, log
            retry(lambda: c.set_voters(cluster.names), timeout=60)
            assert c.get("before/4").value == b"kept"

        # A voter again, it votes: with the leader gone, it and the other member elect one.
        [current] = leaders_among(cluster, cluster.names)
        survivors = [n for n in cluster.names if n != current]
        cluster.kill(current)
        deadline = time.monotonic() + 30
        while not leaders_among(cluster, survivors):
            assert time.monotonic() < deadline, "the re-added member did not help elect"
            time.sleep(0.1)
    finally:
        for m in cluster.members:
            if m.pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(m.pid, signal.SIGCONT)
        cluster.stop(timeout=CLEANUP_TIMEOUT_S)


def test_a_member_added_by_scaling_up_is_admitted_without_a_lost_disk_warning(tmp_path: Path):
    root = tmp_path / "c"
    cluster, _ = local.up(root, 3, **FAST)
    try:
        with cluster.client(timeout=10) as c:
            for i in range(5):
                c.put(f"k{i}", b"v")
        scaling.scale(root, 4, timeout=120)
        cluster = local.LocalCluster.load(root)
        [new] = [n for n in cluster.names if n not in ("n1", "n2", "n3")]
        assert cluster.member_status(new)["admission"] is None
        log = wait_logged(cluster, new, ADMITTED)
        assert LOST_DISK not in log, log
        assert log.count(WAITING) == 1, log
        assert log.count(ADMITTED) == 1, log
    finally:
        local.LocalCluster.load(root).stop(timeout=CLEANUP_TIMEOUT_S)
