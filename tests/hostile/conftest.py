"""Fixtures of the hostile-peer suite.

``keeper`` is the module's ``Keeper``: one three-member cluster per test module, started with
the module's ``CLUSTER_OPTIONS`` (LocalCluster keywords) if it has any. ``cluster`` hands a
test that cluster, checked healthy (or replaced), and prints the members' logs when the test
failed.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.harness.fixtures import require_node
from tests.harness.processes import LocalCluster
from tests.hostile.support import Keeper, Listener


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when == "call":
        item.stash[_FAILED] = report.failed


_FAILED = pytest.StashKey[bool]()


@pytest.fixture(scope="module")
def keeper(request, tmp_path_factory) -> Iterator[Keeper]:
    require_node()
    options = getattr(request.module, "CLUSTER_OPTIONS", {})
    kept = Keeper(tmp_path_factory.mktemp(request.module.__name__.rsplit(".", 1)[-1]),
                  **options)
    try:
        yield kept
    finally:
        kept.stop()


@pytest.fixture
def cluster(keeper: Keeper, request) -> Iterator[LocalCluster]:
    cluster = keeper.healthy_cluster()
    yield cluster
    if request.node.stash.get(_FAILED, False):
        print(f"\n=== what the members logged during the test (cluster {cluster.root})")
        for name in cluster.nodes:
            lines = keeper.new_log_text(name).splitlines()
            print(f"--- {name}:\n" + "\n".join(lines[-40:]))


@pytest.fixture
def listeners() -> Iterator[tuple[Listener, Listener]]:
    """The attacker's two servers: one advertised as a peer URL, one as a client URL."""
    peer, client = Listener("peer"), Listener("client")
    try:
        yield peer, client
    finally:
        peer.close()
        client.close()
