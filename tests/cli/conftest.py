"""Fixtures for the client and CLI tests.

``cluster`` is one real three-member cluster (``tests.harness.processes.LocalCluster``, fast
timing) shared by a module's tests that leave it as they found it; tests that kill members
use the function-scoped ``local_cluster`` factory instead. Both skip, with the reason, where
``python -m flotilla.node`` cannot run. The stub-server tests need no node at all.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from flotilla import local
from tests.harness.cli import CLEANUP_TIMEOUT_S
from tests.harness.fixtures import local_cluster, require_node  # noqa: F401 (a fixture)
from tests.harness.processes import LocalCluster

#: Fast elections keep the suite quick; the CLI takes the same through `up`.
FAST = {"election_timeout_ms": 500, "heartbeat_ms": 50}
FAST_FLAGS = ["--election-timeout-ms", str(FAST["election_timeout_ms"]),
              "--heartbeat-ms", str(FAST["heartbeat_ms"])]


def text(result: subprocess.CompletedProcess) -> str:
    return (result.stdout + result.stderr).decode(errors="replace")


def ok(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, text(result)
    return result.stdout.decode()


def tear_down(root: Path) -> None:
    """Whatever a test did, no member of the local cluster in ``root`` outlives it; the end of
    each member's log is printed (pytest shows it when the test failed)."""
    if local.LocalCluster.exists(root):
        cluster = local.LocalCluster.load(root)
        cluster.stop(timeout=CLEANUP_TIMEOUT_S)
        for m in cluster.members:
            print(f"--- {m.name} ({m.log_file}):\n{cluster.log_tail(m.name, 30)}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    require_node()
    made = LocalCluster(tmp_path_factory.mktemp("cluster"), 3, start=False, **FAST)
    try:
        made.start()
        made.wait_leader(30)
        yield made
    finally:
        try:
            print(f"\n=== logs of the cluster under {made.root}\n{made.log_tails(40)}")
        finally:
            made.stop_all()
