"""Mutual TLS on a real 3-member cluster: members find each other over https with the
cluster's CA, clients speak https, and whoever is not a member with its own certificate is
refused: no certificate, a certificate of another CA, a valid certificate of a non-member,
and a member's valid certificate used in another member's name. Afterwards the leader and its
term are unchanged and every write is there."""

from __future__ import annotations

import json
import ssl
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from flotilla.node import tls
from flotilla.node.consensus import Message, MessageType
from flotilla.node.transport import CLUSTER_HEADER, MESSAGES_PATH, SENDER_HEADER
from flotilla.node.wire import encode_batch

from flotilla.client import Client
from tests.harness.fixtures import require_node
from tests.harness.ports import allocate_ports
from tests.harness.processes import NodeProcess

NAMES = ("n0", "n1", "n2")
HOSTS = {name: f"127.0.0.{i + 2}" for i, name in enumerate(NAMES)}
CLUSTER_ID = "tls-test"
TOKEN = "tls-test-admin-token-0123456789"


class Certs:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.ca = tls.make_ca("flotilla-test-ca")
        self.ca_file = self._write("ca", self.ca)
        self.other_ca = tls.make_ca("someone-elses-ca")

    def _write(self, name: str, issued: tls.Issued) -> str:
        cert, key = self.root / f"{name}.crt", self.root / f"{name}.key"
        issued.write(cert, key)
        return str(cert)

    def issue(self, name: str, host: str = "127.0.0.1", ca: tls.Issued | None = None,
              label: str | None = None) -> tuple[str, str]:
        label = label or name
        self._write(label, tls.issue(ca or self.ca, name, [host]))
        return str(self.root / f"{label}.crt"), str(self.root / f"{label}.key")


@pytest.fixture(scope="module")
def secure(tmp_path_factory):
    """A 3-member cluster with mutual TLS on the peer port and TLS on the client port."""
    require_node()
    root = tmp_path_factory.mktemp("tls")
    certs = Certs(root)
    peer = {n: f"{HOSTS[n]}:{allocate_ports(1, HOSTS[n])[0]}" for n in NAMES}
    client = {n: f"{HOSTS[n]}:{allocate_ports(1, HOSTS[n])[0]}" for n in NAMES}
    initial = {n: f"https://{peer[n]}" for n in NAMES}
    nodes = {}
    for name in NAMES:
        cert, key = certs.issue(name, HOSTS[name])
        nodes[name] = NodeProcess(
            name, root / name / "data", peer[name], client[name], initial_cluster=initial,
            cluster_id=CLUSTER_ID, election_timeout_ms=1000, heartbeat_ms=100,
            advertise_peer=f"https://{peer[name]}", advertise_client=f"https://{client[name]}",
            extra_args=["--cert-file", cert, "--key-file", key, "--peer-cert-file", cert,
                        "--peer-key-file", key, "--peer-trusted-ca-file", certs.ca_file,
                        "--admin-token", TOKEN])
    urls = [f"https://{client[n]}" for n in NAMES]
    try:
        with Client(urls, ca_file=certs.ca_file, token=TOKEN, timeout=30) as c:
            deadline = time.monotonic() + 30
            while True:
                status = c.status()
                if status.get("leader"):
                    break
                assert time.monotonic() < deadline, status
                time.sleep(0.2)
        yield {"certs": certs, "peer": peer, "client": client, "urls": urls, "nodes": nodes}
    finally:
        for node in nodes.values():
            node.kill()
        for node in nodes.values():
            print(f"--- {node.name}\n{node.log_path.read_text(errors='replace')[-3000:]}")


def _client(secure, **options) -> Client:
    return Client(secure["urls"], ca_file=secure["certs"].ca_file, token=TOKEN, **options)


def _leader_and_term(secure) -> tuple[str, int]:
    with _client(secure, timeout=20) as c:
        doc = c.status()
        return doc["leader"], doc["term"]


