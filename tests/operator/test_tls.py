"""The members' certificates and admin token: what a certificate in a Secret says and when it is
due (`certs`), the Secrets and cert-manager Certificates reconcile after reconcile against an
in-memory API (`tlsassets` through `reconcile`), and the probe members run with client
certificates, against a real node.

The same paths against kmock, with real members speaking TLS, are in test_kopf_kmock.py.
"""

from __future__ import annotations

import base64
import datetime
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from flotilla.node.tls import issue, make_ca
from flotilla.operator import certs, render, tlsassets
from flotilla.operator.spec import ClusterSpec

from tests.harness import ports
from tests.harness.polling import wait_for
from tests.operator.test_archivejobs import PatchingKube, rounds
from tests.operator.test_spec import UID, body


def now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


@pytest.fixture(autouse=True)
def read_secrets_every_round(monkeypatch):
    """Each round reads the Secrets again (the operator remembers them for a minute)."""
    monkeypatch.setenv(tlsassets.SECRETS_INTERVAL_ENV, "0")


def secret_data(kube: PatchingKube, name: str) -> dict[str, bytes]:
    return certs.decode(kube.objects[("Secret", "prod", name)])


def put_secret(kube: PatchingKube, name: str, data: dict[str, bytes],
               owner: str | None = UID) -> None:
    meta: dict[str, Any] = {"name": name, "namespace": "prod"}
    if owner is not None:
        meta["ownerReferences"] = [{"uid": owner, "kind": "RaftCluster", "name": "demo"}]
    kube.objects[("Secret", "prod", name)] = {
        "apiVersion": "v1", "kind": "Secret", "metadata": meta,
        "data": {k: base64.b64encode(v).decode() for k, v in data.items()}}


def creates(kube: PatchingKube) -> list[tuple[str, str]]:
    return [(kind, name) for verb, kind, name in kube.calls if verb == "create"]


# --- certs: what a certificate says ------------------------------------------------------------


SPEC = ClusterSpec.from_body(body())
CA = make_ca("test CA")


def test_a_member_certificate_names_the_member_and_its_dns_names():
    issued = certs.issue_member(SPEC, "demo-2", CA)
    info = certs.read(issued.cert_pem)
    assert info is not None
    assert info.names == frozenset(SPEC.member_dns_names("demo-2"))
    assert issued.certificate.subject.rfc4514_string() == "CN=demo-2"
    lifetime = info.not_after - info.not_before
    assert abs(lifetime - datetime.timedelta(days=365, minutes=5)) < datetime.timedelta(
        seconds=5)  # spec.tls.duration, and the five minutes it is backdated
    assert info.renew_at == info.not_after - lifetime / 3
    assert certs.due(info, SPEC.member_dns_names("demo-2"), CA.cert_pem, now()) is None


def test_a_certificate_is_due_with_a_third_of_its_life_left():
    short = issue(CA, "demo-0", SPEC.member_dns_names("demo-0")[1:], days=60 / 86400)
    info = certs.read(short.cert_pem)
    assert info is not None and info.not_after > now()  # still valid, but due
    why = certs.due(info, SPEC.member_dns_names("demo-0"), CA.cert_pem, now())
    assert why is not None and "a third of its lifetime is left" in why


def test_a_certificate_with_other_names_or_from_another_ca_is_due():
    issued = certs.issue_member(SPEC, "demo-0", CA)
    info = certs.read(issued.cert_pem)
    assert certs.due(info, SPEC.member_dns_names("demo-1"), CA.cert_pem, now()) == (
        f"it does not name {', '.join(sorted(set(SPEC.member_dns_names('demo-1')) - info.names))}")
    assert certs.due(info, SPEC.member_dns_names("demo-0"), make_ca("test CA").cert_pem,
                     now()) == "another CA signed it"
    assert certs.due(None, [], CA.cert_pem, now()) == "it has no readable certificate"
    assert certs.read(b"not a certificate") is None


