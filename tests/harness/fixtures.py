"""pytest fixtures for process-level tests. Make them visible in a suite's conftest.py::

    from tests.harness.fixtures import local_cluster  # noqa: F401 (a fixture)

and use them in its tests::

    def test_leader_survives(local_cluster):
        cluster = local_cluster(3, proxied=True)
        leader = cluster.wait_leader()
        ...

``local_cluster`` is a factory: every cluster it makes is killed at teardown, whatever the test
did, and the end of each member's log is printed then; pytest shows captured teardown output
only for a test that failed, which is when it is wanted. Tests skip, with the reason, where
``python -m flotilla.node`` cannot run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness.processes import LocalCluster, node_unavailable_reason

__all__ = ["local_cluster", "require_node"]


def require_node() -> None:
    """Skip the calling test, with the reason, when the node server cannot run here."""
    reason = node_unavailable_reason()
    if reason:
        pytest.skip(reason)


@pytest.fixture
def local_cluster(tmp_path: Path) -> Iterator[Callable[..., LocalCluster]]:
    """``local_cluster(size=3, **options)`` -> a started ``LocalCluster`` under tmp_path."""
    require_node()
    made: list[LocalCluster] = []

    def make(size: int = 3, **options: Any) -> LocalCluster:
        root = tmp_path / f"cluster{len(made)}"
        cluster = LocalCluster(root, size, start=False, **options)
        made.append(cluster)  # before start(): a failed start is cleaned up too
        cluster.start()
        return cluster

    try:
        yield make
    finally:
        for cluster in made:
            try:
                print(f"\n=== logs of the cluster under {cluster.root}\n{cluster.log_tails(40)}")
            finally:
                cluster.stop_all()

