"""Real members on the first release's files (tests/fixtures/v1, written by that release): a
member starts on its data dir and goes on writing, and a new cluster restores from its archive."""

from __future__ import annotations

import pytest

from tests.archive_node.support import FAST, Store, Writer, read_state
from tests.fixtures import copy_v1, v1_expected
from tests.harness.fixtures import require_node
from tests.harness.processes import LocalCluster

KEYS = [f"key-{n:03d}" for n in range(120)]


def expected_values(state: dict[str, str]) -> dict[str, bytes | None]:
    return {key: state[key].encode() if key in state else None for key in KEYS}


@pytest.mark.timeout(90)
def test_a_member_starts_on_a_v1_data_dir_and_keeps_writing(tmp_path):
    require_node()
    expected = v1_expected()
    with LocalCluster(tmp_path / "c", names=[expected["member"]], start=False,
                      cluster_id=expected["cluster_id"], **FAST) as cluster:
        node = cluster.nodes[expected["member"]]
        copy_v1("datadir", node.data_dir)
        cluster.start()
        cluster.wait_leader()
        values, _ = read_state(node.url, KEYS, "key-")
        assert values == expected_values(expected["state"])
        with Writer([node.url]) as writer:
            written = writer.put("key-new", "after the upgrade")
        assert written.index > expected["last_index"]
        assert node.terminate() == 0
        node.start()
        cluster.wait_leader()
        values, _ = read_state(node.url, [*KEYS, "key-new"], "key-")
        assert values == {**expected_values(expected["state"]),
                          "key-new": b"after the upgrade"}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("at", ["newest", "index"])
def test_a_new_cluster_restores_from_a_v1_archive(tmp_path, local_cluster, at):
    expected = v1_expected()
    root = copy_v1("archive", tmp_path / "archive")
    store = Store(root.as_uri())
    index = expected["first_archived_index"] if at == "index" else None
    state = expected["state_at_first_archived_index"] if index else expected["state"]
    cluster = local_cluster(1, cluster_id=f"from-v1-{at}", **FAST,
                            extra_args=store.restore_flags(cluster_id=expected["cluster_id"],
                                                           index=index))
    leader = cluster.wait_leader(timeout=60)
    values, _ = read_state(cluster.nodes[leader].url, KEYS, "key-")
    assert values == expected_values(state)
