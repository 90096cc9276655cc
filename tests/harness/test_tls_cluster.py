"""The harness with ``tls=True``: members run with TLS on both ports and mutual TLS between them,
behind the fault proxies too, and the harness's clients dial them with the cluster's CA."""

from __future__ import annotations

import ssl

import pytest

from tests.harness.certs import TestCA
from tests.harness.kvclient import TRANSPORT_ERRORS, KVClient, Workload, read_finals
from tests.harness.linearizability import check_final_state

FAST = {"election_timeout_ms": 500, "heartbeat_ms": 50}


def test_a_proxied_tls_cluster_forwards_and_recovers_from_a_partition(local_cluster, tmp_path):
    cluster = local_cluster(3, proxied=True, tls=True, **FAST)
    assert all(n.url.startswith("https://") and n.peer_url.startswith("https://")
               for n in cluster.nodes.values())
    # Peers dial each other through the proxies on 127.0.0.1, over TLS end to end.
    view = cluster.initial_cluster_view("n0")
    assert all(url.startswith("https://127.0.0.1:") for m, url in view.items() if m != "n0")
    leader = cluster.wait_leader(30)
    follower = next(m for m in cluster.members if m != leader)
    with cluster.client(follower) as c:  # forwarded to the leader over TLS
        assert c.put("k", b"v").status == 200
    cluster.isolate(leader)
    new = cluster.wait_leader(30, among=[m for m in cluster.members if m != leader])
    cluster.heal()
    assert cluster.wait_leader(30) == new
    w = Workload(cluster.urls, clients=2, duration=2.0, ssl_context=cluster.ssl_context)
    history = w.run()
    assert w.ok_count > 10, w.summary()
    finals = read_finals(cluster.urls, sorted({op.key for op in history.ops}),
                         ssl_context=cluster.ssl_context)
    assert check_final_state(history, finals).ok

    # Clients without the cluster's CA, or speaking plain HTTP to a TLS port, get nothing.
    url = cluster.nodes[new].url
    with KVClient(url, timeout=2) as c, pytest.raises(ssl.SSLCertVerificationError):
        c.get("k")
    other = TestCA(tmp_path / "other").client_context()
    with KVClient(url, timeout=2, ssl_context=other) as c, \
            pytest.raises(ssl.SSLCertVerificationError):
        c.get("k")
    with KVClient(url.replace("https://", "http://"), timeout=2) as c, \
            pytest.raises(TRANSPORT_ERRORS):
        c.get("k")


def test_client_cert_auth_makes_clients_show_a_certificate_of_the_ca(local_cluster):
    cluster = local_cluster(1, tls=True, client_cert_auth=True, **FAST)
    cluster.wait_leader(30)
    assert "--client-cert-auth" in cluster.nodes["n0"].argv
    with cluster.client("n0") as c:  # the cluster's ssl_context carries a client certificate
        assert c.put("k", b"v").status == 200
    without = ssl.create_default_context(cafile=str(cluster.ca.ca_file))
    with KVClient(cluster.nodes["n0"].url, timeout=2, ssl_context=without) as c, \
            pytest.raises(TRANSPORT_ERRORS):
        c.get("k")
