"""Fixtures for the client and CLI tests.

``cluster`` is one real three-member cluster (``tests.harness.processes.LocalCluster``, fast
timing) shared by a module's tests that leave it as they found it; tests that kill members
use the function-scoped ``local_cluster`` factory instead. Both skip, with the reason, where
``python -m flotilla.node`` cannot run. The stub-server tests need no node at all.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest

from tests.harness.fixtures import local_cluster, require_node  # noqa: F401 (a fixture)
from tests.harness.processes import LocalCluster

#: Fast elections keep the suite quick; the CLI takes the same through `up`.
FAST = {"election_timeout_ms": 500, "heartbeat_ms": 50}


def text(result: subprocess.CompletedProcess) -> str:
    return (result.stdout + result.stderr).decode(errors="replace")


def ok(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, text(result)
    return result.stdout.decode()


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
