"""The whole path on kind: image, chart, MinIO, a RaftCluster that scales, loses its leader,
snapshots to S3, is deleted with its volumes and comes back from the archive with every write
it acknowledged up to that snapshot.

One story, one test: each step depends on the state the previous one left.
"""

from __future__ import annotations

import base64
import ssl
from typing import TYPE_CHECKING, Any

import pytest

from flotilla.client import Client, Unavailable

if TYPE_CHECKING:
    from conftest import Kube, PortForward

READY_TIMEOUT = 600  # first pull of nothing (the image is loaded), volumes, an election


def raft_cluster(name: str, minio: dict[str, str], archive_url: str,
                 restore: dict[str, Any] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "replicas": 3,
        "imagePullPolicy": "Never",  # the image was loaded into the kind node, not pushed
        "storage": {"size": "256Mi"},
        "archive": {"url": archive_url, "endpoint": minio["endpoint"],
                    "region": minio["region"], "intervalMs": 1000,
                    "credentialsSecret": {"name": "s3-credentials"}},
    }
    if restore is not None:
        spec["bootstrap"] = {"restore": restore}
    return {"apiVersion": "flotilla.dev/v1alpha1", "kind": "RaftCluster",
            "metadata": {"name": name}, "spec": spec}


def wait_ready(kube: Kube, name: str, replicas: int) -> None:
    def ready() -> bool:
        phase = kube.get(f"raft/{name}", "{.status.phase}")
        voters = kube.get(f"raft/{name}", "{.status.replicas}")
        ready_members = kube.get(f"raft/{name}", "{.status.readyReplicas}")
        joint = kube.get(f"raft/{name}", "{.status.configuration.joint}")
        return (phase == "Ready" and voters == str(replicas) and ready_members == str(replicas)
                and joint != "true")
    kube.wait_for(f"{name} Ready with {replicas} voters, not joint", ready, READY_TIMEOUT)


def access(kube: Kube, name: str) -> dict[str, Any]:
    """What a client of cluster `name` needs, from the Secrets the operator made: its CA (the
    members speak TLS) and its admin token (for the snapshot)."""
    ca = base64.b64decode(kube.get(f"secret/{name}-ca", r"{.data.ca\.crt}")).decode()
    token = base64.b64decode(kube.get(f"secret/{name}-admin-token", "{.data.token}")).decode()
    return {"ssl_context": ssl.create_default_context(cadata=ca), "token": token}


def write_keys(client: Client, forward: PortForward, acked: dict[str, tuple[bytes, int]],
               first: int, count: int) -> None:
    """Write keys e2e/<n>, recording each acknowledged one with its commit index. A write
    that fails for good (the forwarded pod went away) is retried through a new port-forward;
    rewriting the same value is harmless."""
    for n in range(first, first + count):
        key, value = f"e2e/{n:05d}", f"value {n}".encode()
        for attempt in range(5):
            try:
                acked[key] = (value, client.put(key, value).index)
                break
            except Unavailable:
                if attempt == 4:
                    raise
                forward.restart()


def scale(kube: Kube, name: str, replicas: int) -> None:
    kube.kubectl("scale", f"raft/{name}", f"--replicas={replicas}")
    wait_ready(kube, name, replicas)


@pytest.mark.timeout(3600)
def test_a_cluster_scales_survives_its_leader_and_is_restored_from_its_archive(
        kube: Kube, minio: dict[str, str]) -> None:
    archive = f"s3://{minio['bucket']}/{kube.namespace}"
    acked: dict[str, tuple[bytes, int]] = {}

    kube.apply(raft_cluster("e2e", minio, f"{archive}/e2e"))
    wait_ready(kube, "e2e", 3)
    cluster_id = kube.get("raft/e2e", "{.status.clusterId}")
    assert cluster_id

    # Writes through the client Service; members forward to the leader.
    forward = kube.port_forward("svc/e2e", 2379)
    client = Client(forward.url, timeout=30, prefer_leader=False, **access(kube, "e2e"))
    write_keys(client, forward, acked, 0, 300)

    # Grow to 5 voters and back to 3: learners, catch-up, joint consensus, both ways.
    scale(kube, "e2e", 5)
    write_keys(client, forward, acked, 300, 50)
    scale(kube, "e2e", 3)
    write_keys(client, forward, acked, 350, 50)

    # Lose the leader's pod: a new leader is elected and writes go on.
    leader = kube.get("raft/e2e", "{.status.leader}")
    assert leader.startswith("e2e-")
    kube.kubectl("delete", "pod", leader, "--wait=false")
    write_keys(client, forward, acked, 400, 100)
    wait_ready(kube, "e2e", 3)

    # A snapshot, taken by the leader and shipped to MinIO.
    leader = kube.get("raft/e2e", "{.status.leader}")
    to_leader = kube.port_forward(f"pod/{leader}", 2379)
    try:
        snapshot = Client(to_leader.url, timeout=60, **access(kube, "e2e")).snapshot()
    finally:
        to_leader.stop()
    assert snapshot.get("location"), f"the snapshot was not shipped to the archive: {snapshot}"
    expected = {key: value for key, (value, index) in acked.items()
                if index <= snapshot["index"]}
    assert len(expected) >= 300, f"snapshot at {snapshot['index']} holds few writes"
    client.close()
    forward.stop()

    # The cluster and its volumes go; the archive stays.
    kube.kubectl("delete", "raft/e2e", "--timeout=300s", timeout=330)
    kube.kubectl("wait", "--for=delete", "pod", "-l", "app.kubernetes.io/instance=e2e",
                 "--timeout=300s", timeout=330)
    kube.kubectl("delete", "pvc", "-l", "app.kubernetes.io/instance=e2e", "--timeout=300s",
                 timeout=330)
    assert kube.get("pvc", "{.items[*].metadata.name}") == ""

    # A new cluster from the old one's archive.
    kube.apply(raft_cluster("e2e-restored", minio, f"{archive}/e2e-restored",
                            restore={"url": f"{archive}/e2e", "clusterId": cluster_id}))
    wait_ready(kube, "e2e-restored", 3)
    assert kube.get("raft/e2e-restored", "{.status.clusterId}") != cluster_id

    forward = kube.port_forward("svc/e2e-restored", 2379)
    try:
        with Client(forward.url, timeout=30, prefer_leader=False,
                    **access(kube, "e2e-restored")) as restored:
            found = {key: restored.get(key).value for key in expected}
    finally:
        forward.stop()
    lost = {key: found[key] for key, value in expected.items() if found[key] != value}
    assert not lost, (f"{len(lost)} of {len(expected)} acknowledged writes up to index "
                      f"{snapshot['index']} are missing or wrong after the restore: "
                      f"{dict(list(lost.items())[:10])}")