def test_a_ca_of_ones_own_must_be_a_ca_with_its_key():
    assert certs.ca_from_secret(None) == "it does not exist"
    leaf = issue(CA, "not-a-ca")
    found = certs.ca_from_secret({"data": {"tls.crt": base64.b64encode(leaf.cert_pem).decode(),
                                           "tls.key": base64.b64encode(leaf.key_pem).decode()}})
    assert found == "its tls.crt is not a CA certificate (basicConstraints CA:TRUE)"
    other = make_ca("other")
    found = certs.ca_from_secret({"data": {"tls.crt": base64.b64encode(CA.cert_pem).decode(),
                                           "tls.key": base64.b64encode(other.key_pem).decode()}})
    assert found == "its tls.key is not the private key of its tls.crt"
    assert "needs tls.crt and tls.key" in certs.ca_from_secret({"data": {}})
    ca, trust = certs.ca_from_secret({"data": {
        "tls.crt": base64.b64encode(CA.cert_pem).decode(),
        "tls.key": base64.b64encode(CA.key_pem).decode()}})
    assert (ca.cert_pem, trust) == (CA.cert_pem, CA.cert_pem)


def test_a_cert_manager_certificate_for_a_member():
    spec = ClusterSpec.from_body(body({"tls": {"duration": "2160h", "issuerRef": {
        "name": "platform", "kind": "ClusterIssuer"}}}))
    cert = certs.certificate(spec, "demo-1-tls", "demo-1", spec.member_dns_names("demo-1"),
                             spec.labels)
    assert cert["apiVersion"] == "cert-manager.io/v1" and cert["kind"] == "Certificate"
    assert cert["metadata"]["ownerReferences"] == [render.owner_reference(spec)]
    assert cert["spec"] == {
        "secretName": "demo-1-tls", "commonName": "demo-1",
        "dnsNames": [n for n in spec.member_dns_names("demo-1") if n != "127.0.0.1"],
        "ipAddresses": ["127.0.0.1"],
        "duration": "2160h", "renewBefore": "720h",
        "usages": ["digital signature", "key encipherment", "server auth", "client auth"],
        "privateKey": {"algorithm": "ECDSA", "size": 256, "rotationPolicy": "Always"},
        "issuerRef": {"name": "platform", "kind": "ClusterIssuer", "group": "cert-manager.io"},
        "secretTemplate": {"labels": spec.labels},
    }


# --- reconcile: the Secrets before the pods --------------------------------------------------


def test_the_first_round_makes_the_token_the_ca_and_every_members_secret_before_the_pods():
    kube, obj = PatchingKube(), body()
    (first,) = rounds(kube, obj)
    made = creates(kube)
    assert made[:5] == [("Secret", "demo-admin-token"), ("Secret", "demo-ca"),
                        ("Secret", "demo-0-tls"), ("Secret", "demo-1-tls"),
                        ("Secret", "demo-2-tls")]
    assert made.index(("Secret", "demo-2-tls")) < made.index(("StatefulSet", "demo"))
    assert ("NetworkPolicy", "demo") in made
    token = secret_data(kube, "demo-admin-token")["token"]
    assert re.fullmatch(rb"[0-9a-f]{64}", token)  # 32 random bytes, never a leading "-"
    ca = secret_data(kube, "demo-ca")
    for i in range(3):
        member = secret_data(kube, f"demo-{i}-tls")
        assert set(member) == {"tls.crt", "tls.key", "ca.crt"}
        assert member["ca.crt"] == ca["tls.crt"]
        info = certs.read(member["tls.crt"])
        assert info.names == frozenset(SPEC.member_dns_names(f"demo-{i}"))
        assert certs.due(info, SPEC.member_dns_names(f"demo-{i}"), ca["tls.crt"], now()) is None
        stored = kube.objects[("Secret", "prod", f"demo-{i}-tls")]
        assert stored["type"] == "kubernetes.io/tls"
        assert stored["metadata"]["ownerReferences"][0]["uid"] == UID
    tls = obj["status"]["tls"]
    assert (tls["enabled"], tls["issuer"], tls["clientCertAuth"]) == (True, "operator", False)
    assert [c["secret"] for c in tls["certificates"]] == [f"demo-{i}-tls" for i in range(3)]
    assert {e[1] for e in first.events} >= {"Created"}
    assert not [e for e in first.events if e[0] == "Warning"]
    # Nothing new in the next round: the Secrets are good.
    before = len(kube.calls)
    (second,) = rounds(kube, obj)
    assert not [c for c in kube.calls[before:] if c[1] == "Secret" and c[0] != "get"]
    assert not [e for e in second.events if e[1] in ("Created", "CertificateRenewed")]


