"""A voter whose disk is lost comes back empty; it must not help elect a leader that lacks a
write the lost disk held.

Real processes: x is acknowledged by the leader and follower F while follower S is paused, so
only those two disks hold it. F's data dir is deleted and F restarts empty, waiting to be added
(`existing`, as a local cluster and the operator's pods do once the cluster has served). The
leader is killed and S resumes. S lacks x; if the empty F voted for it, S would lead and x would
be gone. F must refuse: no leader until the old leader is back, and then x is there."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import time
from pathlib import Path

from flotilla import local
from flotilla.client import Client
from tests.harness.cli import CLEANUP_TIMEOUT_S

FAST = {"election_timeout_ms": 500, "heartbeat_ms": 50}


def test_an_empty_member_does_not_elect_a_leader_that_lacks_an_acknowledged_write(
        tmp_path: Path):
    cluster, leader = local.up(tmp_path / "c", 3, **FAST)
    try:
        stopped, emptied = [n for n in cluster.names if n != leader]
        os.kill(cluster.member(stopped).pid, signal.SIGSTOP)
        with Client(cluster.url(leader), timeout=10) as c:
            index = c.put("x", b"acknowledged by two disks").index

        cluster.kill(emptied)
        shutil.rmtree(cluster.member(emptied).data_dir)
        cluster.start([emptied])
        deadline = time.monotonic() + 20
        while (cluster.member_status(emptied) or {}).get("admission") is None:
            assert time.monotonic() < deadline, f"{emptied} never answered"
            time.sleep(0.1)

        cluster.kill(leader)
        os.kill(cluster.member(stopped).pid, signal.SIGCONT)
        time.sleep(10 * FAST["election_timeout_ms"] / 1000)  # many election timeouts
        for name in (stopped, emptied):
            doc = cluster.member_status(name)
            assert doc is not None and doc["role"] != "leader", (
                f"{name} leads without the write at {index}: {doc}")
        assert cluster.member_status(emptied)["admission"] in ("undecided", "fenced")

        cluster.restart(leader)
        with Client(cluster.endpoints, timeout=30) as c:
            assert c.get("x").value == b"acknowledged by two disks"
    finally:
        for m in cluster.members:
            if m.pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(m.pid, signal.SIGCONT)
        cluster.stop(timeout=CLEANUP_TIMEOUT_S)