def _post(secure, member: str, sender: str, cert: tuple[str, str] | None,
          ca_file: str | None = None, body_sender: str | None = None):
    """A peer batch (one heartbeat in a far-away term) to `member`'s peer port, in the name of
    `sender`, over TLS with `cert` (None: no certificate). (status, body) or the exception."""
    ctx = ssl.create_default_context(cafile=ca_file or secure["certs"].ca_file)
    if cert is not None:
        ctx.load_cert_chain(*cert)
    frm = body_sender or sender
    body = encode_batch(CLUSTER_ID, frm, "https://127.0.0.1:1", "https://127.0.0.1:2",
                        [Message(MessageType.HEARTBEAT, to=member, frm=frm, term=10**6)])
    request = urllib.request.Request(
        f"https://{secure['peer'][member]}{MESSAGES_PATH}", data=body, method="POST",
        headers={CLUSTER_HEADER: CLUSTER_ID, SENDER_HEADER: sender})
    try:
        with urllib.request.urlopen(request, timeout=10, context=ctx) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()
    except (urllib.error.URLError, OSError) as exc:
        return exc


def test_a_tls_cluster_serves_writes_through_every_member(secure):
    for i, url in enumerate(secure["urls"]):
        with Client(url, ca_file=secure["certs"].ca_file, prefer_leader=False,
                    timeout=20) as c:
            c.put(f"tls/{i}", f"v{i}".encode())  # followers forward to the leader over https
    with _client(secure, timeout=20) as c:
        for i in range(len(secure["urls"])):
            assert c.get(f"tls/{i}").value == f"v{i}".encode()
        members = c.status()["members"]
    # Every member's client URL is in the configuration, as https.
    assert {m["client_url"] for m in members.values()} == set(secure["urls"]), members


def test_plain_http_and_an_unknown_ca_cannot_reach_a_tls_member(secure):
    with pytest.raises(Exception):  # noqa: B017 (any refusal will do: nothing is served)
        urllib.request.urlopen(f"http://{secure['client']['n0']}/v1/status", timeout=5).read()
    with Client(secure["urls"][0], ca_file=secure["certs"].issue("stranger")[0], retries=0,
                timeout=2) as c, pytest.raises(Exception):  # noqa: B017
        c.status()


def test_an_impostor_is_refused_whatever_certificate_it_holds(secure):
    certs = secure["certs"]
    before = _leader_and_term(secure)
    other_ca_n1 = certs.issue("n1", ca=certs.other_ca, label="n1-other-ca")
    mallory = certs.issue("mallory", label="mallory")
    n1 = certs.issue("n1", HOSTS["n1"], label="n1-copy")
    for member in ("n0", "n2"):
        # No certificate, and one from another CA: the handshake fails, nothing is served.
        for cert in (None, other_ca_n1):
            answer = _post(secure, member, "n1", cert)
            assert isinstance(answer, Exception), answer
        # A valid certificate of a non-member.
        status, body = _post(secure, member, "mallory", mallory)
        assert status == 403 and json.loads(body)["code"] == "not_a_member", body
        # n1's own certificate, used in n2's name (headers), or in n0's name (the batch).
        status, body = _post(secure, member, "n2" if member != "n2" else "n0", n1)
        assert status == 403 and json.loads(body)["code"] == "not_authenticated", body
        status, body = _post(secure, member, "n1", n1, body_sender="n2")
        assert status in (400, 403), body
    # None of it moved the term or the leader, and the cluster still serves.
    time.sleep(1.0)
    assert _leader_and_term(secure) == before
    with _client(secure, timeout=20) as c:
        c.put("tls/after", b"ok")
        assert c.get("tls/after").value == b"ok"


def test_client_certificates_are_required_with_client_cert_auth(tmp_path):
    require_node()
    certs = Certs(tmp_path)
    cert, key = certs.issue("solo", "127.0.0.1")
    user = certs.issue("alice", label="alice")
    peer_port, client_port = allocate_ports(2)
    node = NodeProcess("solo", tmp_path / "solo" / "data", f"127.0.0.1:{peer_port}",
                       f"127.0.0.1:{client_port}", cluster_id=CLUSTER_ID,
                       advertise_client=f"https://127.0.0.1:{client_port}",
                       extra_args=["--cert-file", cert, "--key-file", key,
                                   "--trusted-ca-file", certs.ca_file, "--client-cert-auth"])
    url = f"https://127.0.0.1:{client_port}"
    try:
        with Client(url, ca_file=certs.ca_file, cert_file=user[0], key_file=user[1],
                    timeout=20) as c:
            c.put("k", b"v")
            assert c.get("k").value == b"v"
        stranger = Client(url, ca_file=certs.ca_file, retries=0, timeout=2)
        with stranger, pytest.raises(Exception):  # noqa: B017 (refused at the handshake)
            stranger.get("k")
    finally:
        node.kill()