def test_a_certificate_near_expiry_is_renewed_and_status_says_until_when():
    kube, obj = PatchingKube(), body()
    rounds(kube, obj)
    ca = secret_data(kube, "demo-ca")
    ca_issued = certs.Issued(ca["tls.crt"], ca["tls.key"])
    short = issue(ca_issued, "demo-1", SPEC.member_dns_names("demo-1")[1:], days=60 / 86400)
    put_secret(kube, "demo-1-tls", {"tls.crt": short.cert_pem, "tls.key": short.key_pem,
                                    "ca.crt": ca["tls.crt"]})
    (renewed,) = rounds(kube, obj)
    assert ("patch", "Secret", "demo-1-tls") in kube.calls
    info = certs.read(secret_data(kube, "demo-1-tls")["tls.crt"])
    assert info.serial != short.certificate.serial_number
    assert info.not_after - now() > datetime.timedelta(days=364)
    (event,) = [e for e in renewed.events if e[1] == "CertificateRenewed"]
    assert event[0] == "Normal" and "demo-1-tls" in event[2]
    assert "a third of its lifetime is left" in event[2]
    entry = next(c for c in obj["status"]["tls"]["certificates"] if c["secret"] == "demo-1-tls")
    assert entry["notAfter"] == info.not_after.strftime("%Y-%m-%dT%H:%M:%SZ")


def test_scaling_up_issues_the_new_members_certificates_in_the_round_that_grows_the_set():
    kube, obj = PatchingKube(), body()
    rounds(kube, obj)
    obj["spec"]["replicas"] = 5
    kube.objects[("StatefulSet", "prod", "demo")]["spec"]["replicas"] = 3
    obj["status"]["bootstrapped"] = True
    rounds(kube, obj)
    assert ("Secret", "demo-3-tls") in creates(kube) and ("Secret", "demo-4-tls") in creates(kube)


class ReadingKube(PatchingKube):
    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        self.calls.append(("get", kind, name))
        return super().get(kind, namespace, name)


def test_a_member_that_joins_has_only_its_own_secret_read(monkeypatch):
    """Within the secrets interval, the round that grows the member set reads (and makes) the
    new members' Secrets only: the CA and the others' were read a moment ago."""
    monkeypatch.setenv(tlsassets.SECRETS_INTERVAL_ENV, "60")
    kube, obj = ReadingKube(), body()
    rounds(kube, obj)
    obj["spec"]["replicas"] = 5
    kube.objects[("StatefulSet", "prod", "demo")]["spec"]["replicas"] = 3
    obj["status"]["bootstrapped"] = True
    before = len(kube.calls)
    rounds(kube, obj)
    assert [c for c in kube.calls[before:] if c[1] == "Secret"] == [
        ("get", "Secret", "demo-3-tls"), ("create", "Secret", "demo-3-tls"),
        ("get", "Secret", "demo-4-tls"), ("create", "Secret", "demo-4-tls")]
    assert [c["secret"] for c in obj["status"]["tls"]["certificates"]] == [
        f"demo-{i}-tls" for i in range(5)]
    tlsassets.forget()  # after the interval: every Secret is read again, none made
    before = len(kube.calls)
    rounds(kube, obj)
    assert [c for c in kube.calls[before:] if c[1] == "Secret"] == [
        ("get", "Secret", name) for name in ("demo-admin-token", "demo-ca",
                                             *(f"demo-{i}-tls" for i in range(5)))]


def test_a_short_admin_token_stops_everything_and_says_why():
    kube, obj = PatchingKube(), body({"adminTokenSecret": {"name": "admin"}})
    put_secret(kube, "admin", {"token": b"hunter2"}, owner=None)
    outcomes = rounds(kube, obj, 2)
    assert creates(kube) == []
    status = obj["status"]
    assert status["phase"] == "Invalid"
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "AdminTokenTooShort")
    assert "7 bytes" in ready["message"] and "under 16 bytes" in ready["message"]
    assert [e[:2] for e in outcomes[0].events] == [("Warning", "AdminTokenTooShort")]
    # once it is long enough, the cluster is made, with that token
    put_secret(kube, "admin", {"token": b"a-token-of-sixteen-bytes"}, owner=None)
    rounds(kube, obj)
    assert ("StatefulSet", "demo") in creates(kube)
    assert ("Secret", "demo-admin-token") not in creates(kube)


def test_a_missing_admin_token_secret_is_named():
    kube, obj = PatchingKube(), body({"adminTokenSecret": {"name": "admin", "key": "t"}})
    (outcome,) = rounds(kube, obj)
    assert outcome.events[-1][:2] == ("Warning", "AdminTokenSecretMissing")
    assert "the admin token Secret admin (spec.adminTokenSecret) does not exist" in \
        outcome.events[-1][2]
    put_secret(kube, "admin", {"token": b"x" * 20}, owner=None)
    (outcome,) = rounds(kube, obj)
    assert outcome.events[-1][:2] == ("Warning", "AdminTokenSecretMissing")
    assert "has no key 't'" in outcome.events[-1][2]


def test_members_can_be_signed_with_a_ca_of_ones_own():
    kube, obj = PatchingKube(), body({"tls": {"secretName": "team-ca"}})
    (missing,) = rounds(kube, obj)
    assert missing.events[-1][:2] == ("Warning", "CASecretInvalid")
    assert "the CA Secret team-ca (spec.tls.secretName)" in missing.events[-1][2]
    assert ("Secret", "demo-ca") not in creates(kube)
    root = make_ca("team root")
    put_secret(kube, "team-ca", {"tls.crt": root.cert_pem, "tls.key": root.key_pem},
               owner=None)
    rounds(kube, obj)
    member = secret_data(kube, "demo-0-tls")
    assert member["ca.crt"] == root.cert_pem
    assert certs.due(certs.read(member["tls.crt"]), SPEC.member_dns_names("demo-0"),
                     root.cert_pem, now()) is None
    assert obj["status"]["tls"]["issuer"] == "secret/team-ca"
    assert ("Secret", "demo-ca") not in creates(kube)


def test_with_client_certificates_the_operator_gets_one_of_its_own():
    kube, obj = PatchingKube(), body({"tls": {"clientCertAuth": True}})
    rounds(kube, obj)
    client = secret_data(kube, "demo-client-tls")
    assert certs.read(client["tls.crt"]).names == {"flotilla-operator"}
    ctx = tlsassets.client_context(client["ca.crt"], (client["tls.crt"], client["tls.key"]))
    assert ctx is tlsassets.client_context(client["ca.crt"],
                                           (client["tls.crt"], client["tls.key"]))


def test_with_an_issuer_cert_manager_signs_and_no_pod_starts_before_its_secret():
    kube, obj = PatchingKube(), body({"tls": {"issuerRef": {"name": "platform"}}})
    rounds(kube, obj, 2)
    made = creates(kube)
    assert [n for k, n in made if k == "Certificate"] == ["demo-0-tls", "demo-1-tls",
                                                          "demo-2-tls"]
    assert ("Secret", "demo-ca") not in made
    assert kube.objects[("StatefulSet", "prod", "demo")]["spec"]["replicas"] == 0
    assert "waiting for the certificate Secrets of demo-0, demo-1, demo-2" in \
        obj["status"]["lastAction"]
    # cert-manager writes the Secrets (with ca.crt); then the members start
    ca = make_ca("cert-manager's CA")
    for i in range(3):
        issued = certs.issue_member(ClusterSpec.from_body(obj), f"demo-{i}", ca)
        put_secret(kube, f"demo-{i}-tls", {"tls.crt": issued.cert_pem,
                                           "tls.key": issued.key_pem, "ca.crt": ca.cert_pem},
                   owner=None)
    rounds(kube, obj)
    assert kube.objects[("StatefulSet", "prod", "demo")]["spec"]["replicas"] == 3
    assert obj["status"]["tls"]["issuer"] == "cert-manager/Issuer/platform"
    assert len(obj["status"]["tls"]["certificates"]) == 3


def test_without_cert_manager_the_status_says_what_to_install():
    class NoCertManager(PatchingKube):
        def create(self, obj: dict[str, Any]) -> dict[str, Any]:
            if obj["kind"] == "Certificate":
                from flotilla.operator.kube import ApiError
                raise ApiError(404, "the server could not find the requested resource")
            return super().create(obj)

    kube, obj = NoCertManager(), body({"tls": {"issuerRef": {"name": "platform"}}})
    (outcome,) = rounds(kube, obj)
    assert outcome.events[-1][:2] == ("Warning", "CertManagerMissing")
    assert "install cert-manager" in outcome.events[-1][2]
    assert ("StatefulSet", "demo") not in creates(kube)


def test_turning_the_network_policy_off_deletes_it():
    kube, obj = PatchingKube(), body()
    rounds(kube, obj)
    assert ("NetworkPolicy", "prod", "demo") in kube.objects
    obj["spec"]["network"] = {"policy": False}
    (outcome,) = rounds(kube, obj)
    assert ("delete", "NetworkPolicy", "demo") in kube.calls
    assert ("Normal", "Deleted", "NetworkPolicy demo: spec.network.policy is false") in \
        outcome.events


# --- the probe members run when they ask clients for a certificate -------------------------


def test_the_client_certificate_probe_passes_against_a_real_member(tmp_path: Path):
    """The exec probe the operator renders with clientCertAuth, run against a node started
    with the same flags: it shows the member's own certificate and passes once the member is
    ready; without a certificate it cannot even connect."""
    spec = ClusterSpec.from_body(body({"tls": {"clientCertAuth": True}}))
    ca = make_ca("probe CA")
    issued = certs.issue_member(spec, "demo-0", ca)
    folder = tmp_path / "tls"
    folder.mkdir()
    for name, data in (("tls.crt", issued.cert_pem), ("tls.key", issued.key_pem),
                       ("ca.crt", ca.cert_pem)):
        (folder / name).write_bytes(data)
    peer, client = ports.allocate_ports(2, "127.0.0.1")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLOTILLA_")}
    flags = {v["name"]: v["value"] for v in render.node_env(spec, ["demo-0"], False)
             if v["name"].endswith(("_FILE", "_AUTH"))}
    env.update({k: v.replace(render.TLS_DIR, str(folder)) for k, v in flags.items()})
    env.update({"FLOTILLA_NAME": "demo-0", "FLOTILLA_DATA_DIR": str(tmp_path / "data"),
                "FLOTILLA_LISTEN_PEER": f"127.0.0.1:{peer}",
                "FLOTILLA_LISTEN_CLIENT": f"127.0.0.1:{client}",
                "FLOTILLA_ADVERTISE_PEER": f"https://localhost:{peer}",
                "FLOTILLA_ADVERTISE_CLIENT": f"https://localhost:{client}",
                "FLOTILLA_INITIAL_CLUSTER": f"demo-0=https://localhost:{peer}",
                "FLOTILLA_ADMIN_TOKEN": "t" * 20})
    assert flags["FLOTILLA_CLIENT_CERT_AUTH"] == "true"
    node = subprocess.Popen([sys.executable, "-m", "flotilla.node"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    (container,) = render.pod_spec(spec, [], True)["containers"]

    def probe(kind: str, tls_dir: Path = folder) -> int:
        command = [sys.executable if word == "python" else word.replace(
            render.TLS_DIR, str(tls_dir)).replace(":2379", f":{client}")
            for word in container[kind]["exec"]["command"]]
        return subprocess.run(command, capture_output=True, timeout=20).returncode

    try:
        wait_for(lambda: probe("readinessProbe") == 0, 30, "the readiness probe to pass")
        assert probe("livenessProbe") == 0 and probe("startupProbe") == 0
        stranger = tmp_path / "stranger"
        stranger.mkdir()
        other = make_ca("another CA")
        bad = issue(other, "demo-0", ["localhost"])
        (stranger / "tls.crt").write_bytes(bad.cert_pem)
        (stranger / "tls.key").write_bytes(bad.key_pem)
        (stranger / "ca.crt").write_bytes(ca.cert_pem)
        assert probe("readinessProbe", stranger) != 0
    finally:
        node.terminate()
        node.wait(15)


def test_a_cluster_from_before_tls_gets_no_certificates_and_says_why():
    kube, obj = PatchingKube(), body(status={"bootstrapped": True,
                                             "clusterId": "prod-demo-6f1c2a9e"})
    rounds(kube, obj, 2)
    assert [n for k, n in creates(kube) if k == "Secret"] == ["demo-admin-token"]
    assert obj["status"]["tls"] == {"enabled": False, "issuer": "none", "legacy": True}
    env = {v["name"]: v.get("value") for v in kube.objects[("StatefulSet", "prod", "demo")][
        "spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["FLOTILLA_ADVERTISE_PEER"].startswith("http://")
    assert "FLOTILLA_CERT_FILE" not in env
